"""How far the scaling model has been off where it could be checked: the band beside each prediction.

A band is the range of measured / predicted training throughput over the checked cases of a
prediction's kind, least to most; a prediction P is shown with [P x lo, P x hi], what the
checked cases' errors would make of it. With a dozen cases it is a record of how wrong the
model has been, not a confidence interval, and a measured point outside it is news.

- GPU predictions: the published figures of planner/figures (planner/corpus.py), one band per kind
  (one node; across nodes, planned from one GPU or from a measured node of as many GPUs; across nodes
  over a link under 50 Gbit/s a node), each the central 90% of measured / predicted over that kind's
  points (corpus.band_edges: split-conformal ranks), recomputed with today's model each time, with its
  coverage out of sample: each source's points against the band drawn from the other sources.
  A kind with fewer than 19 points or 3 sources, or a band past -30% or +30%, is said in words.
- CPU predictions on one node: this machine's 2- and 4-worker runs against the model
  (`benchmarks/plan_validation.py`, recorded below with the date and the model they met).
- GPU predictions at a local batch other than the measured one carry, besides, the band of one H100's runs
  at local batches 32 to 1024 planned from each other (BATCH_BOUND: never above the measured rate per step,
  so mostly far below: the model does not know where a GPU's step stops being bound by its launches).
- CPU predictions across nodes: two hosts (network namespaces) at three link rates against one
  (`benchmarks/network.py`, two models), recorded likewise. The single-host band did not hold them:
  simple_cnn unshaped measured 17% below the prediction, past its -9%.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from ddplab.planner.planfile import BandPart


@dataclass(frozen=True)
class Band:
    lo: float  # the least measured / predicted throughput over the cases (a corpus kind's: corpus.band_edges' low)
    hi: float  # the most (a corpus kind's: band_edges' high)
    cases: int
    source: str
    held: int = 0  # held-out points inside the band drawn without their own source (0 of 0: not checked so)
    held_of: int = 0
    untrusted: str = ""  # why it is said in words, not as a range (too few points or sources, too wide); "": trusted

    def around(self, predicted: float) -> tuple[float, float]:
        return predicted * self.lo, predicted * self.hi

    def holds(self, predicted: float, measured: float) -> bool:
        """Whether a measured figure lies in this band around its prediction (a speedup or a throughput)."""
        return self.lo <= measured / predicted <= self.hi

    def text(self) -> str:
        held = (
            f"; held {self.held} of {self.held_of} points out of sample (each source against the band of the others)"
            if self.held_of
            else ""
        )
        if not self.cases:
            return f"no band: the model was never checked on {self.source}"
        if self.untrusted:
            return (
                f"no band ({self.untrusted}): measured from {_side(self.lo)} to {_side(self.hi)} the prediction "
                f"over {self.cases} points ({self.source}){held}"
            )
        return f"measured {self.lo - 1:+.0%} to {self.hi - 1:+.0%} of the prediction over {self.cases} " + (
            f"points ({self.source}){held}" if self.held_of else f"checked cases ({self.source})"
        )

    def beyond(self) -> str:
        """What a figure outside this band lies beyond."""
        return "90% of the published points of its kind" if self.held_of else "any checked case"

    def to_json(self) -> BandPart:
        return cast("BandPart", asdict(self))  # Band's fields are BandPart's (tests/unit/planner/test_planfile.py)

    def and_(self, other: Band) -> Band:
        """A prediction that carries both kinds' errors (a GPU count and a local batch not measured)."""
        return Band(
            self.lo * other.lo,
            self.hi * other.hi,
            self.cases + other.cases,
            f"{self.source}; {other.source}",
            untrusted="; ".join(filter(None, (self.untrusted, other.untrusted))),
        )


def _side(ratio: float) -> str:
    return f"{1 - ratio:.0%} below" if ratio < 1 else f"{ratio - 1:.0%} above"


def from_ratios(ratios: list[float], source: str) -> Band:
    if not ratios:
        raise ValueError(f"no checked cases for a band ({source})")
    return Band(min(ratios), max(ratios), len(ratios), source)


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


def hosts_band() -> Band:
    return from_ratios(
        [measured / predicted for *_, predicted, measured in HOST_CHECKS],
        "2 hosts of this machine at 4 link rates, benchmarks/network.py, 2026-11-26 and 2026-11-28",
    )


def cpu_band() -> Band:
    return from_ratios(
        [measured / predicted for _, _, _, predicted, measured in CPU_CHECKS],
        "this machine's DDP runs on 2 CPU cores, benchmarks/plan_validation.py, 2026-11-26",
    )


@functools.lru_cache(maxsize=1)
def gpu_bands() -> dict[str, Band]:
    """The corpus's bands by kind (planner/figures; the model recomputed on every point each time it is asked, its
    step spreads (a GPU's, a node's) fitted without each point's source)."""
    from ddplab.planner import corpus

    _, series = corpus.load()
    _, held, spreads = corpus.predicted(series)  # STRAGGLER's spreads fitted leave-one-source-out
    return {
        kind: Band(
            b.lo,
            b.hi,
            b.points,
            f"published runs {corpus.KIND_WORDS[kind]}, {b.sources} sources, planner/figures",
            held=b.held,
            held_of=b.held_of,
            untrusted=b.untrusted,
        )
        for kind, b in corpus.kind_bands(held, spreads).items()
    }


def gpu_band(nodes: int = 1, node_gbit: float | None = None, from_node: bool = False) -> Band:
    """A GPU prediction's band: its kind's (corpus.kind_for: one node, across nodes from one GPU or from a measured
    node of as many GPUs, across nodes over a slow link)."""
    from ddplab.planner import corpus

    kind = corpus.kind_for(nodes, node_gbit, from_node=from_node)
    none = Band(1.0, 1.0, 0, f"published runs {corpus.KIND_WORDS[kind]}, planner/figures", untrusted="no points")
    return gpu_bands().get(kind, none)


def band_for(
    on_cuda: bool, nodes: int = 1, other_batch: bool = False, node_gbit: float | None = None, from_node: bool = False
) -> Band:
    """The band of a prediction of this kind: GPU (the corpus's kind, from the nodes, a node's network in Gbit/s
    where known and whether the measured run was a node of as many GPUs; times the batch checks' band at a local
    batch other than the measured one), CPU on one node, CPU across nodes."""
    if on_cuda:
        kind = gpu_band(nodes, node_gbit, from_node)
        return kind.and_(batch_band()) if other_batch else kind
    return hosts_band() if nodes > 1 else cpu_band()
