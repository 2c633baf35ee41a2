"""manifest.json: which run folder is which point of a sweep, what became of each, and the report's sections.

Version 2 adds the run order, the sections (resolved to run names) and the points a sweep
does not run, with why; the report still reads version 1. The file is rewritten atomically
whenever a run starts or ends, so it is valid JSON at every moment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddplab import files
from ddplab.errors import ConfigError
from ddplab.sweep.spec import Sweep

MANIFEST = "manifest.json"
VERSION = 2
KEPT = ("status", "exit_code", "error", "wall_s", "wall_epochs", "job")  # job: its Slurm array task (--executor slurm)  # what a re-run keeps of a run's earlier entry


def manifest_of(sweep: Sweep, previous: dict[str, dict], states: dict[str, str],
                unavailable: dict[str, str]) -> dict[str, Any]:
    """The manifest for `sweep`: each run's earlier outcome kept, finished runs marked so from their
    folders (`states`: run name -> runfiles.run_state), runs this machine cannot start marked skipped."""
    runs = []
    for run in sweep.runs:
        entry = {"name": run.name, "dir": f"runs/{run.name}", "point": run.point, "seed": run.seed, "launch": run.launch,
                 "config": f"configs/{run.name}.toml", "status": "pending", "exit_code": None, "error": None, "wall_s": None,
                 "wall_epochs": None, "job": None}
        old = previous.get(run.name)
        if old is not None and old.get("status") != "skipped":
            entry.update({k: old.get(k) for k in KEPT})
            if entry["status"] == "running":  # its sweep died with it running (this sweep holds the folder now)
                entry["status"] = "interrupted"
        if states.get(run.name) == "finished":
            entry["status"] = "finished"
        elif run.name in unavailable:
            entry.update(status="skipped", error=unavailable[run.name])
        runs.append(entry)
    return {"version": VERSION, "name": sweep.name, "description": sweep.description, "sweep_file": str(sweep.file),
            "profile": sweep.profile, "overrides": sweep.overrides, "axes": sweep.axes, "repeats": sweep.repeats,
            "order": sweep.order, "adapted": [a.text() for a in sweep.adaptations], "sections": sweep.section_records(),
            "runs": runs}


def read_manifest(out: Path) -> dict[str, dict]:
    """The runs of the manifest in `out`, by name; empty when there is none or it is damaged (it is
    rebuilt from the run folders)."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        return {}
    try:
        return {r["name"]: r for r in json.loads(path.read_text()).get("runs", [])}
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        return {}


def read_full_manifest(out: Path) -> dict[str, Any]:
    """The whole manifest in `out`, for the commands that follow a sweep (--status, --wait): a missing or
    damaged one is one line (ConfigError), not rebuilt as `read_manifest` does for a runner."""
    try:
        manifest = json.loads((Path(out) / MANIFEST).read_text())
    except (OSError, ValueError):
        raise ConfigError(f"{out} holds no sweep manifest: run or submit the sweep first") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("runs"), list):
        raise ConfigError(f"{Path(out) / MANIFEST} is not a ddplab sweep manifest")
    return manifest


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    files.write_json(Path(out) / MANIFEST, manifest)
