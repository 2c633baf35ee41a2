"""Sweeps: a sweep file -> validated runs (spec) -> a sweep folder (folder) -> each point run by an executor
(executor: local, slurm) through point.py -> manifest.json.

The report reads the run folders and the manifest; nothing here draws or summarizes.
"""

from ddplab.sweep.folder import MANIFEST, Entry, Manifest, Status, SweepFolder
from ddplab.sweep.local import LocalExecutor, default_out, dry_run_rows, dry_run_text, unavailable_runs
from ddplab.sweep.spec import Sweep, SweepRun, SweepSection, bundled_sweeps, load_sweep, run_name_for, sweep_file

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
]
