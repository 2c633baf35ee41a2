"""Find run folders (alone, in sweeps, or anywhere under a folder) and group them into points.

A point is one experiment repeated over seeds: runs whose config.toml files are equal once
`train.seed` and the `[output]` section are left out. Reading never stops at a run that did
not finish: it is kept, with its status and error, so the report can list it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddplab import runfiles
from ddplab.borders import COUNT, TABLE, TEXT, kept
from ddplab.errors import ConfigError, DataError
from ddplab.metrics.records import EpochRecord, read_epochs
from ddplab.metrics.summary import read_summary
from ddplab.runfiles import read_json, read_jsonl

if TYPE_CHECKING:
    from ddplab.sweep.folder import Entry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FINISHED = ("finished", "stopped_early")  # summary.json statuses of a run that ran to its end
# What the report shows of env.json (engine/rundir.environment writes it): a field of another kind is left
# out and said, the rest of the run drawn.
ENV = {"device_name": TEXT, "torch": TEXT, "cpus": COUNT, "network": TABLE | None}
IGNORED_FIELDS = ("train.seed",)  # what may differ between the repeats of one point
IGNORED_SECTIONS = ("output.",)  # where a run was written, not what it trained


@dataclass
class SweepShown:
    """A sweep as its manifest describes it: the report makes one section per entry of `sections`."""

    dir: Path
    name: str
    description: str = ""
    axes: list[str] = field(default_factory=list)
    sections: list[dict[str, Any]] = field(default_factory=list)  # version 2; [] means one over every run


@dataclass
class Run:
    """One run folder as read from disk; `summary` is None unless it finished."""

    dir: Path
    name: str
    status: str  # finished | stopped_early | unfinished | failed | pending | running
    config: dict[str, Any] = field(default_factory=dict)  # flattened: {"train.batch_size": 32, ...}
    summary: dict[str, Any] | None = None
    history: list[EpochRecord] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    gpu: list[dict[str, Any]] = field(default_factory=list)
    point: dict[str, Any] = field(default_factory=dict)  # sweep axis values, from the manifest
    axes: list[str] = field(default_factory=list)  # the manifest's axes; empty outside sweeps
    error: str | None = None
    sweep: SweepShown | None = None  # the sweep it belongs to; None for a run given on its own
    env: dict[str, Any] = field(default_factory=dict)  # env.json: versions, device name, host
    skipped: list[str] = field(default_factory=list)  # what of its files the report could not use, said in its findings

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def seed(self) -> Any:
        return self.config.get("train.seed", (self.summary or {}).get("run", {}).get("seed"))


@dataclass
class Point:
    """Runs of one configuration over several seeds."""

    label: str
    runs: list[Run]
    config: dict[str, Any]  # flattened, without the fields repeats may vary
    axes: dict[str, Any]  # the values of the report's axes at this point


def first_epochs(run: Run, epochs: int) -> Run:
    """A finished run as if it had stopped after `epochs`: what a run of that many epochs would have
    recorded, seed for seed, when nothing in its recipe is planned over its length
    (`config.SCHEDULES_OVER_THE_RUN`; the caller checks). Its time is its startup and those epochs."""
    import dataclasses

    history = run.history[:epochs]
    last, best = history[-1], max(history, key=lambda r: r.test_acc)
    final = {k: getattr(last, k) for k in ("epoch", "train_loss", "train_acc", "train_eval_loss", "train_eval_acc",
                                           "test_loss", "test_acc")}
    summary = dict(run.summary or {})
    summary.update(final=final, best={"epoch": best.epoch, "test_acc": best.test_acc},
                   run={**summary.get("run", {}), "epochs_planned": epochs, "epochs_done": epochs},
                   time={**summary.get("time", {}), "train_s": sum(r.train_s for r in history),
                         "eval_s": sum(r.eval_s for r in history),
                         "total_s": (summary.get("time", {}).get("startup_s") or 0.0) + sum(r.epoch_s for r in history)})
    return dataclasses.replace(run, summary=summary, history=history,
                               steps=[r for r in run.steps if isinstance(r.get("epoch"), int) and r["epoch"] <= epochs],
                               gpu=[r for r in run.gpu if not isinstance(r.get("epoch"), int) or r["epoch"] <= epochs])


def load_runs(paths: list[Path]) -> list[Run]:
    """Every run under `paths`, in a stable order, each folder once."""
    runs: list[Run] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise ConfigError(f"{path} is not a folder: give run folders, sweep folders, or folders holding them")
        found = find_runs(path)
        if not found:
            raise ConfigError(f"no runs found under {path}: no folder holds summary.json, metrics.jsonl or manifest.json")
        runs += found
    if runs and all(run.status == "unreadable" for run in runs):
        raise DataError(runs[0].error)  # nothing to draw: the first file that could not be read
    unique, seen = [], set()
    for run in runs:  # a folder given twice (or inside two given folders) counts once
        if run.dir.resolve() not in seen:
            seen.add(run.dir.resolve())
            unique.append(run)
    name_runs(unique)
    return unique


def find_runs(root: Path, seen: set[Path] | None = None) -> list[Run]:
    """Runs at `root` (a run or a sweep folder), else in the folders below it, not looking inside runs.

    Each real folder is read once: a link back up the tree (`latest -> .`) is not walked again.
    """
    seen = set() if seen is None else seen
    real = root.resolve()
    if real in seen:
        return []
    seen.add(real)
    if (root / "manifest.json").is_file():
        return load_sweep(root)
    if is_run_dir(root):
        return [readable_run(root)]
    runs: list[Run] = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        runs += find_runs(sub, seen)
    return runs


def is_run_dir(path: Path) -> bool:
    """A folder ddplab trained into: finished, or started (config.toml and env.json written)."""
    return any((path / f).is_file() for f in (runfiles.SUMMARY, runfiles.METRICS)) or all(
        (path / f).is_file() for f in (runfiles.CONFIG, runfiles.ENV))


def readable_run(run_dir: Path, status: str | None = None) -> Run:
    """`load_run` for a report over many runs: a run whose files cannot be read (truncated, edited)
    comes back "unreadable", with the reason, so the report draws the others and lists it."""
    try:
        return load_run(run_dir, status)
    except DataError as exc:
        return Run(dir=run_dir, name=shown(run_dir.name), status="unreadable", config={}, error=shown(str(exc)))


def load_run(run_dir: Path, status: str | None = None) -> Run:
    """A run with its records; one without summary.json comes back unfinished, with what it left."""
    run = Run(dir=run_dir, name=shown(run_dir.name), status=status or "unfinished", config=read_config(run_dir))
    if not (run_dir / runfiles.SUMMARY).is_file():
        run.error = unfinished_reason(run_dir)
        return run
    run.summary, run.history = read_summary(run_dir), read_epochs(run_dir / runfiles.METRICS, run_dir)
    run.status = str(run.summary.get("status", "finished"))
    run.steps = numeric_records(read_optional(run_dir / runfiles.STEPS, run_dir), run_dir / runfiles.STEPS, run.skipped)
    run.gpu = numeric_records(read_optional(run_dir / runfiles.GPU, run_dir), run_dir / runfiles.GPU, run.skipped)
    if (run_dir / runfiles.ENV).is_file():
        run.env, skipped = kept(read_json(run_dir / runfiles.ENV, run_dir), ENV, str(run_dir / runfiles.ENV))
        run.skipped += skipped
    return run


def load_sweep(sweep_dir: Path) -> list[Run]:
    """The runs a sweep's manifest.json lists, with the axis values of each."""
    from ddplab.sweep.folder import SweepFolder

    manifest = SweepFolder(sweep_dir).load()
    shown_as = SweepShown(dir=sweep_dir, name=shown(manifest.name or sweep_dir.name), description=manifest.description,
                          axes=list(manifest.axes), sections=list(manifest.sections))
    runs = [sweep_run(sweep_dir, entry, manifest.axes) for entry in manifest.runs]
    for run in runs:
        run.sweep = shown_as
    return runs


def sweep_run(sweep_dir: Path, entry: Entry, axes: list[str]) -> Run:
    run_dir = sweep_dir / entry.dir
    status = entry.status.value
    # A run folder that finished is read whatever the manifest says: a Slurm sweep's tasks finish on
    # their own, after the manifest was last written.
    if run_dir.is_dir() and (status == "finished" or runfiles.run_state(run_dir) == "finished"):
        run = readable_run(run_dir)
        if not run.finished and run.status != "unreadable":
            run.error = f"the manifest says finished but {run_dir} has no summary.json"
    else:
        run = Run(dir=run_dir, name=shown(run_dir.name), status=status,
                  config=read_config(run_dir) if run_dir.is_dir() else {})
        run.error = entry.error or failure_reason(status, entry.exit_code, run_dir)
    run.name = shown(entry.name)
    run.point = dict(entry.point)
    run.axes = list(axes)
    return run


def failure_reason(status: str, exit_code: Any, run_dir: Path) -> str:
    if status == "failed":
        return f"exit code {exit_code}" if exit_code is not None else "failed without an error message"
    if status == "finished":
        return f"the manifest says finished but {run_dir} is missing"
    return f"{status}: not finished when the report was made"


def unfinished_reason(run_dir: Path) -> str:
    """What a run without summary.json left: epochs recorded and the last error in its log."""
    try:
        epochs = len(read_epochs(run_dir / runfiles.METRICS, run_dir, growing=True))
    except (ConfigError, DataError):
        epochs = 0
    reason = f"no summary.json: stopped or still running after {epochs} epoch{'s' * (epochs != 1)}"
    try:
        lines = (run_dir / runfiles.LOG).read_text(errors="replace").splitlines()
    except OSError:
        return reason
    errors = [line.strip() for line in lines if "error" in line.lower()]
    return f"{reason}; log: {errors[-1][:300]}" if errors else reason


def read_optional(path: Path, run_dir: Path) -> list[dict[str, Any]]:
    """Records of an optional JSONL file (steps.jsonl, gpu.jsonl); none when it is absent."""
    if not path.is_file():
        return []
    records = read_jsonl(path, run_dir)
    if not all(isinstance(r, dict) for r in records):
        raise DataError(f"{path} does not hold JSON objects, one per line")
    return records


def numeric_records(records: list[dict[str, Any]], path: Path, skipped: list[str]) -> list[dict[str, Any]]:
    """The records of a per-step or per-sample file whose values are numbers (or lists of them, or None), the
    others left out and counted in `skipped`: one edited line must not cost the whole report."""
    def number(v: Any) -> bool:
        return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) or (
            isinstance(v, list) and all(number(x) for x in v))

    kept = [r for r in records if all(number(v) for v in r.values())]
    if len(kept) < len(records):
        skipped.append(f"{len(records) - len(kept)} of {len(records)} records of {path.name} left out (values that "
                       "are not numbers)")
    return kept


def read_config(run_dir: Path) -> dict[str, Any]:
    """config.toml flattened to dotted names; empty when the run wrote none."""
    path = run_dir / runfiles.CONFIG
    try:
        with path.open("rb") as f:
            return flatten(tomllib.load(f))
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise DataError(f"{path} is not valid TOML: {str(exc).splitlines()[0]}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} cannot be read ({type(exc).__name__})") from None


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def shown(text: str) -> str:
    """A name from the file system as text that can be shown and written: bytes that are not UTF-8 (Python keeps
    them as lone surrogates) become U+FFFD, which pages, CSVs, JSON and plot labels all take."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def name_runs(runs: list[Run]) -> None:
    """Give runs that share a folder name their parent's name too, so every row is told apart."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.name] = counts.get(run.name, 0) + 1
    for run in runs:
        if counts[run.name] > 1:
            run.name = f"{shown(run.dir.parent.name)}/{run.name}"
    seen: dict[str, int] = {}
    for run in runs:  # still equal (same parent names): number them
        seen[run.name] = seen.get(run.name, 0) + 1
        if seen[run.name] > 1:
            run.name = f"{run.name}#{seen[run.name]}"


# ---- points -------------------------------------------------------------------------------
def experiment_config(config: dict[str, Any]) -> dict[str, Any]:
    """The fields that define what was trained: all but the seed and the output settings."""
    return {k: v for k, v in config.items() if k not in IGNORED_FIELDS and not k.startswith(IGNORED_SECTIONS)}


def groups_without(points: list[Point], prefixes: tuple[str, ...]) -> list[list[int]]:
    """Indexes of points whose configs are equal once the fields starting with `prefixes` are left out
    (a point without a config is a group of its own): the points a scaling or batch-size line joins."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(points):
        config = {k: v for k, v in experiment_config(p.config).items() if not k.startswith(prefixes)}
        groups.setdefault(repr(sorted(config.items())) if config else p.label, []).append(i)
    return list(groups.values())


def group_points(runs: list[Run]) -> list[Point]:
    """Finished runs grouped over seeds, in order of first appearance, labelled by the axes that vary."""
    groups: dict[Any, list[Run]] = {}
    for run in (r for r in runs if r.finished):
        config = experiment_config(run.config)
        # Without a config.toml there is nothing to match on: such a run is a point of its own.
        key = (repr(sorted(config.items(), key=lambda kv: kv[0])), repr(sorted(run.point.items()))) if config else str(run.dir)
        groups.setdefault(key, []).append(run)
    configs = [experiment_config(g[0].config) for g in groups.values()]
    axes = report_axes([g[0] for g in groups.values()], configs)
    points = []
    for group, config in zip(groups.values(), configs):
        values = {a: group[0].point.get(a, config.get(a)) for a in axes}
        points.append(Point(label="", runs=group, config=config, axes=values))
    label_points(points)
    return points


def report_axes(first_runs: list[Run], configs: list[dict[str, Any]]) -> list[str]:
    """The sweeps' axes that vary here when every point comes from a sweep, else the config fields that differ."""
    if first_runs and all(r.axes for r in first_runs):
        axes = list(dict.fromkeys(a for r in first_runs for a in r.axes if a not in IGNORED_FIELDS))
        varying = [a for a in axes if len({repr(p.point.get(a)) for p in first_runs}) > 1]
        if len(first_runs) == 1:
            return axes
        if varying:
            return varying
    return differing_fields(configs)


def differing_fields(configs: list[dict[str, Any]]) -> list[str]:
    names = list(dict.fromkeys(k for c in configs for k in c))
    return [k for k in names if len({repr(c.get(k)) for c in configs}) > 1]


def label_points(points: list[Point]) -> None:
    """Short labels from the axis values: a variant's label as written, a setting as name=value
    ("batch_size=32, 2 workers"); the run name when nothing varies."""
    names = [a for a in (points[0].axes if points else {})]
    short = {a: a.rsplit(".", 1)[-1] for a in names}
    if len(set(short.values())) < len(short):
        short = {a: a for a in names}
    for p in points:
        label = ", ".join(axis_text(a, short[a], v) for a, v in p.axes.items())
        p.label = label or p.runs[0].name
    seen: dict[str, int] = {}
    for p in points:
        seen[p.label] = seen.get(p.label, 0) + 1
        if seen[p.label] > 1:
            p.label = f"{p.label} ({p.runs[0].name})"


def axis_text(axis: str, short: str, value: Any) -> str:
    """A sweep's variant sets (no dot in their name) are labelled by their own labels when those are words;
    settings, and bare numbers, by name=value."""
    if "." not in axis and isinstance(value, str) and any(c.isalpha() for c in value):
        return value
    return f"{short}={value_text(value)}"


def value_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)
