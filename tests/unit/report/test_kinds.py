"""The kinds of report section (report/kinds.py): the names a sweep file may give, the findings and tables of each."""

from pathlib import Path

import pytest

from ddplab.report.build import build_report

from support.reports import assert_findings_restate_tables
from support.runs import write_manifest, write_run

SECTIONS = [
    {
        "title": "Q2. Scaling",
        "question": "Does DDP pay?",
        "kind": "scaling",
        "note": "Background.",
        "runs": ["one", "ddp", "dp"],
        "baseline_runs": ["one"],
        "not_measured": [{"point": "nccl", "reason": "NCCL needs CUDA GPUs"}],
    },
    {
        "title": "Q3. Overfitting",
        "kind": "overfitting",
        "runs": ["one", "ddp"],
        "baseline_runs": ["one"],
        "not_measured": [],
    },
    {
        "title": "Q5. Remedies",
        "kind": "regularization",
        "runs": ["one", "aug"],
        "baseline_runs": ["one"],
        "not_measured": [],
    },
]


def write_sectioned_sweep(sweep: Path) -> Path:
    losses = {"one": (1.0, 0.7, 0.9, 1.2, 1.3), "ddp": (1.0, 0.7, 0.9, 1.2, 1.3), "aug": (1.0, 0.8, 0.75, 0.74, 0.74)}
    for name, kwargs in (
        ("one", {}),
        ("ddp", {"strategy": "ddp", "nproc": 2, "batch": 16}),
        ("aug", {"config": {"data": {"crop_padding": 4}}, "test_acc": 0.78}),
    ):
        write_run(
            sweep / "runs" / name,
            epoch_s=(3.0,) * 5,
            train_loss=(1.2, 0.9, 0.6, 0.3, 0.2),
            test_loss=losses[name],
            train_eval_acc=0.95 if name != "aug" else 0.80,
            other_cpu=0.01,
            cpu_s=4.0,
            **kwargs,
        )
    runs = [{"name": n, "point": {"config": n}, "seed": 0} for n in ("one", "ddp", "aug")]
    runs.append(
        {
            "name": "dp",
            "point": {"config": "dp x2"},
            "seed": 0,
            "status": "skipped",
            "error": "not run on this machine: DataParallel needs CUDA devices",
        }
    )
    return write_manifest(sweep, runs, sections=SECTIONS)


@pytest.mark.slow(why="draws every plot of a report of each section kind")
def test_a_sweeps_sections_answer_their_questions(tmp_path):
    result = build_report([write_sectioned_sweep(tmp_path / "study")], tmp_path / "out")
    scaling, over, remedies = result["sections"]
    assert [s["title"] for s in result["sections"]] == ["Q2. Scaling", "Q3. Overfitting", "Q5. Remedies"]
    assert scaling["findings"][0].startswith(
        "ddp: 1.00x the training throughput of one (500 vs 500 images/s), 100% of the ideal 1x"
    )
    assert "(the same global batch of 32: the same optimizer steps)" in scaling["findings"][0]
    assert scaling["findings"][-2:] == [
        "not measured here: nccl: NCCL needs CUDA GPUs",
        "not measured here: dp x2: not run on this machine: DataParallel needs CUDA devices",
    ]
    assert over["findings"][0] == (
        "one overfits: its test loss was lowest at epoch 2 (0.700) and ends +86% above it (1.300 at epoch 5) while the "
        "training loss on training images in eval mode kept falling; train accuracy 95.00% (training images in eval "
        "mode) vs test 70.00%, a gap of +25.0 points. Early stopping on test loss (patience 2) would have stopped "
        "after epoch 4, at 70.00% test accuracy (the same run, cut short)"
    )
    assert remedies["findings"][0].startswith("aug vs one: single run: as fast (500 vs 500 training images/s; ")
    assert (
        "test loss +0% from its lowest at the end (one: +86%), train-test gap +2.0 vs +25.0 points"
        in remedies["findings"][0]
    )
    assert remedies["findings"][1].startswith("one overfits")  # the baseline, for reference
    for s in result["sections"]:
        assert "Speed" in [t[0] for t in s["tables"]]
    assert "Overfitting" in [t[0] for t in over["tables"]] and "Scaling" in [t[0] for t in scaling["tables"]]
    assert scaling["setup"] == (
        "simple_cnn (1,000 parameters, 2.0 MFLOP/image); synthetic: 1,000 training / 10,000 "
        "test images; 5 epochs; adam lr 0.001 (schedule none); on CPU Test (2 CPUs), torch 2.13.0"
    )
    # Each section's answer in one sentence, with its verdict (report/headline.py), first on the page.
    assert (
        scaling["headline"]
        == "ddp: 1.00x the training throughput of one, 100% of the ideal 1x, single run; not measured here: nccl, dp x2"
    )
    assert over["headline"] == "2 of 2 overfit; most one: test loss lowest at epoch 2, +86% by epoch 5"
    # The question is overfitting: its answer leads, the speed follows nowhere it is no effect.
    assert remedies["headline"] == (
        "least overfitting aug: train-test gap +2.0 vs +25.0 points of one, its test loss no longer rising (one's: "
        "+86% past its lowest); +8.0 points of test accuracy, single seed"
    )
    assert_findings_restate_tables(result)
    page = result["index_html"].read_text()
    assert "<blockquote>Does DDP pay?</blockquote>" in page and "Background." in page
    answers = page.index('<nav class="answers">')
    assert answers < page.index("<section") and f"Q2. Scaling</a>: {scaling['headline']}</li>" in page[answers:]


def test_a_sweep_file_may_name_exactly_the_section_kinds_the_report_has():
    """spec.KINDS (what a sweep file may say) and report/kinds.py (what the report does with each) name the same
    kinds."""
    from ddplab.report.kinds import KINDS
    from ddplab.sweepdir.spec import KINDS as NAMES

    assert set(NAMES) == set(KINDS) and NAMES[0] == "all"
