"""benchmarks/*.py: each script runs end to end in --quick mode on the CPU and writes sane JSON.

The figures of a --quick run mean nothing (tiny synthetic data, a shared machine); what is
checked is the shape of the result, that both sides of a comparison did the same work (same
images, same batches), and that the reported ratios are the ones the raw numbers give. The tests
that also bound a measured figure (a phase share, the model's error, a shaped link's rate) are
`alone`: scripts/test.sh runs them when nothing else loads the machine; the rest run with the
other tests that start processes.
"""

import hashlib
import json
import math
import os
import statistics
import sys
from pathlib import Path

import pytest

from ddplab.launch import warm

from support import tiers

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


# `python SCRIPT ARGS` as `python -c RUN_SCRIPT SCRIPT ARGS`, which a warm server can fork (ddplab.launch.warm): the
# script runs as __main__ with its own folder first on sys.path, as the interpreter would run it.
RUN_SCRIPT = (
    "import os, runpy, sys; sys.argv = sys.argv[1:]; sys.path[0] = os.path.dirname(sys.argv[0]); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def run_bench(name, tmp_path, *args):
    out = tmp_path / f"{name}.json"
    # One thread per process: quick runs, and no waiting on a second core that other work holds. Started warm
    # (torch imported once for the file, not once a script): what a script measures is its own children.
    proc = warm.run(
        [sys.executable, "-c", RUN_SCRIPT, str(BENCH / f"{name}.py"), "--device", "cpu", "--quick", "--out", str(out),
         *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    payload = json.loads(out.read_text())
    assert payload["benchmark"] == name and payload["args"]["device"] == "cpu" and payload["args"]["quick"] is True
    machine = payload["machine"]
    assert machine["device"] == "cpu" and machine["torch"] and machine["cpu_cores"] >= 1 and machine["cpu_model"]
    assert payload["table"] in proc.stdout and payload["table"].count("\n|") >= 2
    return payload["results"], proc.stdout


def check_comparison(throughput, a, b, repeats):
    """compare()'s block: medians of per-repeat rates, ratio b/a of the medians, paired ratios."""
    for side in (a, b):
        values = throughput[side]["values"]
        assert len(values) == repeats and all(v > 0 and math.isfinite(v) for v in values)
        assert throughput[side]["median"] == pytest.approx(statistics.median(values))
    assert throughput["ratio"] > 0
    assert throughput["ratio"] == pytest.approx(throughput[b]["median"] / throughput[a]["median"])
    assert throughput["paired_ratios"] == pytest.approx(
        [y / x for x, y in zip(throughput[a]["values"], throughput[b]["values"], strict=True)]
    )


def test_loop_overhead_times_both_loops_interleaved(tmp_path):
    results, stdout = run_bench("loop_overhead", tmp_path)
    runs = results["runs"]
    assert [r["repeat"] for r in runs["plain"]] == [r["repeat"] for r in runs["ddplab"]] == [1, 2]
    for side in ("plain", "ddplab"):
        for run in runs[side]:
            assert len(run["epoch_s"]) == len(run["images"]) == 2 and all(t > 0 for t in run["epoch_s"])
            assert run["images"] == [256, 256]  # every image once per epoch, on both sides
            assert run["images_per_s"] == pytest.approx(256 / run["epoch_s"][1])  # the first epoch left out
    assert results["images"] == 256 and results["images_per_epoch"] == {"plain": [256], "ddplab": [256]}
    check_comparison(results["throughput"], "plain", "ddplab", 2)
    assert results["speed_ratio"] == results["throughput"]["ratio"]
    assert "deterministic" in results["engine"]
    assert "| plain PyTorch loop" in stdout and "| ddplab (" in stdout and "ddplab / plain throughput:" in stdout


def test_data_path_feeds_the_same_batches_both_ways(tmp_path):
    results, stdout = run_bench("data_path", tmp_path)
    assert results["images"] == 1024 and results["expected_batches"] == 8
    for side in ("dataloader", "ddplab"):
        assert len(results["runs"][side]) == 2
        for run in results["runs"][side]:
            assert (run["images"], run["batches"]) == (1024, 8) and run["seconds"] > 0
        first = results["first_batch"][side]  # normalized float batches of the same shape on both sides
        assert first["shape"] == [128, 3, 32, 32] and first["dtype"] == "torch.float32"
        assert abs(first["mean"]) < 0.5 and 0.5 < first["std"] < 1.5
        assert results["setup_s"][side] > 0
    check_comparison(results["throughput"], "dataloader", "ddplab", 2)
    assert "| per-sample DataLoader (2 workers)" in stdout and "ddplab / DataLoader:" in stdout


def test_time_to_accuracy_reads_the_first_epoch_at_the_target(tmp_path):
    results, stdout = run_bench("time_to_accuracy", tmp_path)
    assert results["target"] == 0.5 and results["reached_in"] == 1
    (run,) = results["runs"]
    epochs = run["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    k = run["epoch"]
    assert all(e["test_acc"] < 0.5 for e in epochs[: k - 1]) and epochs[k - 1]["test_acc"] == run["test_acc"] >= 0.5
    expected = run["startup_s"] + sum(e["epoch_s"] for e in epochs[:k])
    assert run["time_to_target_s"] == pytest.approx(expected) and results["time_to_target_s"][
        "median"
    ] == pytest.approx(expected)
    assert all(a["cumulative_s"] < b["cumulative_s"] for a, b in zip(epochs, epochs[1:], strict=False))
    # The process's own clock includes the interpreter's start and the between-epoch work.
    assert run["wall_to_target_s"] >= run["time_to_target_s"] and run["process_wall_s"] >= run["wall_to_target_s"]
    assert "| 50% | 1/1 |" in stdout


@pytest.mark.dist
@pytest.mark.alone(why="its check bounds a measured speed ratio")
def test_ddp_scaling_runs_both_sides_on_the_same_global_batch(tmp_path):
    results, stdout = run_bench("ddp_scaling", tmp_path)
    single, ddp = results["runs"]["single"][0], results["runs"]["ddp"][0]
    assert (
        (single["world_size"], ddp["world_size"]) == (1, 2) and results["nproc"] == 2 and results["backend"] == "gloo"
    )
    assert (single["batch_local"], ddp["batch_local"]) == (64, 32) and single["batch_global"] == ddp[
        "batch_global"
    ] == 64
    assert single["steps_per_epoch"] == ddp["steps_per_epoch"] == 8
    assert single["train_images_per_epoch"] == ddp["train_images_per_epoch"] == [512, 512]
    assert single["test_images_per_epoch"] == ddp["test_images_per_epoch"] == [128, 128]
    for run in (single, ddp):
        assert run["images_per_s"] > 0 and run["median_epoch_s"] > 0 and 0 <= run["test_acc"] <= 1
        # The phases make up the training time (comm wait is the part of fwd+bwd spent waiting).
        assert 0.5 < sum(v for k, v in run["phase_share"].items() if k != "comm_wait_s") < 1.05
    assert single["phase_share"]["comm_wait_s"] == 0.0
    check_comparison(results["throughput"], "single", "ddp", 1)
    assert results["speedup"] == results["throughput"]["ratio"]
    assert results["efficiency"] == pytest.approx(results["speedup"] / 2)
    assert "| single, 1 thread |" in stdout and "| ddp gloo, 2 x 1 thread |" in stdout


def test_speedrun_reports_mean_and_std_over_seeds_and_the_flops_floor(tmp_path):
    # fp32: the preset's bf16 is 6x slower on a CPU without bf16 units, and the plumbing is the same
    results, stdout = run_bench(
        "speedrun", tmp_path, "--seeds", "2", "--runs-dir", str(tmp_path / "runs"), "--", "--precision", "fp32"
    )
    runs = results["runs"]
    assert [r["seed"] for r in runs] == [0, 1]
    for r in runs:  # the records' clock: data init + training + the final evaluation, nothing else
        assert r["record_s"] == pytest.approx(r["data_init_s"] + r["train_s"] + r["final_eval_s"], abs=2e-3)
        assert r["data_init_s"] > 0 and 0 <= r["test_acc"] <= 1
    accs = [r["test_acc"] for r in runs]
    assert results["test_acc"] == pytest.approx({"mean": statistics.fmean(accs), "std": statistics.stdev(accs)})
    summary = json.loads((tmp_path / "runs" / "seed-0" / "summary.json").read_text())
    per_image = summary["model"]["flops_per_image"]
    # 3 forward-equivalents per training image seen (512 images x 2 epochs) + 6 TTA views of each test image (128).
    assert results["flops_per_run"] == per_image * (3 * 512 * 2 + 6 * 128)
    assert results["floor"]["seconds"] == pytest.approx(
        results["flops_per_run"] / (results["floor"]["bf16_tflops"] * 1e12)
    )
    assert "--preset" in results["train_args"] and "speedrun" in results["train_args"]


# A stand-in with airbench94_muon.py's interface, written here (ddplab carries none of airbench's code): it
# imports torchvision as airbench does, reads its data from ./cifar10, reads its own source as `code`, keeps its
# time in a variable its final print_training_details(locals(), ...) call is given, and returns its accuracy alone.
AIRBENCH_STAND_IN = """
import sys
with open(sys.argv[0]) as f:
    code = f.read()
import torch
import torchvision
import torchvision.transforms as T

CIFAR_MEAN, CIFAR_STD = torch.tensor((0.5, 0.5, 0.5)), torch.tensor((0.25, 0.25, 0.25))


class CifarNet(torch.nn.Module):  # on a CPU
    def cuda(self):
        return self

    def compile(self, mode=None):
        open("compiled", "w").write(mode)


def print_training_details(variables, is_final_entry):
    print("| its own table |", variables["run"])  # its prints must not reach the answers


def main(run, model):
    train, test = torch.load("cifar10/train.pt"), torch.load("cifar10/test.pt")
    normalized = T.Normalize(CIFAR_MEAN, CIFAR_STD)(train["images"][:2].permute(0, 3, 1, 2).float() / 255)
    time_seconds = 0.0

    def stop_timer():
        nonlocal time_seconds
        time_seconds += 9.0 if run == "warmup" else 1.5 + run

    stop_timer()
    with open("runs.txt", "a") as f:
        f.write(f"{run} {tuple(train['images'].shape)} {train['images'].dtype} {len(test['labels'])} "
                f"{normalized.shape[1]} {'import torch' in code}\\n")
    tta_val_acc = 0.5 if run == "warmup" else 0.25 + 0.01 * run
    print_training_details(locals(), is_final_entry=False)
    print_training_details(locals(), is_final_entry=True)
    return tta_val_acc
"""


def test_speedrun_against_airbench_interleaves_its_runs_on_the_same_data_and_compares(tmp_path):
    """--against airbench with a stand-in of airbench's interface (a CPU cannot run airbench, and ddplab carries
    none of its code): its data written from the preset's own (airbench's format: uint8 HWC, at ./cifar10), its
    torchvision answered, compiled and warmed up once, its runs interleaved with the preset's, its time read from
    its final row's locals, its prints kept out of the answers, the comparison the numbers give, and every figure
    labelled a stand-in's, never airbench94_muon's."""
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(AIRBENCH_STAND_IN)
    runs = tmp_path / "runs"
    results, stdout = run_bench(
        "speedrun", tmp_path, "--seeds", "2", "--runs-dir", str(runs), "--against", "airbench",
        "--airbench-file", str(stand_in), "--airbench-unverified", "--", "--precision", "fp32",
    )  # fmt: skip
    data = runs / "airbench-data"
    assert (data / "compiled").read_text() == "max-autotune"
    assert (data / "runs.txt").read_text().splitlines() == [
        f"{run} (512, 16, 16, 3) torch.uint8 128 3 True" for run in ("warmup", 0, 1)
    ]  # the preset's synthetic images, HWC; torchvision's Normalize answered; its own source as `code`
    digest = hashlib.sha256(stand_in.read_bytes()).hexdigest()
    label = f"stand-in stand_in.py (sha256 {digest[:12]}, not a known airbench94_muon.py)"
    order = [line.split(":")[0] for line in stdout.splitlines() if line.startswith(("seed ", f"{label}, run "))]
    assert order == ["seed 0", f"{label}, run 0", f"{label}, run 1", "seed 1"]  # A B, B A
    against, ours = results["against"], results["record_s"]["mean"]
    assert [r["acc"] for r in against["runs"]] == [0.25, 0.26] and [r["time_s"] for r in against["runs"]] == [1.5, 2.5]
    assert against["test_acc"] == pytest.approx({"mean": 0.255, "std": statistics.stdev([0.25, 0.26])})
    assert against["time_s"]["mean"] == 2.0 and against["time_ratio"] == pytest.approx(ours / 2.0)
    assert against["meets"] == {
        "accuracy": results["test_acc"]["mean"] >= 0.255,
        "time": against["time_ratio"] <= 0.75,
    }
    assert against["name"] == label and against["sha256"] == digest and against["commit"] is None
    assert against["run_time_changes"] and all(c in stdout for c in against["run_time_changes"])
    assert f"| {label} | 25.50% +- 0.71% | 2.000 +- 0.707 |" in stdout
    assert "airbench94_muon |" not in stdout and "airbench94_muon @" not in stdout  # no figure under its name
    assert "its own table" not in stdout and "its own table" in (runs / "airbench.log").read_text()


def test_speedrun_against_airbench_takes_only_a_file_it_knows_unless_told_and_airbenchs_own_only_on_cuda(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.syspath_prepend(str(BENCH))
    import _airbench as airbench
    import speedrun

    def refusal(*args):
        with pytest.raises(SystemExit) as usage:
            speedrun.parse_args(["--device", "cpu", "--against", "airbench", *args])
        assert usage.value.code == 2
        return " ".join(capsys.readouterr().err.split())

    assert "needs --airbench-file" in refusal()
    assert "no such file; fetch airbench94_muon.py from" in refusal("--airbench-file", str(tmp_path / "none.py"))
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(AIRBENCH_STAND_IN)
    said = refusal("--airbench-file", str(stand_in))
    assert "is no airbench94_muon.py this benchmark knows (known: 704e29251a52 at f1c599c)" in said
    assert "--airbench-unverified" in said
    told = speedrun.parse_args(["--device", "cpu", "--against", "airbench", "--airbench-file", str(stand_in),
                                "--airbench-unverified"])  # fmt: skip
    assert told.reference.commit is None and told.reference.label.startswith("stand-in stand_in.py (sha256 ")
    # A file of a known hash is airbench's own, run on CUDA and CIFAR-10 only (the stand-in's hash made known here).
    monkeypatch.setitem(airbench.KNOWN, hashlib.sha256(stand_in.read_bytes()).hexdigest(), "0" * 40)
    assert "airbench94_muon runs on CUDA only" in refusal("--airbench-file", str(stand_in))


@pytest.mark.alone(why="its check bounds the model's error against runs it times")
def test_plan_validation_sets_the_model_against_measured_runs(tmp_path):
    """--quick: the tiny net at batch 32, one process and 2 workers, the link measured with 2 ranks; each row's
    error is its predicted over its measured throughput, less one, as the table prints it, and within a factor of
    two either way (-50% to +100%).

    On the 2-core development VM the model is off by 11-26% on such runs (BENCHMARKS.md), but one run apiece is
    noisy when the machine is shared: on 2026-12-03 (fourth session) the 1-process run gave 3,430 to 6,900 img/s
    from one try to the next and the error ran from -32% to +72% over nine tries, two of them past the +50% this
    bound was before (one failing a fresh-clone CI run). Keeping each shape's fastest of two runs still left +45%
    and doubled the test's time. A factor of two still catches a model wrong in kind (a bandwidth in bits for
    bytes, a communication term a thousand times off, a count of cores squared)."""
    out = tmp_path / "plan.json"
    proc = warm.run(
        [sys.executable, "-c", RUN_SCRIPT, str(BENCH / "plan_validation.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads(out.read_text())
    (row,) = payload["rows"]
    assert (row["case"], row["batch"], row["workers"]) == ("tiny", 32, 2) and set(payload["links"]) == {"2"}
    assert row["measured"] > 0 and row["predicted"] > 0 and row["error"] == row["predicted"] / row["measured"] - 1
    assert 0.5 < row["predicted"] / row["measured"] < 2 or len(os.sched_getaffinity(0)) < 2, row  # 2 on 1 core: nothing
    assert (
        f"| tiny | 32 | {row['one']:,.0f} img/s | 2 | {row['predicted']:,.0f} | {row['measured']:,.0f} | "
        f"{row['error']:+.0%} |" in proc.stdout
    )


@pytest.mark.alone(why="measures a link's rate between hosts: another test beside it takes its cores")
def test_network_sets_one_host_against_two_at_a_link_rate(tmp_path):
    from ddplab.launch import hosts

    reason = hosts.why_not_available()
    if reason:
        tiers.skip("root", reason)
    results, stdout = run_bench("network", tmp_path)
    runs, side = results["runs"], "2 hosts at 200mbit"
    assert list(runs) == ["one host", "one host beside its twin", side]
    one, two, twins = runs["one host"][0], runs[side][0], runs["one host beside its twin"]
    assert (one["world_size"], one["batch_local"], two["world_size"], two["batch_local"]) == (1, 64, 2, 32)
    assert [(t["world_size"], t["batch_local"], t["repeat"]) for t in twins] == [(1, 64, 1), (1, 64, 1)]  # each host
    assert one["train_samples"] == two["train_samples"] == [512, 512]  # the same images, the same global batch
    assert one["ddp_exposed_ms"] is None and two["ddp_exposed_ms"] > 0
    assert results["speedup"][side] == pytest.approx(two["images_per_s"] / one["images_per_s"])
    link = results["links"][side]
    assert link["set_bit_s"] == 200e6 and 0.5 < link["busbw_gbps"] * 8e9 / 200e6 < 1.5
    # The planner's predictions for the 2 hosts, from each one-host side and the measured link, and their errors.
    guesses = results["predicted_images_per_s"]
    for way in ("from one host alone", "from one host beside its twin"):
        guess, error = guesses[way][side], results["error"][way][side]
        assert guess > 0 and error == pytest.approx(guess / two["images_per_s"] - 1)
        assert f"{common_rate(guess)} ({error:+.0%})" in stdout


def common_rate(value):
    """A rate as the benchmarks print it (benchmarks/_common.fmt_rate)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def test_ddp_step_sets_ddp_against_the_plain_step_at_each_batch(tmp_path):
    results, stdout = run_bench("ddp_step", tmp_path)
    rows = results["rows"]
    assert [(r["model"], r["batch"]) for r in rows] == [("simple_cnn", 16), ("simple_cnn", 32)]
    for r in rows:
        plain, ddp = r["step_s"]["plain"], r["step_s"]["ddp"]
        assert len(plain) == len(ddp) == 2 and min(plain + ddp) > 0 and r["tensors"] == 10
        assert r["ddp_adds_s"] == pytest.approx(statistics.median([d - p for p, d in zip(plain, ddp, strict=True)]))
    assert rows[1]["per_image_over_largest"] == 1.0
    assert rows[0]["per_image_over_largest"] == pytest.approx(
        rows[0]["median_s"]["plain"] / 16 / (rows[1]["median_s"]["plain"] / 32)
    )


def test_step_clocks_sets_ddp_with_the_clocks_against_ddp_alone(tmp_path):
    results, stdout = run_bench("step_clocks", tmp_path)
    (row,) = results["rows"]
    assert (row["model"], row["batch"]) == ("simple_cnn", 16) and results["steps"] == 3
    ddp, clocked = row["step_s"]["ddp"], row["step_s"]["clocked"]
    assert len(ddp) == len(clocked) == 2 and min(ddp + clocked) > 0
    assert row["clocks_add_s"] == pytest.approx(statistics.median([c - d for d, c in zip(ddp, clocked, strict=True)]))
    assert f"{row['clocks_add_s'] / row['median_s']['ddp']:+.2%}" in stdout


def test_checkpoint_kills_never_leave_a_torn_checkpoint(tmp_path):
    """40 writers killed at random moments of a write: each restart loads the last whole checkpoint (or the one
    whose rename the kill just missed), never a torn one, and the dead writer's temporary file is cleared."""
    results, _ = run_bench("checkpoint_kills", tmp_path)
    assert results["trials"] == 40 and results["torn"] == 0, results["torn_examples"]
    assert results["killed_before_the_rename"] + results["killed_after_the_rename"] == 40
    assert results["killed_before_the_rename"] >= 10  # the kills land inside writes, not between them
    assert results["temp_files_removed"] >= 10


def test_memory_format_sets_channels_last_against_nchw_on_the_same_model_and_images(tmp_path):
    results, stdout = run_bench("memory_format", tmp_path, "--precision", "bf16")
    (row,) = results["rows"]
    assert (row["model"], row["width"], row["batch"]) == ("simple_cnn", 0.25, 8) and results["steps"] == 2
    assert row["in_format"] == {"nchw": True, "channels_last": True} and "(Adam, bf16)" in stdout
    for phase in ("train", "eval"):
        check_comparison(row[phase], "nchw", "channels_last", 2)
        assert f"{row[phase]['ratio']:.2f}x" in stdout


def test_warm_start_sets_cold_against_warm_for_a_point_a_ddp_run_and_a_sweep(tmp_path):
    results, stdout = run_bench("warm_start", tmp_path)
    assert results["server_start_s"] > 0
    for shape in ("point", "ddp", "sweep"):
        got = results["shapes"][shape]
        for side in ("cold", "warm"):
            assert len(got["wall_s"][side]) == len(got["fixed_s"][side]) == 1
            assert 0 < got["fixed_s"][side][0] < got["wall_s"][side][0]  # the runs trained for some of it
        assert got["median_fixed_s"] == [got["fixed_s"]["cold"][0], got["fixed_s"]["warm"][0]]
    (steps,) = results["first_step_s"]
    assert len(steps) == 2 and all(0 < s for s in steps)  # both ranks stepped, after their launcher started them


def test_planner_terms_leaves_each_term_out_and_puts_it_back():
    """The model as it stands is `ddplab plan --corpus`'s held-out figures; STRAGGLER left out is its column without
    it; every term left out changes what it should and is back once its row is measured."""
    import importlib.util

    from ddplab.planner import corpus

    spec = importlib.util.spec_from_file_location("planner_terms", BENCH / "planner_terms.py")
    terms = sys.modules["planner_terms"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
    spec.loader.exec_module(terms)
    _, series = corpus.load()
    plain, held, _ = corpus.predicted(series)
    first = [abs(p.error) for p in held if not p.series.from_node and p.error is not None]
    as_is = terms.measure("as is", "")
    assert as_is["points"] == len(first) and as_is["median_abs"] == statistics.median(first)
    rows = {}
    for term in terms.TERMS:
        with term.leave_out():
            rows[term.name] = terms.measure(term.name, term.without)
    assert terms.measure("again", "") == {**as_is, "term": "again"}  # nothing left patched
    no_straggler = rows["STRAGGLER, both"]
    assert no_straggler["spreads"] == [(0.0, 0.0)]
    assert no_straggler["median_abs"] == statistics.median(abs(p.error) for p in plain if p.error is not None)
    assert (
        rows["STRAGGLER, a GPU's spread"]["spreads"][0][0] == 0.0 < rows["STRAGGLER, a GPU's spread"]["spreads"][0][1]
    )
    figures = ("median_abs", "below", "p5", "p95", "median_abs_by_kind", "held")
    for name, row in rows.items():  # each term moves the corpus somewhere
        assert any(row[k] != as_is[k] for k in figures), name
    assert rows["LINK_QUEUE (the all-reduce under backward)"]["below"] > as_is["below"]  # more exposed: slower


def test_band_rules_compares_ddplabs_rule_with_the_pooled_one_on_the_cells_a_plan_takes():
    """ddplab's rule is the one the plan prints (band.gpu_band's cell, validation and all); the pooled rule is the
    cases' own central 90%; every rule is checked on the same held-out points."""
    import importlib.util

    from ddplab.planner import band, corpus

    spec = importlib.util.spec_from_file_location("band_rules", BENCH / "band_rules.py")
    rules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rules)
    rows = rules.measure()
    assert len(rows) == (len(rules.CELLS) + len(rules.COMPOSED)) * len(rules.RULES)
    ours = {r["cell"]: r for r in rows if r["rule"] == "new source (ddplab's)"}
    printed = {corpus.cell_words(*cell): band.corpus_cells()[cell] for cell in rules.CELLS}
    for nodes, per_node in rules.COMPOSED:  # across nodes from one GPU: the band a plan's row of 8 GPUs a node takes
        printed[corpus.composed_words(nodes, per_node, "synthetic")] = band.gpu_band(nodes, per_node, 400.0)
    assert sorted(printed) == sorted(ours)
    for words, b in printed.items():
        row = ours[words]
        assert (row["lo"], row["hi"], row["held"], row["held_of"]) == (b.lo, b.hi, b.held, b.held_of)
    pooled = next(r for r in rows if r["rule"] == "pooled")  # one node, 2 GPUs: Lambda's points set it
    _, held, _ = corpus.predicted(corpus.load()[1])
    cell = [1 / (1 + p.error) for p in held if p.error is not None and corpus.cell_of(p) == rules.CELLS[0]]
    assert (pooled["lo"], pooled["hi"]) == corpus.band_edges(cell) and pooled["held_of"] == len(cell)
    assert all(r["held"] <= r["held_of"] and r["lo"] < 1 < r["hi"] for r in rows)
