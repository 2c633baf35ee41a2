"""The captured training step (--train.cuda_graphs): its logic on a CPU, its capture on CUDA.

On a CPU `Trainer.capture_step(capture=False)` sets up everything a capture does (static
input buffers, the learning rate as a device tensor, persistent gradients, warm-up steps
undone) and runs the step eagerly on those buffers, so the tests compare that path with
the plain loop. The CUDA tests capture for real and skip here.
"""

import pytest
import torch

from ddplab.config import build_config
from ddplab.distributed import DistContext, resolve_device, unwrap
from ddplab.engine.worker import build_trainer
from ddplab.errors import ConfigError
from ddplab.machine import check_environment
from ddplab.rundir.epochs import reproducible

from support.settings import tiny_config

NO_RANDOMNESS = {"crop_padding": 0, "flip": False}


def trainer_for(cfg):
    """A single-process trainer on the config's device, as `ddplab train` would place it."""
    return build_trainer(cfg, DistContext(device=resolve_device(cfg.train.device)), None)[0]


def learning_curve(history):
    return [reproducible(r, per_rank=False) for r in history]


def flat_params(trainer):
    return torch.cat([p.detach().flatten() for p in unwrap(trainer.model).parameters()])


# 256 images in micro-batches of 24, accumulate 3: 3 full steps and a ragged one (2 micro-batches, the last of 16).
RAGGED = dict(train={"epochs": 2, "batch_size": 24, "accumulate": 3})


# The speedrun preset's Muon: filter norms held fixed, its own momentum, a linear schedule.
SPEEDRUN_MUON = {
    "name": "muon",
    "muon_normalize": True,
    "muon_momentum": 0.6,
    "muon_ns_steps": 3,
    "schedule": "linear",
    "weight_decay": 1e-3,
}


# The later records' Muon: filters rescaled every few steps (a count on the device, which a replay advances and the
# ragged eager step reads; every 2: the capture's 3 warm-up steps, were they not undone, would shift its phase),
# momentum in bfloat16.
RECORD_MUON = {**SPEEDRUN_MUON, "muon_normalize_every": 2, "muon_momentum_precision": "bf16"}


@pytest.mark.parametrize("optimizer", ["sgd", "adamw", "rmsprop", "muon", "speedrun_muon", "record_muon"])
@pytest.mark.parametrize("shape", ["even", "ragged"])
def test_static_step_trains_like_the_plain_loop_cpu(optimizer, shape):
    sections = dict(RAGGED) if shape == "ragged" else dict(train={"epochs": 2, "batch_size": 32})
    lr = {"sgd": 0.05, "adamw": 3e-3, "rmsprop": 3e-4, "muon": 0.05, "speedrun_muon": 0.05, "record_muon": 0.05}[
        optimizer
    ]
    optim = {"speedrun_muon": SPEEDRUN_MUON, "record_muon": RECORD_MUON}.get(optimizer, {"name": optimizer})
    sections.update(optim={**optim, "lr": lr, "grad_clip": 1.0}, model={"batchnorm": True})
    plain = trainer_for(tiny_config(**sections))
    plain.fit()
    graphed = trainer_for(tiny_config(**sections))
    graphed.capture_step(capture=False)
    graphed.fit()
    full_steps = 3 if shape == "ragged" else 8
    assert graphed.graphed.replays == 2 * full_steps and graphed.state.step == plain.state.step
    # The learning rate reaches the update as a float32 tensor instead of a Python float: equal to float tolerance.
    torch.testing.assert_close(flat_params(graphed), flat_params(plain), rtol=1e-4, atol=1e-5)
    for g, p in zip(learning_curve(graphed.state.history), learning_curve(plain.state.history), strict=True):
        assert g.keys() == p.keys()
        for key in g:
            assert g[key] == pytest.approx(p[key], rel=1e-4, abs=1e-6), key


def test_learning_rate_tensor_follows_the_schedule_every_step_cpu():
    trainer = trainer_for(tiny_config(train={"epochs": 1}, optim={"schedule": "onecycle"}))
    trainer.capture_step(capture=False)
    seen = []
    step_fn = trainer.graphed.step_fn

    def recording(micro_batches, meter):
        seen.append((trainer.optimizer.param_groups[0]["lr"].item(), trainer.last_lr))
        return step_fn(micro_batches, meter)

    trainer.graphed.step_fn = recording
    trainer.fit()
    assert len(seen) == 8 and len({lr for lr, _ in seen}) == 8  # onecycle changes the rate every step
    # The rate a step reads on the device is the one the host's schedule gave it (float32 rounding apart).
    lrs = [lr for lr, _ in seen]
    expected = [lr for _, lr in seen][1:] + [trainer.last_lr]  # last_lr is set after the step that used it
    assert lrs == pytest.approx(expected, rel=1e-6)
    assert isinstance(trainer.optimizer.param_groups[0]["lr"], float)  # the tensor is in the group only inside the step


def test_capture_preparation_changes_nothing_the_run_depends_on_cpu():
    trainer = trainer_for(
        tiny_config(train={"epochs": 1}, optim={"name": "adamw", "lr": 3e-3}, model={"batchnorm": True})
    )
    module = unwrap(trainer.model)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    rng = torch.get_rng_state()
    info = trainer.capture_step(capture=False)
    assert info.startswith("static step prepared (not captured) after 3 warm-up steps")
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())  # weights and BatchNorm statistics
    assert all(p.grad is not None and not p.grad.any() for p in module.parameters())  # kept, zeroed
    state = trainer.optimizer.state
    assert state and all(not v.any() for s in state.values() for v in s.values())  # as lazily built: zeros, step 0
    assert trainer.state.step == 0


def test_gradients_keep_their_storage_across_steps_cpu():
    trainer = trainer_for(tiny_config(train={"epochs": 1}, **{k: v for k, v in RAGGED.items() if k != "train"}))
    trainer.capture_step(capture=False)
    pointers = [p.grad.data_ptr() for p in unwrap(trainer.model).parameters()]
    trainer.fit()
    assert [p.grad.data_ptr() for p in unwrap(trainer.model).parameters()] == pointers


def test_a_loader_with_no_full_step_captures_nothing_cpu():
    trainer = trainer_for(tiny_config(train={"epochs": 1, "batch_size": 300}))  # 256 images: one ragged batch
    assert trainer.capture_step(capture=False).startswith("not captured")
    assert trainer.graphed is None


@pytest.mark.parametrize(
    "setting, value, match",
    [
        (("train", "precision"), "fp16", "train.precision='fp16'.*gradient scaler"),
        (("dist", "strategy"), "dp", "dist.strategy='dp'.*DataParallel"),
        (("dist", "backend"), "gloo", "dist.backend='gloo'.*NCCL"),
        (("model", "compile_mode"), "reduce-overhead", "model.compile_mode='reduce-overhead'"),
    ],
)
def test_cuda_graphs_refuse_what_a_graph_cannot_hold(setting, value, match):
    section, key = setting
    values = {"train": {"cuda_graphs": True, "device": "cuda"}}
    values.setdefault(section, {})[key] = value
    if key == "compile_mode":
        values["model"]["compile"] = True
    if key == "backend":
        values["dist"] = {"strategy": "ddp", "backend": value}
    with pytest.raises(ConfigError, match=match):
        build_config(values)


@pytest.mark.parametrize(
    "sections, device, decided",
    [
        ({}, "cuda", (True, "auto: on")),
        ({}, "cpu", (False, "auto: off (no CUDA device)")),
        (
            {"train": {"precision": "fp16"}},
            "cuda",
            (
                False,
                "auto: off (train.precision='fp16': fp16's gradient scaler decides on the host whether to skip "
                "each step)",
            ),
        ),  # fmt: skip
        (
            {"dist": {"strategy": "dp"}},
            "cuda",
            (False, "auto: off (dist.strategy='dp': DataParallel scatters batches from the host every step)"),
        ),  # fmt: skip
        (
            {"train": {"profile_steps": 3}},
            "cuda",
            (
                False,
                "auto: off (train.profile_steps=3: torch.profiler's "
                "CUPTI teardown can hang or crash while CUDA graphs it did "
                "not capture replay (pytorch#135003))",
            ),
        ),  # fmt: skip
    ],
)
def test_auto_captures_where_the_step_can_be_and_says_why_not_elsewhere(sections, device, decided):
    """train.cuda_graphs=auto is never refused: what true refuses turns it off, and the setup line says which."""
    values = {**sections, "train": {**sections.get("train", {}), "cuda_graphs": "auto"}}
    assert build_config(values).cuda_graphs_on(device) == decided
    # true and false are what they say (true's refusals are errors before anything runs: the test above)
    assert build_config({"train": {"cuda_graphs": True}}).cuda_graphs_on(device) == (True, "on")
    assert build_config({"train": {"cuda_graphs": False}}).cuda_graphs_on(device) == (False, "off")


def test_auto_on_a_cpu_trains_the_plain_run_and_the_run_says_so(tiny_run, caplog):
    """On a CPU auto is off: the run is the plain one, number for number, and its summary says why."""
    check_environment(build_config({"train": {"cuda_graphs": "auto", "device": "cpu"}}))  # never refused
    auto, plain = tiny_run(train={"epochs": 1, "cuda_graphs": "auto", "device": "cpu"}), tiny_run(train={"epochs": 1})
    assert auto.summary["engine"]["cuda_graphs"] is False
    assert auto.summary["engine"]["cuda_graphs_said"] == "auto: off (no CUDA device)"
    assert plain.summary["engine"]["cuda_graphs_said"] == "off"
    assert [reproducible(r, per_rank=False) for r in auto.history] == [
        reproducible(r, per_rank=False) for r in plain.history
    ]
    log = (auto.run_dir / "train.log").read_text()
    assert "steps/epoch, the step in a CUDA graph: auto: off (no CUDA device)" in log
    assert "CUDA graph" not in (plain.run_dir / "train.log").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_graphs_without_cuda_is_refused_before_anything_runs():
    with pytest.raises(ConfigError, match="train.cuda_graphs=true.*no"):
        check_environment(build_config({"train": {"cuda_graphs": True}}))


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_captured_step_trains_like_eager_on_cuda(optimizer):
    lr = {"sgd": 0.05, "adamw": 3e-3}[optimizer]
    sections = dict(
        train={**RAGGED["train"], "device": "cuda", "deterministic": True},
        optim={"name": optimizer, "lr": lr, "grad_clip": 1.0},
        model={"batchnorm": True, "dropout": 0.0},
    )
    eager = trainer_for(tiny_config(**sections))
    eager.fit()
    sections["train"]["cuda_graphs"] = True
    graphed = trainer_for(tiny_config(**sections))
    assert "captured" in graphed.warm_up()["cuda_graph"]
    assert graphed.graphed.graph is not None
    graphed.fit()
    assert graphed.graphed.replays == 6
    torch.testing.assert_close(flat_params(graphed), flat_params(eager), rtol=1e-3, atol=1e-4)
    for g, e in zip(graphed.state.history, eager.state.history, strict=True):
        assert g.train_loss == pytest.approx(e.train_loss, rel=1e-3)
        assert g.test_acc == pytest.approx(e.test_acc, abs=0.02)


@needs_cuda
@pytest.mark.parametrize("setting", [True, "auto"])
def test_cuda_graphs_run_records_the_capture_in_its_summary(tmp_path, setting):
    import ddplab

    result = ddplab.train(tiny_config(tmp_path / "run", train={"epochs": 1, "device": "cuda", "cuda_graphs": setting}))
    assert result.summary["engine"]["cuda_graphs"] is True
    assert result.summary["engine"]["cuda_graphs_said"] == ("on" if setting is True else "auto: on")
    assert "captured" in result.summary["time"]["warmup"]["cuda_graph"]
