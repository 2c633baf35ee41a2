"""A run is prepared once (runplan.py): a resume reads its folder's config.toml and last.pt once each."""

import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch

import ddplab
from ddplab import config as config_module
from ddplab.cli import main
from ddplab.rundir.runfolder import Resume
from ddplab.rundir.runplan import RunPlan, prepared

from support.settings import tiny_config


@pytest.fixture
def reads(monkeypatch):
    """How many times each run-folder file was read: config.toml through the TOML reader, checkpoints
    through torch.load (the only ways ddplab reads them)."""
    counts = Counter()
    toml_load, torch_load = config_module.tomllib.load, torch.load

    def counting_toml(f, *args, **kwargs):
        counts[Path(f.name).name] += 1
        return toml_load(f, *args, **kwargs)

    def counting_torch(f, *args, **kwargs):
        counts[Path(f).name] += 1
        return torch_load(f, *args, **kwargs)

    monkeypatch.setattr(config_module.tomllib, "load", counting_toml)
    monkeypatch.setattr(torch, "load", counting_torch)
    return counts


def test_a_resume_reads_config_and_last_checkpoint_once_each(tmp_path, reads):
    """Single process, through the CLI as a user types it: `--resume` takes the run's own config.toml."""
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--dataset",
                "synthetic",
                "--data.synthetic_size",
                "64",
                "--data.image_size",
                "8",
                "--model",
                "simple_cnn",
                "--model.width",
                "0.25",
                "--epochs",
                "1",
                "--device",
                "cpu",
                "--output.progress",
                "false",
                "--output.tensorboard",
                "false",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    reads.clear()
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2"]) == 0
    assert reads == Counter({"config.toml": 1, "last.pt": 1})
    assert len(ddplab.engine.worker.finished_result(out).history) == 2


def copied(tiny_run, tmp_path: Path) -> Path:
    """A one-epoch run of its own, copied from the shared one (tests here resume or edit it)."""
    return shutil.copytree(tiny_run(train={"epochs": 1}).run_dir, tmp_path / "r")


def test_the_python_api_prepares_once_and_a_finished_resume_reads_nothing_twice(tmp_path, reads, tiny_run):
    copied(tiny_run, tmp_path)
    reads.clear()
    result = ddplab.train(tiny_config(tmp_path / "r", train={"epochs": 2}, output={"resume": True}))
    assert reads == Counter({"config.toml": 1, "last.pt": 1})
    assert [r.epoch for r in result.history] == [1, 2]
    reads.clear()
    again = ddplab.train(tiny_config(tmp_path / "r", train={"epochs": 2}, output={"resume": True}))
    assert reads == Counter({"config.toml": 1, "last.pt": 1})  # nothing to do: checked, then the summary read back
    assert again.summary == result.summary


def test_a_plan_holds_its_folder_and_hands_its_workers_facts_not_the_checkpoint(tmp_path, tiny_run):
    copied(tiny_run, tmp_path)
    with prepared(tiny_config(tmp_path / "r", train={"epochs": 3}, output={"resume": True})) as plan:
        assert isinstance(plan, RunPlan) and plan.holds_lock and plan.place is None
        assert plan.run_dir == (tmp_path / "r") and (tmp_path / "r" / ".lock").exists()
        assert (plan.resume.epoch, plan.resume.planned_epochs, plan.resume.stopped_early) == (1, 1, False)
        assert plan.nothing_to_do() is None and not plan.launches_workers()
        assert plan.resume.checkpoint is not None and plan.for_workers().resume.checkpoint is None
        assert plan.for_workers().resume == plan.resume  # the same facts
    assert not (tmp_path / "r" / ".lock").exists()


def test_a_resume_removes_the_temporary_files_a_killed_writer_left_and_no_live_ones(tmp_path, tiny_run):
    """A checkpoint write killed between its temporary file and its rename left the file for good."""
    import os
    import subprocess

    copied(tiny_run, tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process id that was a writer's and is no process now
    checkpoints = tmp_path / "r" / "checkpoints"
    dead = [checkpoints / f"last.pt.{gone.pid}.tmp", tmp_path / "r" / f"metrics.jsonl.{gone.pid}.tmp"]
    live = checkpoints / f"last.pt.{os.getpid()}.tmp"  # a live process's write in progress: not ours to remove
    for path in (*dead, live):
        path.write_bytes(b"half")
    with prepared(tiny_config(tmp_path / "r", train={"epochs": 2}, output={"resume": True})):
        assert not any(path.exists() for path in dead) and live.exists()
    assert (checkpoints / "last.pt").stat().st_size > 4


def test_what_a_resume_has_left_to_do():
    r = Resume(epoch=3, stopped_early=False, planned_epochs=3)
    assert (
        r.nothing_left(Path("run"), 3) == "run has already trained 3 of 3 epochs; pass a larger --epochs to extend it"
    )
    assert r.nothing_left(Path("run"), 4) is None
    stopped = Resume(epoch=2, stopped_early=True, planned_epochs=5)
    assert "stopped early at epoch 2" in stopped.nothing_left(Path("run"), 9)


def test_the_checkpoint_read_for_the_checks_is_handed_over_once(tmp_path, reads, tiny_run):
    copied(tiny_run, tmp_path)
    reads.clear()
    with prepared(tiny_config(tmp_path / "r", train={"epochs": 2}, output={"resume": True})) as plan:
        path = plan.run_dir / "checkpoints" / "last.pt"
        first = plan.resume.take_checkpoint(path)
        assert reads["last.pt"] == 1 and first["train_state"]["epoch"] == 1
        second = plan.resume.take_checkpoint(path)  # a second taker reads the file itself
        assert reads["last.pt"] == 2 and second is not first


def test_a_multi_node_run_needs_a_meeting_point_only_when_ddplab_launches_it(tmp_path, monkeypatch):
    """Under srun (or torchrun) the launcher says where the group meets: a Slurm sweep's multi-node point
    needs no dist.rdzv_endpoint in its config; ddplab's own launcher does."""
    from ddplab.errors import ConfigError

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    config = tiny_config(tmp_path / "r", dist={"strategy": "ddp", "nnodes": 2})  # valid as a config
    with pytest.raises(ConfigError, match="a multi-node run started by ddplab's launcher needs host:port"):
        with prepared(config):
            pass
    assert not (tmp_path / "r").exists()


def test_a_largest_message_between_the_sizes_timed_is_said(capsys):
    """--max-mib 300 times up to 256 MiB (the sizes go up by 4x): said, not dropped in silence."""
    import argparse

    from ddplab.cli import refuse_unmeasurable

    refuse_unmeasurable(argparse.Namespace(max_mib=300, nproc=[2], backend="gloo", nnodes=1, rdzv_endpoint=None))
    assert capsys.readouterr().err == (
        "ddplab: note: --max-mib 300: messages are timed from 4 KiB up by 4x, so the largest is 256 MiB\n"
    )
    refuse_unmeasurable(argparse.Namespace(max_mib=256, nproc=[2], backend="gloo", nnodes=1, rdzv_endpoint=None))
    assert capsys.readouterr().err == ""


@pytest.fixture(scope="module")
def one_epoch_run(tiny_run):
    return tiny_run(train={"epochs": 1}).run_dir


@pytest.mark.parametrize(
    "edit, said",
    [
        (lambda s: s.update(epoch="3"), r"train_state\.epoch is '3', not a whole number >= 0"),
        (lambda s: s.pop("step"), r"lacks train_state\.step, which ddplab always writes"),
        (lambda s: s.update(stopped_early="no"), r"train_state\.stopped_early is 'no', not true or false"),
        (lambda s: s.update(history=[1, 2]), r"train_state\.history is \[1, 2\], not a list, each item a JSON object"),
    ],
)
def test_a_checkpoint_whose_counters_are_missing_or_of_another_kind_is_one_line_naming_it(
    one_epoch_run, tmp_path, edit, said
):
    """A hand-edited or foreign last.pt was a KeyError or TypeError traceback (exit 1): now exit 3 naming the
    file and the field, before anything is built."""
    import shutil

    from ddplab.errors import DataError

    run = shutil.copytree(one_epoch_run, tmp_path / "r")
    path = run / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    edit(state["train_state"])
    torch.save(state, path)
    with pytest.raises(DataError, match=rf"^checkpoint {path}:? .*{said}") as refused:
        with prepared(tiny_config(run, train={"epochs": 2}, output={"resume": True})):
            pass
    assert refused.value.exit_code == 3


def test_a_run_folder_moved_while_it_trains_stops_the_run_and_resumes_where_it_went(tmp_path, monkeypatch):
    """The folder moved (mv) during epoch 2: the run used to make the old path again, half (checkpoints and
    records, no config.toml), and the moved copy resumed into a second finished run. Now the run stops before
    writing (exit 5, naming both ways on), nothing appears at the old path, and the moved folder resumes to the
    end as the one run it is."""
    from ddplab.engine.trainer import Trainer
    from ddplab.errors import FileSystemError

    run_epoch = Trainer.run_epoch

    def moved_during_epoch_2(self, epoch):
        result = run_epoch(self, epoch)
        if epoch == 2:
            (tmp_path / "r").rename(tmp_path / "moved")
        return result

    monkeypatch.setattr(Trainer, "run_epoch", moved_during_epoch_2)
    with pytest.raises(FileSystemError, match=r"the run folder .*/r was moved or removed while the run trained"):
        ddplab.train(tiny_config(tmp_path / "r", train={"epochs": 3}))
    assert not (tmp_path / "r").exists()
    monkeypatch.setattr(Trainer, "run_epoch", run_epoch)
    done = ddplab.train(tiny_config(tmp_path / "moved", train={"epochs": 3}, output={"resume": True}))
    assert [r.epoch for r in done.history] == [1, 2, 3]


@pytest.mark.parametrize("given", ["config.toml", {"train": {"epochs": 2}}, None])
def test_train_from_python_says_what_to_pass_for_anything_but_a_run_config(given):
    """A notebook's first guesses ended in AttributeError: 'str' object has no attribute 'dist'."""
    from ddplab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train\(\) takes a RunConfig, not .*: build one with .*build_config"):
        ddplab.train(given)
