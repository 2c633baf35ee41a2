"""Sweeps: a sweep file -> validated runs (sweepdir/spec.py) -> a sweep folder (sweepdir/folder.py) -> each point
run by an executor (executor: local, slurm, ray) through point.py -> manifest.json; run.py (`run_sweep`) does it all
and writes the report, as `ddplab sweep` does.

The report reads the run folders and the manifest (ddplab.sweepdir: the file formats, below it); nothing here draws
or summarizes. The formats' names are re-exported here for the sweep's callers.
"""

from ddplab.sweepdir.folder import MANIFEST, Entry, Manifest, Status, SweepFolder
from ddplab.sweepdir.spec import Sweep, SweepRun, SweepSection, bundled_sweeps, load_sweep, run_name_for, sweep_file

LOCAL = ("LocalExecutor", "default_out", "dry_run_rows", "dry_run_text", "unavailable_runs")

__all__ = [
    "MANIFEST",
    "Entry",
    "LocalExecutor",
    "Manifest",
    "Status",
    "Sweep",
    "SweepFolder",
    "SweepRun",
    "SweepSection",
    "bundled_sweeps",
    "default_out",
    "dry_run_rows",
    "dry_run_text",
    "load_sweep",
    "run_name_for",
    "sweep_file",
    "unavailable_runs",
    "run_sweep",
    "SweepResult",
]


def __getattr__(name: str):
    # Lazy: the executors start processes (the local one loads the process tree and the warm server) and run.py
    # writes the report: `ddplab sweep --list` and the formats' callers need neither.
    if name in LOCAL:
        from ddplab.sweep import local

        return getattr(local, name)
    if name in ("run_sweep", "SweepResult"):
        from ddplab.sweep import run

        return getattr(run, name)
    raise AttributeError(f"module 'ddplab.sweep' has no attribute {name!r}")
