"""A report's sections (report/sections.py): one per sweep, nothing compared across, each point against its baseline."""

import json
from pathlib import Path

import pytest

from ddplab.report.build import build_report
from ddplab.report.runs import load_runs

from support.reports import write_axis_sweep
from support.runs import write_manifest, write_run


def test_a_variant_axis_is_compared_against_its_first_value(tmp_path):
    """An optimizer variant changes name and lr together: compared along the sweep's axis, against the first value."""
    sweep = write_axis_sweep(
        tmp_path / "sweep",
        "optimizer",
        [
            (label, {"optim": {"name": label, "lr": lr}}, {"epoch_s": (epoch, epoch), "test_acc": acc})
            for label, lr, epoch, acc in (
                ("adam", 0.001, 10.0, 0.70),
                ("sgd", 0.05, 8.0, 0.73),
                ("rmsprop", 0.0005, 10.0, 0.65),
            )
        ],
    )
    findings = build_report([sweep], tmp_path / "out")["findings"]
    compared = [f.split(":")[0] for f in findings if " vs " in f.split(":")[0]]
    assert compared == ["sgd vs adam", "rmsprop vs adam"]  # each against the first value only
    sgd = next(f for f in findings if f.startswith("sgd vs adam"))
    assert sgd.startswith(
        "sgd vs adam: single run: 1.29x faster (143 vs 111 training images/s; one run per side "
        "cannot tell an effect from run-to-run noise: set sweep.repeats); test accuracy 73.00% vs "
        "70.00% (+3.0 points, single seed (beyond the test set's sampling noise of 0.5 points; the "
        "spread over seeds is not measured: set sweep.repeats))"
    )
    assert next(f for f in findings if f.startswith("best test accuracy")).startswith(
        "best test accuracy: sgd, 73.00%; ahead of adam"
    )


@pytest.mark.slow(why="draws every plot of two sweeps' reports")
def test_two_sweeps_make_two_sections_and_nothing_is_compared_across(tmp_path):
    first = write_axis_sweep(
        tmp_path / "optimizers",
        "optimizer",
        [("adam", {"optim": {"name": "adam"}}, {}), ("sgd", {"optim": {"name": "sgd"}}, {"test_acc": 0.75})],
    )
    second = write_axis_sweep(
        tmp_path / "precision",
        "precision",
        [("fp32", {}, {}), ("bf16", {}, {"precision": "bf16", "epoch_s": (5.0, 5.0, 5.0)})],
    )
    result = build_report([first, second], tmp_path / "out")
    titles = [s["title"] for s in result["sections"]]
    assert titles == ["optimizers sweep", "precision sweep"]
    mine = {s["title"]: " ".join(s["findings"]) for s in result["sections"]}
    assert "fp32" not in mine["optimizers sweep"] and "adam" not in mine["precision sweep"]
    assert "bf16 vs fp32" in mine["precision sweep"] and "sgd vs adam" in mine["optimizers sweep"]
    page = result["index_html"].read_text()
    assert page.count("<section id=") == 2 and '<a href="#1-optimizers-sweep">' in page


def write_sized_down_sweep(
    sweep: Path,
    schedule: str = "none",
    adapted_here: bool = True,
    values: tuple = ("fp32", "bf16"),
    named: str = "bf16",
) -> Path:
    """fp32 for 3 epochs and bf16 sized down to 2 (an [adapt] table did it), two seeds each; fp32's test
    accuracy climbs 30, 40, 60% (seed 1: +2 points), bf16 ends at 41 and 43%."""
    runs = []
    for seed in (0, 1):
        fp32 = write_run(
            sweep / "runs" / f"fp32_s{seed}",
            seed=seed,
            epoch_s=(12.0, 10.0, 10.0),
            steps=True,
            config={"optim": {"schedule": schedule}},
        )
        lines = [json.loads(line) for line in (fp32 / "metrics.jsonl").read_text().splitlines()]
        for record, acc in zip(lines, (0.30, 0.40, 0.60), strict=True):
            record["test_acc"] = acc + 0.02 * seed
        (fp32 / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        summary = json.loads((fp32 / "summary.json").read_text())
        summary["final"]["test_acc"] = summary["best"]["test_acc"] = 0.60 + 0.02 * seed
        (fp32 / "summary.json").write_text(json.dumps(summary))
        write_run(
            sweep / "runs" / f"bf16_s{seed}",
            seed=seed,
            precision="bf16",
            epoch_s=(60.0, 50.0),
            steps=True,
            test_acc=0.41 + 0.02 * seed,
            config={"optim": {"schedule": schedule}},
        )
        runs += [
            {"name": f"fp32_s{seed}", "point": {"config": values[0]}, "seed": seed},
            {"name": f"bf16_s{seed}", "point": {"config": values[1]}, "seed": seed},
        ]
    adapted = "this CPU (Test) does not compute bf16 natively: so bf16 with train.epochs=2 (the others: 3)"
    sections = [
        {
            "title": "Precision",
            "kind": "compare",
            "runs": [r["name"] for r in runs],
            "baseline_runs": ["fp32_s0", "fp32_s1"],
            "not_measured": [],
            "adapted": [adapted],
            "adapted_points": [named] if adapted_here else [],
        }
    ]
    return write_manifest(sweep, runs, sections=sections)


def test_a_point_sized_down_for_this_machine_is_compared_at_equal_epochs(tmp_path):
    """bf16 trained 2 epochs where fp32 trained 3: with a schedule not planned over the run, fp32's first 2
    epochs are what a 2-epoch fp32 run would have trained, seed for seed, so bf16 is set against them (speed
    from their timed epochs, accuracy at epoch 2), and the setup line says what was adapted."""
    from ddplab.report.figures import run_row
    from ddplab.report.sections import build_sections, setup_text

    runs = load_runs([write_sized_down_sweep(tmp_path / "sweep")])
    (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
    (pair,) = section.pairs
    assert pair.baseline == "fp32, its first 2 epochs" and pair.equal_epochs
    assert pair.base["final_test_acc"] == pytest.approx(0.41) and pair.acc_diff == pytest.approx(0.01)
    assert pair.speedup == pytest.approx(9.0 / 49.0)  # epoch 2 alone is timed on both sides
    assert setup_text(section).endswith(
        "; adapted to this machine: this CPU (Test) does not compute bf16 natively: "
        "so bf16 with train.epochs=2 (the others: 3)"
    )
    # A schedule planned over the run (onecycle): fp32's first 2 epochs are not a 2-epoch run; compared as they are.
    runs = load_runs([write_sized_down_sweep(tmp_path / "onecycle", schedule="onecycle")])
    (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
    (pair,) = section.pairs
    assert pair.baseline == "fp32" and not pair.equal_epochs and pair.acc_diff == pytest.approx(-0.19)
    # A point that asks for fewer epochs itself (not sized down for this machine) is compared as it is.
    runs = load_runs([write_sized_down_sweep(tmp_path / "asked", adapted_here=False)])
    (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
    assert not section.pairs[0].equal_epochs and section.pairs[0].acc_diff == pytest.approx(-0.19)
    # An axis of true/false: the sweep names the point "true" (spec.point_text), as the report must read it.
    runs = load_runs([write_sized_down_sweep(tmp_path / "flag", values=(False, True), named="true")])
    (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
    assert section.pairs[0].equal_epochs and section.pairs[0].acc_diff == pytest.approx(0.01)


def test_points_that_differ_in_the_captured_step_are_said_to(tmp_path):
    """train.cuda_graphs=auto (the GPU profiles') captures where it can: DataParallel cannot be, so a section may
    set captured points against eager ones. The setup line names who replayed a graph and why the others did not;
    all or none captured is said once or not at all."""
    from ddplab.report.figures import run_row
    from ddplab.report.sections import build_sections, graphs_text

    dp_said = "auto: off (dist.strategy='dp': DataParallel scatters batches from the host every step)"

    def section_with(said: dict[str, tuple[bool, str]]):
        sweep = write_axis_sweep(tmp_path / f"sweep{len(list(tmp_path.iterdir()))}", "strategy",
                                 [(label, {}, {}) for label in said])  # fmt: skip
        for label, (on, text) in said.items():
            path = sweep / "runs" / label / "summary.json"
            summary = json.loads(path.read_text())
            summary["engine"] = {**(summary.get("engine") or {}), "cuda_graphs": on, "cuda_graphs_said": text}
            path.write_text(json.dumps(summary))
        runs = load_runs([sweep])
        (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
        return section

    mixed = section_with({"ddp x2": (True, "auto: on"), "dp x2": (False, dp_said), "one": (True, "auto: on")})
    assert graphs_text(mixed) == (
        f"the step replayed as one CUDA graph in ddp x2, one only (dp x2: {dp_said}): part of a difference in time "
        "between them is the capture"
    )
    assert graphs_text(section_with({"a": (True, "on"), "b": (True, "auto: on")})) == (
        "every step replayed as one CUDA graph"
    )
    assert graphs_text(section_with({"a": (False, "off"), "b": (False, "auto: off (no CUDA device)")})) == ""
