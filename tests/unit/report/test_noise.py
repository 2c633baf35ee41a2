"""When a difference is an effect (report/noise.py): beyond noise, within it, or unreliable under load."""

import statistics
from pathlib import Path

import pytest

from ddplab.report import noise
from ddplab.report.build import build_report
from ddplab.report.records import Load, Timing

from support.reports import assert_findings_restate_tables
from support.runs import write_run


def precision_runs(root: Path, bf16_epoch: float, spread: float, other_cpu=None) -> Path:
    """fp32 and bf16, two seeds each; bf16's epochs take `bf16_epoch` s (train_s 1 s less), seeds apart by
    `spread` s."""
    for name, precision, seed, acc, epoch in (
        ("a0", "fp32", 0, 0.70, 10.0),
        ("a1", "fp32", 1, 0.72, 10.0 + spread),
        ("b0", "bf16", 0, 0.69, bf16_epoch),
        ("b1", "bf16", 1, 0.71, bf16_epoch + spread),
    ):
        write_run(
            root / name,
            precision=precision,
            seed=seed,
            test_acc=acc,
            epoch_s=(epoch, epoch),
            train_loss=(1.0, 0.9),
            test_loss=(1.0, 0.95),
            other_cpu=0.0 if other_cpu is None or name != "b1" else other_cpu,
        )
    return root


def test_a_timing_difference_beyond_noise_is_an_effect(tmp_path):
    result = build_report([precision_runs(tmp_path / "runs", bf16_epoch=8.0, spread=0.0)], tmp_path / "out")
    (finding,) = [f for f in result["findings"] if f.startswith("precision=bf16 vs precision=fp32")]
    assert finding == (
        "precision=bf16 vs precision=fp32: 1.29x faster (143 vs 111 training images/s, beyond noise "
        "(±3%, over seeds)); test accuracy 70.00% vs 71.00% (-1.0 points, within noise (noise 1.4 "
        "points, std over seeds))"
    )
    assert_findings_restate_tables(result)


def test_a_timing_difference_within_the_seeds_spread_is_not_an_effect(tmp_path):
    """bf16 2% faster, but the seeds of each point are 5% apart: noise, said so."""
    result = build_report([precision_runs(tmp_path / "runs", bf16_epoch=9.8, spread=0.5)], tmp_path / "out")
    (finding,) = [f for f in result["findings"] if f.startswith("precision=bf16 vs precision=fp32")]
    assert finding.startswith("precision=bf16 vs precision=fp32: within noise: 1.02x faster (")
    assert "beyond noise" not in finding.split("test accuracy")[0]


def test_a_comparison_with_a_contended_run_is_unreliable_whatever_the_numbers(tmp_path):
    result = build_report(
        [precision_runs(tmp_path / "runs", bf16_epoch=5.0, spread=0.0, other_cpu=0.35)], tmp_path / "out"
    )
    (finding,) = [f for f in result["findings"] if f.startswith("precision=bf16 vs precision=fp32")]
    assert finding.startswith(
        "precision=bf16 vs precision=fp32: unreliable: 2.25x faster (250 vs 111 training images/s; "
        "the clocks measured other work; b1: other processes used up to 35% of the CPUs)"
    )
    assert "beyond noise (±" not in finding
    page = result["index_html"].read_text()
    assert '<li class="unreliable">precision=bf16 vs precision=fp32' in page and "35% CPU (contended)" in page
    assert_findings_restate_tables(result)


def test_accuracy_noise_is_the_seeds_spread_or_the_test_sets_own():
    a = {"final_test_acc": 0.70, "final_test_acc_std": None, "test_images": 10_000}
    b = {"final_test_acc": 0.73, "final_test_acc_std": None, "test_images": 10_000}
    verdict = noise.accuracy_verdict(
        0.03, b, a
    )  # sampling noise, the larger side's: sqrt(.7 * .3 / 10000) = 0.46 points
    assert verdict.text() == (
        "single seed (beyond the test set's sampling noise of 0.5 points; the spread over seeds "
        "is not measured: set sweep.repeats)"
    )
    small = {**a, "test_images": 200}  # sqrt(.7 * .3 / 200) = 3.2 points: 3 points is within it
    assert noise.accuracy_verdict(0.03, {**b, "test_images": 200}, small).word == "within noise"
    seeds = {**a, "final_test_acc_std": 0.02}
    assert (
        noise.accuracy_verdict(0.03, {**b, "final_test_acc_std": 0.01}, seeds).text()
        == "within noise (noise 2.0 points, std over seeds)"
    )


def test_timing_noise_of_one_run_is_its_windows_standard_error():
    steps = [
        {"epoch": 2, "step": s, "t_s": t}
        for s, t in ((0, 0.0), (1, 1.0), (2, 2.1), (3, 3.0), (4, 4.1), (5, 5.0), (6, 6.1))
    ]
    rates = noise.window_rates(steps, images_per_step=100, epochs=2)
    assert rates == pytest.approx([100.0, 100 / 1.1, 100 / 0.9, 100 / 1.1, 100 / 0.9, 100 / 1.1])
    assert noise.within_run_noise(rates) == pytest.approx(statistics.stdev(rates) / statistics.fmean(rates) / 6**0.5)
    assert noise.within_run_noise(rates[:4]) is None  # too few windows to say
    one = noise.point_timing([100.0], [0.02])
    assert (one.noise, one.basis) == (0.02, "within-run")
    two = noise.point_timing([100.0, 110.0], [0.01, 0.01])
    assert two.basis == "seeds" and two.noise == pytest.approx(7.0711 / 105, rel=1e-4)
    quiet = {"a": Load(0.0, 0.0, None)}
    # One run per side: a run's own spread says nothing of the next run's, however large the ratio.
    for ratio in (1.05, 3.0):
        assert noise.timing_verdict(ratio, one, one, quiet).text() == (
            "single run (one run per side cannot tell an effect from run-to-run noise: set sweep.repeats)"
        )
    assert noise.timing_verdict(3.0, two, one, quiet).word == "single run"
    steady = Timing(100.0, 0.005, "seeds")  # 2 x hypot(0.5%, 0.5%) = 1.4%: the 3% floor applies
    assert noise.timing_verdict(1.02, steady, steady, quiet).text() == "within noise (±3%, over seeds)"
    assert noise.timing_verdict(1.04, steady, steady, quiet).word == "beyond noise"
