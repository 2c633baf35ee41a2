"""The error band beside each prediction (planner/band.py): its arithmetic, and which checked cases it is made of."""

import pytest

from ddplab.planner import band
from ddplab.planner.published import CASES, predict


def test_a_band_is_the_least_to_the_most_measured_over_predicted():
    b = band.from_ratios([0.9, 1.2, 1.05], "test")
    assert (b.lo, b.hi, b.cases) == (0.9, 1.2, 3)
    assert b.around(100.0) == pytest.approx((90.0, 120.0))
    assert b.holds(2.0, 1.8) and b.holds(2.0, 2.4) and not b.holds(2.0, 1.79) and not b.holds(2.0, 2.41)
    assert b.text() == "measured -10% to +20% of the prediction over 3 checked cases (test)"
    with pytest.raises(ValueError, match="no checked cases"):
        band.from_ratios([], "none")


def test_the_gpu_band_is_the_published_cases_that_measure_ddp_recomputed_with_todays_model():
    """The DDP benchmark's 8 rows (ResNet-50 and -101 on 2-16 V100s) are in it; DAWNBench's two leaderboard
    entries and the seed reports' own figures are not, each with its reason. With DDP_HOST (the one-GPU figures
    ran without DDP) the predicted step is within 1% short to 2.2% long of the stated one: errors on both sides
    (before the term, all 6-9% short: a band wholly below every GPU prediction)."""
    left_out = {c.name: c.not_comparable for c in CASES if c.not_comparable}
    assert set(left_out) == {c.name for c in CASES[2:]} and all(left_out.values())
    rows = [r for c in CASES[:2] for r in predict(c)]
    gpu = band.gpu_band()
    assert gpu.cases == 8 == len(rows)
    assert gpu.lo == pytest.approx(min(r["predicted"] / r["stated"] for r in rows))
    assert gpu.hi == pytest.approx(max(r["predicted"] / r["stated"] for r in rows))
    assert 0.99 < gpu.lo < 1 < gpu.hi < 1.025 and band.band_for(True) == gpu


def test_the_cpu_band_is_this_machines_recorded_checks():
    cpu = band.band_for(False)
    ratios = [measured / predicted for *_, predicted, measured in band.CPU_CHECKS]
    assert cpu.cases == len(band.CPU_CHECKS) >= 12 and (cpu.lo, cpu.hi) == (min(ratios), max(ratios))
    assert cpu.source.startswith("this machine's DDP runs")


def test_a_cpu_prediction_across_nodes_takes_the_band_of_the_checks_across_hosts():
    """The single-host band (-9% to +45%) did not hold two hosts unshaped (-13% with STRAGGLER, -17% before it):
    predictions across nodes carry the band of the cases measured across hosts."""
    hosts = band.band_for(False, nodes=2)
    ratios = [measured / predicted for *_, predicted, measured in band.HOST_CHECKS]
    assert hosts.cases == len(band.HOST_CHECKS) >= 3 and (hosts.lo, hosts.hi) == (min(ratios), max(ratios))
    assert hosts.lo < band.cpu_band().lo and not band.cpu_band().holds(1035.2, 897.7) and hosts.holds(1035.2, 897.7)
    assert band.band_for(False, nodes=1) == band.cpu_band() and band.band_for(True, nodes=2) == band.gpu_band()
