"""--train.profile_steps: what it writes, where its window falls, and that it changes no number (CPU)."""

import json
from types import SimpleNamespace

import pytest
import torch

from ddplab import train
from ddplab.metrics.profiler import KERNELS_OUTSIDE_OPS, OUTSIDE_OPS, SKIP_STEPS, WARMUP_STEPS, step_figures
from ddplab.rundir.epochs import reproducible
from ddplab.rundir.summary import format_summary

from support.settings import tiny_config

DATA = {"synthetic_size": 512}  # 16 steps an epoch at batch 32


def numbers(history):
    return [reproducible(r) for r in history]


def profiler_steps(trace_file):
    trace = json.loads(trace_file.read_text())
    return sorted(
        int(e["name"].split("#")[1]) for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
    )


def test_a_profiled_run_writes_a_trace_and_an_op_table_and_trains_the_same(tmp_path):
    plain = train(tiny_config(tmp_path / "plain", data=DATA))
    profiled = train(tiny_config(tmp_path / "profiled", data=DATA, train={"profile_steps": 3}))
    assert numbers(profiled.history) == numbers(plain.history)  # observed, not changed
    assert plain.summary["profile"] is None and not (tmp_path / "plain" / "profile").exists()

    profile = profiled.summary["profile"]
    assert (profile["steps"], profile["first_step"], profile["last_step"]) == (3, SKIP_STEPS + WARMUP_STEPS + 1, 9)
    folder = tmp_path / "profiled" / "profile"
    assert sorted(p.name for p in folder.iterdir()) == ["ops_rank0_steps7-9.txt", "trace_rank0_steps7-9.json"]
    assert profiler_steps(folder / profile["trace"]) == [6, 7, 8]  # torch counts the session's steps from 0
    assert "aten::convolution_backward" in (folder / profile["ops"]).read_text()
    top = profile["top_ops"]
    shares = [op["share"] for op in top]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1
    assert any(op["op"] == "aten::convolution_backward" for op in top)  # a conv net's step is its convolutions
    assert all(op["ms_per_step"] > 0 and op["calls_per_step"] > 0 for op in top)
    assert sum(op["ms_per_step"] for op in top) <= profile["step_ms"]
    line = next(x for x in format_summary(profiled.summary).splitlines() if x.lstrip().startswith("profile"))
    assert f"steps 7-9, {profile['step_ms']:.1f} ms a step; host self time: {top[0]['op']} " in line


def test_the_window_stays_inside_one_epoch_and_counts_the_runs_steps_after_a_resume(tmp_path):
    first = train(tiny_config(tmp_path / "r", data=DATA, train={"epochs": 1}))
    assert first.summary["profile"] is None
    # Resuming with another profile_steps is allowed: it changes no number of the run.
    resumed = train(
        tiny_config(tmp_path / "r", data=DATA, train={"epochs": 2, "profile_steps": 50}, output={"resume": True})
    )
    profile = resumed.summary["profile"]
    # 16 steps an epoch, 6 to warm up: 10 fit, and none of the evaluation that follows the epoch.
    assert (profile["steps"], profile["requested"], profile["first_step"], profile["last_step"]) == (10, 50, 23, 32)
    trace = tmp_path / "r" / "profile" / "trace_rank0_steps23-32.json"
    assert profiler_steps(trace) == list(range(6, 16))
    calls = {
        line.split()[0]: int(line.split()[-1])
        for line in (tmp_path / "r" / "profile" / profile["ops"]).read_text().splitlines()
        if line.strip().startswith("aten::")
    }
    assert calls["aten::mkldnn_convolution"] == calls["aten::convolution_backward"] == 3 * 10  # no evaluation forward


def test_a_run_whose_epochs_are_too_short_for_the_window_says_so_and_writes_nothing(tmp_path):
    result = train(tiny_config(tmp_path / "r", train={"epochs": 1, "profile_steps": 3}, data={"synthetic_size": 128}))
    assert result.summary["profile"] == {
        "steps": 0,
        "written": False,
        "reason": "an epoch has 4 optimizer steps; the window needs 7 inside one",
    }
    assert not (tmp_path / "r" / "profile").exists()
    assert "profile       none written: an epoch has 4 optimizer steps" in format_summary(result.summary)


def test_a_failure_to_profile_is_a_warning_not_a_lost_run(tmp_path, monkeypatch):
    def broken(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", broken)
    result = train(tiny_config(tmp_path / "r", data=DATA, train={"profile_steps": 3}))
    assert result.summary["status"] == "finished" and (tmp_path / "r" / "summary.json").is_file()
    trace = tmp_path / "r" / "profile" / "trace_rank0_steps7-9.json"  # the file, never its temporary name
    assert result.summary["profile"]["reason"] == (
        f"profiling failed: FileSystemError: cannot write {trace}: No space left on device; free some space"
    )
    assert "WARNING profiling failed" in (tmp_path / "r" / "train.log").read_text()
    assert not list((tmp_path / "r").rglob("trace_*"))  # no half-written trace, under its name or a temporary one


def row(key, device="CPU", self_cpu=0, self_device=0, count=1, cpu_total=0, annotation=False):
    return SimpleNamespace(
        key=key,
        device_type=SimpleNamespace(name=device),
        self_cpu_time_total=self_cpu,
        self_device_time_total=self_device,
        count=count,
        cpu_time_total=cpu_total,
        is_user_annotation=annotation,
    )


def test_cpu_figures_share_the_hosts_self_time_and_name_what_no_op_covers():
    rows = [
        row("ProfilerStep*", self_cpu=1000, cpu_total=10_000, count=2),
        row("aten::conv", self_cpu=6000, count=4),
        row("aten::relu", self_cpu=3000, count=4),
    ]
    figures = step_figures(rows, cuda=False, steps=2)
    assert figures["step_ms"] == 5.0 and "device_busy_share" not in figures
    assert [(o["op"], o["ms_per_step"], o["share"], o["calls_per_step"]) for o in figures["top_ops"]] == [
        ("aten::conv", 3.0, 0.6, 2.0),
        ("aten::relu", 1.5, 0.3, 2.0),
        (OUTSIDE_OPS, 0.5, 0.1, 1.0),
    ]


def test_cuda_figures_count_each_kernel_once():
    """Kernel rows hold the device time; each op is charged the kernels it launched; annotations span, never count."""
    rows = [
        row("ProfilerStep*", cpu_total=20_000, count=2, self_device=1500, annotation=True),  # a span, not work
        row("ProfilerStep#3", device="CUDA", self_device=9000, annotation=True),  # the GPU-side span
        row("aten::conv", self_cpu=800, self_device=4000, count=2),
        row("aten::mm", self_cpu=300, self_device=2000),
        row("void conv_kernel", device="CUDA", self_device=4000, count=2),
        row("void gemm_kernel", device="CUDA", self_device=2000),
        row("void graph_kernel", device="CUDA", self_device=1000),
    ]  # replayed by a graph: no op launched it
    figures = step_figures(rows, cuda=True, steps=2)
    assert figures["step_ms"] == 10.0 and figures["device_busy_share"] == pytest.approx(7000 / 20_000)
    assert [(o["op"], o["ms_per_step"], o["share"]) for o in figures["top_ops"]] == [
        ("aten::conv", 2.0, pytest.approx(4 / 7, abs=1e-4)),
        ("aten::mm", 1.0, pytest.approx(2 / 7, abs=1e-4)),
        (KERNELS_OUTSIDE_OPS, 0.5, pytest.approx(1 / 7, abs=1e-4)),
    ]
