"""Sweeps: a sweep file -> validated runs (spec) -> a sweep folder (folder) -> each point run by an executor
(executor: local, slurm, ray) through point.py -> manifest.json; run.py (`run_sweep`) does it all and writes the
report, as `ddplab sweep` does.

The report reads the run folders and the manifest (spec.py and folder.py: the file formats, below it); nothing
else here draws or summarizes.
"""

from ddplab.sweep.folder import MANIFEST, Entry, Manifest, Status, SweepFolder
from ddplab.sweep.spec import Sweep, SweepRun, SweepSection, bundled_sweeps, load_sweep, run_name_for, sweep_file

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
    # Lazy: the file formats (spec, folder) are what the report and the planner read; the executors start processes
    # (the local one loads the process tree and the warm server), and run.py writes the report, which reads these
    # formats: importing either here would load them into everything that reads a sweep folder.
    if name in LOCAL:
        from ddplab.sweep import local

        return getattr(local, name)
    if name in ("run_sweep", "SweepResult"):
        from ddplab.sweep import run

        return getattr(run, name)
    raise AttributeError(f"module 'ddplab.sweep' has no attribute {name!r}")
