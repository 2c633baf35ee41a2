"""manifest.json: which run folder is which point of a sweep, what became of each, and the report's sections.

Version 2 adds the run order, the sections (resolved to run names) and the points a sweep
does not run, with why; the report still reads version 1. The file is rewritten atomically
whenever a run starts or ends, so it is valid JSON at every moment. `load` is its one reader
(the runner, --status, --wait, Slurm's refresh and the report), checked against `ENTRY` and
`SECTION`: an edited or foreign manifest is one line naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddplab import files, runfiles
from ddplab.borders import INTEGER, LIST, SCALAR, SECONDS, TABLE, TEXT, WHOLE, check, check_each, list_of, one_of, whole
from ddplab.errors import ConfigError, DataError
from ddplab.sweep.spec import Sweep

MANIFEST = "manifest.json"
VERSION = 2
VERSIONS = (1, 2)  # that this ddplab reads
# What a run can be in: pending (not started), running, finished, failed, interrupted (a stop signal or
# its sweep died), skipped (this machine cannot run it), submitted and queued (to Slurm).
STATUSES = ("pending", "running", "finished", "failed", "interrupted", "skipped", "submitted", "queued")
TEXTS = list_of(TEXT)
ENTRY = {"name": TEXT, "dir": TEXT, "point": TABLE, "seed": WHOLE, "launch": TEXT, "config": TEXT,
         "status": one_of(*STATUSES), "exit_code": INTEGER | None, "error": TEXT | None, "wall_s": SECONDS | None,
         "wall_epochs": WHOLE | None, "job": TEXT | None}
SECTION = {"title": TEXT, "question": TEXT, "kind": TEXT, "note": TEXT, "runs": TEXTS, "adapted": TEXTS,
           "adapted_points": TEXTS, "baseline_runs": TEXTS, "not_measured": list_of(TABLE)}
TOP = {"version": whole(1), "name": TEXT, "description": TEXT, "sweep_file": TEXT, "profile": TEXT | None,
       "overrides": TEXTS, "axes": TEXTS, "repeats": WHOLE, "order": TEXT, "adapted": TEXTS, "sections": LIST,
       "runs": LIST, "executor": TEXT, "slurm_jobs": TEXTS}
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


def load(out: Path) -> dict[str, Any]:
    """The manifest in the sweep folder `out`, checked: each run's entry (its folder under the sweep's runs/),
    each section. None there is a ConfigError; one ddplab did not write (edited, truncated, of a newer
    version) is a DataError naming the file and the field."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise ConfigError(f"{out} holds no sweep manifest: run or submit the sweep first")
    manifest = check(runfiles.read_json(path, Path(out)), TOP, str(path), required=("runs",))
    if manifest.get("version", 1) not in VERSIONS:
        raise DataError(f"{path} has version {manifest['version']}; this ddplab reads versions "
                        f"{', '.join(map(str, VERSIONS))} (written by a newer ddplab?)")
    names = set()
    for i, entry in enumerate(manifest["runs"]):
        check(entry, ENTRY, str(path), prefix=f"runs[{i}].", required=("name", "dir"))
        check_each(entry.get("point") or {}, SCALAR, str(path), f"runs[{i}].point")
        run_dir = Path(out) / entry["dir"]
        if Path(entry["dir"]).is_absolute() or not run_dir.resolve().is_relative_to((Path(out) / "runs").resolve()):
            raise DataError(f"{path}: runs[{i}].dir is {entry['dir']!r}, outside the sweep's runs/ (a manifest is data: "
                            "its runs stay in its folder)")
        if entry["name"] in names:
            raise DataError(f"{path}: runs[{i}].name {entry['name']!r} is listed twice")
        names.add(entry["name"])
    for i, section in enumerate(manifest.get("sections") or []):
        check(section, SECTION, str(path), prefix=f"sections[{i}].")
    return manifest


def read_manifest(out: Path, echo=None) -> dict[str, dict]:
    """The runs of the manifest in `out`, by name, for a runner that rebuilds it: empty when there is none, or
    when it cannot be read (said through `echo`): the run folders say what finished."""
    if not (Path(out) / MANIFEST).is_file():
        return {}
    try:
        return {r["name"]: r for r in load(out)["runs"]}
    except DataError as exc:
        if echo is not None:
            echo(f"note: {exc}: made again from the run folders")
        return {}


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    files.write_json(Path(out) / MANIFEST, manifest)
