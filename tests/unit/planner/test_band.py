"""The error band beside each prediction (planner/band.py): its arithmetic, and which checked cases it is made of."""

import pytest

from ddplab.planner import band, corpus
from ddplab.planner.published import CASES, predict


def test_a_band_is_the_least_to_the_most_measured_over_predicted():
    b = band.from_ratios([0.9, 1.2, 1.05], "test")
    assert (b.lo, b.hi, b.cases) == (0.9, 1.2, 3)
    assert b.around(100.0) == pytest.approx((90.0, 120.0))
    assert b.holds(2.0, 1.8) and b.holds(2.0, 2.4) and not b.holds(2.0, 1.79) and not b.holds(2.0, 2.41)
    assert b.text() == "measured -10% to +20% of the prediction over 3 checked cases (test)"
    with pytest.raises(ValueError, match="no checked cases"):
        band.from_ratios([], "none")


def test_the_published_ddp_benchmark_cases_are_predicted_within_three_percent():
    """The DDP benchmark's 8 rows (ResNet-50 and -101 on 2-16 V100s; `ddplab plan --published`); DAWNBench's two
    leaderboard entries and the seed reports' own figures are marked as not measuring DDP, each with its reason.
    With DDP_HOST (the one-GPU figures ran without DDP) the predicted step is within 1% short to 2.2% long of the
    stated one (before the term, all 6-9% short)."""
    left_out = {c.name: c.not_comparable for c in CASES if c.not_comparable}
    assert set(left_out) == {c.name for c in CASES[2:]} and all(left_out.values())
    ratios = [r["predicted"] / r["stated"] for c in CASES[:2] for r in predict(c)]
    assert len(ratios) == 8 and 0.99 < min(ratios) < 1 < max(ratios) < 1.025


def test_a_gpu_band_is_its_kinds_central_90_percent_over_the_corpus():
    """One node, across nodes, across nodes over a slow link: the central 90% of measured / predicted over the
    corpus's points of that kind (the order statistics a split-conformal band takes), recomputed with today's
    model, each point predicted out of sample (STRAGGLER's GPU spread fitted without its source)."""
    points, _ = corpus.held_out([p for p in corpus.points(corpus.load()[1]) if p.steps is not None])
    for nodes, gbit, kind in ((1, None, "one node"), (2, 400.0, "across nodes")):
        b = band.band_for(True, nodes, node_gbit=gbit)
        ratios = sorted(1 / (1 + p.error) for p in points if p.kind == kind and p.error is not None)
        assert b.cases == len(ratios) >= 10 and kind_words(kind) in b.source
        assert (b.lo, b.hi) == conformal(ratios) and ratios[0] <= b.lo < b.hi <= ratios[-1]
        assert 0 < b.held <= b.held_of == b.cases
    assert band.band_for(True) == band.gpu_band(1) and band.band_for(True, 2) == band.gpu_band(2, 400.0)
    # Planned from a measured node of as many GPUs: the points predicted again from their series' node, a kind of
    # their own, its coverage each source against the band of the others.
    _, held, spreads = corpus.predicted(corpus.load()[1])
    node = band.band_for(True, 2, node_gbit=400.0, from_node=True)
    ratios = sorted(1 / (1 + p.error) for p in held if p.series.from_node)
    assert node.cases == len(ratios) >= 10 and node != band.band_for(True, 2, node_gbit=400.0)
    assert (node.lo, node.hi) == conformal(ratios)
    assert node.held == corpus.kind_bands(held, spreads)["across nodes, from a measured node"].held
    # Every published point over links under 50 Gbit/s a node went through parameter servers: not predicted, so
    # that kind has no band, and says so.
    slow = band.band_for(True, 4, node_gbit=10.0)
    assert (
        slow.cases == 0
        and slow.untrusted
        and slow.text()
        == (
            "no band: the model was never checked on published runs across nodes over links under 50 Gbit/s a node, "
            "planner/figures"
        )
    )
    assert band.band_for(True, 1, other_batch=True).cases == band.gpu_band(1).cases + len(band.BATCH_CHECKS)


def conformal(sorted_values):
    """A 90% band's edges from n sorted values, written out: the values of ranks floor((n + 1) 0.05) and
    ceil((n + 1) 0.95), counted from 1 and kept within 1..n."""
    n = len(sorted_values)
    lo, hi = max(1, int((n + 1) * 0.05)), min(n, -int(-(n + 1) * 0.95 // 1))
    return sorted_values[lo - 1], sorted_values[hi - 1]


def test_a_bands_edges_are_order_statistics_that_hold_a_new_point_nine_times_in_ten():
    """39 values: ranks 2 and 38 (each tail keeps one value out, as 5% of 40 draws would); 19: ranks 1 and 19;
    under 19 the least and the most, never an interpolated value between two."""
    values = [float(i) for i in range(1, 40)]
    assert corpus.band_edges(values) == (2.0, 38.0) == conformal(values)
    assert corpus.band_edges(values[:19]) == (1.0, 19.0) and corpus.band_edges([3.0, 1.0, 2.0]) == (1.0, 3.0)
    assert corpus.band_edges(values[::-1]) == (2.0, 38.0)  # the order given does not matter
    assert corpus.central(values) == (2.9, 37.1)  # the percentiles (the tables' columns) interpolate


def kind_words(kind):
    return corpus.KIND_WORDS[kind]


def make_points(errors_by_source):
    """Points of one-node series, one source each, whose predictions miss by the given errors."""
    found = []
    for source, errors in errors_by_source.items():
        series = corpus._series(
            source,
            {"name": source, "model": "m", "params": 1e6, "layers": 1, "intra": "nvlink2", "inter": "", "nics": 0,
             "precision": "fp32", "unit": "images/s", "per": "job", "keep": "local", "local_batch": 32,
             "rows": [[1, 1, 100.0]] + [[2, 1, 200.0]] * len(errors)},
            source,
        )  # fmt: skip
        found += [
            corpus.Point(series, row, 200.0, 200.0 * (1 + e), None)
            for row, e in zip(series.rows[1:], errors, strict=True)
        ]
    return found


def test_a_band_is_checked_out_of_sample_one_source_at_a_time():
    """Each source's points against the band of the others' points: a source unlike the rest is not held."""
    found = make_points({"a": [0.0] * 10, "b": [0.01 * i for i in range(10)], "c": [1.0, 1.0]})
    (b,) = corpus.kind_bands(found).values()
    # a's band from b and c (12 ratios: two 0.5s, 1/1.09 .. 1/1.00): ranks 1 and 12, 0.5 to 1.0, around a's ten
    # b's band from a and c (ten 1.0s, two 0.5s): 0.5 to 1.0, around all ten of b's
    # c's band from a and b (20 ratios): ranks 1 and 20, 1/1.09 to 1.0: c's 0.5s fall below it
    assert (b.held, b.held_of, b.points, b.sources) == (10 + 10 + 0, 22, 22, 3)
    assert (b.lo, b.hi) == conformal(sorted(1 / (1 + p.error) for p in found)) == (0.5, 1.0)


def test_a_band_too_wide_or_too_thin_is_said_in_words_with_no_range():
    wide = corpus.KindBand("across nodes", 0.43, 1.02, 200, 7, 150, 200)
    thin = corpus.KindBand("link under 50 Gbit/s", 0.9, 1.0, 23, 2, 13, 23)
    fine = corpus.KindBand("one node", 0.71, 1.04, 482, 12, 425, 482)
    assert wide.untrusted == "reaching past -30% or +30%" and thin.untrusted.startswith("23 points from 2 sources")
    assert fine.untrusted == ""
    said = band.Band(0.43, 1.02, 200, "s", held=150, held_of=200, untrusted=wide.untrusted).text()
    assert said.startswith("no band (reaching past -30% or +30%): measured from 57% below to 2% above the prediction")
    assert "held 150 of 200 points out of sample" in said
    assert (
        band.Band(0.71, 1.04, 482, "s", held=425, held_of=482)
        .text()
        .startswith("measured -29% to +4% of the prediction over 482 points (s); held 425 of 482")
    )


def test_the_cpu_band_is_this_machines_recorded_checks():
    cpu = band.band_for(False)
    ratios = [measured / predicted for *_, predicted, measured in band.CPU_CHECKS]
    assert cpu.cases == len(band.CPU_CHECKS) >= 12 and (cpu.lo, cpu.hi) == (min(ratios), max(ratios))
    assert cpu.source.startswith("this machine's DDP runs")


def test_a_cpu_prediction_across_nodes_takes_the_band_of_the_checks_across_hosts():
    """The single-host band (-9% to +45%) did not hold two hosts unshaped (-13% with STRAGGLER, -17% before it):
    predictions across nodes carry the band of the cases measured across hosts, on both sides of the model since
    resnet18 and vgg_small at 300 Mbit/s (+11%, -16%)."""
    hosts = band.band_for(False, nodes=2)
    ratios = [measured / predicted for *_, predicted, measured in band.HOST_CHECKS]
    assert hosts.cases == len(band.HOST_CHECKS) >= 3 and (hosts.lo, hosts.hi) == (min(ratios), max(ratios))
    assert hosts.lo < band.cpu_band().lo and not band.cpu_band().holds(1035.2, 897.7) and hosts.holds(1035.2, 897.7)
    assert hosts.lo < 0.84 and hosts.hi > 1.1 and hosts.holds(19.7, 21.8) and hosts.holds(73.4, 61.3)
    assert band.band_for(False, nodes=1) == band.cpu_band() and band.band_for(True, nodes=2) == band.gpu_band(2)
