"""The corpus of published scaling figures (planner/figures, planner/corpus.py): what it holds, each point's
arithmetic, the reader's refusals, and the predictions it sets against the figures."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from ddplab.errors import DataError
from ddplab.planner import corpus, links
from ddplab.planner.links import Link
from ddplab.planner.model import Spread

SOURCES, SERIES = corpus.load()
POINTS = corpus.points(SERIES)
UNSEEN_SOURCES, UNSEEN = corpus.load_unseen()  # planner/figures/test: never in a fit or a band
TRANSFORMERS = ("bert", "gpt", "vit", "transformer", "llama")


def test_the_corpus_spans_what_the_band_must_hold():
    """At least 150 points from 8 independent sources (one file a publisher): CNNs and transformers, one node
    and many (8 to 512+ GPUs), fp32 and mixed precision, the per-GPU and the global batch kept."""
    assert len(POINTS) >= 150
    assert len({s["publisher"] for s in SOURCES.values()}) == len(SOURCES) >= 8
    models = {s.model for s in SERIES}
    assert any(m.startswith(TRANSFORMERS) for m in models) and {"resnet50", "vgg16"} <= models
    assert {p.kind for p in POINTS + corpus.points(corpus.from_nodes(SERIES))} == set(corpus.KINDS)
    assert max(p.row.gpus for p in POINTS) >= 512 and any(p.row.nodes >= 8 for p in POINTS)
    assert {"fp32", "amp-fp16"} <= {s.precision for s in SERIES}
    assert {"pcie3", "pcie4", "nvlink2", "nvlink3"} <= {s.intra for s in SERIES}
    assert {"ib-edr", "ib-hdr", "eth-10g", "aries"} <= {s.inter for s in SERIES}


def test_the_test_sources_are_kept_out_of_the_corpus():
    """The sources of planner/figures/test are read by load_unseen alone: none of them is in a fit, a band or the
    validation figures, and no publisher is in both."""
    assert len(UNSEEN_SOURCES) >= 2 and not set(UNSEEN_SOURCES) & set(SOURCES)
    assert not {s["publisher"] for s in UNSEEN_SOURCES.values()} & {s["publisher"] for s in SOURCES.values()}
    assert {s.source for s in SERIES}.isdisjoint({s.source for s in UNSEEN})


@pytest.mark.parametrize("series", SERIES + UNSEEN, ids=lambda s: f"{s.source}: {s.name[:60]}")
def test_each_series_arithmetic(series):
    """Units, the base rate, what was scaled: a point's throughput is the row's figure in samples a second (per
    GPU figures times the GPUs, times converted to rates), scaling at most a little past linear (more is a
    transcription error), and a kept global batch splits into whole micro-batches."""
    base = series.rows[0]
    for row in series.rows:
        rate = series.samples_per_s(row)
        assert rate > 0 and math.isfinite(rate)
        if series.unit in corpus.RATES and series.unit != "tokens/s":
            assert rate == row.value * (row.gpus if series.per == "gpu" else 1)
        if series.keep == "global":
            assert series.local(row) == int(series.local(row)) >= 1, row
            assert series.batch_per_step(row) == series.global_batch
        else:
            assert row.accumulate == 1 and series.local(row) == series.local_batch
    for row in series.rows[1:]:
        ideal = row.gpus / base.gpus
        assert 0 < series.samples_per_s(row) / series.samples_per_s(base) <= 1.3 * ideal, row
    source = {**SOURCES, **UNSEEN_SOURCES}[series.source]
    assert series.fields["where"] and source["where"] and source["date"]


def test_a_point_is_predicted_from_its_base_row_alone(monkeypatch):
    """One GPU as the base: the model's rate for the row (on an ideal link, with no DDP work: N times the base);
    a base of several GPUs: the model's ratio to the base times the base's figure."""
    monkeypatch.setitem(links.CLASSES, "ideal", Link("ideal", 1e12, 0.0, "test"))
    fields = {**SERIES[0].fields, "params": 1e6, "layers": 0, "intra": "ideal", "inter": "ideal", "nics": 1,
              "unit": "images/s", "per": "job", "keep": "local", "local_batch": 32}  # fmt: skip
    series = corpus._series("test", {**fields, "rows": [[1, 1, 100.0], [2, 1, 190.0], [8, 4, 3000.0]]}, "test")
    found = corpus.points([series])
    assert [round(p.predicted, 9) for p in found] == [200.0, 3200.0]
    assert [round(p.error, 9) for p in found] == [round(200 / 190 - 1, 9), round(3200 / 3000 - 1, 9)]
    # Between nodes over 1 Gbit/s: 4 MB of gradients cost about 60 ms a step against 0.32 s of compute; a base
    # of one node of 8 (on the ideal link) is predicted as published, the two nodes below twice its rate.
    slow = corpus._series("test", {**fields, "inter": "eth-1g", "rows": [[8, 1, 800.0], [8, 2, 1400.0]]}, "test")
    (p,) = corpus.points([slow])
    assert p.kind == "link under 50 Gbit/s"
    comm = links.CLASSES["eth-1g"].allreduce_s(4e6, 16)
    assert 1600 * 0.32 / (0.32 + comm) <= p.predicted < 1600 * 0.99


def test_a_base_that_ran_ddp_has_ddps_own_work_in_its_rate_already(monkeypatch):
    """DDP_HOST is what a base without DDP never did: added to every row of several GPUs, so a series whose rows
    scale perfectly is predicted short of them by that much. A base that ran under DDP (a script that wraps the
    model at any world size) did it already: nothing is added, and perfect scaling is predicted."""
    from ddplab.planner.model import DDP_HOST_PER_LAYER_S, host_s

    monkeypatch.setitem(links.CLASSES, "ideal", Link("ideal", 1e12, 0.0, "test"))
    fields = {**SERIES[0].fields, "params": 1e6, "layers": 100, "intra": "ideal", "inter": "ideal", "nics": 1,
              "unit": "images/s", "per": "job", "keep": "local", "local_batch": 32,
              "rows": [[1, 1, 100.0], [4, 1, 400.0]], "base_ran_ddp": False}  # fmt: skip
    (plain,) = corpus.points([corpus._series("t", fields, "t")])
    (ran,) = corpus.points([corpus._series("t", {**fields, "base_ran_ddp": True}, "t")])
    step = 32 / 100.0  # the base's step: 32 images at 100 images/s
    assert ran.predicted == pytest.approx(400.0) and ran.steps[0].own_s == ran.steps[1].own_s == pytest.approx(step)
    assert plain.predicted == pytest.approx(400.0 * step / (step + 100 * DDP_HOST_PER_LAYER_S))
    # Where a row's step is bound by its host (a tiny model's step: microseconds of compute), a base that ran DDP
    # had DDP's work in its floor as well as in its rate: the floor is the launches and DDP's work together, as it is
    # where DDP_HOST is added to a base without DDP
    quick = {**fields, "rows": [[1, 1, 1e6], [4, 1, 4e6]]}
    (plain_q,) = corpus.points([corpus._series("t", quick, "t")])
    (ran_q,) = corpus.points([corpus._series("t", {**quick, "base_ran_ddp": True}, "t")])
    floor = host_s(100, under_ddp=True)
    assert floor == pytest.approx(host_s(100) + 100 * DDP_HOST_PER_LAYER_S)
    assert ran_q.steps[0].own_s == ran_q.steps[1].own_s == pytest.approx(floor)
    assert plain_q.steps[1].own_s == pytest.approx(floor) and plain_q.steps[0].own_s == pytest.approx(host_s(100))
    # In the corpus: the series whose scripts were read to wrap DDP at one GPU, each file saying where
    flagged = {}
    for s in SERIES:
        if s.fields.get("base_ran_ddp"):
            flagged[s.source] = flagged.get(s.source, 0) + 1
    assert flagged == {
        "csc-ml-benchmarks": 9,
        "paik-ddp-scaling-benchmark-2026": 12,
        "torres-supercomputing-for-ai-2026": 2,
        "lambda-deeplearning-benchmark": 2,
        "dlperf": 4,
    }
    with pytest.raises(DataError, match="base_ran_ddp"):
        corpus._checked({**fields, "name": "n", "where": "w", "model": "m", "gpu": "g", "data": "real",
                         "precision": "fp32", "allreduce": "nccl", "base_ran_ddp": "yes"},
                        corpus.SERIES, corpus.REQUIRED, "t")  # fmt: skip


def test_kinds_and_why_a_point_is_not_predicted():
    by_kind = {p.kind for p in POINTS if p.series.keep == "global"}
    assert by_kind == {"strong scaling"}
    assert all(p.kind == "one node" for p in POINTS if p.row.nodes == 1 and p.series.rows[0].nodes == 1
               and p.series.keep == "local")  # fmt: skip
    unpredicted = [p for p in POINTS if p.predicted is None]
    assert unpredicted and all(p.why_not for p in unpredicted) and len(unpredicted) < len(POINTS) / 2
    assert all(p.predicted is None for p in POINTS if p.series.fields["allreduce"] in corpus.NOT_ALL_REDUCE)
    one_process = [p for p in POINTS if p.series.fields.get("processes") == "node"]
    assert one_process and all(p.why_not == corpus.ONE_PROCESS_A_NODE for p in one_process)


def test_what_lambdas_scripts_ran_is_what_the_corpus_predicts():
    """Read from the scripts, not the table: Transformer-XL ran as N processes training N copies (DLE's train.py
    wraps DDP only with --multi_gpu ddp, which Lambda never passes), so no row of it is a data-parallel figure; runs
    dated while benchmark_pytorch.sh exported NCCL_P2P_DISABLE=1 (2022-10-16 to 2023-02-06) moved gradients over
    the host's PCIe, whatever NVLink the machine had; and a series is one machine (the RTX 6000 Ada's workstation
    rows and server rows are two series, the server's predicted from its own 4 GPUs)."""
    lambda_ = [s for s in SERIES if s.source == "lambda-deeplearning-benchmark"]
    txl = [s for s in lambda_ if s.model.startswith("transformer-xl")]
    assert len(txl) == 12 and all(s.fields["allreduce"] == "none" for s in txl)
    unwrapped = [p for p in POINTS if p.series in txl]
    assert unwrapped and {p.why_not for p in unwrapped} == {corpus.NOT_ALL_REDUCE["none"]}
    dated = {s.name: re.search(r"Runs (\d{4}-\d{2}-\d{2})", s.fields["note"]) for s in lambda_}
    assert [name for name, runs in dated.items() if runs is None] == [s.name for s in lambda_ if "B200" in s.name]
    no_p2p = [s for s in lambda_ if dated[s.name] and "2022-10-16" <= dated[s.name][1] < "2023-02-06"]
    assert len(no_p2p) == 32 and all(s.intra.startswith("pcie") for s in no_p2p)
    pcie_of = {"V100 SXM2 16GB": "pcie3", "A100 SXM4 80GB": "pcie4"}  # what each NVLink board's GPUs sit on
    assert {s.fields["gpu"]: s.intra for s in no_p2p if s.fields["gpu"] in pcie_of} == pcie_of
    assert {s.intra for s in lambda_ if "H100 80GB SXM5" in s.name} == {"nvlink4"}  # 2023-02-14: P2P back on
    ada = [s for s in lambda_ if "RTX 6000 Ada" in s.name]
    assert sorted({tuple(r.gpus for r in s.rows) for s in ada}) == [(1, 2), (4, 8)]
    assert all(("workstation" in s.name) == (s.rows[0].gpus == 1) for s in ada)


def test_one_process_a_node_is_predicted_only_where_it_drives_one_gpu():
    """The model is DDP's, one process a GPU: a source whose one process drives a node's GPUs is another model
    wherever a node has more than one GPU, and the same model where it has one."""
    fields = {**SERIES[0].fields, "params": 1e6, "layers": 0, "intra": "nvlink2", "inter": "ib-edr", "nics": 1,
              "unit": "images/s", "per": "job", "keep": "local", "local_batch": 32, "processes": "node"}  # fmt: skip
    node = corpus._series("t", {**fields, "rows": [[1, 1, 100.0], [8, 1, 700.0]]}, "t")
    alone = corpus._series("t", {**fields, "rows": [[1, 1, 100.0], [1, 4, 390.0]]}, "t")
    (p,) = corpus.points([node])
    (q,) = corpus.points([alone])
    assert (p.predicted, p.why_not) == (None, corpus.ONE_PROCESS_A_NODE)
    assert q.predicted is not None and q.why_not is None
    unknown = corpus._series(
        "t", {**fields, "processes": "gpu", "allreduce": "unknown", "rows": node.fields["rows"]}, "t"
    )
    assert corpus.points([unknown])[0].why_not == corpus.NOT_ALL_REDUCE["unknown"]


def test_a_series_is_predicted_again_from_its_measured_node():
    """Across nodes from a node of as many GPUs (a plan from a measured node): the base is that node's row, whose
    own shortfall (an input pipeline, a host) the prediction then carries; rows of another count a node, one-node
    rows and strong scaling are not predicted so."""
    fields = {**SERIES[0].fields, "params": 1e6, "layers": 0, "intra": "nvlink2", "inter": "ib-edr", "nics": 1,
              "unit": "images/s", "per": "job", "keep": "local", "local_batch": 32}  # fmt: skip
    rows = [[1, 1, 100.0], [4, 1, 300.0], [8, 1, 400.0], [8, 2, 780.0], [8, 4, 1500.0], [4, 2, 590.0]]
    s = corpus._series("t", {**fields, "rows": rows}, "t")
    again = corpus.from_nodes([s])
    assert [(a.rows[0].per_node, [r.gpus for r in a.rows[1:]]) for a in again] == [(4, [8]), (8, [16, 32])]
    by_gpus = {p.row.gpus: p for p in corpus.points([again[1]])}
    # From the node's 400 images/s (half the ideal of 800): 2 and 4 such nodes at about 800 and 1600, not the
    # 1600 and 3200 the first row (100 images/s on one GPU) promises.
    assert by_gpus[16].kind == "across nodes, from a measured node" and 700 < by_gpus[16].predicted <= 800
    assert 1400 < by_gpus[32].predicted <= 1600
    assert {p.kind for p in corpus.points([s]) if p.row.nodes > 1} == {"across nodes"}
    strong = corpus._series("t", {**fields, "keep": "global", "global_batch": 256, "rows": rows}, "t")
    assert corpus.from_nodes([strong]) == []
    plain, held, _ = corpus.predicted([s])
    assert len(plain) == 5 and len(held) == 5 + 3 and sum(p.series.from_node for p in held) == 3


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "src-x.toml"
    path.write_text(text)
    return path


SOURCE_TABLE = """[source]
id = "src-x"
title = "t"
where = "w"
date = "2020-01"
publisher = "p"
framework = "f"
notes = ""
"""
SERIES_TABLE = """[[series]]
name = "n"
where = "table 1"
model = "resnet50"
params = 25.56e6
layers = 107
gpu = "V100"
intra = "nvlink2"
inter = "ib-edr"
nics = 1
data = "synthetic"
precision = "fp32"
allreduce = "nccl"
unit = "images/s"
per = "job"
keep = "local"
local_batch = 64
"""


@pytest.mark.parametrize(
    "edit, says",
    [
        ("rows = [[1, 1, 100.0], [8, 1, 700.0]]", None),
        ("rows = [[1, 1, 100.0]]", "needs its base row and at least one more"),
        ("rows = [[1, 1, 100.0], [1, 1, 90.0]]", "more GPUs than the base"),
        ("rows = [[1, 1, 100.0], [1.5, 1, 90.0]]", "not [GPUs per node, nodes, figure]"),
        ("rows = [[1, 1, 100.0], [0, 1, 90.0]]", "rows is"),
        ("rows = [[1, 1, 100.0], [2, 1, -5.0]]", "rows is"),
        ("rows = [[1, 1, 100.0], [2, 1, 190.0, 2]]", "accumulation steps only where the global batch is kept"),
        ('keep = "global"\nrows = [[1, 1, 100.0], [2, 1, 190.0]]', "needs global_batch"),
        ('rows = [[1, 1, 100.0], [2, 1, 190.0]]\nintra = "nvlink9"', "intra is"),
    ],
)
def test_the_reader_names_the_file_and_what_is_wrong(tmp_path, edit, says):
    text = SOURCE_TABLE + SERIES_TABLE + edit + "\n"
    if 'keep = "global"' in edit:
        text = text.replace('keep = "local"\n', "")
    if "intra = " in edit:
        text = text.replace('intra = "nvlink2"\n', "")
    path = write(tmp_path, text)
    if says is None:
        source, series = corpus.read_file(path)
        assert source["id"] == "src-x" and series[0].rows[1].gpus == 8
        return
    with pytest.raises(DataError, match=str(path).replace(".", r"\.")) as exc:
        corpus.read_file(path)
    assert says in str(exc.value)


def test_a_file_named_otherwise_than_its_source_or_without_fields_is_refused(tmp_path):
    path = tmp_path / "other.toml"
    path.write_text(SOURCE_TABLE + SERIES_TABLE + "rows = [[1, 1, 1.0], [2, 1, 2.0]]\n")
    with pytest.raises(DataError, match="not the file's name"):
        corpus.read_file(path)
    path = write(tmp_path, SOURCE_TABLE + SERIES_TABLE.replace('unit = "images/s"\n', "") + "rows = [[1, 1, 1.0]]\n")
    with pytest.raises(DataError, match="lacks unit"):
        corpus.read_file(path)


def test_the_table_prints_every_source_and_kind_with_and_without_the_term():
    held, spreads = corpus.held_out([p for p in POINTS if p.steps is not None])
    text = corpus.table(POINTS, held, spreads)
    assert all(source in text for source in SOURCES) and all(p.kind in text for p in held)
    assert "fitted leave-one-source-out" in text and "not predicted:" in text


def series_of(source, rows, local_batch=32):
    fields = {"name": source, "model": "m", "params": 1e6, "layers": 0, "intra": "nvlink2", "inter": "ib-edr",
              "nics": 1, "precision": "fp32", "unit": "images/s", "per": "job", "keep": "local",
              "local_batch": local_batch, "rows": rows}  # fmt: skip
    return corpus._series(source, fields, source)


def published_at(spread, source, gpus=(2, 4, 8), nodes=1):
    """A series whose published figures are exactly what the model predicts at STRAGGLER's `spread`: rows of
    `gpus` GPUs on one node each, or across `nodes` of that many GPUs."""
    draft = series_of(source, [[1, 1, 100.0]] + [[g, nodes, 100.0 * g * nodes] for g in gpus])
    rows = [[1, 1, 100.0]] + [[p.row.per_node, nodes, p.predicted] for p in corpus.points([draft], spread)]
    return series_of(source, rows)


def test_straggler_slows_a_step_by_the_most_of_n_normals_times_each_spread():
    step = corpus.Step(own_s=0.3, exposed_s=0.01, workers=8, samples=256)
    assert step.rate(Spread()) == pytest.approx(256 / 0.31)
    assert step.rate(Spread(0.04, 0.5)) == pytest.approx(256 / (0.3 * (1 + 1.4236 * 0.04) + 0.01), rel=1e-4)
    across = corpus.Step(own_s=0.3, exposed_s=0.01, workers=8, samples=256, nodes=4)  # a node's spread, of 4
    assert across.rate(Spread(0.04, 0.02)) == pytest.approx(
        256 / (0.3 * (1 + 1.4236 * 0.04 + 1.0294 * 0.02) + 0.01), rel=1e-4
    )
    assert corpus.Step(0.3, 0.0, 1, 32).rate(Spread(0.5, 0.5)) == pytest.approx(32 / 0.3)  # one GPU waits for nobody


def test_the_spreads_are_fitted_out_of_sample_one_source_at_a_time():
    """Figures made with spreads of 3% (a GPU's) and 2% (a node's) are fitted back to them; a source is predicted
    with the spreads the others give (leave-one-source-out), never its own."""
    made = Spread(0.03, 0.02)
    assert corpus.fit_spread(corpus.points([published_at(made, "a"), published_at(made, "a", nodes=4)])) == made
    found = corpus.points([published_at(Spread(0.05), "c", gpus=(8,))] + [published_at(Spread(0.02), s) for s in "abd"])
    held, spreads = corpus.held_out(found)
    assert spreads == {s: Spread(0.02) for s in "abcd"}  # c's 5% is never its own fit, and outvoted in the others'
    assert all(p.spread == spreads[p.series.source] for p in held)
    assert all(abs(p.error) < 1e-9 for p in held if p.series.source != "c")
    assert all(p.error > 0.01 for p in held if p.series.source == "c")  # predicted faster than its stragglers let it


def test_sources_weigh_alike_in_the_fit_however_many_points_each_has():
    """One source of many rows (a benchmark run over many settings on one cluster) does not set the spread every
    other machine is planned with: seven points at 2% against two sources of one point each at 3%."""
    many = published_at(Spread(0.02), "many", gpus=(2, 3, 4, 5, 6, 7, 8))
    one = [published_at(Spread(0.03), source, gpus=(8,)) for source in "bc"]
    assert corpus.fit_spread(corpus.points([many, *one])) == Spread(0.03)


def test_the_spreads_the_model_uses_are_the_corpus_fit():
    """planner/model's GPU_STEP_CV and NODE_STEP_CV are recorded, not recomputed at each plan: they must be what
    the corpus fits."""
    from ddplab.planner.model import GPU_STEP_CV, NODE_STEP_CV

    assert corpus.fit_spread([p for p in POINTS if p.steps is not None]) == Spread(GPU_STEP_CV, NODE_STEP_CV)
