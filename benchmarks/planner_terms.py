#!/usr/bin/env python3
"""Each term of the scaling model against the published corpus: the errors with the term and without it.

    python benchmarks/planner_terms.py                 # seconds: arithmetic over planner/figures, no run, no torch
    python benchmarks/planner_terms.py --out terms.json

The corpus (`ddplab plan --corpus`, planner/corpus.py) predicted as the planner predicts it, then again with one
named term of planner/model.py left out at a time, everything else as it is: STRAGGLER's spreads refitted
leave-one-source-out each time (a term left out may move what the spreads absorb), every error out of sample as
`ddplab plan --corpus` computes it. For each: the median |error| over the points predicted from their series'
first row, the share below the published figure, the central 90% and the worst error, the median by kind, and
how many held-out points the two printed bands hold (one node; across nodes from a measured node). The terms
the published points cannot exercise (the corpus has no gradient accumulation, CPU runs or a batch other than
the source's) are listed with why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

from ddplab.planner import corpus, model  # noqa: E402 (torch-free)

PRINTED_KINDS = ("one node", "across nodes, from a measured node")  # the kinds whose band is printed as a range


@dataclass(frozen=True)
class Term:
    name: str
    without: str  # what the model does instead
    leave_out: Callable[[], contextlib.AbstractContextManager]


def _all_exposed(costs, link, workers, local_batch, per_node):
    """LINK_QUEUE left out: the whole all-reduce after backward."""
    if workers <= 1:
        return 0.0, 0.0
    total = sum(model.bucket_times(costs, link, workers)[1])
    return total, total


def _a_port_each(costs, per_node, nodes, local_batch, link, inter_node=None):
    """The node's ports not shared: each GPU with as much of the network as the whole node has."""
    if nodes > 1 and inter_node is not None:
        inter_node = replace(inter_node, busbw_gbps=inter_node.busbw_gbps * per_node)
    return model.predict_one(costs, per_node, nodes, local_batch, link, inter_node)


@contextlib.contextmanager
def _fit(gpu_grid=corpus.CV_GRID, node_grid=corpus.CV_GRID) -> Iterator[None]:
    original = corpus.fit_spread
    with mock.patch.object(corpus, "fit_spread", lambda found: original(found, gpu_grid, node_grid)):
        yield


TERMS = (
    Term("STRAGGLER, a GPU's spread", "no GPU waits for the slowest of its peers", lambda: _fit(gpu_grid=(0.0,))),
    Term("STRAGGLER, a node's spread", "no node waits for the slowest node", lambda: _fit(node_grid=(0.0,))),
    Term(
        "STRAGGLER, both",
        "every step the mean step (the model before planner 3)",
        lambda: _fit(gpu_grid=(0.0,), node_grid=(0.0,)),
    ),
    Term(
        "DDP_HOST",
        "DDP's own host work a step not counted",
        lambda: mock.patch.object(model, "DDP_HOST_PER_LAYER_S", 0.0),  # added to rows and in a DDP base's floor
    ),
    Term(
        "HOST_FLOOR",
        "a step as short as PER_IMAGE makes it",
        lambda: mock.patch.object(corpus, "host_s", lambda layers, under_ddp=False: 0.0),
    ),
    Term(
        "LINK_QUEUE (the all-reduce under backward)",
        "the whole all-reduce after backward",
        lambda: mock.patch.object(model, "exposed_comm", _all_exposed),
    ),
    Term(
        "a node's network shared by its GPUs",
        "each GPU with the node's whole network",
        lambda: mock.patch.object(corpus, "predict_one", _a_port_each),
    ),
    Term(
        "GRAD_BYTES: 2-byte gradients of a half-precision model",
        "4 bytes a parameter for every series",
        lambda: mock.patch.object(corpus, "HALF_GRADIENTS", ()),
    ),
)
NOT_EXERCISED = {
    "GRAD_BYTES: accumulation under no_sync": "no series of the corpus accumulates gradients",
    "BATCH_BOUND": "every point runs at its series' own per-GPU batch, or (strong scaling) at one the source measured "
    "no step of",
    "SHARED_CORES, CPU_SERIAL": "CPU runs: this machine's own (benchmarks/plan_validation.py, benchmarks/network.py)",
    "TIMED_STEPS": "a ddplab run's own timing: the sources give throughputs",
}


def measure(name: str, without: str) -> dict:
    """The corpus's errors as the model stands (inside whatever term is left out)."""
    _, series = corpus.load()
    _, held, spreads = corpus.predicted(series)
    first = [p for p in held if not p.series.from_node and p.error is not None]
    errors = sorted(p.error for p in first)
    by_kind = {}
    for p in held:
        if p.error is not None:
            by_kind.setdefault(p.kind, []).append(abs(p.error))
    bands = corpus.kind_bands(held, spreads)
    p5, p95 = corpus.central(errors)
    return {
        "term": name,
        "without": without,
        "points": len(errors),
        "median_abs": statistics.median(abs(e) for e in errors),
        "below": sum(e < 0 for e in errors) / len(errors),
        "p5": p5,
        "p95": p95,
        "worst": max(errors, key=abs),
        "median_abs_by_kind": {kind: statistics.median(v) for kind, v in sorted(by_kind.items())},
        "held": {kind: [bands[kind].held, bands[kind].held_of] for kind in PRINTED_KINDS if kind in bands},
        "spreads": sorted({(s.gpu, s.node) for s in spreads.values()}),
    }


def table(rows: list[dict]) -> str:
    kinds = ("one node", "across nodes", "across nodes, from a measured node", "strong scaling")
    headers = ["left out", "instead", "median \\|err\\|", "below", "5%..95%", "worst", *kinds]
    headers.append("bands hold (one node; from a node)")
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        held = "; ".join(f"{h}/{n} ({h / n:.1%})" for h, n in r["held"].values())
        by_kind = " | ".join(f"{r['median_abs_by_kind'].get(k, float('nan')):.1%}" for k in kinds)
        lines.append(
            f"| {r['term']} | {r['without']} | {r['median_abs']:.2%} | {r['below']:.0%} | "
            f"{r['p5']:+.0%}..{r['p95']:+.0%} | {r['worst']:+.0%} | {by_kind} | {held} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = p.parse_args(argv)
    rows = [measure("(none: the model as it is)", "")]
    for term in TERMS:
        with term.leave_out():
            rows.append(measure(term.name, term.without))
    print(table(rows))
    print("\nnot exercised by the published points:")
    for name, why in NOT_EXERCISED.items():
        print(f"  {name}: {why}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "not_exercised": NOT_EXERCISED}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
