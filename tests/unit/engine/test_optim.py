"""Optimizers and schedules: the right class with the right settings, and lr curves by step."""

import math

import pytest
import torch

from ddplab.config import OptimConfig
from ddplab.engine.optim import build_optimizer, build_scheduler
from ddplab.metrics.early_stop import EarlyStopping


def lrs(cfg: OptimConfig, epochs=4, steps_per_epoch=10):
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg)
    sched = build_scheduler(opt, cfg, epochs=epochs, steps_per_epoch=steps_per_epoch)
    out = []
    for _ in range(epochs * steps_per_epoch):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize(
    "name, cls",
    [
        ("sgd", torch.optim.SGD),
        ("adam", torch.optim.Adam),
        ("adamw", torch.optim.AdamW),
        ("rmsprop", torch.optim.RMSprop),
    ],
)
def test_build_optimizer_settings(name, cls):
    cfg = OptimConfig(name=name, lr=0.3, weight_decay=0.01, momentum=0.5, betas=[0.8, 0.95], nesterov=name == "sgd")
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg)
    group = opt.param_groups[0]
    assert type(opt) is cls and group["weight_decay"] == 0.01
    if name == "sgd":
        assert group["momentum"] == 0.5 and group["nesterov"] is True
    if name in ("adam", "adamw"):
        assert group["betas"] == (0.8, 0.95)
    if name == "rmsprop":
        assert group["momentum"] == 0.5 and group["alpha"] == 0.99


def test_onecycle_rises_to_peak_then_falls():
    curve = lrs(OptimConfig(schedule="onecycle", lr=1.0, warmup_epochs=1.0))
    peak = max(range(len(curve)), key=curve.__getitem__)
    assert curve[peak] == pytest.approx(1.0) and peak == 9  # the last step of the 1-epoch rise
    assert curve[0] == pytest.approx(0.1)  # div_factor 10
    assert all(a < b for a, b in zip(curve[:peak], curve[1 : peak + 1], strict=False))
    assert all(a > b for a, b in zip(curve[peak:-1], curve[peak + 1 :], strict=False))
    assert curve[-1] < 0.02


def test_cosine_with_warmup():
    curve = lrs(OptimConfig(schedule="cosine", lr=1.0, warmup_epochs=1.0, min_lr_ratio=0.1))
    assert curve[0] == pytest.approx(0.1) and curve[9] == pytest.approx(1.0)
    assert curve[10] == pytest.approx(1.0)
    mid = 10 + 15  # half-way through the cosine part
    assert curve[mid] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert curve[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 29 / 30)))


def test_step_decay_every_n_epochs():
    curve = lrs(OptimConfig(schedule="step", lr=1.0, step_epochs=2, gamma=0.5))
    assert curve[:20] == [1.0] * 20 and curve[20:] == pytest.approx([0.5] * 20)


def test_constant_schedule():
    assert lrs(OptimConfig(schedule="none", lr=0.2)) == [0.2] * 40


def test_early_stopping_min_and_max_modes():
    stop = EarlyStopping("test_loss", patience=2, min_delta=0.1)
    decisions = [stop.update(e, v) for e, v in enumerate([1.0, 0.95, 0.85, 0.9, 0.8], 1)]
    # 0.95 is not 0.1 better than 1.0 -> bad 1; 0.85 is -> reset; 0.9 bad 1; 0.8 bad 2 (needs < 0.75) -> stop
    assert decisions == [False, False, False, False, True] and stop.best_epoch == 3
    acc = EarlyStopping("test_acc", patience=1)
    assert [acc.update(e, v) for e, v in enumerate([0.5, 0.6, 0.6], 1)] == [False, False, True]
    assert EarlyStopping(None, patience=1).update(1, 0.5) is False


def test_early_stopping_state_round_trip():
    a = EarlyStopping("test_acc", patience=3)
    a.update(1, 0.4)
    a.update(2, 0.3)
    b = EarlyStopping("test_acc", patience=3)
    b.load_state_dict(a.state_dict())
    assert b == a


@pytest.mark.parametrize("schedule", ["onecycle", "cosine", "linear", "step", "none"])
@pytest.mark.parametrize("epochs, steps_per_epoch", [(1, 1), (2, 1), (1, 2), (3, 1), (1, 3)])
def test_schedules_survive_tiny_runs(schedule, epochs, steps_per_epoch):
    curve = lrs(OptimConfig(schedule=schedule, lr=1.0), epochs=epochs, steps_per_epoch=steps_per_epoch)
    assert len(curve) == epochs * steps_per_epoch and all(0 < lr <= 1.0 for lr in curve)


def test_linear_schedule_warms_up_then_falls_straight_to_the_floor():
    straight = lrs(OptimConfig(schedule="linear", lr=1.0, warmup_epochs=0.0))  # 40 steps
    assert straight == pytest.approx([1 - k / 40 for k in range(40)])
    warm = lrs(OptimConfig(schedule="linear", lr=1.0, warmup_epochs=1.0, min_lr_ratio=0.1))
    assert warm[:10] == pytest.approx([(k + 1) / 10 for k in range(10)])
    assert warm[10:] == pytest.approx([0.1 + 0.9 * (1 - k / 30) for k in range(30)])


def test_fused_kernels_on_cuda_only_where_the_optimizer_has_one():
    import inspect

    from ddplab.engine.optim import fused_kwargs

    cuda = torch.device("cuda", 0)
    assert fused_kwargs(torch.optim.Adam, torch.device("cpu")) == {}
    assert fused_kwargs(torch.optim.Adam, cuda) == {"fused": True} and fused_kwargs(torch.optim.AdamW, cuda) == {
        "fused": True
    }

    class NoFused(torch.optim.Optimizer):  # an optimizer without a fused kernel (RMSprop on older torch)
        def __init__(self, params, lr=0.1, weight_decay=0.0):
            super().__init__(params, {"lr": lr})

    assert fused_kwargs(NoFused, cuda) == {}
    expected = {"fused": True} if "fused" in inspect.signature(torch.optim.SGD).parameters else {}
    assert fused_kwargs(torch.optim.SGD, cuda) == expected


def test_a_checkpoint_from_a_fused_gpu_run_resumes_unfused_here(tmp_path):
    """The saved param groups say fused=True; the optimizer built on this CPU must stay unfused."""
    from ddplab.distributed import DistContext
    from ddplab.engine.worker import build_trainer

    from support.settings import tiny_config

    trainer = build_trainer(tiny_config(optim={"name": "adam", "lr": 1e-3}), DistContext(), None)[0]
    trainer.fit()
    state = trainer.state_dict()
    for group in state["optimizer"]["param_groups"]:
        group["fused"] = True  # as a CUDA run saved it
    resumed = build_trainer(tiny_config(optim={"name": "adam", "lr": 1e-3}, train={"epochs": 3}), DistContext(), None)[
        0
    ]
    resumed.load_state_dict(state)
    assert all(not g["fused"] for g in resumed.optimizer.param_groups)
    resumed.fit()  # an Adam step with fused=True on CPU tensors would raise
    assert resumed.state.epoch == 3
