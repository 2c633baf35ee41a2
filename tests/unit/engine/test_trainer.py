"""The loop itself: accumulation math, every CPU precision and optimizer, NaN stop, early stop."""

import dataclasses
import math

import pytest
import torch

from ddplab.distributed import DistContext, unwrap
from ddplab.engine.tta import evaluate
from ddplab.engine.worker import build_trainer
from ddplab.errors import TrainingError
from ddplab.rundir import checkpoint
from ddplab.rundir.epochs import reproducible

from support.settings import REPO, tiny_config

NO_RANDOMNESS = {"crop_padding": 0, "flip": False}  # augmentation draws depend on the batch size


def trainer_for(cfg, run_dir=None):
    return build_trainer(cfg, DistContext(), run_dir)[0]


def params_after(cfg):
    trainer = trainer_for(cfg)
    trainer.fit()
    return torch.cat([p.detach().flatten() for p in unwrap(trainer.model).parameters()]), trainer.state


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_accumulated_micro_batches_equal_one_big_batch(optimizer):
    # contiguous: oneDNN's channels_last weight gradient sums a batch in an order that depends on its size, which
    # AdamW's first steps amplify past this tolerance (1.5e-6 on 1 of 57k weights, 1 thread); the arithmetic of
    # accumulation is what is tested here, not the layout
    common = dict(
        data=NO_RANDOMNESS, model={"dropout": 0.0, "channels_last": False}, optim={"name": optimizer, "lr": 0.01}
    )
    big, big_state = params_after(tiny_config(train={"epochs": 1, "batch_size": 32}, **common))
    small, small_state = params_after(tiny_config(train={"epochs": 1, "batch_size": 8, "accumulate": 4}, **common))
    assert big_state.step == small_state.step == 8
    torch.testing.assert_close(small, big, rtol=1e-5, atol=1e-6)
    assert small_state.history[0].train_loss == pytest.approx(big_state.history[0].train_loss, rel=1e-5)
    # ... and the comparison is sharp: a different lr moves the weights measurably.
    other, _ = params_after(
        tiny_config(train={"epochs": 1, "batch_size": 32}, **{**common, "optim": {"name": optimizer, "lr": 0.011}})
    )
    assert (other - big).abs().max() > 1e-4


def test_uneven_last_step_is_weighted_by_its_samples():
    # 256 images, micro-batch 24, accumulate 3: 10 full micro-batches + one of 16 -> 4 steps,
    # the last of 2 micro-batches.
    cfg = tiny_config(
        train={"epochs": 1, "batch_size": 24, "accumulate": 3}, data=NO_RANDOMNESS, model={"dropout": 0.0}
    )
    trainer = trainer_for(cfg)
    assert len(trainer.train_loader) == 11 and trainer.steps_per_epoch() == 4
    trainer.fit()
    assert trainer.state.step == 4 and trainer.state.history[0].train_samples == 256


HALF = "half precision on a CPU without native bf16 or fp16 is emulated: seconds a case (under one with it)"


@pytest.mark.parametrize(
    "precision",
    [
        "fp32",
        pytest.param("bf16", marks=pytest.mark.slow(why=HALF)),
        pytest.param("fp16", marks=pytest.mark.slow(why=HALF)),
    ],
)
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw", "rmsprop"])
def test_every_optimizer_and_precision_learns(optimizer, precision):
    lr = {"sgd": 0.2, "adam": 3e-3, "adamw": 3e-3, "rmsprop": 3e-4}[optimizer]
    cfg = tiny_config(train={"epochs": 3, "precision": precision}, optim={"name": optimizer, "lr": lr})
    trainer = trainer_for(cfg)
    state = trainer.fit()
    assert all(math.isfinite(r.train_loss) and math.isfinite(r.test_loss) for r in state.history)
    assert state.history[-1].test_acc >= 0.6  # 4 classes: chance is 0.25
    if precision == "fp16":
        assert trainer.precision.scaler is not None and trainer.precision.state_dict()["scale"] > 0


def test_autocast_really_lowers_precision():
    trainer = trainer_for(tiny_config(train={"precision": "bf16"}))
    x, _ = next(iter(trainer.eval_loader))
    with trainer.precision.autocast():
        assert trainer.model(x).dtype == torch.bfloat16


def test_gradient_clipping_bounds_the_norm(monkeypatch):
    cfg = tiny_config(train={"epochs": 1}, optim={"grad_clip": 0.01, "lr": 0.05})
    trainer = trainer_for(cfg)
    norms = []
    real_step = trainer.precision.step

    def spy(optimizer):
        norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in trainer.model.parameters()])).item())
        real_step(optimizer)

    monkeypatch.setattr(trainer.precision, "step", spy)
    trainer.fit()
    assert len(norms) == 8 and max(norms) <= 0.01 + 1e-6


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    trainer = trainer_for(tiny_config(train={"epochs": 3}), run_dir=tmp_path)
    trainer.config = dataclasses.replace(trainer.config, epochs=1)
    trainer.fit()
    good = checkpoint.load(tmp_path / "checkpoints" / checkpoint.LAST)
    trainer.config = dataclasses.replace(trainer.config, epochs=3)
    with torch.no_grad():
        next(unwrap(trainer.model).parameters()).fill_(float("nan"))
    with pytest.raises(TrainingError, match="epoch 2.*last good checkpoint: epoch 1"):
        trainer.fit()
    kept = checkpoint.load(tmp_path / "checkpoints" / checkpoint.LAST)
    assert kept["train_state"]["epoch"] == 1
    for key, value in good["model"].items():
        assert torch.equal(kept["model"][key], value)


def test_early_stopping_ends_the_run():
    # No epoch can beat the first by 1.0 in accuracy, so patience 2 stops after epoch 3.
    cfg = tiny_config(train={"epochs": 6, "early_stop_metric": "test_acc", "patience": 2, "min_delta": 1.0})
    state = trainer_for(cfg).fit()
    assert state.epoch == 3 and state.stopped_early and len(state.history) == 3


def test_channels_last_gives_the_same_run():
    a, _ = params_after(tiny_config(train={"epochs": 1}, model={"channels_last": False}))
    b, _ = params_after(tiny_config(train={"epochs": 1}, model={"channels_last": True}))
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_channels_last_auto_is_on_for_a_cpu_run_and_off_on_cuda():
    """model.channels_last=auto (the default): oneDNN's convolutions are faster channels_last, so a CPU run's
    model and batches are; on CUDA it stays off unless asked for, and true/false are taken as given."""
    cfg = tiny_config()
    assert cfg.model.channels_last == "auto"
    assert (cfg.channels_last_on("cpu"), cfg.channels_last_on("cuda")) == (True, False)
    for setting in (True, False):
        fixed = tiny_config(model={"channels_last": setting})
        assert fixed.channels_last_on("cpu") == fixed.channels_last_on("cuda") == setting
    trainer, info = build_trainer(cfg, DistContext(), None)
    conv = next(p for p in unwrap(trainer.model).parameters() if p.dim() == 4)
    x, _ = next(iter(trainer.train_loader))
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert x.is_contiguous(memory_format=torch.channels_last) and info.engine["channels_last"] is True
    # Off a CPU (the meta device stands in for CUDA: "auto" is a truthy string, which the rule must not read
    # as true) the model and every loader stay NCHW.
    from ddplab.distributed import wrap_model
    from ddplab.engine.worker import build_datasets, build_loaders, build_model

    train, test, _ = build_datasets(cfg, DistContext())
    elsewhere = DistContext(device=torch.device("meta"))
    conv = next(p for p in wrap_model(build_model(cfg, train), cfg, elsewhere).parameters() if p.dim() == 4)
    assert conv.device.type == "meta" and conv.is_contiguous()
    assert not any(loader.channels_last for loader in build_loaders(cfg, elsewhere, train, test) if loader)


def test_a_saved_config_is_compared_by_the_format_its_run_chose():
    """A folder trained before model.channels_last defaulted to "auto" says false: on CUDA that is the run "auto"
    makes (NCHW), on a CPU another one (its runs are channels_last now), which a refusal then explains."""
    from ddplab.rundir.runfolder import changed_defaults, config_differences

    for device, differs in (("cpu", True), ("cuda", False), ("cuda:1", False), ("auto", True)):
        old = tiny_config(train={"device": device}, model={"channels_last": False})
        new = tiny_config(train={"device": device})
        assert ("model.channels_last" in config_differences(old, new)) is differs, device
    assert tiny_config(train={"device": "cpu"}).channels_last_as_run() is True
    assert "model.channels_last=false" in changed_defaults({"model.channels_last", "optim.lr"})
    assert changed_defaults({"optim.lr"}) == ""


def test_eval_counts_every_sample_once():
    trainer = trainer_for(tiny_config(train={"eval_batch_size": 7}))
    result = trainer.evaluate()
    assert result["count"] == 64 and 0 <= result["correct"] <= 64
    assert result["acc"] == result["correct"] / 64


def test_fused_conv_relu_option_trains_the_same_model():
    plain, _ = params_after(tiny_config(train={"epochs": 1}))
    fused_trainer = trainer_for(tiny_config(train={"epochs": 1}, model={"fuse_conv_relu": True}))
    from ddplab.kernels import FusedConvReLU

    assert sum(isinstance(m, FusedConvReLU) for m in fused_trainer.model.modules()) == 3
    fused_trainer.fit()
    fused = torch.cat([p.detach().flatten() for p in unwrap(fused_trainer.model).parameters()])
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)


def test_fused_conv_relu_on_a_model_without_pairs_is_a_config_error():
    from ddplab.errors import ConfigError

    with pytest.raises(ConfigError, match="fastnet has no Conv2d->ReLU pair"):
        trainer_for(tiny_config(model={"name": "fastnet", "fuse_conv_relu": True}))


@pytest.mark.slow(why="torch.compile compiles the model (about 30 s)")
def test_torch_compile_path_trains_like_eager(tmp_path):
    # No dropout: compiled graphs draw their own dropout masks (Inductor's RNG), eager ones torch's.
    eager_trainer = trainer_for(tiny_config(train={"epochs": 1}, model={"dropout": 0.0}))
    eager = eager_trainer.fit().history[-1]
    compiled_trainer = trainer_for(
        tiny_config(train={"epochs": 1}, model={"compile": True, "dropout": 0.0}), run_dir=tmp_path
    )
    assert compiled_trainer.should_warm_up()
    assert compiled_trainer.warm_up() == {"batch_sizes": {"train": [32], "eval": [64]}}
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    compiled = compiled_trainer.fit().history[-1]
    assert counters["stats"]["unique_graphs"] == graphs  # everything was compiled before the clocks started
    assert type(compiled_trainer.model).__name__ == "OptimizedModule"
    assert compiled.train_loss == pytest.approx(eager.train_loss, rel=1e-4)
    assert compiled.test_loss == pytest.approx(eager.test_loss, rel=1e-4)
    saved = checkpoint.load(tmp_path / "checkpoints" / checkpoint.LAST)["model"]
    assert saved.keys() == unwrap(eager_trainer.model).state_dict().keys()  # no _orig_mod. prefixes


def test_fused_conv_relu_follows_autocast():
    trainer = trainer_for(tiny_config(train={"epochs": 1, "precision": "bf16"}, model={"fuse_conv_relu": True}))
    x, _ = next(iter(trainer.eval_loader))
    with trainer.precision.autocast():
        assert trainer.model(x).dtype == torch.bfloat16
    state = trainer.fit()
    assert math.isfinite(state.history[-1].train_loss)


def test_warm_up_changes_nothing_the_run_depends_on():
    """Warm-up runs every batch shape through the model; the run that follows is the same run, bit for bit."""
    cfg = dict(train={"epochs": 2}, data={"subset": 200}, model={"batchnorm": True, "dropout": 0.3})
    plain = trainer_for(tiny_config(**cfg)).fit().history
    trainer = trainer_for(tiny_config(**cfg))
    module = unwrap(trainer.model)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    rng = torch.get_rng_state()
    assert trainer.warm_up_shapes() == {"train": [32, 200 % 32], "eval": [64]}  # the ragged last batch too
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())  # weights and BatchNorm statistics
    assert all(p.grad is None for p in module.parameters()) and trainer.state.step == 0

    def strip(history):
        return [reproducible(r, per_rank=False) for r in history]

    assert strip(trainer.fit().history) == strip(plain)


def test_each_warm_up_shape_starts_from_no_gradient(monkeypatch):
    """Under reduce-overhead the gradients are outputs of the backward's CUDA graph: the ragged shape's backward
    accumulating into the full shape's read a buffer its replay had overwritten (H200, torch 2.11)."""
    trainer = trainer_for(tiny_config(data={"subset": 200}))
    module = unwrap(trainer.model)
    seen = []
    real = trainer.forward_backward

    def forward_backward(batches, meter=None):
        seen.append(all(p.grad is None for p in module.parameters()))
        return real(batches, meter)

    monkeypatch.setattr(trainer, "forward_backward", forward_backward)
    trainer.warm_up_shapes()
    assert seen == [True, True]


def test_only_compiling_runs_warm_up_and_the_summary_says_so(tmp_path, monkeypatch, tiny_run):
    import ddplab
    from ddplab.engine.trainer import Trainer

    assert not trainer_for(tiny_config()).should_warm_up()
    assert not trainer_for(tiny_config(model={"fuse_conv_relu": True})).should_warm_up()  # no autotuning on a CPU
    result = tiny_run(train={"epochs": 1})
    assert result.summary["time"]["warmup"] is None
    monkeypatch.setattr(Trainer, "should_warm_up_shapes", lambda self: True)  # as a compiled run would
    warmed = ddplab.train(tiny_config(tmp_path / "warm", train={"epochs": 1}))
    warmup = warmed.summary["time"]["warmup"]
    assert warmup["batch_sizes"] == {"train": [32], "eval": [64]} and warmup["counted_in"] == "startup_s"
    assert 0 < warmup["s"] < warmed.summary["time"]["startup_s"]


def test_cpu_runs_stay_bit_exact_by_default_and_cuda_runs_fast():
    import torch as t

    from ddplab.engine.worker import resolve_deterministic

    cpu, cuda = t.device("cpu"), t.device("cuda", 0)
    assert resolve_deterministic(tiny_config(), cpu) is True
    assert resolve_deterministic(tiny_config(), cuda) is False  # cuDNN autotuner: never slower than a plain loop
    assert resolve_deterministic(tiny_config(train={"deterministic": True}), cuda) is True
    assert resolve_deterministic(tiny_config(train={"deterministic": False}), cpu) is False


def test_the_summary_says_how_the_numbers_were_taken(tiny_run):
    result = tiny_run(train={"epochs": 1})
    assert result.summary["engine"] == {
        "deterministic": True,
        "cudnn_benchmark": False,
        "time_breakdown": "every step",
        "progress_syncs_per_epoch": 8,
        "fused_optimizer": False,
        "cuda_graphs": False,
        "cuda_graphs_said": "off",
        "channels_last": True,
        "cpu_threads": torch.get_num_threads(),
    }


def test_phase_timer_times_one_step_in_n_and_extrapolates(monkeypatch):
    from ddplab.engine import trainer as trainer_module

    ticks = iter(range(1000))
    monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: float(next(ticks)))
    timer = trainer_module.PhaseTimer(torch.device("cpu"), enabled=True, every=3)
    for i in range(7):  # steps 0, 3 and 6 are timed: 1 s of data and 2 s of compute each (fake clock)
        timer.begin_step(i)
        timer.lap("data_s")
        next(ticks)
        timer.lap("forward_backward_s")
    assert timer.timed_steps == 3
    assert timer.totals(7) == {"data_s": 7.0, "forward_backward_s": 14.0}
    off = trainer_module.PhaseTimer(torch.device("cpu"), enabled=False)
    off.begin_step(0)
    off.lap("data_s")
    assert off.totals(7) == {}


def test_train_threads_sets_the_cpu_threads_and_the_summary_says_so(tmp_path):
    import ddplab

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = ddplab.train(tiny_config(tmp_path / "r", train={"epochs": 1, "threads": 1}))
        assert result.summary["engine"]["cpu_threads"] == 1
        assert torch.get_num_threads() == 2  # the caller's setting is back when train() returns
    finally:
        torch.set_num_threads(before)


def test_a_run_gives_the_caller_its_logger_back(tmp_path):
    """ddplab's logger kept the run's train.log after train() returned: what a notebook logged next, and every
    later test's warnings, went into the last run's folder."""
    import io
    import logging

    import ddplab

    logger = logging.getLogger("ddplab")
    mine = logging.StreamHandler(io.StringIO())
    logger.addHandler(mine)
    try:
        result = ddplab.train(tiny_config(tmp_path / "r", train={"epochs": 1}))
        kept = (result.run_dir / "train.log").read_text()
        assert "epoch 1/1" in kept and "epoch 1/1" not in mine.stream.getvalue()  # the run had its own handlers
        logger.warning("after the run")
        assert (result.run_dir / "train.log").read_text() == kept
        assert logger.handlers == [mine] and mine.stream.getvalue() == "after the run\n"
    finally:
        logger.removeHandler(mine)


def test_train_gives_the_caller_its_torch_settings_back(tmp_path):
    import ddplab

    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    try:
        result = ddplab.train(tiny_config(tmp_path / "r", train={"epochs": 1}))  # deterministic on CPU
        assert result.summary["engine"]["deterministic"] is True
        assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
    finally:
        torch.backends.cudnn.benchmark = False


def test_training_images_are_measured_as_the_test_set_is():
    """train_eval_* is the eval-mode loss and accuracy on the first N training images, unaugmented:
    what evaluate() gives on them after the epoch; the running train_acc (dropout, augmentation) is not it."""
    cfg = tiny_config(train={"epochs": 2, "eval_train_images": 100}, model={"dropout": 0.5})
    trainer = trainer_for(cfg)
    record = trainer.fit().history[-1]
    loader = trainer.train_eval_loader
    assert len(loader.labels) == 100 and torch.equal(loader.labels, trainer.train_loader.labels[:100])
    again = evaluate(trainer.model, loader, trainer.precision, trainer.ctx)
    assert (record.train_eval_loss, record.train_eval_acc) == (again["loss"], again["acc"])
    assert record.train_eval_acc != record.train_acc
    off = trainer_for(tiny_config(train={"epochs": 1, "eval_train_images": 0})).fit().history[0]
    assert off.train_eval_acc is None and "train_eval_acc" not in off.to_json()
    # More than the training set holds: all of it.
    assert len(trainer_for(tiny_config(train={"eval_train_images": 10**6})).train_eval_loader.labels) == 256


def test_the_trainer_reads_its_own_config_not_the_runs():
    """engine/worker.trainer_config hands the loop what it reads; trainer.py never names the run's whole config."""

    from ddplab.engine.worker import trainer_config

    config = tiny_config(
        train={"epochs": 4, "seed": 9, "accumulate": 2, "tta": "flip"},
        optim={"grad_clip": 0.5, "label_smoothing": 0.1, "lookahead_steps": 5},
        output={"save_best": False},
    )
    own = trainer_config(config, "cpu")
    assert (own.epochs, own.seed, own.accumulate, own.tta) == (4, 9, 2, "flip")
    assert (own.grad_clip, own.label_smoothing, own.lookahead_steps, own.save_best) == (0.5, 0.1, 5, False)
    assert own.recorded == config.with_data_root().to_dict()  # what each checkpoint says it was trained with
    assert trainer_for(config).config == own
    for name in ("trainer.py", "state.py"):
        source = (REPO / "src/ddplab/engine" / name).read_text()
        assert "RunConfig" not in source and "config.train" not in source, name


def steps_rows(run_dir):
    """steps.jsonl without its clock: what a resume must reproduce."""
    import json

    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "t_s"} for row in rows]


@pytest.mark.parametrize(
    "model, optim",
    [({"dropout": 0.3}, {}), ({"batchnorm": True}, {"lookahead_steps": 5})],
    ids=["dropout", "batchnorm-lookahead"],
)
def test_a_run_stopped_inside_an_epoch_resumes_from_its_checkpoint_there_bit_for_bit(
    tmp_path, monkeypatch, model, optim
):
    """A checkpoint every 4 steps (8 an epoch): stopped before epoch 2's 7th step, the run resumes after its 4th
    step (global step 12), with the data position, augmentation streams, dropout RNG, partial sums, progress rows
    and Lookahead's slow weights it had, and ends as the run never stopped (which checkpoints at epochs only)."""
    import ddplab
    from ddplab import faults

    sections = dict(train={"epochs": 3}, data={"crop_padding": 2, "flip": True}, model=model, optim=optim)
    plain = ddplab.train(tiny_config(tmp_path / "plain", **sections))
    inside = {**sections, "train": {"epochs": 3, "checkpoint_every": "4"}}
    monkeypatch.setattr(faults, "_FAULT", ("raise", {"epoch": 2, "step": 7}))
    with pytest.raises(TrainingError, match="injected fault"):
        ddplab.train(tiny_config(tmp_path / "cut", **inside))
    saved = checkpoint.load(tmp_path / "cut" / "checkpoints" / checkpoint.LAST)
    at = saved["mid_epoch"]
    assert (saved["train_state"]["step"], at["epoch"], at["steps_done"], at["position"]) == (12, 2, 4, 128)
    monkeypatch.setattr(faults, "_FAULT", None)
    resumed = ddplab.train(tiny_config(tmp_path / "cut", **{**inside, "output": {"resume": True}}))
    assert [reproducible(r, per_rank=False) for r in resumed.history] == [
        reproducible(r, per_rank=False) for r in plain.history
    ]
    assert steps_rows(tmp_path / "cut") == steps_rows(tmp_path / "plain")
    end = checkpoint.load(tmp_path / "cut" / "checkpoints" / checkpoint.LAST)
    assert "mid_epoch" not in end  # the epoch's end writes a plain one
    for key, value in checkpoint.load(tmp_path / "plain" / "checkpoints" / checkpoint.LAST)["model"].items():
        assert torch.equal(end["model"][key], value), key


def test_checkpoints_by_time_are_decided_at_progress_refreshes(monkeypatch):
    """checkpoint_every=1s: every progress refresh after a second since the last checkpoint writes one (the clock
    moved on by hand: no sleeping); the one-process run agrees with itself over DistContext.any_true."""
    from ddplab.engine import trainer as loop

    clock = iter(range(0, 10_000, 1))
    monkeypatch.setattr(loop.time, "perf_counter", lambda: float(next(clock)))
    trainer = trainer_for(tiny_config(train={"epochs": 1, "checkpoint_every": "1s"}))
    written = []
    monkeypatch.setattr(trainer, "save_mid_epoch", lambda epoch, done, meter, steps: written.append(done))
    trainer.fit()
    assert written == list(range(1, 8))  # 8 steps, each a refresh; never after the last (the epoch's end writes)
