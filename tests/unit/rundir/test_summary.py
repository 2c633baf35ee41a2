"""The end-of-run summary, from per-epoch records alone."""

from types import SimpleNamespace

import pytest

from ddplab.config import RunConfig
from ddplab.rundir.summary import RunInfo, build_summary, format_summary

from support.runs import epoch_record


def record(epoch, train_acc, test_acc, test_loss, gpus=None):
    return epoch_record(
        epoch,
        train_loss=1.0 / epoch,
        train_acc=train_acc,
        test_loss=test_loss,
        test_acc=test_acc,
        epoch_s=10.0,
        train_s=8.0,
        eval_s=2.0,
        images_per_s=100.0 * epoch,
        peak_alloc_mib=100.0 * epoch,
        rank_train_s=[8.0, 9.0],
        rank_peak_alloc_mib=[50.0 * epoch, 60.0],
        gpu_peak_alloc_mib=gpus,
        rank_ddp_comm_s=[0.001 * epoch, 0.002],
        rank_ddp_overlap_s=[float("nan"), 0.001],
    )


def two_ranks_on(device: str) -> RunInfo:
    """What a 2-rank run's build found: 100 training and 50 test images of 3 classes, 10 steps an epoch."""
    return RunInfo(
        world_size=2,
        device=device,
        steps_per_epoch=10,
        params=1,
        flops_per_image=2,
        train_images=100,
        eval_images=50,
        eval_split="test",
        num_classes=3,
    )


def test_overfitting_signals_and_data_parallel_memory():
    history = [
        record(1, 0.5, 0.55, 1.0, [300.0, 100.0]),
        record(2, 0.8, 0.60, 0.9, [320.0, 90.0]),
        record(3, 0.95, 0.58, 1.2, [310.0, 110.0]),
    ]
    state = SimpleNamespace(history=history, epoch=3, step=30, best_test_acc=0.60, best_epoch=2, stopped_early=False)
    s = build_summary(RunConfig(), two_ranks_on("cuda:0"), state, startup_s=1.5, total_s=40.0)
    over = s["overfitting"]
    assert over["train_test_acc_gap"] == pytest.approx(0.37) and over["min_test_loss_epoch"] == 2
    assert over["test_loss_rise"] == pytest.approx(0.3) and over["best_minus_final_acc"] == pytest.approx(0.02)
    assert s["memory"] == {"peak_alloc_mib": 300.0} and s["gpu_peak_alloc_mib"] == [320.0, 110.0]
    assert s["ranks"]["train_s"] == {"per_rank": [24.0, 27.0], "max": 27.0, "mean": 25.5}
    assert s["ranks"]["peak_alloc_mib"]["per_rank"] == [150.0, 60.0]  # peaks, not sums
    assert s["ranks"]["ddp_comm_ms"]["per_rank"] == [3.0, 2.0]  # DDP's mean a step: the last epoch's
    assert "ddp_overlap_ms" not in s["ranks"] and "ddp_overlap_s" not in s["ranks"]  # a rank timed nothing (NaN)
    assert s["time"]["mean_epoch_s_after_first"] == 10.0 and s["time"]["images_per_s"] == 200.0
    text = format_summary(s)
    assert "overfitting" in text and "+37.00%" in text and "per rank" in text


def test_comm_wait_is_shown_inside_forward_backward_never_beside_it():
    """The probe's wait for the all-reduce is part of forward+backward: listed beside it, the parts of
    training time added up to more than all of it (117.7% in a torchrun run)."""
    from ddplab.rundir.summary import phases_text

    text = phases_text({"data_s": 0.5, "forward_backward_s": 8.0, "optimizer_s": 1.0, "comm_wait_s": 3.25})
    assert text == "data 0.5 s, forward+backward 8.0 s (of which comm wait 3.2 s), optimizer 1.0 s"
    assert phases_text({"data_s": 0.5, "forward_backward_s": 8.0, "optimizer_s": 1.0, "comm_wait_s": 0.0}) == (
        "data 0.5 s, forward+backward 8.0 s, optimizer 1.0 s"
    )  # one process: nothing to wait for


def test_a_resumed_run_whose_early_epochs_lack_a_per_rank_figure_still_sums_up():
    """Epochs written before a figure existed (a checkpoint of an older ddplab, resumed) lack its per-rank
    list: the summary sums the epochs that hold it instead of failing at the end of the run."""
    old = record(1, 0.5, 0.55, 1.0)
    old.per_rank.pop("ddp_comm_s")
    old.per_rank.pop("train_s")
    history = [old, record(2, 0.8, 0.60, 0.9)]
    state = SimpleNamespace(history=history, epoch=2, step=20, best_test_acc=0.60, best_epoch=2, stopped_early=False)
    s = build_summary(RunConfig(), two_ranks_on("cpu"), state, startup_s=1.5, total_s=40.0)
    assert s["ranks"]["train_s"]["per_rank"] == [8.0, 9.0] and s["ranks"]["ddp_comm_ms"]["per_rank"] == [2.0, 2.0]


def test_every_field_the_summary_is_written_with_is_declared_with_its_kind():
    """summary.json is declared once (rundir.summary.Summary, each field's type and kind): what build_summary writes
    has no field the declaration lacks, part by part, and passes its checks; the required fields are the _Written
    parts'."""
    from ddplab.rundir.summary import SUMMARY

    history = [record(1, 0.5, 0.55, 1.0, [300.0, 100.0]), record(2, 0.8, 0.60, 0.9, [320.0, 90.0])]
    state = SimpleNamespace(history=history, epoch=2, step=20, best_test_acc=0.60, best_epoch=2, stopped_early=False)
    summary = build_summary(
        RunConfig(),
        two_ranks_on("cpu"),
        state,
        startup_s=1.5,
        total_s=40.0,
        warmup={"s": 0.5},
        profile={"steps": 2},
        tracking={"mlflow": {"uri": "sqlite:///x.db", "run_id": "r", "logged": True, "error": None}},
    )

    def undeclared(written, schema, prefix=""):
        for key, value in written.items():
            assert key in schema, f"{prefix}{key} is written but not declared"
            if isinstance(schema[key], dict) and isinstance(value, dict):
                undeclared(value, schema[key], f"{prefix}{key}.")

    undeclared(summary, SUMMARY.schema)
    SUMMARY.check(summary, "summary.json")
    assert SUMMARY.required[:3] == ("status", "run.dataset", "run.model") and "time.total_s" in SUMMARY.required
    assert "overfitting" not in SUMMARY.required and "time.eval_s" not in SUMMARY.required


def test_each_ranks_step_clocks_are_medians_across_epochs_not_totals():
    from ddplab.rundir.summary import per_rank_summary

    history = [record(e, 0.5, 0.5, 1.0, [1.0, 1.0]) for e in (1, 2, 3)]
    for r, (step, share) in zip(history, [(0.010, 0.9), (0.012, 0.8), (0.011, 1.0)], strict=True):
        r.per_rank.update(
            {"step_median_s": [step, step], "step_max_s": [3 * step, 2 * step], "last_share": [1 - share, share]}
        )
    history[0].per_rank["joined_median_s"] = [None, None]  # one rank: nothing to join
    ranks = per_rank_summary(history)
    assert ranks["step_median_s"]["per_rank"] == [0.011, 0.011] and ranks["step_max_s"]["per_rank"] == [0.036, 0.024]
    assert ranks["last_share"]["per_rank"] == [pytest.approx(0.1), pytest.approx(0.9)]
    assert "joined_median_s" not in ranks  # not measured on every rank: left out, never summed as zeros


@pytest.mark.parametrize(
    ("policy", "scale", "said"),
    [
        ("refuse", 1.0, None),
        ("keep_global_batch", 1.0, "on other workers: keep_global_batch (the global batch kept"),
        ("keep_local_batch", 0.5, "the learning rate with it: x0.5 of the configured, linear in the global batch"),
    ],
)
def test_a_resizable_runs_batch_policy_and_rate_are_in_its_summary(policy, scale, said):
    """dist.on_resize is recorded in summary.json beside the batch, with the factor on the configured learning rate
    the run trained with, and said in the printed summary; a run that may not resize says nothing of it."""
    from dataclasses import replace

    history = [record(1, 0.5, 0.55, 1.0)]
    state = SimpleNamespace(history=history, epoch=1, step=10, best_test_acc=0.55, best_epoch=1, stopped_early=False)
    config = RunConfig()
    config.dist.on_resize = policy
    s = build_summary(config, replace(two_ranks_on("cpu"), lr_scale=scale), state, startup_s=1.0, total_s=10.0)
    if said is None:
        assert (
            "on_resize" not in s["batch"] and "lr_scale" not in s["batch"] and "other workers" not in format_summary(s)
        )
        return
    assert s["batch"]["on_resize"] == policy and s["batch"]["lr_scale"] == scale
    assert said in format_summary(s)
