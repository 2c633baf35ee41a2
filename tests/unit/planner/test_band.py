"""The error band beside each prediction (planner/band.py): its arithmetic, and which checked cases it is made of."""

import math
import statistics

import pytest

from ddplab.planner import band, corpus
from ddplab.planner.published import CASES, predict


def test_a_band_of_few_cases_is_their_least_to_most_and_marked_few():
    b = band.from_ratios([0.9, 1.2, 1.05], "test")
    assert (b.lo, b.hi, b.cases, b.marks) == (0.9, 1.2, 3, ("few",))
    assert b.around(100.0) == pytest.approx((90.0, 120.0))
    assert b.holds(2.0, 1.8) and b.holds(2.0, 2.4) and not b.holds(2.0, 1.79) and not b.holds(2.0, 2.41)
    assert b.text() == (
        "measured -10% to +20% of the prediction over 3 cases from 1 source (test); not validated out of sample "
        "(one source) [few: under 19 cases or 3 sources, its edges are drawn from a handful]"
    )
    with pytest.raises(ValueError, match="no checked cases"):
        band.from_ratios([], "none")


def test_every_band_is_one_rule_its_cases_central_90_percent_marked_where_weak():
    """The same order statistics for a corpus cell, a CPU count and the batch checks; a band is always a range,
    marked "few" (under 19 cases or 3 sources) and "wide" (past -30% or +30%); a cell with no case has none."""
    values = [0.5 + i / 100 for i in range(40)]
    b = band.from_ratios(values, "s", sources=4, held=30, held_of=40)
    assert (b.lo, b.hi) == conformal(values) and b.marks == ("wide",)
    assert b.text() == (
        "measured -49% to -12% of the prediction over 40 cases from 4 sources (s); validation: 30 of 40 inside the "
        "band drawn from the other sources [wide: past -30% or +30%]"
    )
    assert band.Band(0.95, 1.04, 40, "s", sources=2).marks == ("few",)  # many cases, too few sources
    assert band.Band(0.95, 1.04, 40, "s", sources=3).marks == ()
    batch = band.batch_band()
    ratios = sorted(m / p for *_, p, m in band.BATCH_CHECKS)
    assert (batch.lo, batch.hi) == conformal(ratios) and batch.marks == ("few", "wide")
    none = band.unchecked("no check at 8 hosts")
    assert none.cases == 0 and none.marks == () and none.text() == "no band: no check at 8 hosts"


def test_the_published_ddp_benchmark_is_predicted_with_a_plans_terms_and_says_the_ddp_host_it_implies():
    """The DDP benchmark's 8 rows (ResNet-50 and -101 on 2-16 V100s; `ddplab plan --published`), predicted with the
    terms a CUDA plan uses (DDP_HOST, HOST_FLOOR, STRAGGLER at its fitted spreads): every step long, by 2.5% to 8.7%.
    Alone it agreed within 1% short to 2.2% long only because it left STRAGGLER out. With every other term a plan's,
    the rows imply DDP_HOST of 30 and 48 us a layer, where the model takes the 75 measured on one H100: at that
    value each row is within 4%. DAWNBench's two leaderboard entries and the seed reports' own figures are marked as
    not measuring DDP, each with its reason."""
    from ddplab.planner.model import DDP_HOST_PER_LAYER_S
    from ddplab.planner.published import implied_ddp_host

    left_out = {c.name: c.not_comparable for c in CASES if c.not_comparable}
    assert set(left_out) == {c.name for c in CASES[2:]} and all(left_out.values())
    errors = [r["error"] for c in CASES[:2] for r in predict(c)]
    assert len(errors) == 8 and 0.02 < min(errors) < max(errors) < 0.10
    implied = [implied_ddp_host(c) for c in CASES[:2]]
    assert [round(v * 1e6) for v in implied] == [30, 48] and max(implied) < DDP_HOST_PER_LAYER_S
    assert all(abs(r["error"]) < 0.04 for c, v in zip(CASES[:2], implied, strict=True) for r in predict(c, v))


def test_a_gpu_rows_band_is_its_cells_by_kind_count_and_pipeline_validated_leave_one_source_out():
    """A row on one node takes the cell of its GPU count (2, up to 4, up to 8) among the published runs whose images
    were synthetic (a ddplab run's sit on its device, so no host pipeline bounds it): the central 90% of what a new
    source could measure there (each source's median measured / predicted plus each point's deviation from its
    own), each point predicted out of sample (STRAGGLER fitted without its source), and its
    validation each source against the band of the other sources. Where that cell holds too few points, the
    cell of both pipelines; where no point is of the cell, no band, said so."""
    _, held, spreads = corpus.predicted(corpus.load()[1])
    for per_node in (2, 3, 4, 8):
        b = band.band_for(True, 1, per_node=per_node)
        cell = corpus.count_bin(per_node)
        ps = [p for p in held if p.error is not None and corpus.cell_of(p) == ("one node", cell, "synthetic")]
        assert b.cases == len(ps) >= 19 and (b.lo, b.hi) == conformal(new_source(ps))
        assert b.sources >= 3 and b.held_of == b.cases and b.held == corpus._band_of("x", ps, spreads).held
        assert f"at {'up to ' if cell > 2 else ''}{cell} GPUs, synthetic data" in b.source
    assert corpus.count_bin(3) == 4 and corpus.count_bin(5) == 8 and corpus.count_bin(16) == 16
    # across nodes the synthetic-data cells hold under 19 points: both pipelines together, planned from one GPU or
    # from a measured node of as many GPUs (a cell of its own)
    node = band.band_for(True, 2, node_gbit=400.0, from_node=True, per_node=8)
    ps = [p for p in held if p.error is not None and corpus.cell_of(p)[:2] == ("across nodes, from a measured node", 2)]
    assert node.cases == len(ps) >= 19 and (node.lo, node.hi) == conformal(new_source(ps))
    assert "synthetic" not in node.source and node != band.band_for(True, 2, node_gbit=400.0, per_node=8)
    # Every published point over links under 50 Gbit/s a node went through parameter servers: not predicted, so
    # that cell has no band, and says so.
    slow = band.band_for(True, 4, node_gbit=10.0)
    assert slow.cases == 0 and slow.text() == (
        "no band: no published point across nodes over links under 50 Gbit/s a node at up to 4 nodes"
    )
    other = band.band_for(True, 1, other_batch=True, per_node=2)
    one = band.gpu_band(1, 2)
    assert (other.lo, other.hi) == (one.lo * band.batch_band().lo, one.hi * band.batch_band().hi)


def test_a_row_across_nodes_from_one_gpu_takes_a_nodes_band_times_the_nodes_band_validated_on_its_own_points():
    """Planned from one GPU, a row across nodes makes two steps, one GPU to a node of its GPUs and that node to the
    nodes, and its error is their product: on the corpus each such point's measured / predicted is within 4% of its
    series' one-node ratio times its from-a-measured-node ratio (the model reads a sample's compute from each base).
    So its band is the two cells' bands multiplied edge by edge (one node at the node's GPUs, synthetic data; from a
    measured node at the nodes, both pipelines where synthetic holds too few), a node of one GPU taking the nodes'
    alone; its validation is every prediction across that many nodes from one GPU against the band composed for its
    own node and pipeline without its source; at counts whose nodes' step has under 5 points, no band, said so."""
    _, series = corpus.load()
    plain = [p for p in corpus.points(series) if p.error is not None]
    ratio = {(p.series.name, p.row.per_node, p.row.nodes, p.kind): 1 / (1 + p.error) for p in plain}
    ratio |= {(p.series.name, p.row.per_node, p.row.nodes, p.kind): 1 / (1 + p.error)
              for p in corpus.points(corpus.from_nodes(series)) if p.error is not None}  # fmt: skip
    products = [
        ratio[name, n, 1, "one node"] * ratio[name, n, nodes, "across nodes, from a measured node"] / r
        for (name, n, nodes, kind), r in ratio.items()
        if kind == "across nodes" and (name, n, 1, "one node") in ratio
        and (name, n, nodes, "across nodes, from a measured node") in ratio
    ]  # fmt: skip
    assert len(products) >= 150 and all(abs(x - 1) < 0.04 for x in products)
    _, held, _ = corpus.predicted(series)
    for nodes, per_node in ((2, 8), (2, 4), (4, 8), (2, 1)):
        row = band.band_for(True, nodes, node_gbit=400.0, per_node=per_node)
        node = band.band_for(True, 1, per_node=per_node) if per_node > 1 else band.unchecked("none")
        across = band.band_for(True, nodes, node_gbit=400.0, from_node=True)
        assert row.lo == pytest.approx(across.lo * (node.lo if node.cases else 1))
        assert row.hi == pytest.approx(across.hi * (node.hi if node.cases else 1))
        assert row.cases == min(across.cases, node.cases or across.cases) and row.sources >= 3
        from_one = [p for p in held if p.error is not None and p.kind == "across nodes"]
        assert row.held_of == sum(corpus.count_bin(p.row.nodes) == nodes for p in from_one)
        assert row.held >= 0.85 * row.held_of  # the bar, validation: 75 of 84 and 68 of 77 (2026-12-03)
    far = band.band_for(True, 16, node_gbit=400.0, per_node=8)
    assert far.cases == 0 and "under 5" in far.text() and "a measured node's step to the nodes" in far.text()


def new_source(points):
    """What a new source could measure, written out: each source's median measured / predicted, times each point's
    ratio to its own source's median (in logs, a centre plus a deviation); sorted."""
    by_source = {}
    for p in points:
        by_source.setdefault(p.series.source, []).append(1 / (1 + p.error))
    centres = {s: statistics.median(math.log(r) for r in v) for s, v in by_source.items()}
    deviations = [math.log(r) - centres[s] for s, v in by_source.items() for r in v]
    return sorted(math.exp(c + d) for c in centres.values() for d in deviations)


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
    found = make_points({"a": [0.0] * 10, "b": [0.02, -0.02] * 5, "c": [1.0, 1.0]})
    (b,) = corpus.kind_bands(found).values()
    # a's band from b and c: centres about 1.0002 and 0.5, b's ratios about 2% either side of its centre and c's
    # none: 24 cases, the least to the most, about 0.49 to 1.02, around a's ten 1.0s
    # b's band from a and c (centres 1.0 and 0.5, every deviation 0): 0.5 to 1.0, around b's five 1/1.02s only
    # c's band from a and b (centres 1.0 and about 1.0002): about 0.98 to 1.02: c's 0.5s fall below it
    assert (b.held, b.held_of, b.points, b.sources) == (10 + 5 + 0, 22, 22, 3)
    assert (b.lo, b.hi) == conformal(new_source(found)) and b.lo < 0.5 and b.hi > 1.0


def test_a_band_is_for_a_new_source_each_source_one_centre_however_many_its_points():
    """A user's cluster is a new source: sources differ more than one source's runs do, so every source's median
    counts once, with every point's deviation from its own median. Pooled, the 40 points of one source would set the
    band alone (1.0 to 1.01) and a second source one point at +10% would be outside it; for a new source the band
    reaches it (a centre times a ratio: 1.1 x 1.01 at the most). One source's cases are themselves, exactly (the
    CPU and batch checks' bands)."""
    big, one = [1.0] * 38 + [0.99, 1.01], [1.10]
    assert corpus.band_edges(big + one) == (1.0, 1.01)  # pooled: ranks 2 and 41 of 41
    cases = corpus.new_source_cases({"big": big, "one": one})
    assert len(cases) == 2 * 41 and cases[0] == pytest.approx(0.99) and cases[-1] == pytest.approx(1.1 * 1.01)
    assert corpus.band_of_sources({"big": big, "one": one}) == pytest.approx((1.0, 1.10))  # ranks 4 and 79 of 82
    ratios = [1 / 3, 0.7, 1.3, 0.9]
    assert corpus.new_source_cases({"x": ratios}) == sorted(ratios)
    assert corpus.band_of_sources({"x": ratios}) == (1 / 3, 1.3)


def test_the_cpu_band_is_this_machines_recorded_checks_at_the_rows_count():
    for workers in (2, 4):
        cpu = band.band_for(False, per_node=workers)
        ratios = [m / p for _, _, n, p, m in band.CPU_CHECKS if n == workers]
        assert cpu.cases == len(ratios) >= 6 and (cpu.lo, cpu.hi) == (min(ratios), max(ratios))
        assert cpu.source.startswith(f"{workers} processes on this machine's 2 CPU cores") and cpu.marks[0] == "few"
    eight = band.band_for(False, per_node=8)  # never checked: said, not borrowed
    assert eight.cases == 0 and eight.text() == (
        "no band: no check at 8 processes on this machine's 2 CPU cores (checked: 2, 4)"
    )


def test_a_cpu_prediction_across_nodes_takes_the_band_of_the_checks_across_hosts():
    """The single-host band (-9% to +45%) did not hold two hosts unshaped (-13% with STRAGGLER, -17% before it):
    predictions across nodes carry the band of the cases measured across hosts, on both sides of the model since
    resnet18 and vgg_small at 300 Mbit/s (+11%, -16%). Only 2 hosts were checked."""
    hosts = band.band_for(False, nodes=2)
    ratios = [measured / predicted for *_, predicted, measured in band.HOST_CHECKS]
    assert hosts.cases == len(band.HOST_CHECKS) >= 3 and (hosts.lo, hosts.hi) == (min(ratios), max(ratios))
    assert hosts.lo < band.cpu_band().lo and not band.cpu_band().holds(1035.2, 897.7) and hosts.holds(1035.2, 897.7)
    assert hosts.lo < 0.84 and hosts.hi > 1.1 and hosts.holds(19.7, 21.8) and hosts.holds(73.4, 61.3)
    assert band.band_for(False, nodes=4).cases == 0 and "no check at 4 hosts" in band.band_for(False, nodes=4).text()
    assert band.band_for(False, nodes=1) == band.cpu_band() and band.band_for(True, nodes=2) == band.gpu_band(2)


def test_the_sources_kept_out_of_every_fit_and_band_test_the_model_and_its_bands(capsys):
    """planner/figures/test, predicted as a plan predicts (STRAGGLER's constants, from the base row and from the
    measured node): HKBU's BERT-Large on 4 PCIe V100s is predicted at 2.7x what was published (its 1.34 GB of
    gradients cross PCIe far slower than the line rate the model takes), its ResNet-50 5% short; each point
    counted in its band where the band its cell would print holds it, none where its cell has none (HKBU's 10 GbE
    runs: no corpus point is of that kind)."""
    from ddplab.planner.command import show_corpus

    found = [p for p in band.unseen_points() if p.error is not None]
    one_node = {(p.series.name.split(" (")[0], p.series.inter): p.error for p in found if p.kind == "one node"}
    large, resnet = [
        [e for (name, _), e in one_node.items() if name == m] for m in ("BERT-Large MG-WFBP", "ResNet-50 MG-WFBP")
    ]
    assert len(large) == len(resnet) == 3  # one run of the node a network series: three runs of the same 4 GPUs
    assert all(1.6 < e < 1.8 for e in large) and all(-0.06 < e < -0.05 for e in resnet)
    tested = band.unseen_table(found)
    bands = [band.point_band(p) for p in found]
    inside = sum(b.holds(p.predicted, p.published) for b, p in zip(bands, found, strict=True) if b.cases)
    none = sum(not b.cases for b in bands)
    assert none == sum(p.kind == "link under 50 Gbit/s" for p in found) > 0
    assert (
        f"  all predictions {' ' * 22} {len(found):>6}" in tested
        and f"{inside} of {len(found) - none}, {none} none" in tested
    )
    assert "kept out of every fit and band" in tested and band.unseen_table([]) == ""
    assert not {p.series.source for p in found} & {p.series.source for p in corpus.points(corpus.load()[1])}
    assert show_corpus() == 0 and capsys.readouterr().out.endswith(f"\n\n{tested}\n")  # plan --corpus, last
