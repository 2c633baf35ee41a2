"""Find run folders (alone, in sweeps, or anywhere under a folder) and group them into points (each
folder read by runread.py).

A point is one experiment repeated over seeds: runs whose config.toml files are equal once
`train.seed` and the `[output]` section are left out. Reading never stops at a run that did
not finish: it is kept, with its status and error, so the report can list it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddplab.errors import ConfigError, DataError
from ddplab.rundir import runfiles
from ddplab.rundir.runread import Run, SweepShown, displayable, is_run_dir, read_config, readable_run
from ddplab.rundir.summary import final_part
from ddplab.sweepdir.folder import Entry, SweepFolder
from ddplab.sweepdir.spec import point_text

IGNORED_FIELDS = ("train.seed",)  # what may differ between the repeats of one point
IGNORED_SECTIONS = ("output.",)  # where a run was written, not what it trained


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
    assert run.summary is not None  # a finished run's
    summary = run.summary.copy()
    summary["final"] = final_part(last)
    summary["best"] = {"epoch": best.epoch, "test_acc": best.test_acc}
    summary["run"] = {**run.summary["run"], "epochs_planned": epochs, "epochs_done": epochs}
    summary["time"] = {
        **run.summary["time"],
        "train_s": sum(r.train_s for r in history),
        "eval_s": sum(r.eval_s for r in history),
        "total_s": (run.summary["time"].get("startup_s") or 0.0) + sum(r.epoch_s for r in history),
    }
    return dataclasses.replace(
        run,
        summary=summary,
        history=history,
        steps=[r for r in run.steps if isinstance(r.get("epoch"), int) and r["epoch"] <= epochs],
        gpu=[r for r in run.gpu if not isinstance(r.get("epoch"), int) or r["epoch"] <= epochs],
    )


def load_runs(paths: list[Path]) -> list[Run]:
    """Every run under `paths`, in a stable order, each folder once."""
    runs: list[Run] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise ConfigError(f"{path} is not a folder: give run folders, sweep folders, or folders holding them")
        found = find_runs(path)
        if not found:
            raise ConfigError(
                f"no runs found under {path}: no folder holds summary.json, metrics.jsonl or manifest.json"
            )
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
    if SweepFolder(root).has_manifest():
        return sweep_runs(root)
    if is_run_dir(root):
        return [readable_run(root)]
    runs: list[Run] = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        runs += find_runs(sub, seen)
    return runs


def sweep_runs(sweep_dir: Path) -> list[Run]:
    """The runs a sweep's manifest.json lists, with the axis values of each."""
    manifest = SweepFolder(sweep_dir).load()
    shown_as = SweepShown(
        dir=sweep_dir,
        name=displayable(manifest.name or sweep_dir.name),
        description=manifest.description,
        axes=list(manifest.axes),
        sections=list(manifest.sections),
    )
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
        run = Run(
            dir=run_dir,
            name=displayable(run_dir.name),
            status=status,
            config=read_config(run_dir) if run_dir.is_dir() else {},
        )
        run.error = entry.error or failure_reason(status, entry.exit_code, run_dir)
    run.name = displayable(entry.name)
    run.point = dict(entry.point)
    run.axes = list(axes)
    return run


def failure_reason(status: str, exit_code: Any, run_dir: Path) -> str:
    if status == "failed":
        return f"exit code {exit_code}" if exit_code is not None else "failed without an error message"
    if status == "finished":
        return f"the manifest says finished but {run_dir} is missing"
    return f"{status}: not finished when the report was made"


def name_runs(runs: list[Run]) -> None:
    """Give runs that share a folder name their parent's name too, so every row is told apart."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.name] = counts.get(run.name, 0) + 1
    for run in runs:
        if counts[run.name] > 1:
            run.name = f"{displayable(run.dir.parent.name)}/{run.name}"
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
        key = (
            (repr(sorted(config.items(), key=lambda kv: kv[0])), repr(sorted(run.point.items())))
            if config
            else str(run.dir)
        )
        groups.setdefault(key, []).append(run)
    configs = [experiment_config(g[0].config) for g in groups.values()]
    axes = report_axes([g[0] for g in groups.values()], configs)
    points = []
    for group, config in zip(groups.values(), configs, strict=True):
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
    return f"{short}={point_text(value)}"
