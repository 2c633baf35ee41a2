"""--train.profile_steps: what it writes, where its window falls, and that it changes no number (CPU)."""

import json

from conftest import tiny_config
from ddplab.engine.run import train
from ddplab.metrics.summary import format_summary
from ddplab.metrics.profiler import SKIP_STEPS, WARMUP_STEPS

CLOCKS = ("_s", "_per_s", "_mib")


def numbers(history):
    return [{k: v for k, v in r.items() if not k.endswith(CLOCKS)} for r in history]


def test_a_profiled_run_writes_a_trace_and_an_op_table_and_trains_the_same(tmp_path):
    plain = train(tiny_config(tmp_path / "plain", train={"epochs": 2}))  # 256 images / 32: 8 steps an epoch
    profiled = train(tiny_config(tmp_path / "profiled", train={"epochs": 2, "profile_steps": 3}))
    assert numbers(profiled.history) == numbers(plain.history)  # observed, not changed
    assert plain.summary["profile"] is None and not (tmp_path / "plain" / "profile").exists()

    profile = profiled.summary["profile"]
    assert profile["steps"] == 3 and profile["first_step"] == SKIP_STEPS + WARMUP_STEPS + 1 == 7
    folder = tmp_path / "profiled" / "profile"
    trace = json.loads((folder / profile["trace"]).read_text())
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#6", "ProfilerStep#7", "ProfilerStep#8"]  # torch counts steps from 0: ours 7-9
    assert "aten::convolution_backward" in (folder / profile["ops"]).read_text()
    top = profile["top_ops"]
    shares = [op["share"] for op in top]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1
    assert any(op["op"] == "aten::convolution_backward" for op in top)  # a conv net's step is its convolutions
    assert all(op["ms_per_step"] > 0 and op["calls_per_step"] > 0 for op in top)
    line = next(x for x in format_summary(profiled.summary).splitlines() if x.lstrip().startswith("profile"))
    assert f"3 steps from step 7, host self time: {top[0]['op']} " in line and "profile/trace_rank0.json" in line


def test_a_run_too_short_for_the_window_says_so_and_writes_nothing(tmp_path):
    result = train(tiny_config(tmp_path / "r", train={"epochs": 1, "profile_steps": 3}, data={"synthetic_size": 128}))
    assert result.summary["profile"] == {
        "steps": 0, "written": False, "reason": "the run took 4 optimizer steps; the window opens after step 6"}
    assert not (tmp_path / "r" / "profile").exists()
    assert "profile       none written: the run took 4 optimizer steps" in format_summary(result.summary)
