#!/usr/bin/env python3
"""Which band rule holds a new source's points: ddplab's against the pooled cases and three parametric widenings.

    python benchmarks/band_rules.py                 # seconds: arithmetic over planner/figures, no run, no torch
    python benchmarks/band_rules.py --out rules.json

For each cell a plan's row can take (on one node at 2, up to 4 and up to 8 GPUs, synthetic data; across nodes at 2
and up to 4 nodes, both pipelines, planned from a measured node and from one GPU), each rule's band over the cell's
points and its validation: each source's points against the band the rule draws from the other sources alone
(leave-one-source-out, STRAGGLER fitted without that source, as `ddplab plan --corpus` does). The rules:

- pooled: the central 90% of all the cell's measured / predicted (band_edges), as ddplab drew it before 2026-12-03;
- new source (ddplab's, corpus.band_of_sources): the same ranks over every source's median plus every point's
  deviation from its own source's median;
- new source, t: the same, the sources' medians spread about their mean by the Student t factor for a new draw of
  K (t(0.95, K - 1) / 1.645 x sqrt(1 + 1/K));
- t + within, added: the medians' mean plus and minus that t-interval of a new source's median, with the deviations'
  central 90% (band_edges) added to each edge;
- t + within, root sum of squares: the two half-widths combined as independent errors.

Every figure here is validation: the rule was chosen looking at it (BENCHMARKS.md, "The bands for a new source").
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
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
    ("across nodes", 2, ""),
    ("across nodes", 4, ""),
)
Rule = Callable[[dict[str, list[float]]], tuple[float, float]]


def _parts(by_source: dict[str, list[float]]) -> tuple[list[float], list[float]]:
    medians = [statistics.median(v) for v in by_source.values()]
    deviations = [r - m for m, v in zip(medians, by_source.values(), strict=True) for r in v]
    return medians, deviations


def _t_half(medians: list[float]) -> float:
    """Half the 90% interval of a new source's median from K medians (0 for one)."""
    k = len(medians)
    return T95[min(k - 1, len(T95)) - 1] * statistics.stdev(medians) * math.sqrt(1 + 1 / k) if k > 1 else 0.0


def pooled(by_source: dict[str, list[float]]) -> tuple[float, float]:
    return corpus.band_edges([r for v in by_source.values() for r in v])


def new_source_t(by_source: dict[str, list[float]]) -> tuple[float, float]:
    medians, deviations = _parts(by_source)
    k, mean = len(medians), statistics.fmean(medians)
    widen = T95[min(k - 1, len(T95)) - 1] / Z95 * math.sqrt(1 + 1 / k) if k > 1 else 1.0
    return corpus.band_edges([mean + widen * (m - mean) + d for m in medians for d in deviations])


def t_added(by_source: dict[str, list[float]]) -> tuple[float, float]:
    medians, deviations = _parts(by_source)
    mean, half = statistics.fmean(medians), _t_half(medians)
    lo, hi = corpus.band_edges(deviations)
    return mean - half + lo, mean + half + hi


def t_rss(by_source: dict[str, list[float]]) -> tuple[float, float]:
    medians, deviations = _parts(by_source)
    mean, half = statistics.fmean(medians), _t_half(medians)
    lo, hi = corpus.band_edges(deviations)
    return mean - math.hypot(half, lo), mean + math.hypot(half, hi)


RULES: dict[str, Rule] = {
    "pooled": pooled,
    "new source (ddplab's)": corpus.band_of_sources,
    "new source, t": new_source_t,
    "t + within, added": t_added,
    "t + within, root sum of squares": t_rss,
}


def by_source(points: list[corpus.Point]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for p in points:
        if p.error is not None:
            out.setdefault(p.series.source, []).append(1 / (1 + p.error))
    return out


def measure() -> list[dict]:
    _, series = corpus.load()
    _, held, spreads = corpus.predicted(series)
    cells: dict[tuple[str, int, str], list[corpus.Point]] = {}
    for p in held:
        if p.error is not None:
            kind, count, data = corpus.cell_of(p)
            cells.setdefault((kind, count, data), []).append(p)
            cells.setdefault((kind, count, ""), []).append(p)
    rows = []
    for cell in CELLS:
        points = cells[cell]
        for name, rule in RULES.items():
            inside = of = 0
            for source in sorted({p.series.source for p in points}):
                others = by_source([p.at(spreads[source]) for p in points if p.series.source != source])
                own = by_source([p for p in points if p.series.source == source])[source]
                lo, hi = rule(others)
                inside, of = inside + sum(lo <= r <= hi for r in own), of + len(own)
            lo, hi = rule(by_source(points))
            rows.append(
                {"cell": corpus.cell_words(*cell), "rule": name, "points": len(points), "lo": lo, "hi": hi,
                 "held": inside, "held_of": of}
            )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the rows as JSON here too")
    args = ap.parse_args(argv)
    rows = measure()
    print(f"{'cell':78} {'rule':32} {'band':>13} {'width':>5} {'validation':>14}")
    for r in rows:
        print(
            f"{r['cell']:78} {r['rule']:32} {r['lo'] - 1:>+6.0%}..{r['hi'] - 1:<+6.0%} "
            f"{100 * (r['hi'] - r['lo']):>5.0f} {r['held']:>4} of {r['held_of']:<4} {r['held'] / r['held_of']:>4.0%}"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
