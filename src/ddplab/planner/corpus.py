"""Published data-parallel scaling figures, and how far the scaling model is from each of them.

planner/figures/ holds one TOML file per source (a benchmark page, a paper, a project's result
files), each figure transcribed as printed with its provenance: which table, the hardware and links
the source states, the precision, the per-GPU or global batch kept. A series is one model on one
kind of machine: its first row is the base the others scale from, and every later row is a point.

The model predicts a point from its base row alone, as `ddplab plan` predicts a run from one
measured step: the base's rate gives a GPU's compute per sample, the series' links and the model's
size give the all-reduce, and the prediction is the model's rate for the point's GPUs, scaled by
what the model gets wrong at the base (nothing, where the base is one GPU). The error is
predicted / published - 1: positive is the model promising more than the source measured.

Points fall in one kind each, the first that applies: strong scaling (the global batch kept),
a link under 50 Gbit/s a node between nodes, across nodes, one node. A series with a one-node row
of several GPUs and rows across nodes of as many GPUs a node is predicted a second time from that
node (`from_nodes`), as a run is planned from a measured node: the kind "across nodes, from a
measured node", whose base carries what the node itself loses (its input pipeline, its host).
Torch-free.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from ddplab.errors import DataError
from ddplab.io.borders import FLAG, TABLE, TEXT, WHOLE, Kind, check, list_of, number, one_of
from ddplab.planner.links import CLASSES, GBIT, Link
from ddplab.planner.model import Spread, StepCosts, ddp_work_s, host_s, predict_one, straggler_waits_s

NO_SPREAD = Spread()  # STRAGGLER left out
RATES = ("images/s", "sequences/s", "tokens/s", "samples/s")  # throughput as printed
NOT_ALL_REDUCE = {  # gradients exchanged otherwise than DDP's all-reduce: another model than this one
    "parameter-server": "gradients through parameter servers, not an all-reduce",
    "torch-dataparallel": "nn.DataParallel: one process scattering and gathering, not DDP",
    "unknown": "the source does not say how gradients were exchanged",
    "none": "each process trained its own copy: no gradients exchanged",
}
# The model is DDP's: one process a GPU, each with its own host thread launching its GPU's work. One process
# driving all of a node's GPUs (tf.distribute's mirrored strategies, tf_cnn_benchmarks) shares one host among them.
ONE_PROCESS_A_NODE = "one process drives all of a node's GPUs, not one process a GPU as in DDP"
TIMES = {"s/step": 1.0, "ms/step": 1e-3, "s/epoch": 1.0}  # a time as printed, in seconds
SLOW_LINK_GBIT = 50.0  # a node's network under this (ports x rate) is the slow-link kind
KINDS = ("strong scaling", "link under 50 Gbit/s", "across nodes, from a measured node", "across nodes", "one node")
KIND_WORDS = {
    "strong scaling": "with the global batch kept",
    "link under 50 Gbit/s": "across nodes over links under 50 Gbit/s a node",
    "across nodes, from a measured node": "across nodes, planned from a measured node of as many GPUs",
    "across nodes": "across nodes",
    "one node": "on one node",
}
PRECISIONS = ("fp32", "tf32", "amp-fp16", "amp-bf16", "fp16", "bf16")
HALF_GRADIENTS = ("fp16", "bf16")  # the whole model in half precision: 2-byte gradients (autocast keeps fp32's)
FIGURES = "figures"  # planner/figures/*.toml, package data
TEST = "test"  # planner/figures/test/*.toml: the sources held out of every choice (load_unseen)

SOURCE = {"id": TEXT, "title": TEXT, "where": TEXT, "date": TEXT, "publisher": TEXT, "framework": TEXT, "notes": TEXT}
LINK_NAME = Kind(
    "a link class named in planner/links.CLASSES, or unknown", lambda v: v in CLASSES or v in ("unknown", "")
)
SERIES = {
    "name": TEXT,
    "where": TEXT,
    "model": TEXT,
    "params": number(0),  # 0: not stated (the series' points are not predicted)
    "params_from": TEXT,
    "layers": WHOLE,
    "gpu": TEXT,
    "hardware": TEXT,
    "intra": LINK_NAME,
    "inter": LINK_NAME,
    "nics": WHOLE,
    "data": one_of("synthetic", "real"),
    "precision": one_of(*PRECISIONS),
    "allreduce": TEXT,
    "unit": one_of(*RATES, *TIMES),
    "per": one_of("job", "gpu"),
    "keep": one_of("local", "global"),
    "local_batch": WHOLE,
    "global_batch": WHOLE,
    "rows": list_of(list_of(number(above=0))),
    "note": TEXT,
    "tokens_per_sample": WHOLE,  # tokens/s: a sample's tokens (its sequence length), where the source states it
    "processes": one_of("gpu", "node"),  # one process a GPU (as DDP; the default), or one driving a node's GPUs
    "base_ran_ddp": FLAG,  # the base row ran under DDP too (a script that wraps the model at any world size)
}
OPTIONAL = (
    "note",
    "global_batch",
    "params_from",
    "hardware",
    "where",
    "tokens_per_sample",
    "processes",
    "base_ran_ddp",
)
REQUIRED = tuple(k for k in SERIES if k not in OPTIONAL)


def kind_for(nodes: int, node_gbit: float | None = None, strong: bool = False, from_node: bool = False) -> str:
    """The kind of a prediction, the first that applies: strong scaling (the global batch kept), across nodes over
    a node's network under SLOW_LINK_GBIT, across nodes from a measured node of as many GPUs (`from_node`), across
    nodes, one node (node_gbit None: not known, not slow)."""
    if strong:
        return KINDS[0]
    if nodes > 1:
        if node_gbit is not None and node_gbit < SLOW_LINK_GBIT:
            return KINDS[1]
        return KINDS[2] if from_node else KINDS[3]
    return KINDS[4]


@dataclass(frozen=True)
class Row:
    per_node: int
    nodes: int
    value: float  # as printed, in the series' unit
    accumulate: int = 1

    @property
    def gpus(self) -> int:
        return self.per_node * self.nodes


@dataclass(frozen=True)
class Series:
    source: str  # the source's id
    name: str
    model: str
    params: float
    layers: int
    intra: str
    inter: str
    nics: int
    precision: str
    unit: str
    per: str
    keep: str
    local_batch: int
    global_batch: int
    rows: tuple[Row, ...]
    fields: dict[str, Any]  # everything the file says of it (provenance included)
    from_node: bool = False  # its base is a node of several GPUs (from_nodes), not the series' first row

    def samples_per_s(self, row: Row) -> float:
        """The job's throughput at `row`, in samples per second (an epoch's time: in epochs, as a ratio)."""
        if self.unit in RATES:
            tokens = self.fields.get("tokens_per_sample") or 1 if self.unit == "tokens/s" else 1
            return row.value * (row.gpus if self.per == "gpu" else 1) / tokens
        seconds = row.value * TIMES[self.unit]
        if self.unit == "s/epoch":
            return 1.0 / seconds
        return self.batch_per_step(row) / seconds

    def local(self, row: Row) -> float:
        """A GPU's micro-batch at `row`."""
        return self.global_batch / (row.gpus * row.accumulate) if self.keep == "global" else self.local_batch

    def batch_per_step(self, row: Row) -> float:
        return self.local(row) * row.gpus * row.accumulate

    def node_link(self) -> Link | None:
        """The link between nodes as a node has it: its ports together (one where the source does not say)."""
        link = CLASSES.get(self.inter)
        if link is None:
            return None
        return Link(link.name, link.busbw_gbps * max(1, self.nics), link.alpha_s, link.source)

    def kind(self, row: Row) -> str:
        link = self.node_link()
        node_gbit = link.busbw_gbps / GBIT if link is not None else None
        return kind_for(max(row.nodes, self.rows[0].nodes), node_gbit, self.keep == "global", self.from_node)

    def unpredictable(self) -> str | None:
        """Why the model cannot predict this series' points (a link it does not name), or None."""
        if self.fields.get("allreduce") in NOT_ALL_REDUCE:
            return NOT_ALL_REDUCE[self.fields["allreduce"]]
        if self.fields.get("processes") == "node" and any(r.per_node > 1 for r in self.rows):
            return ONE_PROCESS_A_NODE
        if self.intra in ("unknown", "") and any(r.per_node > 1 for r in self.rows):
            return "the source does not say how a node's GPUs connect"
        if self.inter in ("unknown", "") and any(r.nodes > 1 for r in self.rows):
            return "the source does not say what links its nodes"
        if not self.params or (self.keep == "local" and not self.local_batch):
            return "the source does not state the model's size or its batch"
        if self.unit == "s/epoch":
            return "an epoch's time says nothing of a step's without the epoch's samples"
        if self.unit == "tokens/s" and not self.fields.get("tokens_per_sample"):
            return "tokens a second say nothing of a step's samples without the sequence length"
        return None


@dataclass(frozen=True)
class Step:
    """The model's step for a row, apart from STRAGGLER: what a worker does, and the all-reduce left exposed."""

    own_s: float
    exposed_s: float
    workers: int
    samples: float  # the job's samples a step
    nodes: int = 1

    def rate(self, spread: Spread) -> float:
        """Samples a second at STRAGGLER's `spread` (the slowest of the workers, and of the nodes, sets the step)."""
        wait = straggler_waits_s(self.own_s, self.workers, self.nodes, spread)
        return self.samples / (self.own_s + wait + self.exposed_s)


@dataclass(frozen=True)
class Point:
    series: Series
    row: Row
    published: float  # samples per second (or epochs per second), the job's
    predicted: float | None  # None: not predictable (why in `why_not`)
    why_not: str | None
    steps: tuple[Step, Step] | None = None  # the model's step at the base row and at this row
    spread: Spread = NO_SPREAD  # STRAGGLER's spreads `predicted` was made with

    def at(self, spread: Spread) -> Point:
        """This point predicted at STRAGGLER's `spread`: the model's ratio to the base times the base's rate."""
        if self.steps is None:
            return self
        base, row = self.steps
        predicted = row.rate(spread) / base.rate(spread) * self.series.samples_per_s(self.series.rows[0])
        return replace(self, predicted=predicted, spread=spread)

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.published - 1

    @property
    def kind(self) -> str:
        return self.series.kind(self.row)

    @property
    def speedup(self) -> float:
        """Published throughput over the base row's."""
        return self.published / self.series.samples_per_s(self.series.rows[0])


def read_file(path: Path) -> tuple[dict[str, Any], list[Series]]:
    """One source's file: its [source] table and its series, checked (a DataError names the file and field)."""
    import tomllib

    where = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DataError(f"{where}: cannot read it ({exc})") from None
    source = _checked(data.get("source"), SOURCE, tuple(SOURCE), f"{where}, [source]")
    if source["id"] != path.stem:
        raise DataError(f"{where}: source.id is {source['id']!r}, not the file's name {path.stem!r}")
    series = []
    for i, raw in enumerate(data.get("series") or []):
        at = f"{where}, series {i + 1}"
        series.append(_series(source["id"], _checked(raw, SERIES, REQUIRED, at), at))
    if not series:
        raise DataError(f"{where}: no [[series]]")
    return source, series


def _checked(data: Any, schema: dict[str, Kind], required: tuple[str, ...], at: str) -> dict[str, Any]:
    TABLE.check(data, at, "it")
    missing = [name for name in required if name not in data]
    if missing:
        raise DataError(f"{at} lacks {', '.join(missing)} (planner/figures/README.md says what each field holds)")
    return check(data, schema, at)


def _series(source: str, s: dict[str, Any], at: str) -> Series:
    rows = []
    for r in s["rows"]:
        if len(r) not in (3, 4) or not all(float(x).is_integer() and x >= 1 for x in (r[:2] + r[3:])):
            raise DataError(f"{at}: a row is {r}, not [GPUs per node, nodes, figure] (and accumulation steps)")
        rows.append(Row(int(r[0]), int(r[1]), float(r[2]), int(r[3]) if len(r) == 4 else 1))
    if len(rows) < 2:
        raise DataError(f"{at}: a series needs its base row and at least one more")
    if any(r.gpus <= rows[0].gpus for r in rows[1:]):
        raise DataError(f"{at}: every row after the base must have more GPUs than the base ({rows[0].gpus})")
    keep = s["keep"]
    if keep == "global" and not s.get("global_batch"):
        raise DataError(f"{at}: keep = 'global' needs global_batch")
    if keep == "local" and any(r.accumulate != 1 for r in rows):
        raise DataError(f"{at}: accumulation steps only where the global batch is kept")
    return Series(
        source=source,
        name=s["name"],
        model=s["model"],
        params=float(s["params"]),
        layers=int(s["layers"]),
        intra=s["intra"],
        inter=s["inter"],
        nics=int(s["nics"]),
        precision=s["precision"],
        unit=s["unit"],
        per=s["per"],
        keep=keep,
        local_batch=int(s["local_batch"]),
        global_batch=int(s.get("global_batch") or 0),
        rows=tuple(rows),
        fields=dict(s),
    )


def figures_dir() -> Path:
    return Path(str(resources.files("ddplab.planner").joinpath(FIGURES)))


def load_unseen() -> tuple[dict[str, dict[str, Any]], list[Series]]:
    """The sources of planner/figures/test: transcribed after the model's terms, the band's rule and its cells were
    fixed (2026-12-03), and kept out of every fit and every band (a decision made after one look at their errors
    inside the corpus, said in BENCHMARKS.md), so what they say of the model is a test, not validation. Nothing may
    be chosen looking at them; a source moved into the corpus stops being a test."""
    return load(figures_dir() / TEST)


def load(folder: Path | None = None) -> tuple[dict[str, dict[str, Any]], list[Series]]:
    """Every source in `folder` (planner/figures by default): {id: source table}, and all their series."""
    sources, series = {}, []
    for path in sorted((folder or figures_dir()).glob("*.toml")):
        source, found = read_file(path)
        sources[source["id"]] = source
        series.extend(found)
    return sources, series


def _step(s: Series, row: Row, per_sample_s: float) -> Step:
    """The model's step for `row`, a GPU computing a sample in `per_sample_s` (no STRAGGLER: Step.rate adds it)."""
    local = s.local(row)
    ran_ddp = bool(s.fields.get("base_ran_ddp"))
    costs = StepCosts(
        data_per_image_s=0.0,
        compute_per_image_s=per_sample_s,
        optimizer_s=0.0,
        rest_s=0.0,
        accumulate=row.accumulate,
        train_images=math.ceil(s.batch_per_step(row)),
        grad_bytes=s.params * (2 if s.precision in HALF_GRADIENTS else 4),
        bucket_cap_mb=25.0,
        on_cuda=True,
        measured=None,
        # DDP_HOST: what a base without DDP never did; a base that ran DDP (at world size 1 its reducer still hooks
        # every gradient, fills the buckets and launches their all-reduces) has it in its rate already
        ddp_host_s=0.0 if ran_ddp else ddp_work_s(s.layers),
        host_s=host_s(s.layers, under_ddp=ran_ddp),  # HOST_FLOOR: a host-bound row pays what a base under DDP hid
    )
    intra = CLASSES.get(s.intra) or CLASSES["pcie3"]  # one GPU a node: never used
    p = predict_one(costs, row.per_node, row.nodes, max(1, round(local)), intra, s.node_link())
    return Step(p.step_s - p.exposed_comm_s, p.exposed_comm_s, row.gpus, row.gpus * local * row.accumulate, row.nodes)


def points(series: list[Series], spread: Spread = NO_SPREAD) -> list[Point]:
    """Every point of every series, predicted from its base row at STRAGGLER's `spread` (or not predicted, with
    why). The base's rate gives a GPU's compute per sample, taking the base's own GPUs as ideal; the prediction
    is the model's ratio to the base times the base's rate, which takes that back out."""
    out = []
    for s in series:
        base, why = s.rows[0], s.unpredictable()
        if why is not None:
            out += [Point(s, row, s.samples_per_s(row), None, why) for row in s.rows[1:]]
            continue
        per_sample = base.gpus / s.samples_per_s(base)
        base_step = _step(s, base, per_sample)
        for row in s.rows[1:]:
            steps = (base_step, _step(s, row, per_sample))
            out.append(Point(s, row, s.samples_per_s(row), None, None, steps).at(spread))
    return out


def from_nodes(series: list[Series]) -> list[Series]:
    """Each series again, based on its measured node: for each count of GPUs a node with rows across nodes, the
    one-node row of that many GPUs as the base and those rows as the points (weak scaling, predictable series)."""
    out = []
    for s in series:
        if s.keep != "local" or s.rows[0].nodes != 1 or s.unpredictable() is not None:
            continue
        for base in s.rows:
            across = tuple(r for r in s.rows if r.nodes > 1 and r.per_node == base.per_node)
            if base.nodes == 1 and base.per_node > 1 and across:
                out.append(replace(s, rows=(base, *across), from_node=True))
    return out


def predicted(series: list[Series]) -> tuple[list[Point], list[Point], dict[str, Spread]]:
    """Every point as the corpus checks it: predicted from its series' first row without STRAGGLER (`plain`), and
    out of sample (`held`: STRAGGLER's spreads fitted without the point's source, on the first-row predictions
    alone), the latter with the points predicted again from a measured node (from_nodes); and the spreads."""
    plain = points(series)
    held, spreads = held_out(plain)
    again = [p.at(spreads[p.series.source]) for p in points(from_nodes(series)) if p.steps is not None]
    return plain, held + again, spreads


CV_GRID = tuple(i / 400 for i in range(81))  # STRAGGLER's spreads: 0 to 20% by 0.25%


def fit_spread(
    found: list[Point], gpu_grid: tuple[float, ...] = CV_GRID, node_grid: tuple[float, ...] = CV_GRID
) -> Spread:
    """STRAGGLER's spreads that predict `found` best: the GPU's from the points on one node (a node's spread
    does not reach them), then the node's from the points across nodes, each the first on its grid with the least
    mean over sources of a source's median |error|. Sources weigh alike: one benchmark of many rows on one
    cluster (dlperf: 220 of 427 points) would otherwise set the constants every other machine is planned with.
    A grid of (0.0,) leaves that spread out (benchmarks/planner_terms.py)."""
    terms: dict[bool, dict[str, list[tuple[Step, Step, float]]]] = {False: {}, True: {}}  # across nodes -> source
    for p in found:  # what an error at any spread is made of, read once: the two steps, base figure / published
        if p.steps is not None:
            ratio = p.series.samples_per_s(p.series.rows[0]) / p.published
            terms[p.steps[1].nodes > 1].setdefault(p.series.source, []).append((*p.steps, ratio))

    def error(by_source: dict[str, list[tuple[Step, Step, float]]], spread: Spread) -> float:
        return statistics.fmean(
            statistics.median(abs(row.rate(spread) / base.rate(spread) * ratio - 1) for base, row, ratio in ts)
            for ts in by_source.values()
        )

    gpu = min(gpu_grid, key=lambda cv: error(terms[False], Spread(cv))) if terms[False] else 0.0
    node = min(node_grid, key=lambda cv: error(terms[True], Spread(gpu, cv))) if terms[True] else 0.0
    return Spread(gpu, node)


def held_out(found: list[Point]) -> tuple[list[Point], dict[str, Spread]]:
    """Every predicted point predicted out of sample: with the spreads fitted on the other sources' points alone
    (leave-one-source-out), and those spreads by source."""
    found = [p for p in found if p.steps is not None]
    spreads, out = {}, []
    for source in sorted({p.series.source for p in found}):
        spreads[source] = fit_spread([p for p in found if p.series.source != source])
        out += [p.at(spreads[source]) for p in found if p.series.source == source]
    return out, spreads


def summary(found: list[Point], key) -> list[dict[str, Any]]:
    """Per group of `key(point)`: points, sources, median and worst |error|, the share below the published
    figure, and the central 90% of errors (5th to 95th percentile)."""
    groups: dict[str, list[Point]] = {}
    for p in found:
        if p.error is not None:
            groups.setdefault(key(p), []).append(p)
    rows = []
    for name, ps in sorted(groups.items()):
        errors = sorted(p.error for p in ps if p.error is not None)
        rows.append(
            {
                "group": name,
                "points": len(errors),
                "sources": len({p.series.source for p in ps}),
                "median_abs": statistics.median(abs(e) for e in errors),
                "worst": max(errors, key=abs),
                "below": sum(e < 0 for e in errors) / len(errors),
                **dict(zip(("p5", "p95"), central(errors), strict=True)),
            }
        )
    return rows


def central(values: list[float]) -> tuple[float, float]:
    """The 5th and 95th percentiles of `values`, linear between order statistics: the tables' 5%..95% columns, which
    describe the points (a band's edges are band_edges')."""
    if len(values) == 1:
        return values[0], values[0]
    cuts = statistics.quantiles(values, n=20, method="inclusive")
    return cuts[0], cuts[-1]


def table(plain: list[Point], held: list[Point], spreads: dict[str, Spread]) -> str:
    """The errors by source and by kind, as `ddplab plan --corpus` prints them: without STRAGGLER (`plain`) and
    with it, its spreads fitted without each point's source (`held`, which holds the predictions from
    a measured node too: a kind of their own, left out of the errors by source)."""
    lines = []
    predicted = [p for p in plain if p.error is not None]
    again = [p.at(NO_SPREAD) for p in held if p.series.from_node]
    fitted = ""
    if spreads:
        gpu, node = [sorted(getattr(s, side) for s in spreads.values()) for side in ("gpu", "node")]
        fitted = f": a GPU's {gpu[0]:.2%} to {gpu[-1]:.2%}, a node's {node[0]:.2%} to {node[-1]:.2%}"
    lines.append(
        f"{len(predicted)} points predicted from their series' base rows ({len(plain) - len(predicted)} not: why at "
        f"the end); error = predicted / published - 1. Without STRAGGLER, and with it (its step spreads fitted "
        f"leave-one-source-out{fitted}, by the source left out)\n{VALIDATION}"
    )
    head = (
        f"  {'':38} {'points':>6}   {'without: median |err|':>21} {'below':>5}   {'validation: median |err|':>24} "
        f"{'below':>5} {'5%..95%':>13} {'worst':>6}"
    )
    first = [p for p in held if not p.series.from_node]
    for title, key in (("by source", lambda p: p.series.source), ("by kind", lambda p: p.kind)):
        lines += [f"\n{title}:", head]
        if title == "by source":
            rows = list(zip(summary(predicted, key), summary(first, key), strict=True))
            rows += zip(summary(predicted, lambda p: "all"), summary(first, lambda p: "all"), strict=True)
        else:
            rows = list(zip(summary(predicted + again, key), summary(held, key), strict=True))
        for a, b in rows:
            lines.append(
                f"  {a['group'][:38]:38} {a['points']:>6}   {a['median_abs']:>21.1%} {a['below']:>5.0%}   "
                f"{b['median_abs']:>24.1%} {b['below']:>5.0%} {b['p5']:>+6.0%}..{b['p95']:<+6.0%} {b['worst']:>+6.0%}"
            )
    why_not = Counter((p.series.source, p.why_not) for p in plain if p.why_not is not None)
    if why_not:
        lines.append("\nnot predicted:")
        lines.extend(f"  {source}: {n} points ({why})" for (source, why), n in sorted(why_not.items()))
    return "\n".join(lines)


VALIDATION = (
    "These errors and the bands' coverage are validation, not test figures: the model's terms (STRAGGLER's spreads, "
    "DDP_HOST, HOST_FLOOR, LINK_QUEUE, BATCH_BOUND), the band's method and thresholds (90% split-conformal ranks over "
    "what a new source could measure: each source's median plus each point's deviation from its own, chosen over the "
    "pooled points and three parametric widenings; 19 cases and 3 sources, else marked few; past +-30%, marked wide; "
    "under 5 cases, no band), its cells (kind, count, input pipeline; across nodes from one GPU, a node's band times "
    "the nodes') and which series to read again were all chosen while looking at them. Two sources are held back "
    "for a test (NVIDIA DeepLearningExamples' performance tables, Horovod's benchmark page): nothing of them is here. "
    "Two more, transcribed after all of it was fixed, are the test at the end."
)


@dataclass(frozen=True)
class KindBand:
    """The band of one kind of prediction (or one cell of a kind: a count and an input pipeline): the central 90%
    of what a new source could measure there, measured / predicted (`band_of_sources`), and how well the same rule
    held out of sample (each source's points against the band drawn from the other sources alone: validation, since the
    model's terms were chosen looking at these figures)."""

    kind: str
    lo: float  # measured / predicted, the low edge of its 90% (band_of_sources)
    hi: float  # the high edge
    points: int
    sources: int
    # each source's held-out points inside the band drawn without it: (source, inside, of), by source
    held_by_source: tuple[tuple[str, int, int], ...] = ()

    @property
    def held(self) -> int:
        return sum(inside for _, inside, _ in self.held_by_source)

    @property
    def held_of(self) -> int:
        return sum(of for _, _, of in self.held_by_source)


def band_edges(values: list[float], share: float = 0.90) -> tuple[float, float]:
    """A band meant to hold a new point with chance `share`, from n points: the order statistics of ranks
    floor((n + 1) (1 - share) / 2) and ceil((n + 1) (1 + share) / 2), the split-conformal choice, which holds a
    new point exchangeable with them at least that often. Percentiles interpolated between order statistics
    (`central`) describe the n points and hold fewer new ones: each source's points against the band of the
    others' (kind_bands), on the corpus of 2026-11-28 (seventh session: 272 one-node points) the one-node band
    held 211 of 272 at percentiles, 221 at these ranks, the band from a measured node 143 and 149 of 170. Under
    19 points the ranks fall outside the n: the least and the most, which hold a new point (n - 1) / (n + 1) of
    the time, under 90% (band.Band marks such a band "few")."""
    v = sorted(values)
    n = len(v)
    tail = (n + 1) * (1 - share) / 2  # 2.0 for 39 points, within a rounding: (1 - 0.9) is 0.0999...
    lo = max(1, math.floor(tail + 1e-9))
    hi = min(n, math.ceil(n + 1 - tail - 1e-9))
    return v[lo - 1], v[hi - 1]


def new_source_cases(by_source: dict[str, list[float]]) -> list[float]:
    """What a source not among these could measure (measured / predicted): every source's median times every
    point's ratio to its own source's median (in logs: a centre plus a deviation), each source counted once for
    where it sits. A user's cluster is such a new source, and sources differ more than one source's runs do (a
    lab's hosts, software, how it timed): pooled, the cases are exchangeable within a source, not across sources,
    and one source of many points sets the band alone. One source: its own cases unchanged, so a band of one
    machine's checks is their own central 90%. Chosen (2026-12-03) looking at the validation figures, against the
    pooled cases and three parametric widenings (BENCHMARKS.md, "The bands for a new source")."""
    if len(by_source) == 1:
        return sorted(*by_source.values())
    centres, deviations = centres_and_deviations(by_source)
    return sorted(math.exp(c + d) for c in centres for d in deviations)


def centres_and_deviations(by_source: dict[str, list[float]]) -> tuple[list[float], list[float]]:
    """In logs of measured / predicted: each source's median, and every point's deviation from its own source's."""
    logs = [[math.log(r) for r in v] for v in by_source.values()]
    centres = [statistics.median(v) for v in logs]
    return centres, [r - c for c, v in zip(centres, logs, strict=True) for r in v]


def band_of_sources(by_source: dict[str, list[float]]) -> tuple[float, float]:
    """The one rule for every band ddplab prints: the central 90% (band_edges' ranks) of the cases a new source could
    measure (new_source_cases). Meant to hold 90%, it cannot promise it across sources: with K of them, a new
    source's median lies outside the K medians' range with chance 2 / (K + 1), so how often it holds is measured
    (validation, leave-one-source-out; the test sources), not assumed."""
    return band_edges(new_source_cases(by_source))


def _ratios(ps: list[Point]) -> dict[str, list[float]]:
    """Measured / predicted by source."""
    by_source: dict[str, list[float]] = {}
    for p in ps:
        if p.error is not None:
            by_source.setdefault(p.series.source, []).append(1 / (1 + p.error))
    return by_source


Rule = Callable[[dict[str, list[float]]], tuple[float, float]]  # ratios by source -> a band's edges


def _without(ps: list[Point], source: str | None, spreads: dict[str, Spread] | None) -> dict[str, list[float]]:
    """Measured / predicted by source of the points not of `source`, predicted with the spreads fitted without it
    (`spreads`; None, or no source left out: as they are), so that nothing of a source is in its test."""
    spread = None if spreads is None or source is None else spreads[source]
    return _ratios([p if spread is None else p.at(spread) for p in ps if p.series.source != source])


def _band_of(name: str, ps: list[Point], spreads: dict[str, Spread] | None, rule: Rule = band_of_sources) -> KindBand:
    """The band of these points, with its coverage out of sample: a source's points against the band of the other
    sources' points (`_without`)."""
    held = []
    for source in sorted({p.series.source for p in ps}):
        others = _without(ps, source, spreads)
        if not others:
            continue
        lo, hi = rule(others)
        own = _ratios([p for p in ps if p.series.source == source]).get(source, [])
        held.append((source, sum(lo <= r <= hi for r in own), len(own)))
    ratios = _ratios(ps)
    return KindBand(name, *rule(ratios), sum(map(len, ratios.values())), len(ratios), tuple(held))


def kind_bands(found: list[Point], spreads: dict[str, Spread] | None = None) -> dict[str, KindBand]:
    """One band per kind of the predicted points (each as `held_out` predicted it), each validated leave-one-source-
    out (`_band_of`)."""
    by_kind: dict[str, list[Point]] = {}
    for p in found:
        if p.error is not None:
            by_kind.setdefault(p.kind, []).append(p)
    return {kind: _band_of(kind, ps, spreads) for kind, ps in by_kind.items()}


def count_of(p: Point) -> int:
    """What a point's cell counts: its GPUs on one node (or with the global batch kept), its nodes across nodes."""
    return p.row.gpus if p.kind in (KINDS[0], KINDS[4]) else p.row.nodes


def count_bin(n: int) -> int:
    """The count a cell holds: 2, then up to 4, up to 8, ... (a row of 3 GPUs is in the cell of 4)."""
    b = 2
    while b < n:
        b *= 2
    return b


def cell_of(p: Point) -> tuple[str, int, str]:
    """A point's cell: its kind, its count's bin (count_bin) and its input pipeline (the series' data: synthetic,
    or real, read by a host pipeline that may bound it)."""
    return p.kind, count_bin(count_of(p)), p.series.fields["data"]


def cell_bands(
    found: list[Point], spreads: dict[str, Spread] | None = None, rule: Rule = band_of_sources
) -> dict[tuple[str, int, str], KindBand]:
    """One band per cell of the predicted points, and per (kind, count) with both pipelines together (pipeline
    ""), each validated leave-one-source-out (`_band_of`; `rule`: another band rule, benchmarks/band_rules.py)."""
    cells: dict[tuple[str, int, str], list[Point]] = {}
    for p in found:
        if p.error is not None:
            kind, count, data = cell_of(p)
            cells.setdefault((kind, count, data), []).append(p)
            cells.setdefault((kind, count, ""), []).append(p)
    return {key: _band_of(cell_words(*key), ps, spreads, rule) for key, ps in sorted(cells.items())}


FEWEST_CASES, FEWEST_SOURCES = 19, 3  # under 19 cases a 90% band's ranks fall outside them (band_edges)


def few(cases: int, sources: int) -> bool:
    """Whether a band's edges are drawn from a handful: under FEWEST_CASES cases or FEWEST_SOURCES sources."""
    return cases < FEWEST_CASES or sources < FEWEST_SOURCES


FROM_ONE_GPU = KINDS[3]  # across nodes, planned from one GPU: a band composed of two cells' (composed_bands)
FACTORS = (KINDS[4], KINDS[2])  # its two steps: one GPU to a node of them, then that node to the nodes


def per_node_bin(per_node: int) -> int:
    """A node's GPUs as a composed band counts them: 1 (the node is the one GPU: no step within it), else count_bin."""
    return 1 if per_node == 1 else count_bin(per_node)


def composed_bands(
    found: list[Point], spreads: dict[str, Spread] | None = None, rule: Rule = band_of_sources
) -> dict[tuple[int, int, str], KindBand]:
    """The band of a prediction across nodes planned from one GPU, by (nodes' count bin, a node's GPUs' bin, input
    pipeline). Such a prediction makes two steps, and its measured / predicted is their product: the model's rate at
    the row over its rate at one GPU is the rate at the row over the node's, times the node's over one GPU's (on the
    corpus, the product of a series' one-node and from-a-measured-node ratios is its from-one-GPU ratio within 4% on
    the 158 of 172 points whose series have the node's row: the model reads a sample's compute from each base, the
    one GPU's or the node's). So its
    band is the two steps' bands multiplied edge by edge, each step's from its own cell (one node at the node's GPUs;
    from a measured node at the nodes), as a prediction at a local batch not measured carries the batch checks'
    band besides its cell's (band.Band.and_): each step drawn from the points that measure it (121 on one node at up
    to 8 GPUs), not from the 84 across 2 nodes planned from one GPU, two thirds of them one source's. A product of
    two bands holds whenever both steps do. Each step takes its pipeline's cell where that is not few (19 cases, 3
    sources), else both pipelines' (band.cell_band's rule). Validation: every prediction across nodes from one GPU
    at that count of nodes (both pipelines, any node size) against the band composed for its own node size and
    pipeline from the other sources alone (leave-one-source-out, STRAGGLER fitted without its source), the same for
    every key at that count."""
    predicted = [p for p in found if p.error is not None]

    @functools.cache
    def step(kind: str, count: int, data: str, without: str | None) -> dict[str, list[float]]:
        def ratios(pipeline: str) -> dict[str, list[float]]:
            cell = [
                p for p in predicted if cell_of(p)[:2] == (kind, count) and pipeline in ("", p.series.fields["data"])
            ]
            return _without(cell, without, spreads)

        refined = ratios(data)
        return refined if not few(sum(map(len, refined.values())), len(refined)) else ratios("")

    @functools.cache
    def composed(nodes: int, per_node: int, data: str, without: str | None = None) -> KindBand | None:
        steps = [step(FACTORS[1], nodes, data, without)]
        if per_node > 1:
            steps.append(step(FACTORS[0], per_node, data, without))
        if not all(steps):
            return None
        lo, hi = math.prod(rule(s)[0] for s in steps), math.prod(rule(s)[1] for s in steps)
        cases = min(sum(map(len, s.values())) for s in steps)
        return KindBand(composed_words(nodes, per_node, data), lo, hi, cases, min(len(s) for s in steps))

    across = [p for p in predicted if p.kind == FROM_ONE_GPU]
    held: dict[int, tuple[tuple[str, int, int], ...]] = {}
    for nodes in sorted({count_bin(p.row.nodes) for p in across}):
        at = [p for p in across if count_bin(p.row.nodes) == nodes]
        by_source = []
        for source in sorted({p.series.source for p in at}):
            inside = of = 0
            for p in at:
                if p.series.source == source:
                    b = composed(nodes, per_node_bin(p.row.per_node), p.series.fields["data"], source)
                    if b is not None:
                        inside, of = inside + (b.lo <= 1 / (1 + p.error) <= b.hi), of + 1  # type: ignore[operator]
            if of:
                by_source.append((source, inside, of))
        held[nodes] = tuple(by_source)
    out = {}
    for nodes in sorted({count_bin(count_of(p)) for p in predicted if p.kind == FACTORS[1]}):
        for per_node in (1, 2, 4, 8):
            for data in ("synthetic", "real"):
                b = composed(nodes, per_node, data)
                if b is not None:
                    out[nodes, per_node, data] = replace(b, held_by_source=held.get(nodes, ()))
    return out


def composed_words(nodes: int, per_node: int, data: str) -> str:
    """A composed band as its text names it (composed_bands)."""
    where = f"up to {nodes}" if nodes > 2 else "2"
    node = "1 GPU" if per_node == 1 else f"{'up to ' if per_node > 2 else ''}{per_node} GPUs"
    pipeline = {"synthetic": ", synthetic data (images on the device)", "real": ", real data", "": ""}[data]
    return f"across {where} nodes of {node} from one GPU (a node's step times the nodes'){pipeline}"


def cell_words(kind: str, count: int, data: str) -> str:
    """A cell as a band's text names it: "on one node at 2 GPUs, synthetic data (images on the device)"."""
    where = f"up to {count}" if count > 2 else "2"
    counted = f"at {where} GPUs" if kind in (KINDS[0], KINDS[4]) else f"at {where} nodes"
    pipeline = {"synthetic": ", synthetic data (images on the device)", "real": ", real data", "": ""}[data]
    return f"{KIND_WORDS[kind]} {counted}{pipeline}"
