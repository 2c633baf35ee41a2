"""Sweeps: a sweep file -> validated runs (spec) -> one supervised process tree each (runner) -> manifest.json.

The report reads the run folders and the manifest; nothing here draws or summarizes.
"""

from ddplab.sweep.manifest import MANIFEST, read_manifest
from ddplab.sweep.runner import check_machine, default_out, format_plan, plan, run_sweep
from ddplab.sweep.spec import Section, Sweep, SweepRun, bundled_sweeps, load_sweep, run_name_for, sweep_file

__all__ = ["MANIFEST", "Section", "Sweep", "SweepRun", "bundled_sweeps", "check_machine", "default_out", "format_plan",
           "load_sweep", "plan", "read_manifest", "run_name_for", "run_sweep", "sweep_file"]
