"""`ddplab compare RUN...`: runs side by side, with scaling against the smallest world size.

Reads summary.json and metrics.jsonl only (no torch), so runs from any machine and any day
can be compared. Throughput is training images per second of training time; speedup is
relative to the run with the fewest processes, efficiency is speedup over the ideal
(world size ratio), and the time shares say where an epoch went.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ddplab.errors import ConfigError, DataError
from ddplab.report.runs import read_json, read_jsonl


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """A finished run's summary and epoch records; one-line errors for anything else."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a folder: give run folders (each holding summary.json and metrics.jsonl)")
    summary = read_json(run_dir / "summary.json", run_dir)
    history = read_jsonl(run_dir / "metrics.jsonl", run_dir)
    if not isinstance(summary, dict) or not all(isinstance(r, dict) for r in history):
        raise DataError(f"{run_dir}: summary.json or metrics.jsonl does not hold ddplab records")
    return {"dir": run_dir, "summary": summary, "history": history}


def scaling_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for run in runs:
        try:
            rows.append(scaling_row(run))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise DataError(f"{run['dir']}: summary.json / metrics.jsonl lack a field ddplab writes ({exc!r}); "
                            "written by another version, or edited?") from None
    base = min(rows, key=lambda r: r["world_size"]) if rows else None
    for row in rows:
        row["speedup"] = row["images_per_s"] / base["images_per_s"] if base["images_per_s"] else 0.0
        row["efficiency"] = row["speedup"] / (row["world_size"] / base["world_size"])
    return rows


def scaling_row(run: dict[str, Any]) -> dict[str, Any]:
    s, history = run["summary"], run["history"]
    steady = history[1:] or history  # the first epoch carries warm-up
    train_s = sum(r["train_s"] for r in steady)
    images = sum(r["train_samples"] for r in steady)
    share = {k: sum(r.get(k, 0.0) for r in steady) / train_s if train_s else 0.0
             for k in ("data_s", "forward_backward_s", "optimizer_s", "comm_wait_s")}
    return {
        "run": run["dir"].name, "strategy": s["run"]["strategy"], "world_size": s["run"]["world_size"],
        "local_batch": s["batch"]["local"], "global_batch": s["batch"]["global"], "precision": s["run"]["precision"],
        "test_acc": s["final"]["test_acc"], "epoch_s": statistics.fmean(r["epoch_s"] for r in steady),
        "images_per_s": images / train_s if train_s else 0.0,
        **{f"{k.removesuffix('_s')}_share": v for k, v in share.items()},
        "peak_mib": max(s["memory"].values()) if s["memory"] else None,
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    header = (f"{'run':<24} {'strategy':<8} {'world':>5} {'batch l/g':>10} {'prec':>5} {'test acc':>8} {'epoch s':>8} "
              f"{'img/s':>9} {'speedup':>7} {'effic.':>6} {'data':>5} {'fwd+bwd':>7} {'optim':>5} {'comm':>5} {'peak MiB':>8}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['run'][:24]:<24} {r['strategy']:<8} {r['world_size']:>5} {r['local_batch']:>4}/{r['global_batch']:<5} "
            f"{r['precision']:>5} {r['test_acc']:>8.2%} {r['epoch_s']:>8.1f} {r['images_per_s']:>9,.0f} "
            f"{r['speedup']:>6.2f}x {r['efficiency']:>6.0%} {r['data_share']:>5.0%} {r['forward_backward_share']:>7.0%} "
            f"{r['optimizer_share']:>5.0%} {r['comm_wait_share']:>5.0%} {r['peak_mib'] or 0:>8,.0f}")
    lines.append("speedup and efficiency are relative to the run with the fewest processes; shares are of training time, "
                 "epochs after the first")
    return "\n".join(lines)
