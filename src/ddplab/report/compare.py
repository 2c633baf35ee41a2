"""`ddplab compare RUN...`: runs picked by hand, side by side, scaled against the one with the fewest workers.

A view over the report's figures: `report/figures.py` computes every number and owns the
definition of speedup, so the two commands never disagree. What compare adds is the choice of
baseline: runs named by hand need not share a config, so it is simply the run with the fewest
workers (a single-process one first) rather than the 1-worker point of the same experiment.
Reads run folders only (no torch).
"""

from __future__ import annotations

from typing import Any, cast

from ddplab.report import figures, tables
from ddplab.report import runs as run_folders
from ddplab.report.records import Row
from ddplab.rundir.runread import Run


def scaling_rows(runs: list[Run]) -> list[Row]:
    """The report's per-run figures, plus speedup and efficiency against the run with the fewest workers."""
    run_folders.name_runs(runs)
    rows = [figures.run_row(run) for run in runs]
    figures.scale(rows, figures.fewest_workers(rows), "run")
    return rows


def columns() -> list[tables.Column]:
    shares = {
        "data_share": "data %",
        "forward_backward_share": "fwd+bwd %",
        "comm_wait_share": "of which comm %",
        "optimizer_share": "optim %",
    }
    return [
        ("run", lambda r: r["run"]),
        ("strategy", lambda r: str(r["strategy"])),
        ("workers", lambda r: str(r["world_size"])),
        ("batch local/global", lambda r: f"{r['local_batch']}/{r['global_batch']}"),
        ("precision", lambda r: str(r["precision"])),
        ("backend", lambda r: str(r["backend"])),
        ("test acc %", lambda r: tables.pm(r, "final_test_acc", tables.percent_value)),
        ("epoch s", lambda r: tables.pm(r, "epoch_s", tables.seconds)),
        ("train images/s", lambda r: tables.pm(r, "images_per_s", tables.rate)),
        ("speedup", lambda r: "baseline" if r.get("is_baseline") else tables.times(r["speedup"])),
        ("of ideal", lambda r: tables.percent(r["efficiency"], 0)),
        *[(title, lambda r, k=k: tables.pm(r, k, tables.percent_value)) for k, title in shares.items()],
        ("slowest rank", lambda r: str(r.get("slowest") or "-")),
        ("other load", tables.load_cell),
        ("peak MiB", lambda r: tables.pm(r, "peak_mib", tables.mib)),
    ]


RANK_CLOCKS = {  # summary.json's `ranks` figures compare lists by rank, median/p95/max each: what a line says
    "step": "steps by rank",
    "data": "  waiting for data",
    "waited": "  waiting in the all-reduce for the last rank",
}


def rank_clocks(run: Run) -> list[str]:
    """Each rank's optimizer step, its wait for data and its wait in the all-reduce for the last rank to join, as
    its step clocks measured them: median/p95/max in ms (summary.json's `ranks`, the medians over epochs:
    engine/clocks.py). None for one rank or a run from before the clocks; no wait line from before the waits."""
    ranks = cast(dict[str, Any], run.summary or {}).get("ranks") or {}
    lines = []
    for name, said in RANK_CLOCKS.items():
        columns: list[list[float]] = []
        for key in (f"{name}_median_s", f"{name}_p95_s", f"{name}_max_s"):
            values = (ranks.get(key) or {}).get("per_rank")
            if (
                isinstance(values, list)
                and len(values) >= 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            ):
                columns.append(values)
        if len(columns) < 3 or len({len(c) for c in columns}) != 1:
            continue
        each = ", ".join(
            f"{rank} " + "/".join(f"{c[rank] * 1e3:.1f}" for c in columns) for rank in range(len(columns[0]))
        )
        lines.append(f"{said} in {run.name} (median/p95/max ms): {each}" if name == "step" else f"{said}: {each}")
    return lines if lines and lines[0].startswith(RANK_CLOCKS["step"]) else []


def format_rows(rows: list[Row], runs: list[Run] | None = None) -> str:
    """The table, what it is scaled against, and for `runs` (in the rows' order) each rank's steps."""
    headers, cells = tables.render(columns(), rows)
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("-" * len(lines[0]))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    base = next((r["run"] for r in rows if r.get("is_baseline")), None)
    lines.append(
        f"speedup: each run's training images/s over {base}'s; of ideal: speedup over the devices it adds "
        "(GPUs; on a CPU, processes of one machine share its cores: ideal 1x); epochs after the first"
        if base
        else "no run has training times to scale against"
    )
    lines += [said for run in runs or [] for said in rank_clocks(run)]
    for r in rows:
        if r.get("straggler") not in (None, "mixed"):
            lines.append(f"straggler in {r['run']}: {r['straggler']}")
    contended = [r["run"] for r in rows if r.get("load") is not None and r["load"].contended]
    if contended:
        lines.append(f"unreliable clocks: {', '.join(contended)} shared the machine with other work while training")
    return "\n".join(lines)
