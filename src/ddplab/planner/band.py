"""How far the scaling model has been off where it could be checked: the band beside each prediction.

One rule for every band ddplab prints (corpus.band_of_sources): the checked cases of a prediction's cell, measured /
predicted training throughput, by source; what a new source could measure is every source's median times every
case's ratio to its own source's median (a user's cluster is a new source, and sources differ more than one source's
cases do), and the band is the central 90% of that (corpus.band_edges' split-conformal ranks). It is meant to hold
90% and cannot promise it across a handful of sources: how often it holds is measured, leave-one-source-out
(validation) and on two sources kept out of every fit and band (the test, planner/figures/test). For one source's
checks (this machine's, one H100's) it is their own central 90% (under 19 cases the least to the most). A prediction
P is shown with [P x lo, P x hi]. Every band is printed as a range, marked where it is weak: "few" (fewer than 19
cases or 3 independent sources: its edges are drawn from a handful) and "wide" (reaching past -30% or +30%). A cell
fewer than 5 cases cover has no band, and says so: it never borrows another cell's.

- GPU predictions: the published figures of planner/figures (planner/corpus.py), one cell per kind (one node;
  across nodes planned from a measured node of as many GPUs; across nodes over a link under 50 Gbit/s a node),
  per count (GPUs on one node, nodes across nodes: 2, up to 4, up to 8, ...) and per input pipeline: a ddplab run
  holds its images on the device, as the sources' synthetic-data runs do, so its rows take the synthetic-data
  cell where it holds 19 points from 3 sources, else the cell of both pipelines (the real-data runs, whose host
  input pipeline bounds them, err further below). Across nodes planned from one GPU, two steps and their two
  cells' bands multiplied (a node's on one node, the nodes' from a measured node: corpus.composed_bands). Each is
  recomputed with today's model each time, with its validation: each source's points against the band drawn from
  the other sources alone (leave-one-source-out). The model's terms were chosen looking at these very figures, so
  the coverage is a validation figure, not a test's.
- CPU predictions on one node: this machine's 2- and 4-worker runs against the model, per worker count
  (`benchmarks/plan_validation.py`, recorded below with the date and the model they met).
- GPU predictions at a local batch other than the measured one carry, besides, the band of one H100's runs
  at local batches 32 to 1024 planned from each other (BATCH_BOUND: never above the measured rate per step,
  so mostly far below: the model does not know where a GPU's step stops being bound by its launches).
- CPU predictions across nodes: two hosts (network namespaces) at four link rates against one
  (`benchmarks/network.py`, three models), recorded likewise.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

from ddplab.planner import corpus
from ddplab.planner.corpus import (
    FEWEST_CASES,
    FEWEST_SOURCES,
    FROM_ONE_GPU,
    band_of_sources,
    cell_bands,
    composed_bands,
)

if TYPE_CHECKING:
    from ddplab.planner.corpus import Point, Spread
    from ddplab.planner.planfile import BandPart

LEAST_CASES = 5  # under 5 cases a cell has no band: one or two points' errors are anecdotes, not a range
TRUST_WITHIN = 0.30  # a band reaching past -30% or +30% is marked wide
SYNTHETIC = "synthetic"  # a ddplab run's images sit on its device: the pipeline of the sources' synthetic-data runs


@dataclass(frozen=True)
class Band:
    """How far measured throughput has been from the model's prediction over one cell's checked cases."""

    lo: float  # measured / predicted throughput, the low edge of its central 90% (corpus.band_of_sources)
    hi: float  # the high edge
    cases: int  # 0: no case covers this cell (no band)
    source: str  # what the cases are: the cell and where they come from
    held: int = 0  # validation: cases inside the band drawn without their own source (0 of 0: not validated so)
    held_of: int = 0
    sources: int = 1  # independent sources among the cases

    @property
    def marks(self) -> tuple[str, ...]:
        """("few",), ("wide",), both or none: how a weak band is marked."""
        if not self.cases:
            return ()
        wide = self.lo < 1 - TRUST_WITHIN or self.hi > 1 + TRUST_WITHIN
        return tuple(m for m, on in (("few", corpus.few(self.cases, self.sources)), ("wide", wide)) if on)

    @property
    def mark(self) -> str:
        return ", ".join(self.marks)

    def around(self, predicted: float) -> tuple[float, float]:
        return predicted * self.lo, predicted * self.hi

    def holds(self, predicted: float, measured: float) -> bool:
        """Whether a measured figure lies in this band around its prediction (a speedup or a throughput)."""
        return self.lo <= measured / predicted <= self.hi

    def text(self) -> str:
        if not self.cases:
            return f"no band: {self.source}"
        validated = ""
        if self.held_of:
            validated = f"; validation: {self.held} of {self.held_of} inside the band drawn from the other sources"
        elif self.sources < 2:
            validated = "; not validated out of sample (one source)"
        few = f"few: under {FEWEST_CASES} cases or {FEWEST_SOURCES} sources, its edges are drawn from a handful"
        if self.cases >= FEWEST_CASES:
            few = f"few: under {FEWEST_SOURCES} sources"
        why = {"few": few, "wide": f"wide: past {-TRUST_WITHIN:+.0%} or {TRUST_WITHIN:+.0%}"}
        marked = "".join(f" [{why[m]}]" for m in self.marks)
        cases = "case" if self.cases == 1 else "cases"
        sources = f"{self.sources} source" + ("s" if self.sources != 1 else "")
        return (
            f"measured {self.lo - 1:+.0%} to {self.hi - 1:+.0%} of the prediction over {self.cases} {cases} from "
            f"{sources} ({self.source}){validated}{marked}"
        )

    def beyond(self) -> str:
        """What a figure outside this band lies beyond."""
        return "90% of the checked cases of its kind" if self.cases >= FEWEST_CASES else "any checked case"

    def to_json(self) -> BandPart:
        # Band's fields are BandPart's first ones (tests/unit/planner/test_planfile.py)
        return cast("BandPart", {**asdict(self), "marks": list(self.marks)})

    def and_(self, other: Band) -> Band:
        """A prediction that carries both cells' errors (a GPU count and a local batch not measured); no band where
        either has none."""
        if not self.cases or not other.cases:
            return self if not self.cases else other
        return Band(
            self.lo * other.lo,
            self.hi * other.hi,
            min(self.cases, other.cases),
            f"{self.source}; times {other.source}",
            sources=min(self.sources, other.sources),
        )


def from_ratios(ratios: list[float], source: str, sources: int = 1, held: int = 0, held_of: int = 0) -> Band:
    """The band of one source's cases by the one rule (corpus.band_of_sources): for one source, their central
    90%."""
    if not ratios:
        raise ValueError(f"no checked cases for a band ({source})")
    return Band(*band_of_sources({source: ratios}), len(ratios), source, held, held_of, sources)


def unchecked(what: str) -> Band:
    """A cell no case covers: no band, and what was not checked."""
    return Band(1.0, 1.0, 0, what)


# `DDPLAB_DATA=../shared/data/cifar10-jpeg python benchmarks/plan_validation.py` on a 2-core VM (AMD EPYC, torch
# 2.13.0+cpu, 2026-11-26; BENCHMARKS.md), the model with LINK_QUEUE and the last micro-batch's window:
# (case, local batch, workers, predicted, measured) training images/s, DDP over Gloo on the same 2 cores.
CPU_CHECKS: tuple[tuple[str, int, int, float, float], ...] = (
    ("cifar", 16, 2, 1402.0, 1447.0),
    ("cifar", 16, 4, 1308.0, 1377.0),
    ("cifar", 32, 2, 1986.0, 2070.0),
    ("cifar", 32, 4, 1871.0, 1954.0),
    ("cifar", 128, 2, 2183.0, 2520.0),
    ("cifar", 128, 4, 2157.0, 3129.0),
    ("tiny", 16, 2, 2818.0, 3438.0),
    ("tiny", 16, 4, 2491.0, 2679.0),
    ("tiny", 32, 2, 4142.0, 5103.0),
    ("tiny", 32, 4, 3781.0, 4257.0),
    ("tiny", 128, 2, 12732.0, 14540.0),
    ("tiny", 128, 4, 11883.0, 10774.0),
)


# `sudo DDPLAB_DATA=../shared/data/cifar10-jpeg python benchmarks/network.py --repeats 2` (simple_cnn, 8,192
# images) and `... --model vgg_small --subset 2048 --test-subset 256` on the same VM (2026-11-26), with the model
# of CPU_SERIAL and STRAGGLER (its kept runs planned again): (model, link, local batch, predicted, measured)
# training images/s of 2 hosts x 1 process against the model planned from the one-host run and the link measured
# at that rate. The last two: `... --rates 300mbit --model M --subset 1024 --test-subset 256 --batch-size 64
# --repeats 1` (2026-11-28, one run a side): both nets' buckets ran under backward as DDP made them (a comm hook's
# timing), which CPU_SERIAL says never happens on a CPU: resnet18 came out above the prediction, vgg_small below
# (BENCHMARKS.md, "A CPU's all-reduce does hide behind backward"). The last eight: all of them run again the same
# ways with one repeat a side (2026-11-28, sixth session; "The overlap on a CPU, tried as a rule and left out").
HOST_CHECKS: tuple[tuple[str, str, int, float, float], ...] = (
    ("simple_cnn", "100mbit", 64, 405.6, 382.3),
    ("simple_cnn", "1gbit", 64, 944.2, 863.3),
    ("simple_cnn", "unshaped", 64, 1035.2, 897.7),
    ("vgg_small", "100mbit", 64, 55.0, 53.0),
    ("vgg_small", "1gbit", 64, 81.6, 78.2),
    ("vgg_small", "unshaped", 64, 84.5, 82.9),
    ("resnet18", "300mbit", 32, 19.7, 21.8),
    ("vgg_small", "300mbit", 32, 73.4, 61.3),
    ("simple_cnn", "100mbit", 64, 393.8, 390.9),
    ("simple_cnn", "1gbit", 64, 872.7, 906.1),
    ("simple_cnn", "unshaped", 64, 953.9, 895.0),
    ("vgg_small", "100mbit", 64, 56.2, 51.3),
    ("vgg_small", "1gbit", 64, 83.2, 74.8),
    ("vgg_small", "unshaped", 64, 86.4, 86.5),
    ("resnet18", "300mbit", 32, 20.5, 22.3),
    ("vgg_small", "300mbit", 32, 69.9, 61.0),
)


# `bash scripts/device_check.sh planner` on one H100 (torch 2.11.0+cu130, 2026-11-26; BENCHMARKS.md, "The planner's
# GPU side"), twice (a fresh machine each, the second with the first epoch profiled: the GPU's busy share), the
# model with TIMED_STEPS and BATCH_BOUND: (model, the runs: plain or profiled, measured local batch, predicted local
# batch, predicted, measured) training images/s of one process, synthetic 32 px images.
BATCH_CHECKS: tuple[tuple[str, str, int, int, float, float], ...] = (
    ("simple_cnn", "plain", 32, 128, 8314.0, 35224.0),
    ("simple_cnn", "plain", 32, 512, 8447.0, 126002.0),
    ("simple_cnn", "plain", 32, 1024, 8469.0, 226507.0),
    ("simple_cnn", "plain", 128, 32, 8806.0, 7822.0),
    ("simple_cnn", "plain", 128, 512, 37372.0, 126002.0),
    ("simple_cnn", "plain", 128, 1024, 37756.0, 226507.0),
    ("simple_cnn", "plain", 512, 32, 7875.0, 7822.0),
    ("simple_cnn", "plain", 512, 128, 31501.0, 35224.0),
    ("simple_cnn", "plain", 512, 1024, 130523.0, 226507.0),
    ("simple_cnn", "plain", 1024, 32, 7078.0, 7822.0),
    ("simple_cnn", "plain", 1024, 128, 28313.0, 35224.0),
    ("simple_cnn", "plain", 1024, 512, 113253.0, 126002.0),
    ("vgg_small", "plain", 32, 128, 8954.0, 31088.0),
    ("vgg_small", "plain", 32, 512, 9092.0, 61984.0),
    ("vgg_small", "plain", 32, 1024, 9116.0, 70082.0),
    ("vgg_small", "plain", 128, 32, 7772.0, 8442.0),
    ("vgg_small", "plain", 128, 512, 32859.0, 61984.0),
    ("vgg_small", "plain", 128, 1024, 33174.0, 70082.0),
    ("vgg_small", "plain", 512, 32, 3874.0, 8442.0),
    ("vgg_small", "plain", 512, 128, 15496.0, 31088.0),
    ("vgg_small", "plain", 512, 1024, 63429.0, 70082.0),
    ("vgg_small", "plain", 1024, 32, 2190.0, 8442.0),
    ("vgg_small", "plain", 1024, 128, 8760.0, 31088.0),
    ("vgg_small", "plain", 1024, 512, 35041.0, 61984.0),
    ("resnet18", "plain", 32, 128, 3436.0, 12846.0),
    ("resnet18", "plain", 32, 512, 3478.0, 18837.0),
    ("resnet18", "plain", 32, 1024, 3485.0, 19774.0),
    ("resnet18", "plain", 128, 32, 3211.0, 3278.0),
    ("resnet18", "plain", 128, 512, 13430.0, 18837.0),
    ("resnet18", "plain", 128, 1024, 13533.0, 19774.0),
    ("resnet18", "plain", 512, 32, 1177.0, 3278.0),
    ("resnet18", "plain", 512, 128, 4709.0, 12846.0),
    ("resnet18", "plain", 512, 1024, 19103.0, 19774.0),
    ("resnet18", "plain", 1024, 32, 618.0, 3278.0),
    ("resnet18", "plain", 1024, 128, 2472.0, 12846.0),
    ("resnet18", "plain", 1024, 512, 9887.0, 18837.0),
    ("simple_cnn", "profiled", 32, 128, 24714.0, 23096.0),
    ("simple_cnn", "profiled", 32, 512, 76866.0, 93319.0),
    ("simple_cnn", "profiled", 32, 1024, 79067.0, 182737.0),
    ("simple_cnn", "profiled", 128, 32, 5774.0, 6179.0),
    ("simple_cnn", "profiled", 128, 512, 92385.0, 93319.0),
    ("simple_cnn", "profiled", 128, 1024, 183323.0, 182737.0),
    ("simple_cnn", "profiled", 512, 32, 5832.0, 6179.0),
    ("simple_cnn", "profiled", 512, 128, 23330.0, 23096.0),
    ("simple_cnn", "profiled", 512, 1024, 186639.0, 182737.0),
    ("simple_cnn", "profiled", 1024, 32, 5711.0, 6179.0),
    ("simple_cnn", "profiled", 1024, 128, 22842.0, 23096.0),
    ("simple_cnn", "profiled", 1024, 512, 91368.0, 93319.0),
    ("vgg_small", "profiled", 32, 128, 21125.0, 20019.0),
    ("vgg_small", "profiled", 32, 512, 32295.0, 55642.0),
    ("vgg_small", "profiled", 32, 1024, 32682.0, 66560.0),
    ("vgg_small", "profiled", 128, 32, 5005.0, 5281.0),
    ("vgg_small", "profiled", 128, 512, 60267.0, 55642.0),
    ("vgg_small", "profiled", 128, 1024, 61857.0, 66560.0),
    ("vgg_small", "profiled", 512, 32, 3478.0, 5281.0),
    ("vgg_small", "profiled", 512, 128, 13910.0, 20019.0),
    ("vgg_small", "profiled", 512, 1024, 73506.0, 66560.0),
    ("vgg_small", "profiled", 1024, 32, 2080.0, 5281.0),
    ("vgg_small", "profiled", 1024, 128, 8320.0, 20019.0),
    ("vgg_small", "profiled", 1024, 512, 33280.0, 55642.0),
    ("resnet18", "profiled", 32, 128, 8495.0, 8805.0),
    ("resnet18", "profiled", 32, 512, 11817.0, 18124.0),
    ("resnet18", "profiled", 32, 1024, 11958.0, 19661.0),
    ("resnet18", "profiled", 128, 32, 2201.0, 2124.0),
    ("resnet18", "profiled", 128, 512, 17933.0, 18124.0),
    ("resnet18", "profiled", 128, 1024, 18169.0, 19661.0),
    ("resnet18", "profiled", 512, 32, 1133.0, 2124.0),
    ("resnet18", "profiled", 512, 128, 4531.0, 8805.0),
    ("resnet18", "profiled", 512, 1024, 20452.0, 19661.0),
    ("resnet18", "profiled", 1024, 32, 614.0, 2124.0),
    ("resnet18", "profiled", 1024, 128, 2458.0, 8805.0),
    ("resnet18", "profiled", 1024, 512, 9830.0, 18124.0),
)


def batch_band() -> Band:
    return from_ratios(
        [measured / predicted for *_, predicted, measured in BATCH_CHECKS],
        "one H100's runs at local batches 32-1024 planned from each other, device_check.sh planner, 2026-11-26",
    )


def hosts_band(nodes: int = 2) -> Band:
    """A CPU prediction across `nodes` hosts: the checks at that many (2 hosts only, so far)."""
    what = "hosts of this machine over shaped links, benchmarks/network.py, 2026-11-26 and 2026-11-28"
    if nodes != 2:
        return unchecked(f"no check at {nodes} hosts (checked: 2 {what})")
    return from_ratios([measured / predicted for *_, predicted, measured in HOST_CHECKS], f"2 {what}")


def cpu_band(workers: int = 2) -> Band:
    """A CPU prediction of `workers` processes on one node: the checks at that many."""
    what = "processes on this machine's 2 CPU cores, benchmarks/plan_validation.py, 2026-11-26"
    ratios = [measured / predicted for _, _, n, predicted, measured in CPU_CHECKS if n == workers]
    if not ratios:
        counts = ", ".join(map(str, sorted({n for _, _, n, _, _ in CPU_CHECKS})))
        return unchecked(f"no check at {workers} {what.split(',')[0]} (checked: {counts})")
    return from_ratios(ratios, f"{workers} {what}")


@functools.lru_cache(maxsize=1)
def _corpus() -> tuple[list[Point], dict[str, Spread]]:
    """Every published point predicted as the corpus checks it (the model recomputed each time it is asked,
    STRAGGLER's spreads fitted without each point's source), and those spreads."""
    _, held, spreads = corpus.predicted(corpus.load()[1])
    return held, spreads


def _published(key_words: str, b: corpus.KindBand) -> Band:
    return Band(
        b.lo, b.hi, b.points, f"published runs {key_words}, planner/figures", b.held, b.held_of, b.sources
    )  # fmt: skip


@functools.lru_cache(maxsize=1)
def corpus_cells() -> dict[tuple[str, int, str], Band]:
    """The corpus's bands by cell: (kind, count, pipeline), pipeline "" for both together (planner/figures)."""
    return {key: _published(corpus.cell_words(*key), b) for key, b in corpus.cell_bands(*_corpus()).items()}


@functools.lru_cache(maxsize=1)
def composed_cells() -> dict[tuple[int, int, str], Band]:
    """The corpus's bands across nodes planned from one GPU, by (nodes, a node's GPUs, pipeline): a node's step's
    band times the nodes' step's (corpus.composed_bands)."""
    return {key: _published(corpus.composed_words(*key), b) for key, b in corpus.composed_bands(*_corpus()).items()}


def gpu_band(nodes: int = 1, per_node: int = 2, node_gbit: float | None = None, from_node: bool = False) -> Band:
    """A GPU prediction's band: the cell of its kind (corpus.kind_for) and count, for a run whose images sit on the
    device (synthetic data); across nodes from one GPU, the band composed of a node's step and the nodes'."""
    kind = corpus.kind_for(nodes, node_gbit, from_node=from_node)
    if kind == corpus.FROM_ONE_GPU:
        return composed_band(corpus.count_bin(nodes), corpus.per_node_bin(per_node), SYNTHETIC)
    return cell_band(kind, corpus.count_bin(per_node if nodes == 1 else nodes), SYNTHETIC)


def cell_band(kind: str, count: int, data: str) -> Band:
    """The band of a prediction of `kind` at `count` whose input pipeline is `data`: that pipeline's cell where it
    holds enough cases (not few), else both pipelines'; no band where fewer than 5 published points are of it."""
    cells = corpus_cells()
    refined, pooled = cells.get((kind, count, data)), cells.get((kind, count, ""))
    if refined is not None and "few" not in refined.marks:
        return refined
    if pooled is not None and pooled.cases >= LEAST_CASES:
        return pooled
    found = f"only {pooled.cases} published point(s)" if pooled is not None else "no published point"
    return unchecked(f"{found} {corpus.cell_words(kind, count, '')}" + (f", under {LEAST_CASES}" if pooled else ""))


def point_band(p: Point) -> Band:
    """The band a published point's prediction takes, as a plan's row of its kind, counts and pipeline would."""
    if p.kind == corpus.FROM_ONE_GPU:
        return composed_band(
            corpus.count_bin(p.row.nodes), corpus.per_node_bin(p.row.per_node), p.series.fields["data"]
        )  # fmt: skip
    return cell_band(*corpus.cell_of(p))


def composed_band(nodes: int, per_node: int, data: str) -> Band:
    """Across `nodes` (a count bin) of `per_node` GPUs planned from one GPU, for pipeline `data`: no band where the
    nodes' step has fewer than 5 published points (corpus.composed_bands takes each step's pipeline cell or both)."""
    found = composed_cells().get((nodes, per_node, data))
    if found is not None and found.cases >= LEAST_CASES:
        return found
    step = corpus.cell_words(corpus.FACTORS[1], nodes, "")
    have = (
        f"only {found.cases} published point(s) {step}, under {LEAST_CASES}" if found else f"no published point {step}"
    )
    return unchecked(f"{have}: across nodes from one GPU takes a measured node's step to the nodes")


def unseen_points() -> list[Point]:
    """The test sources' points (corpus.load_unseen) predicted as a plan predicts: from each series' base row and
    again from its measured node, at STRAGGLER's constants (the spreads fitted to the whole corpus)."""
    from ddplab.planner.model import GPU_STEP_CV, NODE_STEP_CV, Spread

    _, series = corpus.load_unseen()
    spread = Spread(GPU_STEP_CV, NODE_STEP_CV)
    return corpus.points(series, spread) + corpus.points(corpus.from_nodes(series), spread)


def unseen_table(found: list[Point]) -> str:
    """The model and its bands against the test sources (unseen_points): each prediction's error, and whether it lies
    in the band its own cell (kind, count, its input pipeline) draws from the corpus. By source over the published
    figures (each predicted from its series' base row); by kind over every prediction, a figure predicted again
    from its measured node counting again."""
    predicted = [p for p in found if p.error is not None]
    if not predicted:
        return ""
    first = [p for p in predicted if not p.series.from_node]
    lines = [
        f"test: {len(first)} published figures of {len({p.series.source for p in first})} sources "
        f"({len(predicted)} predictions, {len(predicted) - len(first)} of them again from a measured node), "
        "transcribed after the model's terms, the band's rule and its cells were fixed and kept out of every fit and "
        "band (planner/figures/test; kept out after a first look at their errors inside the corpus, BENCHMARKS.md; the "
        "bands across nodes from one GPU composed afterwards, on the corpus alone, and the PCIe 4 and 5 and 25 GbE "
        "links set to published NCCL figures, which none of their runs used); "
        "error = predicted / published - 1 at STRAGGLER's constants; in its band: measured / predicted inside the "
        "band of its cell (kind, count, its input pipeline)",
    ]
    for title, ps, key in (
        ("by source", first, lambda p: p.series.source),
        ("all figures", first, lambda p: "all figures"),
        ("by kind", predicted, lambda p: p.kind),
        ("all predictions", predicted, lambda p: "all predictions"),
    ):
        if title.startswith("by"):
            lines += [
                f"\n{title}:",
                f"  {'':38} {'points':>6} {'median |err|':>12} {'below':>5} {'5%..95%':>13} {'worst':>6} "
                f"{'in its band':>15}",
            ]
        for row in corpus.summary(ps, key):
            group = [(p, p.predicted) for p in ps if key(p) == row["group"] and p.predicted is not None]
            bands = [point_band(p) for p, _ in group]
            held = [b.holds(f, p.published) for b, (p, f) in zip(bands, group, strict=True) if b.cases]
            none = f", {len(group) - len(held)} none" if len(held) < len(group) else ""
            inside = f"{sum(held)} of {len(held)}{none}"
            lines.append(
                f"  {row['group'][:38]:38} {row['points']:>6} {row['median_abs']:>12.1%} {row['below']:>5.0%} "
                f"{row['p5']:>+6.0%}..{row['p95']:<+6.0%} {row['worst']:>+6.0%} {inside:>15}"
            )
    return "\n".join(lines)


def band_for(
    on_cuda: bool,
    nodes: int = 1,
    other_batch: bool = False,
    node_gbit: float | None = None,
    from_node: bool = False,
    per_node: int = 2,
) -> Band:
    """The band of a prediction of `per_node` workers on each of `nodes`: GPU (the corpus's cell, from the nodes,
    a node's network in Gbit/s where known and whether the measured run was a node of as many GPUs; times the
    batch checks' band at a local batch other than the measured one), CPU on one node, CPU across nodes."""
    if on_cuda:
        cell = gpu_band(nodes, per_node, node_gbit, from_node)
        return cell.and_(batch_band()) if other_batch else cell
    return hosts_band(nodes) if nodes > 1 else cpu_band(per_node)


def cells_table(held: list[Point], spreads: dict[str, Spread]) -> str:
    """The bands `ddplab plan` gives rows, cell by cell (kind, count, input pipeline; "both" the pipelines together),
    each with its validation (each source's points against the band of the others); across nodes from one GPU, the
    bands composed of a node's step and the nodes' (by a node's GPUs too), with the composed rule's validation at
    that count of nodes; and each source's points inside the band of their own cell drawn without them: the coverage
    by source."""

    def row(kind: str, count: int, data: str, b, marks: str) -> str:
        return (
            f"  {kind:36} {count:>5} {data or 'both':>9} {b.points:>6} {b.sources:>7} "
            f"{b.lo - 1:>+6.0%}..{b.hi - 1:<+6.0%} {100 * (b.hi - b.lo):>5.0f} "
            + (f"{b.held:>4} of {b.held_of:<4}" if b.held_of else f"{'-':>10}")
            + f"  {marks}"
        )

    def marks_of(b) -> str:
        if b.points < LEAST_CASES:
            return f"no band (under {LEAST_CASES} points)"
        return ", ".join(Band(b.lo, b.hi, b.points, "", sources=b.sources).marks)

    def header(first: str) -> str:
        return (
            f"  {first:36} {'count':>5} {'data':>9} {'points':>6} {'sources':>7} {'band':>13} {'width':>5} "
            f"{'validation':>10}  marks"
        )

    lines = [
        "bands by cell (ddplab plan gives a row its count's synthetic-data cell where it is not few, else both):",
        header("kind"),
    ]
    inside: dict[str, list[int]] = {}  # by source, over the cells of one pipeline (each point in one of them)

    def tally(held_by_source) -> None:
        for source, n, of in held_by_source:
            counts = inside.setdefault(source, [0, 0])
            counts[0] += n
            counts[1] += of

    for (kind, count, data), b in cell_bands(held, spreads).items():
        if kind == FROM_ONE_GPU:
            continue  # composed below
        lines.append(row(kind, count, data, b, marks_of(b)))
        tally(b.held_by_source if data else ())
    composed = composed_bands(held, spreads)
    lines += [
        f"\n{FROM_ONE_GPU} (planned from one GPU): a node's step (one node, at the node's GPUs) times the nodes' step "
        "(from a measured node, at the nodes), edge by edge; points: the fewer of the two steps' cases; validation: "
        "every such prediction at that count of nodes against the band composed for its own node and pipeline from "
        "the other sources",
        header("GPUs a node"),
    ]
    counted: set[int] = set()
    for (nodes, per_node, data), b in composed.items():
        if b.points < LEAST_CASES:
            continue
        lines.append(row(f"{per_node} GPU{'s' if per_node > 1 else ''} a node", nodes, data, b, marks_of(b)))
        if nodes not in counted:
            counted.add(nodes)
            tally(b.held_by_source)
    beyond = sorted({nodes for (nodes, _, _), b in composed.items() if b.points < LEAST_CASES})
    if beyond:
        lines.append(
            f"  at {', '.join(map(str, beyond))} nodes: no band (the nodes' step has under {LEAST_CASES} points)"
        )
    lines.append(
        "\ncoverage by source (its points inside the band of their own cell drawn from the other sources; a point "
        "predicted again from a measured node counts again):"
    )
    lines += [f"  {source:38} {n:>4} of {of:<4} {n / of:>5.0%}" for source, (n, of) in sorted(inside.items())]
    return "\n".join(lines)
