"""What `ddplab plan`'s model predicts beside what a sweep measured (report/predictions.py), over a measured link."""

import json
from pathlib import Path

import pytest

from ddplab.planner import band
from ddplab.report.build import build_report
from ddplab.report.html import md_text
from ddplab.report.records import PairPrediction
from ddplab.report.runs import load_runs

from support.reports import write_sweep
from support.runs import write_manifest, write_run


def test_a_sweep_with_a_measured_link_shows_the_predicted_speedup_beside_the_measured(tmp_path):
    """links.json in the sweep folder (the sweep runner measures it): each scaling pair gets the model's speedup,
    predicted from the 1-worker run. By hand: 1 worker, 32 images a step: (7.2 + 0.9) ms an image, 28.125 ms of
    optimizer a step; 2 processes on the same cores: twice that, plus one 10.004 ms all-reduce, 16 steps an epoch
    against 32: 9.1944 s / (16 x 0.584654 s) = 0.98x."""
    sweep = write_sweep(tmp_path)
    write_link(sweep)
    result = build_report([sweep], tmp_path / "out")
    md = result["report_md"].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| point | vs | speedup | of ideal | predicted"))
    row = next(line for line in md.splitlines() if line.startswith("| workers=2 | workers=1 | 1.71x |"))
    # The prediction with the band of the model's errors on this machine's checked runs (planner/band.py).
    cpu = band.cpu_band()
    predicted = 9.1944 / (16 * 0.584654)
    band_text = f"{predicted * cpu.lo:.2f}-{predicted * cpu.hi:.2f}x"
    assert header and row.split(" | ")[4] == f"0.98x ({band_text}, few)"  # measured 1.71x: the 2-worker runs are faster
    assert (
        md_text(
            "The scaling model (ddplab plan) predicted 0.98x from workers=1 over this machine's measured link; "
            f"the measured 1.71x is OUTSIDE its error band, {1.71 / predicted - 1:+.0%} of the prediction: above it by "
            f"more than any checked case ({band_text}: {cpu.text()})"
        )
        in md
    )
    without = build_report([write_sweep(tmp_path / "plain")], tmp_path / "out2")["report_md"].read_text()
    assert "predicted" not in without  # no link measured: no column, no claim


def write_link(sweep: Path) -> None:
    """links.json as the sweep runner writes it: a 2-rank measurement that fits 10 ms + 1 GB/s exactly."""
    from ddplab.planner.links import SIZES, Link

    link = Link("x", busbw_gbps=1.0, alpha_s=0.01, source="test")
    sizes = list(SIZES[:5])
    (sweep / "links.json").write_text(
        json.dumps(
            {
                "measurement": {
                    "backend": "gloo",
                    "ranks": 2,
                    "device": "cpu",
                    "sizes": sizes,
                    "times_s": [link.allreduce_s(s, 2) for s in sizes],
                }
            }
        )
    )


def test_the_models_curves_run_through_the_measured_points(tmp_path):
    """Batch 32 and 64 x 1 and 2 workers, a measured link: the model planned from the batch-32 1-worker run.
    By hand (the fixture: 9 s training epochs of 1000 images, 10% data, 80% compute, 10% optimizer, 32 steps):
    one worker at its own batch, 32 x (32 x 8.1 ms + 28.125 ms) = 9.1944 s (its last batch is 8 images, the
    model's per-image costs count a full one); at batch 64, 16 x (64 x 8.1 + 28.125) = 8.7444 s. Speedup at
    2 workers from the batch-32 run: 0.98x (as the scaling table); the curve reaches 4 and 8 workers, its
    ideal 1x throughout (one CPU)."""
    from ddplab.report.figures import run_row
    from ddplab.report.sections import build_sections

    sweep = tmp_path / "sweep"
    entries = []
    for batch in (32, 64):
        for workers in (1, 2):
            name = f"b{batch}-w{workers}"
            write_run(
                sweep / "runs" / name,
                batch=batch,
                strategy="ddp" if workers > 1 else "single",
                nproc=workers,
                epoch_s=(12.0, 10.0, 10.0) if workers == 1 else (9.0, 7.0, 7.0),
                comm_share=0.1 * (workers > 1),
            )
            entries.append(
                {"name": name, "point": {"batch": str(batch), "workers": str(workers), "lr": "0.001"}, "seed": 0}
            )
    # another recipe (a higher lr) at batch 64: its own 1-worker point, never drawn on the batch-32 run's curves
    write_run(sweep / "runs" / "lr", batch=64, config={"optim": {"lr": 0.01}}, epoch_s=(12.0, 2.0, 2.0))
    entries.append({"name": "lr", "point": {"batch": "64", "workers": "1", "lr": "0.01"}, "seed": 0})
    write_manifest(sweep, entries, axes=["batch", "workers", "lr"])
    write_link(sweep)
    runs = load_runs([sweep])
    (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
    curves = section.model_curves
    assert curves.source == "batch=32, workers=1, lr=0.001"
    low, high = curves.workers
    assert (low.label, low.x, low.ideal) == ("from batch=32, workers=1, lr=0.001", [1, 2, 4, 8], [1.0] * 4)
    assert low.predicted[0] == pytest.approx(1.0) and round(low.predicted[1], 2) == 0.98
    assert low.measured == [(2, pytest.approx(9 / 6))] and high.label == "from batch=64, workers=1, lr=0.001"
    one, two = curves.batch
    assert (one.label, one.x, two.label) == ("1 worker", [32, 64], "2 workers")
    assert one.predicted == [pytest.approx(9.1944), pytest.approx(8.7444)]
    assert one.measured == [(32, pytest.approx(9.0)), (64, pytest.approx(9.0))]
    assert [x for x, _ in two.measured] == [32, 64]
    result = build_report([sweep], tmp_path / "out")
    (plot,) = [p for p in result["sections"][0]["plots"] if p.name == "predicted"]
    assert plot.path.is_file() and not plot.clipped
    assert "from batch=32, workers=1, lr=0.001: predicted" in plot.legend and "2 workers: measured" in plot.legend


def test_a_measured_speedup_is_said_to_lie_inside_or_outside_the_models_band():
    from ddplab.report.findings import prediction_text

    p = PairPrediction(2.0, band.from_ratios([0.9, 1.1], "test"), 3.0)
    assert prediction_text(p, 2.1, "w=1").endswith(
        "the measured 2.10x is inside its error band (1.80-2.20x: measured -10% to +10% of the prediction over 2 "
        "cases from 1 source (test); not validated out of sample (one source) [few: under 19 cases or 3 sources, its "
        "edges are drawn from a handful])"
    )
    assert "2.30x is OUTSIDE its error band, +15% of the prediction: above it" in prediction_text(p, 2.3, "w=1")
    assert "1.70x is OUTSIDE its error band, -15% of the prediction: below it" in prediction_text(p, 1.7, "w=1")
    # A band wholly below its predictions (the GPU cases': the model's bias) puts an exact prediction outside it.
    biased = PairPrediction(2.0, band.from_ratios([0.9, 0.95], "test"), None)
    assert "2.00x is OUTSIDE its error band, +0% of the prediction: above it" in prediction_text(biased, 2.0, "w=1")
    assert prediction_text(PairPrediction(1.0, None, None), 1.0, "w=1").endswith("; measured 1.00x")
    # A corpus band: outside it is beyond 90% of its cell's cases; a wide one is a range too, marked.
    corpus_band = band.Band(0.8, 1.1, 100, "c", held=90, held_of=100, sources=5)
    assert "above it by more than 90% of the checked cases of its kind" in prediction_text(
        PairPrediction(2.0, corpus_band, None), 2.5, "w=1"
    )
    wide = PairPrediction(2.0, band.Band(0.4, 1.1, 100, "c", held=70, held_of=100, sources=5), None)
    assert prediction_text(wide, 1.5, "w=1").endswith(
        "the measured 1.50x is inside its error band (0.80-2.20x: measured -60% to +10% of the prediction over 100 "
        "cases from 5 sources (c); validation: 70 of 100 inside the band drawn from the other sources [wide: past "
        "-30% or +30%])"
    )
    unchecked = PairPrediction(2.0, band.unchecked("no check at 8 processes"), None)
    assert prediction_text(unchecked, 1.5, "w=1").endswith("; measured 1.50x (no band: no check at 8 processes)")
    from ddplab.report.tables import predicted_cell

    assert predicted_cell(wide) == "2.00x (0.80-2.20x, wide)" and predicted_cell(unchecked) == "2.00x"
    assert predicted_cell(PairPrediction(2.0, corpus_band, None)) == "2.00x (1.60-2.20x)"


def test_a_gpu_pair_at_half_the_local_batch_is_predicted_against_the_baselines_own_rate(tmp_path):
    """The same global batch on 2 GPUs: each GPU steps half the images, which BATCH_BOUND prices at the measured
    step (a GPU below its knee costs about the same at any batch). The predicted speedup is over the baseline's
    measured rate, not over one GPU alone at the halved batch (which would double it)."""
    from types import SimpleNamespace

    from ddplab.planner import model
    from ddplab.planner.links import Link
    from ddplab.report.predictions import predict_pair
    from ddplab.rundir.runread import read_run

    run = read_run(write_run(tmp_path / "one", batch=64, device="cuda"))
    one = SimpleNamespace(finished=True, summary=run.summary, history=run.history, config=run.config, steps=[])
    free = Link("free", busbw_gbps=1e12, alpha_s=0.0, source="test")
    section = SimpleNamespace(
        link=free,
        rows=[{"world_size": 1, "local_batch": 64}, {"world_size": 2, "local_batch": 32}],
        points=[SimpleNamespace(runs=[one], config=run.config), SimpleNamespace(runs=[], config=run.config)],
    )
    predicted = predict_pair(section, 1, 0)
    costs = model.step_costs(run.summary, run.history, run.config)
    two, base = model.predict_one(costs, 2, 1, 32, free), model.predict_one(costs, 1, 1, 64, free)
    # flat at 32, DDP's own work added, the slower of 2 GPUs waited for (STRAGGLER)
    assert two.step_s == pytest.approx((base.step_s + costs.ddp_host_s) * (1 + 0.5642 * model.GPU_STEP_CV), rel=1e-4)
    assert predicted.speedup == pytest.approx(two.images_per_s / base.images_per_s) and predicted.speedup < 1.0
    assert two.speedup == pytest.approx(2 * predicted.speedup)  # over one GPU alone at 32: what it said before
    assert predicted.band == band.gpu_band().and_(band.batch_band())
