"""Whole runs through the Python API and the CLI: reproducible, resumable, honest about errors."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import ddplab
from ddplab.cli import main
from ddplab.config import load_toml
from ddplab.engine.trainer import Trainer
from ddplab.rundir import checkpoint

from support.cli import ddplab_cli
from support.readers import metrics
from support.settings import tiny_config


def final_weights(run_dir):
    return checkpoint.load(run_dir / "checkpoints" / checkpoint.LAST)["model"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_same_seed_same_run_bit_for_bit(tmp_path, tiny_run):
    a = tiny_run()  # trained once for every test that reads it: b is trained here, the same way
    b = ddplab.train(tiny_config(tmp_path / "b"))
    assert (
        metrics(a.run_dir, per_rank=True) == metrics(b.run_dir, per_rank=True)
        and len(metrics(a.run_dir, per_rank=True)) == 2
    )
    assert_same_weights(final_weights(a.run_dir), final_weights(b.run_dir))
    c = ddplab.train(tiny_config(tmp_path / "c", train={"seed": 1}))
    assert metrics(c.run_dir, per_rank=True) != metrics(a.run_dir, per_rank=True)


def test_interrupted_then_resumed_run_is_bit_identical(tmp_path, monkeypatch):
    cfg = dict(train={"epochs": 4}, data={"cutout": 4, "jitter": 0.2})  # every random stream in play
    whole = ddplab.train(tiny_config(tmp_path / "whole", **cfg))

    real_run_epoch = Trainer.run_epoch

    def crash_in_epoch_3(self, epoch):
        if epoch == 3:
            raise KeyboardInterrupt  # as if the process died mid-epoch
        return real_run_epoch(self, epoch)

    monkeypatch.setattr(Trainer, "run_epoch", crash_in_epoch_3)
    with pytest.raises(KeyboardInterrupt):
        ddplab.train(tiny_config(tmp_path / "cut", **cfg))
    first_session = checkpoint.load(tmp_path / "cut" / "checkpoints" / checkpoint.LAST)["train_state"]
    assert first_session["epoch"] == 2
    monkeypatch.setattr(Trainer, "run_epoch", real_run_epoch)
    # Through the CLI, as a user would: --resume takes the run's own config.toml.
    assert main(["train", "--out", str(tmp_path / "cut"), "--resume"]) == 0
    assert metrics(tmp_path / "cut", per_rank=True) == metrics(whole.run_dir, per_rank=True)
    assert_same_weights(final_weights(tmp_path / "cut"), final_weights(whole.run_dir))
    # The resumed run's total time holds both sessions: the first to its checkpoint, then the second.
    times = json.loads((tmp_path / "cut" / "summary.json").read_text())["time"]
    epochs = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert first_session["earlier_sessions_s"] >= sum(r["epoch_s"] for r in epochs[:2])
    assert (
        times["total_s"]
        >= first_session["earlier_sessions_s"] + sum(r["epoch_s"] for r in epochs[2:]) + times["startup_s"]
    )


@pytest.mark.parametrize("schedule, warned", [("onecycle", True), ("none", False)])
def test_extending_a_run_says_when_it_replans_the_schedule(tmp_path, schedule, warned, tiny_run):
    shutil.copytree(tiny_run(optim={"schedule": schedule}).run_dir, tmp_path / "r")
    extended = ddplab.train(
        tiny_config(tmp_path / "r", optim={"schedule": schedule}, train={"epochs": 3}, output={"resume": True})
    )
    log = (tmp_path / "r" / "train.log").read_text()
    if warned:
        start = (
            f"WARNING changing from 2 to 3 epochs re-plans the onecycle schedule over 3: the learning rate goes "
            f"from {extended.history[1].lr:.3g} (the last step's) to "
        )
        assert start in log
        jumped_to = float(log.split(start)[1].split(";")[0])
        assert jumped_to > 10 * extended.history[1].lr  # the end of a 2-epoch plan vs 2/3 into a 3-epoch one
    else:
        assert "WARNING" not in log
    assert "epochs = 3" in (tmp_path / "r" / "config.toml").read_text()
    planned = tiny_run(optim={"schedule": schedule}, train={"epochs": 3})
    # Without a re-plan, the extension is the run that was planned that long; with one, it is not.
    assert (metrics(tmp_path / "r", per_rank=True) == metrics(planned.run_dir, per_rank=True)) is not warned


def test_run_folder_holds_config_metrics_summary_and_reproduces(tmp_path, tiny_run):
    result = tiny_run(train={"epochs": 3})
    run = result.run_dir
    for name in (
        "config.toml",
        "metrics.jsonl",
        "summary.json",
        "env.json",
        "train.log",
        "checkpoints/last.pt",
        "checkpoints/best.pt",
    ):
        assert (run / name).is_file(), name
    summary = json.loads((run / "summary.json").read_text())
    history = result.history
    assert summary["final"]["test_acc"] == history[-1].test_acc
    assert summary["best"]["test_acc"] == max(r.test_acc for r in history)
    assert summary["batch"] == {"local": 32, "accumulate": 1, "global": 32, "steps_per_epoch": 8, "optimizer_steps": 24}
    losses = [r.test_loss for r in history]
    assert summary["overfitting"]["test_loss_rise"] == pytest.approx(losses[-1] - min(losses))
    # The gap is read from training images measured as the test set is (eval mode), not the running train acc.
    assert summary["overfitting"]["gap_from"] == "train_eval_acc"
    assert summary["overfitting"]["train_test_acc_gap"] == pytest.approx(
        history[-1].train_eval_acc - history[-1].test_acc
    )
    assert (
        summary["final"]["train_eval_acc"] == history[-1].train_eval_acc and summary["data"]["train_eval_images"] == 256
    )
    assert summary["time"]["startup_s"] > 0 and "peak_rss_mib" in summary["memory"]
    for record in history:
        assert record.train_samples == 256 and record.test_samples == 64
        assert record.images_per_s == pytest.approx(256 / record.train_s)
    # The saved config alone reproduces the run.
    assert main(["train", "--config", str(run / "config.toml"), "--out", str(tmp_path / "again")]) == 0
    assert metrics(tmp_path / "again", per_rank=True) == metrics(run, per_rank=True)


def test_eval_command_matches_the_run(capsys, tiny_run):
    result = tiny_run(train={"epochs": 3})
    from ddplab.engine.evaluate import evaluate_run

    final = evaluate_run(result.run_dir, device="cpu")
    assert final["correct"] == round(result.history[-1].test_acc * 64) and final["count"] == 64
    assert final["loss"] == pytest.approx(result.history[-1].test_loss, rel=1e-6)
    best = evaluate_run(result.run_dir, weights="best", device="cpu")
    assert best["acc"] == result.summary["best"]["test_acc"] and best["epoch"] == result.summary["best"]["epoch"]
    assert main(["eval", str(result.run_dir), "--device", "cpu"]) == 0
    assert "test acc" in capsys.readouterr().out
    # TTA added afterwards: the same weights over 2 views, named in the output; the run's own setting otherwise.
    flipped = evaluate_run(result.run_dir, device="cpu", tta="flip")
    assert final["tta"] == "none" and flipped["tta"] == "flip" and flipped["count"] == 64
    assert flipped["loss"] != pytest.approx(final["loss"], rel=1e-6)
    assert main(["eval", str(result.run_dir), "--device", "cpu", "--tta", "flip"]) == 0
    assert "tta flip" in capsys.readouterr().out


def test_eval_scores_a_run_in_the_memory_format_it_trained_in(monkeypatch, tiny_run):
    """A CPU run trains and evaluates channels_last (model.channels_last=auto): `ddplab eval` does too, so it sums
    as the run did (and at its speed); a run trained NCHW is scored NCHW."""
    import torch

    from ddplab.engine import evaluate as module

    seen = []

    def spy(model, loader, *args, **kwargs):
        conv = next(p for p in model.parameters() if p.dim() == 4)
        seen.append((conv.is_contiguous(memory_format=torch.channels_last), loader.channels_last))
        return real(model, loader, *args, **kwargs)

    real = module.evaluate
    monkeypatch.setattr(module, "evaluate", spy)
    for setting, channels_last in (("auto", True), (False, False)):
        result = tiny_run(train={"epochs": 1}, model={"channels_last": setting})
        module.evaluate_run(result.run_dir, device="cpu")
        assert seen.pop() == (channels_last, channels_last)


def test_a_finished_run_is_never_overwritten(tmp_path, capsys, tiny_run):
    shutil.copytree(tiny_run(train={"epochs": 1}).run_dir, tmp_path / "run")
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    args = ["train", "--config", str(tmp_path / "run" / "config.toml"), "--out", str(tmp_path / "run")]
    assert main(args) == 2
    assert "already holds a finished run" in capsys.readouterr().err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    # Resuming with a changed setting is refused; more epochs are allowed.
    assert main([*args, "--resume", "--lr", "0.5"]) == 2
    assert "optim.lr" in capsys.readouterr().err
    assert main([*args, "--resume", "--epochs", "2"]) == 0
    assert len(metrics(tmp_path / "run")) == 2
    assert "epochs = 2" in (tmp_path / "run" / "config.toml").read_text()  # the folder's config follows the run
    assert main(["train", "--out", str(tmp_path / "run"), "--resume"]) == 0  # nothing left to do, and no error
    assert main(["train", "--out", str(tmp_path / "run"), "--resume", "--epochs", "1"]) == 2
    assert "already trained 2 epochs" in capsys.readouterr().err


def test_foreign_folder_is_refused(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    assert main(["train", "--dataset", "synthetic", "--out", str(tmp_path / "mine")]) == 2
    assert "not a ddplab run folder" in capsys.readouterr().err


def cli(*args, env=None, cwd=None):
    """Run `python -m ddplab` in a process of its own, as a user would."""
    return ddplab_cli(*args, env=env, cwd=cwd)


def test_a_run_on_a_relative_data_path_is_found_from_anywhere(tmp_path):
    """config.toml records the data root it read as an absolute path: `ddplab eval` and `--resume` work
    from another working directory (a relative --data-dir, or DDPLAB_DATA, used to be read from there)."""
    from PIL import Image

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    for split, count in (("train", 24), ("test", 8)):
        for label, cls in enumerate(("cat", "dog")):
            (work / "imgs" / split / cls).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (8, 8), (40 + 150 * label, 7 * i, 90)).save(work / "imgs" / split / cls / f"{i}.png")
    common = [
        "--dataset",
        "imagefolder",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--device",
        "cpu",
        "--model.width",
        "0.25",
        "--output.progress",
        "false",
        "--output.tensorboard",
        "false",
    ]
    first = cli("train", *common, "--data-dir", "imgs", "--out", "run", cwd=work)
    assert first.returncode == 0, first.stderr[-3000:]
    assert load_toml(work / "run" / "config.toml")["data"]["data_dir"] == str((work / "imgs").resolve())
    evaluated = cli("eval", str(work / "run"), "--device", "cpu", cwd=elsewhere)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    resumed = cli("train", "--out", str(work / "run"), "--resume", "--epochs", "2", cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The same run asked for again with the relative path, from where it was started, is the same run.
    again = cli("train", *common, "--epochs", "2", "--data-dir", "imgs", "--out", "run", "--resume", cwd=work)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr[-3000:]


def assert_one_line_error(proc, code, *needles):
    assert proc.returncode == code, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ddplab: error:")]
    assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1], proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_two_threads_cannot_train_into_one_folder(tmp_path, monkeypatch):
    """The folder's lock is per call, not per process: a second thread's train() on the same --out is
    refused while the first trains (they used to interleave metrics.jsonl and overwrite checkpoints)."""
    from ddplab.errors import ConfigError

    first_training, second_done = threading.Event(), threading.Event()
    real_fit = Trainer.fit

    def fit_that_waits(self, *args, **kwargs):
        first_training.set()
        assert second_done.wait(120)
        return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "fit", fit_that_waits)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", ddplab.train(tiny_config(tmp_path / "r"))))
    first.start()
    assert first_training.wait(120)
    try:
        with pytest.raises(ConfigError, match=r"in use by another thread of this process"):
            ddplab.train(tiny_config(tmp_path / "r"))
    finally:
        second_done.set()
        first.join(120)
    assert results["first"].summary["status"] == "finished" and len(metrics(tmp_path / "r", per_rank=True)) == 2
    monkeypatch.setattr(Trainer, "fit", real_fit)
    assert (
        ddplab.train(tiny_config(tmp_path / "r", train={"epochs": 3}, output={"resume": True})).summary["run"][
            "epochs_done"
        ]
        == 3
    )  # once the first call ended, the folder is free again


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stopped_single_process_run_says_so_and_resumes(tmp_path, sig):
    """SIGTERM (a scheduler's time limit, a sweep) and SIGHUP (a closed terminal or SSH session) stop a single
    process as Ctrl-C does, and as a DDP run's launcher says it: exit 130, one line with the way to continue;
    they used to be 143 or 129 and silence."""
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddplab",
            "train",
            "--dataset",
            "synthetic",
            "--data.synthetic_size",
            "256",
            "--data.image_size",
            "16",
            "--model.width",
            "0.5",
            "--epochs",
            "500",
            "--device",
            "cpu",
            "--output.progress",
            "false",
            "--output.tensorboard",
            "false",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text().count("\n") >= 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"ddplab: error: interrupted by {sig.name}; checkpoints are kept: continue "
        f"with ddplab train --out {out} --resume"
    )
    done = checkpoint.load(out / "checkpoints" / checkpoint.LAST)["train_state"]["epoch"]
    # No record past the checkpoint (a resume rewrites metrics.jsonl from the checkpoint's history); one short of
    # it where the stop landed between the epoch's checkpoint and its record (seen once in CI).
    assert done >= 2 and done - 1 <= len(metrics(out)) <= done
    resumed = cli("train", "--out", str(out), "--resume", "--epochs", str(done + 1))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert len(metrics(out)) == done + 1


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--batch-size", "0"], ["train.batch_size=0", ">= 1"]),
        (["--model", "resnet99"], ["model.name='resnet99'", "simple_cnn"]),
        (["--lr", "-1"], ["optim.lr=-1.0", "> 0"]),
        (["--backend", "nccl", "--device", "cpu"], ["dist.backend='nccl'", "gloo"]),
        (["--data-dir", "/no/such/dir"], ["data.data_dir", "does not exist"]),
        (["--optim.betas", "0.9"], ["optim.betas"]),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path, args, needles):
    assert_one_line_error(cli("train", "--out", str(tmp_path / "r"), *args), 2, *needles)
    assert not (tmp_path / "r").exists()


def test_missing_dataset_says_where_to_put_it(tmp_path):
    proc = cli(
        "train",
        "--dataset",
        "cifar10",
        "--data-dir",
        str(tmp_path),
        "--data.download",
        "false",
        "--out",
        str(tmp_path / "r"),
    )
    assert_one_line_error(proc, 3, "cifar-10-batches-bin", str(tmp_path))


def test_corrupt_dataset_file_is_named(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    record = bytes(3073)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (folder / name).write_bytes(record * 3)
    (folder / "data_batch_2.bin").write_bytes(record * 3 + b"\x00" * 100)  # truncated mid-record
    (folder / "batches.meta.txt").write_text("\n".join("abcdefghij") + "\n")
    proc = cli(
        "train",
        "--dataset",
        "cifar10",
        "--data-dir",
        str(tmp_path),
        "--data.download",
        "false",
        "--out",
        str(tmp_path / "r"),
    )
    assert_one_line_error(proc, 3, "data_batch_2.bin")


def test_non_finite_loss_exits_4_with_one_line(tmp_path):
    proc = cli(
        "train",
        "--dataset",
        "synthetic",
        "--data.synthetic_size",
        "256",
        "--data.image_size",
        "16",
        "--lr",
        "1e12",
        "--epochs",
        "2",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "r"),
    )
    assert_one_line_error(proc, 4, "NaN/inf", "epoch 1")


def test_debug_shows_the_traceback(tmp_path):
    proc = cli("train", "--batch-size", "0", "--debug")
    assert proc.returncode == 2 and "Traceback" in proc.stderr  # the same exit code as without --debug
    assert proc.stderr.strip().splitlines()[-1].startswith("ddplab: error: train.batch_size=0")


def test_models_and_data_commands(tmp_path):
    proc = cli("models")
    assert proc.returncode == 0 and all(m in proc.stdout for m in ("simple_cnn", "vgg_small", "resnet18", "fastnet"))
    assert "620,362" in proc.stdout  # simple_cnn's parameter count at 32x32, 10 classes


def test_real_cifar10_short_run_and_data_commands(cifar_root, tmp_path):
    result = ddplab.train(
        tiny_config(
            tmp_path / "run",
            data={
                "dataset": "cifar10",
                "data_dir": str(cifar_root),
                "subset": 2048,
                "image_size": None,
                "synthetic_size": None,
            },
            model={"width": 1.0},
            optim={"name": "adam", "lr": 2e-3},
            train={"epochs": 1, "batch_size": 64},
        )
    )
    record = result.history[0]
    assert record.train_samples == 2048 and record.test_samples == 10_000
    assert result.summary["data"]["num_classes"] == 10 and result.test_acc > 0.2  # chance is 0.1
    proc = cli("data", "info", "cifar10", "--data-dir", str(cifar_root))
    assert proc.returncode == 0 and "airplane" in proc.stdout and "50000" in proc.stdout.replace(",", "")
    proc = cli("data", "verify", "cifar10", "--data-dir", str(cifar_root))
    assert proc.returncode == 0 and "usable" in proc.stdout
