"""A sweep folder: the one owner of its file names, its manifest and what each point is in.

    OUT/sweep.toml              the sweep file, as run
    OUT/manifest.json           which run folder is which point, what became of each, the report's sections
    OUT/runs/NAME/              each point's run folder (runfiles.py names what is inside)
    OUT/configs/NAME.toml       each point's config, as its run reads it
    OUT/logs/NAME.log           each point's output, every attempt
    OUT/links.json              this machine's all-reduce, for the report's predictions (planner/links.py)
    OUT/EXECUTOR/               an executor's own files (slurm/: batch scripts, each task's outcome)

The manifest is rewritten atomically whenever a point starts or ends, so it is valid JSON at every
moment. Version 2 adds the run order, the sections (resolved to run names) and the points a sweep
does not run; version 1 still reads. `SweepFolder.load` is its one reader (every executor, --status,
--wait and the report), checked against `ENTRY`, `SECTION` and `TOP`: an edited or foreign manifest
is one line naming the field. Torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypedDict

from ddplab.errors import ConfigError, DataError, Interrupted
from ddplab.io import files
from ddplab.io.borders import (
    INTEGER,
    LIST,
    SCALAR,
    SECONDS,
    TABLE,
    TEXT,
    WHOLE,
    Declared,
    Each,
    declared,
    list_of,
    one_of,
    whole,
)
from ddplab.planner.links import LINKS_FILE
from ddplab.rundir import runfiles
from ddplab.sweepdir.spec import Sweep, SweepRun

MANIFEST = "manifest.json"
SWEEP_FILE = "sweep.toml"
VERSION = 2
VERSIONS = (1, 2)  # that this ddplab reads


class Status(str, Enum):
    """What a point is in. STOPPED is only ever shown (--status: "running", but nothing trains it any more)."""

    PENDING = "pending"  # not started
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # a stop signal, or its sweep died: resumable
    SKIPPED = "skipped"  # this machine cannot run it
    SUBMITTED = "submitted"  # handed to a remote executor, not yet seen in its queue
    QUEUED = "queued"  # waiting in a remote executor's queue
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value

    @property
    def settled(self) -> bool:
        """Nothing is left for an executor to do with the point."""
        return self in (Status.FINISHED, Status.SKIPPED)


def ended_as(exit_code: int | None, summary_written: bool) -> Status:
    """What a point's exit makes of it: the one rule for every executor. Finished needs both exit 0 and the
    run's summary.json; INTERRUPTED (Ctrl-C, SIGTERM, scancel, a time limit) leaves it resumable."""
    if exit_code == 0 and summary_written:
        return Status.FINISHED
    return Status.INTERRUPTED if exit_code == Interrupted.exit_code else Status.FAILED


WRITTEN = tuple(s.value for s in Status if s is not Status.STOPPED)
TEXTS = list_of(TEXT)


class SectionRecord(TypedDict, total=False):
    """A report section as the manifest holds it (spec.Sweep.section_records writes it, resolved to run names)."""

    title: Annotated[str, TEXT]
    question: Annotated[str, TEXT]
    kind: Annotated[str, TEXT]
    note: Annotated[str, TEXT]
    runs: Annotated[list[str], TEXTS]
    adapted: Annotated[list[str], TEXTS]
    adapted_points: Annotated[list[str], TEXTS]
    baseline_runs: Annotated[list[str], TEXTS]
    not_measured: Annotated[list[dict[str, Any]], list_of(TABLE)]


@dataclass
class Entry:
    """One point in the manifest: where its folder is, and what became of it."""

    name: Annotated[str, TEXT]
    dir: Annotated[str, TEXT]  # its run folder, relative to the sweep folder (always under runs/)
    point: Annotated[dict[str, Any], TABLE, Each(SCALAR)] = field(default_factory=dict)  # axis -> value
    seed: Annotated[int, WHOLE] = 0
    launch: Annotated[str, TEXT] = "ddplab"
    config: Annotated[str, TEXT] = ""  # its config file, relative to the sweep folder
    status: Annotated[Status, one_of(*WRITTEN)] = Status.PENDING
    exit_code: Annotated[int | None, INTEGER | None] = None
    error: Annotated[str | None, TEXT | None] = None
    wall_s: Annotated[float | None, SECONDS | None] = None
    wall_epochs: Annotated[int | None, WHOLE | None] = None  # epochs trained in wall_s (a resumed run trains fewer)
    job: Annotated[str | None, TEXT | None] = None  # its handle in a remote executor (Slurm: JOB_TASK)
    others: dict[str, Any] = field(default_factory=dict, repr=False)  # a newer writer's fields: written back as read

    KEPT = ("status", "exit_code", "error", "wall_s", "wall_epochs", "job")  # what a re-run keeps of an earlier entry

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        known = {f.name for f in dataclasses.fields(cls)} - {"others"}
        entry = cls(**{k: v for k, v in data.items() if k in known})
        entry.others = {k: v for k, v in data.items() if k not in known}
        entry.status = Status(entry.status)
        entry.point = dict(entry.point or {})
        return entry

    def to_json(self) -> dict[str, Any]:
        mine = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "others"}
        return {**self.others, **mine, "point": dict(self.point), "status": self.status.value}

    def ended(
        self,
        status: Status,
        exit_code: int | None,
        error: str | None,
        wall_s: float | None = None,
        wall_epochs: int | None = None,
    ) -> None:
        self.status, self.exit_code, self.error, self.wall_s = status, exit_code, error, wall_s
        self.wall_epochs = wall_epochs


@dataclass
class Manifest:
    """manifest.json, typed: the sweep as run, its points in order, the executor that runs them."""

    runs: Annotated[list[Entry], LIST]  # each checked against ENTRY
    name: Annotated[str, TEXT] = ""
    version: Annotated[int, whole(1)] = VERSION
    description: Annotated[str, TEXT] = ""
    sweep_file: Annotated[str, TEXT] = ""
    profile: Annotated[str | None, TEXT | None] = None
    overrides: Annotated[list[str], TEXTS] = field(default_factory=list)
    axes: Annotated[list[str], TEXTS] = field(default_factory=list)
    repeats: Annotated[int, WHOLE] = 1
    order: Annotated[str, TEXT] = "listed"
    adapted: Annotated[list[str], TEXTS] = field(default_factory=list)
    sections: Annotated[list[dict[str, Any]], LIST] = field(default_factory=list)  # each checked against SECTION
    executor: Annotated[str, TEXT] = "local"
    # The executor's handles of what it submitted (Slurm: array jobs).
    jobs: Annotated[list[str], TEXTS] = field(default_factory=list)
    others: dict[str, Any] = field(default_factory=dict, repr=False)  # a newer writer's fields: written back as read

    @classmethod
    def of(
        cls,
        sweep: Sweep,
        previous: dict[str, Entry],
        states: dict[str, str],
        unavailable: dict[str, str],
        executor: str = "local",
    ) -> Manifest:
        """The manifest for `sweep`, run by `executor`: each point's earlier outcome kept, finished ones marked so
        from their folders (`states`: run name -> runfiles.run_state), points this machine cannot start marked
        skipped."""
        runs = []
        for run in sweep.runs:
            entry = Entry(
                name=run.name,
                dir=f"runs/{run.name}",
                point=run.point,
                seed=run.seed,
                launch=run.launch,
                config=f"configs/{run.name}.toml",
            )
            old = previous.get(run.name)
            if old is not None and old.status is not Status.SKIPPED:
                for key in Entry.KEPT:
                    setattr(entry, key, getattr(old, key))
                if entry.status is Status.RUNNING:  # its sweep died with it running (this sweep holds the folder now)
                    entry.status = Status.INTERRUPTED
            if states.get(run.name) == "finished":
                entry.status = Status.FINISHED
            elif run.name in unavailable:
                entry.status, entry.error = Status.SKIPPED, unavailable[run.name]
            runs.append(entry)
        return cls(
            name=sweep.name,
            runs=runs,
            description=sweep.description,
            sweep_file=str(sweep.file),
            profile=sweep.profile,
            overrides=list(sweep.overrides),
            axes=list(sweep.axes),
            repeats=sweep.repeats,
            order=sweep.order,
            adapted=[a.text() for a in sweep.adaptations],
            sections=sweep.section_records(),
            executor=executor,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        fields = {f.name for f in dataclasses.fields(cls)}
        known = fields - {"runs", "jobs", "others"}
        manifest = cls(
            runs=[Entry.from_json(e) for e in data["runs"]],
            **{k: v for k, v in data.items() if k in known and (v is not None or k == "profile")},
        )
        manifest.jobs = list(data.get("jobs") or data.get("slurm_jobs") or [])  # slurm_jobs: written before 2026-11-26
        manifest.others = {k: v for k, v in data.items() if k not in fields and k != "slurm_jobs"}
        return manifest

    def to_json(self) -> dict[str, Any]:
        return {
            **self.others,
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("runs", "others")},
            "runs": [e.to_json() for e in self.runs],
        }

    def unfinished(self) -> list[Entry]:
        """Points a re-run would still train: a point this machine cannot run (skipped) is not one of them."""
        return [e for e in self.runs if not e.status.settled]

    def skipped(self) -> list[Entry]:
        """Points this machine cannot run: the report lists them as not measured."""
        return [e for e in self.runs if e.status is Status.SKIPPED]


# What the manifest's reader checks, from the declarations above (borders.declared): each field once, with its kind.
ENTRY = declared(Entry, unwritten=("others",))
SECTION = declared(SectionRecord)
_MANIFEST = declared(Manifest, unwritten=("others",))
TOP = Declared({**_MANIFEST.schema, "slurm_jobs": TEXTS}, _MANIFEST.required, {})  # slurm_jobs: `jobs` before 11-26


@dataclass(frozen=True)
class SweepFolder:
    """Where a sweep's files are, and the checks before anything is written there."""

    root: Path

    def run_dir(self, name: str) -> Path:
        return self.root / "runs" / name

    def config_file(self, name: str) -> Path:
        return self.root / "configs" / f"{name}.toml"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def own(self, executor: str) -> Path:
        """The folder of an executor's own files."""
        return self.root / executor

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    @property
    def links(self) -> Path:
        """This machine's all-reduce, measured for the report's predictions (planner/links.py)."""
        return self.root / LINKS_FILE

    def has_manifest(self) -> bool:
        """Whether this is a sweep's folder: anything named manifest.json says so (one that is not a readable
        file is then load()'s to refuse, naming it, never a folder of loose runs said to be nothing else)."""
        return self.manifest_path.exists() or self.manifest_path.is_symlink()

    def load(self) -> Manifest:
        """The manifest, checked: each point's entry (its folder under runs/), each section. None there is a
        ConfigError; one ddplab did not write (edited, truncated, of a newer version) is a DataError naming the
        file and the field."""
        path = self.manifest_path
        if not self.has_manifest():
            raise ConfigError(f"{self.root} holds no sweep manifest: run or submit the sweep first")
        data = TOP.check(runfiles.read_json(path, self.root), str(path))
        if data.get("version", 1) not in VERSIONS:
            raise DataError(
                f"{path} has version {data['version']}; this ddplab reads versions "
                f"{', '.join(map(str, VERSIONS))} (written by a newer ddplab?)"
            )
        names = set()
        runs_root = (self.root / "runs").resolve()
        for i, entry in enumerate(data["runs"]):
            ENTRY.check(entry, str(path), prefix=f"runs[{i}].")
            if Path(entry["dir"]).is_absolute() or not (self.root / entry["dir"]).resolve().is_relative_to(runs_root):
                raise DataError(
                    f"{path}: runs[{i}].dir is {entry['dir']!r}, outside the sweep's runs/ (a manifest is "
                    "data: its runs stay in its folder)"
                )
            if entry["name"] in names:
                raise DataError(f"{path}: runs[{i}].name {entry['name']!r} is listed twice")
            names.add(entry["name"])
        for i, section in enumerate(data.get("sections") or []):
            SECTION.check(section, str(path), prefix=f"sections[{i}].")
        return Manifest.from_json(data)

    def earlier_entries(self, echo=None) -> dict[str, Entry]:
        """The points of the manifest here, by name, for an executor that rebuilds it: none when there is no
        manifest, or when it cannot be read (said through `echo`): the run folders say what finished."""
        if not self.has_manifest():
            return {}
        try:
            return {e.name: e for e in self.load().runs}
        except DataError as exc:
            if echo is not None:
                echo(f"note: {exc}: made again from the run folders")
            return {}

    def write(self, manifest: Manifest) -> None:
        files.write_json(self.manifest_path, manifest.to_json())

    def refuse_run_folder(self) -> None:
        if any((self.root / name).is_file() for name in (runfiles.CONFIG, runfiles.METRICS)):
            raise ConfigError(
                f"--out {self.root} is a run folder, not a sweep folder (a run folder is never "
                "rewritten): choose another --out"
            )

    def run_states(self, sweep: Sweep) -> dict[str, str]:
        """Each point's run folder as it stands: new | finished | unfinished | foreign (runfiles.run_state)."""
        return {run.name: runfiles.run_state(self.run_dir(run.name)) for run in sweep.runs}

    def stale_reason(self, run: SweepRun, state: str) -> str | None:
        """Why a run folder cannot be kept or continued for this point, or None: not a run folder, or trained
        with other settings than the file asks for now (its results would be reported under a wrong name)."""
        from ddplab.rundir.runfolder import MEETING, OBSERVERS, changed_defaults, config_differences, saved_config

        run_dir = self.run_dir(run.name)
        if state == "foreign":
            return f"{run_dir} exists and is not a ddplab run folder: move it, or use another --out"
        if state in ("finished", "unfinished"):
            differing = config_differences(saved_config(run_dir), run.config) - MEETING
            if state == "unfinished":
                differing -= OBSERVERS  # as --resume allows; the rest of what it allows would change the point
            if differing:
                return (
                    f"{run_dir} was trained with other settings than the sweep now asks for "
                    f"({', '.join(sorted(differing))} differ): the sweep file, its profile or --set changed since; "
                    f"use another --out, or move that run folder away{changed_defaults(differing)}"
                )
        return None

    def prepare(
        self, sweep: Sweep, unavailable: dict[str, str], executor: str, echo=print
    ) -> tuple[Manifest, list[tuple[SweepRun, Entry]]]:
        """The folder made ready for `executor` to run into (folders it cannot keep refused first), its manifest
        written, naming the executor (--status and --wait ask it); the points left to run, each with its entry."""
        states = self.run_states(sweep)
        for run in sweep.runs:
            reason = self.stale_reason(run, states[run.name])
            if reason:
                raise ConfigError(reason)
        for sub in ("runs", "configs", "logs"):
            files.make_dir(self.root / sub)
        if sweep.file.resolve() != (self.root / SWEEP_FILE).resolve():
            files.write_text(self.root / SWEEP_FILE, sweep.file.read_text())
        manifest = Manifest.of(sweep, self.earlier_entries(echo), states, unavailable, executor)
        self.write(manifest)
        return manifest, [
            (run, entry) for run, entry in zip(sweep.runs, manifest.runs, strict=True) if not entry.status.settled
        ]
