#!/usr/bin/env python3
"""Which band rule holds a new source's points: ddplab's against the pooled cases and three parametric widenings.

    python benchmarks/band_rules.py                 # seconds: arithmetic over planner/figures, no run, no torch
    python benchmarks/band_rules.py --out rules.json

For each cell a plan's row can take (on one node at 2, up to 4 and up to 8 GPUs, synthetic data; across nodes at 2
and up to 4 nodes, both pipelines, planned from a measured node; and from one GPU, 8 GPUs a node, the band composed
of a node's step and the nodes', corpus.composed_bands, with each step's band by the rule), each rule's band over
the cell's points and its validation: each source's points against the band the rule draws from the other sources alone
(leave-one-source-out, STRAGGLER fitted without that source, as `ddplab plan --corpus` does). The rules:

- pooled: the central 90% of all the cell's measured / predicted (band_edges), as ddplab drew it before 2026-12-03;
- new source (ddplab's, corpus.band_of_sources): the same ranks over every source's median times every point's
  ratio to its own source's median (a centre plus a deviation, in logs);
- new source, t: the same, the sources' medians spread about their mean by the Student t factor for a new draw of
  K (t(0.95, K - 1) / 1.645 x sqrt(1 + 1/K));
- t + within, added: the medians' mean plus and minus that t-interval of a new source's median, with the
  deviations' central 90% (band_edges) added to each edge (in logs, as every rule but the pooled one);
- t + within, root sum of squares: the two half-widths combined as independent errors.

Every figure here is validation: the rule was chosen looking at it (BENCHMARKS.md, "The bands for a new source").
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

from ddplab.planner import corpus  # noqa: E402 (torch-free)

T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)  # t(0.95, df), df 1..10
Z95 = 1.645
CELLS = (  # the cells a plan's rows take (band.gpu_band): synthetic on one node, both pipelines across nodes
    ("one node", 2, "synthetic"),
    ("one node", 4, "synthetic"),
    ("one node", 8, "synthetic"),
    ("across nodes, from a measured node", 2, ""),
    ("across nodes, from a measured node", 4, ""),
)
COMPOSED = ((2, 8), (4, 8))  # across 2 and up to 4 nodes of 8 GPUs from one GPU: a node's step times the nodes'


def _t_half(centres: list[float]) -> float:
    """Half the 90% interval of a new source's median from K medians (0 for one)."""
    k = len(centres)
    return T95[min(k - 1, len(T95)) - 1] * statistics.stdev(centres) * math.sqrt(1 + 1 / k) if k > 1 else 0.0


def pooled(by_source: dict[str, list[float]]) -> tuple[float, float]:
    return corpus.band_edges([r for v in by_source.values() for r in v])


def new_source_t(by_source: dict[str, list[float]]) -> tuple[float, float]:
    centres, deviations = corpus.centres_and_deviations(by_source)
    k, mean = len(centres), statistics.fmean(centres)
    widen = T95[min(k - 1, len(T95)) - 1] / Z95 * math.sqrt(1 + 1 / k) if k > 1 else 1.0
    return corpus.band_edges([math.exp(mean + widen * (c - mean) + d) for c in centres for d in deviations])


def t_added(by_source: dict[str, list[float]]) -> tuple[float, float]:
    centres, deviations = corpus.centres_and_deviations(by_source)
    mean, half = statistics.fmean(centres), _t_half(centres)
    lo, hi = corpus.band_edges(deviations)
    return math.exp(mean - half + lo), math.exp(mean + half + hi)


def t_rss(by_source: dict[str, list[float]]) -> tuple[float, float]:
    centres, deviations = corpus.centres_and_deviations(by_source)
    mean, half = statistics.fmean(centres), _t_half(centres)
    lo, hi = corpus.band_edges(deviations)
    return math.exp(mean - math.hypot(half, lo)), math.exp(mean + math.hypot(half, hi))


RULES: dict[str, corpus.Rule] = {
    "pooled": pooled,
    "new source (ddplab's)": corpus.band_of_sources,
    "new source, t": new_source_t,
    "t + within, added": t_added,
    "t + within, root sum of squares": t_rss,
}


def measure() -> list[dict]:
    """Each rule's band and validation on each cell of CELLS, by corpus.cell_bands itself (`rule=`)."""
    _, series = corpus.load()
    _, held, spreads = corpus.predicted(series)
    bands = {name: corpus.cell_bands(held, spreads, rule) for name, rule in RULES.items()}
    composed = {name: corpus.composed_bands(held, spreads, rule) for name, rule in RULES.items()}
    cells = [(corpus.cell_words(*cell), {name: bands[name][cell] for name in RULES}) for cell in CELLS]
    cells += [
        (
            corpus.composed_words(nodes, per_node, "synthetic"),
            {n: composed[n][nodes, per_node, "synthetic"] for n in RULES},
        )
        for nodes, per_node in COMPOSED
    ]
    return [
        {"cell": words, "rule": name, "points": b.points, "lo": b.lo, "hi": b.hi, "held": b.held, "held_of": b.held_of}
        for words, by_rule in cells
        for name, b in by_rule.items()
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the rows as JSON here too")
    args = ap.parse_args(argv)
    rows = measure()
    print(f"{'cell':100} {'rule':32} {'band':>13} {'width':>5} {'validation':>14}")
    for r in rows:
        print(
            f"{r['cell']:100} {r['rule']:32} {r['lo'] - 1:>+6.0%}..{r['hi'] - 1:<+6.0%} "
            f"{100 * (r['hi'] - r['lo']):>5.0f} {r['held']:>4} of {r['held_of']:<4} {r['held'] / r['held_of']:>4.0%}"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
