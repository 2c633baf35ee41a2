"""Each section's answer in one sentence (report/headline.py), as the report's first screen lists them."""

import json

from ddplab.report.build import build_report

from support.reports import assert_findings_restate_tables, write_sweep
from support.runs import write_manifest, write_run


def test_a_plain_sweep_answers_with_its_most_accurate_point_and_its_largest_speedup(tmp_path):
    """write_sweep: 1 worker vs DDP x2, two seeds each (70/72% and 69/69%): the accuracies are within noise, the
    2 workers 1.71x faster beyond it."""
    result = build_report([write_sweep(tmp_path)], tmp_path / "out")
    (section,) = result["sections"]
    assert section["headline"] == (
        "most accurate workers=1: 71.00% test accuracy, within noise against workers=2 (69.00%); "
        "workers=2: 1.71x the training throughput of workers=1, 171% of the ideal 1x, beyond noise, super-linear: check"
    )
    assert_findings_restate_tables(result)
    md = result["report_md"].read_text()
    assert (
        md.index("## Answers") < md.index("## 1. scaling") and f"1. [scaling](#1-scaling): {section['headline']}" in md
    )


def test_one_run_a_run_that_does_not_overfit_and_a_section_where_nothing_finished(tmp_path):
    sweep = tmp_path / "study"
    write_run(sweep / "runs" / "one", test_acc=0.75, test_loss=(1.0, 0.8, 0.7))
    runs = [
        {"name": "one", "point": {"config": "one"}, "seed": 0},
        {"name": "gone", "point": {"config": "gone"}, "seed": 0, "status": "failed", "error": "diverged"},
    ]
    sections = [
        {"title": "Run", "kind": "run", "runs": ["one"], "baseline_runs": [], "not_measured": []},
        {"title": "Fit", "kind": "overfitting", "runs": ["one"], "baseline_runs": [], "not_measured": []},
        {"title": "Lost", "kind": "compare", "runs": ["gone"], "baseline_runs": [], "not_measured": []},
    ]
    result = build_report([write_manifest(sweep, runs, sections=sections)], tmp_path / "out")
    assert [s["headline"] for s in result["sections"]] == [
        "one: 75.00% test accuracy at 111 training images/s",
        "none of 1 overfits in 3 epochs",
        "no run finished: nothing to answer",
    ]
    assert_findings_restate_tables(result)


def test_points_this_machine_could_not_run_are_named_in_the_answer(tmp_path):
    """The assignment on one GPU (H100, 2026-11-26): the scaling section had only its baseline, the backends
    section nothing; the answers had read "not timed; 1 device: ..." and "no run finished"."""
    sweep = tmp_path / "study"
    write_run(sweep / "runs" / "one", test_acc=0.75, test_loss=(1.0, 0.8, 0.7))
    why = "not run on this machine: dist.nproc=2 is not valid: this node has 1 CUDA device(s), one per process"
    runs = [
        {"name": "one", "point": {"config": "one"}, "seed": 0},
        *({"name": n, "point": {"config": n}, "seed": 0, "status": "skipped", "error": why} for n in ("two", "gloo")),
    ]
    sections = [
        {"title": "Scale", "kind": "scaling", "runs": ["one", "two"], "baseline_runs": ["one"], "not_measured": []},
        {"title": "Backends", "kind": "compare", "runs": ["two", "gloo"], "baseline_runs": ["two"], "not_measured": []},
    ]
    result = build_report([write_manifest(sweep, runs, sections=sections)], tmp_path / "out")
    assert [s["headline"] for s in result["sections"]] == [
        "one: 75.00% test accuracy at 111 training images/s; not measured here: two",
        "not measured on this machine: two, gloo",
    ]
    assert_findings_restate_tables(result)


def compare_headline(tmp_path, baseline: str) -> str:
    """write_sweep's 2 workers are 1.71x faster and 2.0 points less accurate than 1 worker (within noise), in a
    compare section against `baseline`'s two seeds."""
    sweep = write_sweep(tmp_path)
    manifest = json.loads((sweep / "manifest.json").read_text())
    section = {
        "title": "Q",
        "kind": "compare",
        "runs": ["w1-s0", "w1-s1", "w2-s0", "w2-s1"],
        "baseline_runs": [f"{baseline}-s0", f"{baseline}-s1"],
        "not_measured": [],
    }
    runs = [{k: r[k] for k in ("name", "point", "seed", "status")} for r in manifest["runs"]]
    result = build_report([write_manifest(sweep, runs, axes=("workers",), sections=[section])], tmp_path / "out")
    assert_findings_restate_tables(result)  # the memory beside the speed too
    return result["sections"][0]["headline"]


def test_a_comparison_where_no_point_beats_the_baseline_names_the_closest(tmp_path):
    """With the fastest point's peak memory where it differs by 5% or more (a precision question asks speed and
    memory first): write_sweep's DDP ranks peak at 450 MiB, the one worker at 400."""
    assert compare_headline(tmp_path / "a", "w1") == (
        "fastest workers=2: 1.71x faster than workers=1, beyond noise, 450 vs 400 peak RSS MiB/rank; "
        "none more accurate than workers=1 (closest workers=2: -2.0 points, within noise)"
    )
    assert compare_headline(tmp_path / "b", "w2") == (
        "none faster than workers=2 (closest workers=1: 1.71x slower, beyond noise, 400 vs 450 peak RSS MiB/rank); "
        "most accurate workers=1: +2.0 points of test accuracy vs workers=2, within noise"
    )


def test_a_comparison_whose_baseline_did_not_finish_says_so_first(tmp_path):
    """A compare section whose baseline run failed answered with the other point's figures alone, as if they
    were the comparison, and never said the baseline was missing."""
    sweep = tmp_path / "study"
    write_run(sweep / "runs" / "new", test_acc=0.75, test_loss=(1.0, 0.8, 0.7))
    runs = [
        {"name": "base", "point": {"config": "base"}, "seed": 0, "status": "failed", "error": "diverged"},
        {"name": "new", "point": {"config": "new"}, "seed": 0},
    ]
    sections = [
        {"title": "Q", "kind": "compare", "runs": ["base", "new"], "baseline_runs": ["base"], "not_measured": []}
    ]
    result = build_report([write_manifest(sweep, runs, sections=sections)], tmp_path / "out")
    (section,) = result["sections"]
    assert section["headline"] == (
        "no comparison: the baseline (base) did not finish; new: 75.00% test accuracy at 111 training images/s"
    )
    assert any("the baseline (base) did not finish: no point is compared with it" in f for f in result["findings"])
    assert_findings_restate_tables(result)


def test_a_ratio_that_rounds_to_one_is_as_fast_never_one_times_slower():
    from ddplab.report.tables import faster

    assert [faster(r) for r in (1.25, 1 / 4.71, 1.004, 0.996, None)] == [
        "1.25x faster",
        "4.71x slower",
        "as fast",
        "as fast",
        "-",
    ]


def test_the_scaling_answer_names_a_chronic_straggler_where_waiting_for_it_costs_most():
    """Where the stragglers are the biggest part of a scaling pair's gap and the run named a chronic one, the answer
    says whom it waited for; a gap led by anything else, or a straggler said as noise, names no one."""
    from ddplab.report.headline import scaling
    from ddplab.report.records import Comparison, Gap, Section, Verdict

    def answer(biggest: str, straggler: str | None) -> str:
        gap = Gap(epoch_s=10.0, ideal_epoch_s=5.0, parts={biggest: 4.0}, biggest=biggest, why="")
        pair = Comparison(
            point="ddp-2",
            baseline="single",
            row={"world_size": 2, "straggler": straggler},
            base={"world_size": 1},
            at=1,
            base_at=0,
            equal_epochs=True,
            changed=None,
            scaling=True,
            speedup=1.2,
            ideal=2.0,
            predicted=None,
            gap=gap,
            efficiency=0.6,
            timing_verdict=Verdict("beyond noise", "2 seeds"),
            acc_diff=None,
            acc_verdict=Verdict("single seed"),
            superlinear=False,
        )
        return scaling(Section(title="scaling", kind="scaling", source="s", runs=[], pairs=[pair]))

    chronic = "rank 1 on host 10.211.0.2, chronically 14% slower"
    assert answer("stragglers", chronic).endswith(f"; the biggest part of the gap: waiting for {chronic}")
    assert answer("stragglers", None).endswith("; the biggest part of the gap: stragglers")
    assert answer("all-reduce wait", chronic).endswith("; the biggest part of the gap: all-reduce wait")
