"""A sweep file -> a `Sweep`: every run it names, each config validated, in the order they will run.

    [sweep]
    name = "precision"               # the sweep folder defaults to runs/<name>
    description = "fp32 vs bf16 vs fp16 on 2 workers"
    repeats = 2                      # each point with seeds seed, seed+1, ...
    order = "interleaved"            # "listed" (default): a point's seeds one after another;
                                     # "interleaved": every repeat passes over the points, turning
                                     # round each time (A B C, C B A, ...), so that points compared
                                     # for time saw the same load on average
    unavailable = "skip"             # "refuse" (default): a run this machine cannot start (a second
                                     # GPU, NCCL) stops the sweep before it starts; "skip": recorded
                                     # as not measured here, with the machine's reason

    [base.train]                     # a run config, sections as in configs/*.toml
    epochs = 10

    [grid]                           # every combination of these values
    "train.precision" = ["fp32", "bf16", "fp16"]

    [[variants]]                     # explicit sets of settings, crossed with the grid;
    label = "1 worker"               # [[variants.NAME]] for several independent sets
    "dist.strategy" = "single"
    [[variants]]
    label = "2 workers (torchrun)"
    "dist.strategy" = "ddp"
    "dist.nproc" = 2
    launch = "torchrun"              # or "ddplab" (the built-in launcher, the default)

    [[sections]]                     # optional: the report's sections, each a question about some points
    title = "Does bf16 pay?"
    question = "How much faster is bf16, and does it cost accuracy?"
    kind = "compare"                 # run | scaling | overfitting | regularization | compare | all
    points = ["fp32", "bf16"]        # an axis value (a variant's label, a grid value) selects every
    baseline = "fp32"                # point that has it; default: every point, baseline the first
                                     # (a list: each point is compared with the nearest of them)
    note = "Background the data cannot give."

    [not_measured]                   # points a section names that this file (or profile) does not run
    "fp16" = "why not, in one line"

    [adapt.cpu_without_native_bf16]  # settings of named points, applied only where the condition holds
    "bf16" = { "train.epochs" = 3 }  # on the machine that loads the sweep (CONDITIONS); the manifest
                                     # and the report's setup line say what was detected and adapted

    [profiles.cpu.base.train]        # --profile cpu: merged over the file (base deep, grid per
    epochs = 2                       # key; variants, sections, not_measured, adapt and [sweep] keys replaced)

A sweep never runs something other than what it names: a setting may come from one place
only (the base, one axis, or --set), and the seed comes from `repeats`. An adaptation may
change a base setting of the points it names, never an axis's own (the point's name promises it).
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddplab.config import RunConfig, build_config, load_toml, merge, parse_dotted
from ddplab.errors import ConfigError

LAUNCHERS = ("ddplab", "torchrun")
ORDERS = ("listed", "interleaved")
UNAVAILABLE = ("refuse", "skip")
KINDS = ("all", "run", "scaling", "overfitting", "regularization", "compare")
SWEEP_KEYS = {"name", "description", "repeats", "order", "unavailable"}
PROFILE_KEYS = {"sweep", "base", "grid", "variants", "sections", "not_measured", "adapt"}
TOP_KEYS = PROFILE_KEYS | {"profiles"}
SECTION_KEYS = {"title", "question", "kind", "points", "baseline", "note"}
MAX_RUNS = 10_000  # a grid that expands past this is a mistake, and would take minutes to validate
SEED = "train.seed"  # set by `repeats`, never by an axis


@dataclass(frozen=True)
class SweepRun:
    name: str
    point: dict[str, Any]  # axis -> value (a variant set's label)
    seed: int
    config: RunConfig
    launch: str = "ddplab"


def cpu_without_native_bf16() -> tuple[bool, str]:
    from ddplab.metrics.system import cpu_bf16, cpu_model

    found = cpu_bf16()
    return not found["native"], f"this CPU ({cpu_model()}) {found['text']}"


# What an [adapt.NAME] table may depend on: NAME -> a check of this machine, (holds, what was found).
CONDITIONS = {"cpu_without_native_bf16": cpu_without_native_bf16}


@dataclass(frozen=True)
class Adaptation:
    """An [adapt.NAME] table as this machine decided it: the points it names get `settings` when it holds."""

    condition: str
    holds: bool
    detected: str  # what the check found, in words
    points: dict[str, dict[str, Any]]  # point name -> dotted settings
    replaced: dict[str, Any] = field(default_factory=dict)  # dotted setting -> the value the other points keep

    def text(self) -> str:
        """One line for the report's setup and the dry run: what was detected, what it changed."""
        if not self.holds:
            return f"{self.detected}: {', '.join(self.points)} run as written"
        changes = "; ".join(
            f"{name} with "
            + ", ".join(
                f"{k}={v}" + (f" (the others: {self.replaced[k]})" if k in self.replaced else "") for k, v in s.items()
            )
            for name, s in self.points.items()
        )
        return f"{self.detected}: so {changes}"


@dataclass(frozen=True)
class SweepSection:
    """One question of the report, about the points whose axis values its `points` name."""

    title: str
    question: str = ""
    kind: str = "all"
    points: tuple[str, ...] = ()  # empty: every point
    baseline: tuple[str, ...] = ()  # empty: the first of `points`; several: each point takes the nearest
    note: str = ""


@dataclass
class Sweep:
    name: str
    description: str
    axes: list[str]
    repeats: int
    runs: list[SweepRun]
    file: Path
    profile: str | None = None
    overrides: list[str] = field(default_factory=list)  # --set settings, as given
    order: str = "listed"
    unavailable: str = "refuse"
    sections: list[SweepSection] = field(default_factory=list)
    not_measured: dict[str, str] = field(default_factory=dict)  # point name -> why this sweep does not run it
    adaptations: list[Adaptation] = field(default_factory=list)  # [adapt.NAME] tables, as decided on this machine

    def runs_named(self, name: str) -> list[SweepRun]:
        """The runs of every point that has `name` as one of its axis values."""
        return [r for r in self.runs if name in (point_text(v) for v in r.point.values())]

    def point_names(self) -> list[str]:
        return list(dict.fromkeys(point_text(v) for r in self.runs for v in r.point.values()))

    def section_records(self) -> list[dict[str, Any]]:
        """The sections as the manifest stores them: resolved to run names, so the report needs no file."""
        out = []
        for s in self.sections or [SweepSection(title=self.description or self.name)]:
            runs = (
                list(dict.fromkeys(r.name for n in s.points for r in self.runs_named(n)))
                if s.points
                else [r.name for r in self.runs]
            )
            baseline = s.baseline or tuple(n for n in s.points if self.runs_named(n))[:1]
            names = s.points or self.point_names()
            adapted = [a.text() for a in self.adaptations if any(n in a.points for n in names)]
            out.append(
                {
                    "title": s.title,
                    "question": s.question,
                    "kind": s.kind,
                    "note": s.note,
                    "runs": runs,
                    "adapted": adapted,
                    "adapted_points": [n for a in self.adaptations if a.holds for n in a.points if n in names],
                    "baseline_runs": list(dict.fromkeys(r.name for n in baseline for r in self.runs_named(n))),
                    "not_measured": [
                        {"point": n, "reason": self.not_measured[n]} for n in s.points if not self.runs_named(n)
                    ],
                }
            )
        return out


def point_text(value: Any) -> str:
    """A setting's value as text, the one rule for it: a section names its points so, the report's tables and
    labels show it so. Labels as written, numbers as TOML writes them, a tuple as a list."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(point_text(v) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


# ---- reading --------------------------------------------------------------------------------
BUNDLED = Path(__file__).parent / "bundled"  # the seed experiments and the assignment (also ./sweeps in a checkout)


def bundled_sweeps() -> dict[str, str]:
    """The sweeps that ship with ddplab: name -> description."""
    out = {}
    for path in sorted(BUNDLED.glob("*.toml")):
        meta = load_toml(path).get("sweep", {})
        out[path.stem] = str(meta.get("description", ""))
    return out


def sweep_file(name: str | Path) -> Path:
    """A sweep file's path: the path given (`~` expanded), else the bundled sweep of that name."""
    from ddplab.io.files import user_path

    path = user_path(name)
    if path.is_file() or path.suffix == ".toml" or len(path.parts) > 1:
        return path
    if (BUNDLED / f"{name}.toml").is_file():
        return BUNDLED / f"{name}.toml"
    raise ConfigError(f"{name!r} is neither a sweep file nor a bundled sweep; bundled: {', '.join(bundled_sweeps())}")


def load_sweep(
    path: str | Path, profile: str | None = None, overrides: list[str] | None = None, on_gpus: bool | None = None
) -> Sweep:
    """The sweep in `path` with `profile` applied, then `overrides` ("section.field=value" on every run,
    for settings no axis sets: e.g. train.epochs=3), every run validated. `on_gpus`: whether the runs will
    have GPUs, where that is not this machine (an executor's nodes); it picks the default profile."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {path} does not exist (bundled sweeps: ddplab sweep --list)")
    spec = load_toml(path)
    check_tables(spec, TOP_KEYS, f"sweep file {path}")
    profiles = spec.get("profiles", {})
    check_table(profiles, f"sweep file {path}: [profiles]")
    if profile is None and profiles:
        profile = default_profile(profiles, on_gpus)
    if profile is not None:
        if profile not in profiles:
            raise ConfigError(f"sweep file {path} has no profile {profile!r}; it has: {', '.join(profiles) or 'none'}")
        check_tables(profiles[profile], PROFILE_KEYS, f"sweep file {path}: [profiles.{profile}]")
        spec = apply_profile(spec, profiles[profile])
    sweep = expand(spec, path, profile, parse_dotted(overrides or []))
    sweep.overrides = list(overrides or [])
    return sweep


def check_table(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table, got {value!r}")


def check_tables(spec: Any, allowed: set[str], where: str) -> None:
    """Only known top-level tables, each a table (`variants` may also be an array of tables)."""
    check_table(spec, where)
    unknown = set(spec) - allowed
    if unknown:
        raise ConfigError(
            f"{where}: unknown table(s) {', '.join(sorted(unknown))}; a sweep file has {', '.join(sorted(allowed))}"
        )
    for key, value in spec.items():
        if key == "variants":
            if not isinstance(value, (list, dict)):
                raise ConfigError(
                    f"{where}: variants must be an array of tables ([[variants]] or [[variants.NAME]]), got {value!r}"
                )
            continue
        if key == "sections":
            if not isinstance(value, list):
                raise ConfigError(f"{where}: sections must be an array of tables ([[sections]]), got {value!r}")
            continue
        check_table(value, f"{where}: [{key}]")
    for section, values in spec.get("base", {}).items():
        check_table(values, f"{where}: [base.{section}]")


def default_profile(profiles: dict[str, Any], on_gpus: bool | None = None) -> str | None:
    """ "gpu" where the runs will have GPUs (`on_gpus`; None: this machine, if it has CUDA), else "cpu", when the
    file has them."""
    if on_gpus is None:
        import torch

        on_gpus = torch.cuda.is_available()
    preferred = "gpu" if on_gpus else "cpu"
    return preferred if preferred in profiles else None


def apply_profile(spec: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    for section, values in profile.get("base", {}).items():
        out.setdefault("base", {}).setdefault(section, {}).update(values)
    out.setdefault("grid", {}).update(profile.get("grid", {}))
    for replaced in ("variants", "sections", "not_measured", "adapt"):
        if replaced in profile:
            out[replaced] = profile[replaced]
    out.setdefault("sweep", {}).update(profile.get("sweep", {}))
    return out


Axis = tuple[str, list[tuple[Any, dict[str, Any]]]]  # name -> [(shown value, dotted settings)]


def expand(
    spec: dict[str, Any], path: Path, profile: str | None = None, overrides: dict[str, dict[str, Any]] | None = None
) -> Sweep:
    meta = sweep_settings(spec.get("sweep", {}), path)
    axes = grid_axes(spec.get("grid", {})) + variant_axes(spec.get("variants", []))
    check_one_source(axes, overrides or {}, spec.get("base", {}))
    count = math.prod(len(values) for _, values in axes) * meta["repeats"]
    if count > MAX_RUNS:
        raise ConfigError(f"sweep file {path} expands to {count:,} runs (more than {MAX_RUNS:,}): shorten the grid")
    base = spec.get("base", {})
    adaptations = read_adaptations(spec.get("adapt", {}), axes, path, base)
    for a in adaptations:  # where its condition holds: elsewhere it sets nothing, and --set has the key alone
        if not a.holds:
            continue
        for key in sorted({k for settings in a.points.values() for k in settings}):
            section, _, name = key.partition(".")
            if name in (overrides or {}).get(section, {}):
                raise ConfigError(
                    f"--set {key} would replace what [adapt.{a.condition}] sets for "
                    f"{', '.join(a.points)}: the report would say one and the runs train the other; "
                    "change the sweep file instead"
                )
    seed0 = base.get("train", {}).get("seed", 0)
    if isinstance(seed0, bool) or not isinstance(seed0, int):
        raise ConfigError(f"train.seed={seed0!r} in [base.train] is not valid: expected an integer")
    points: list[list[SweepRun]] = []
    names: set[str] = set()
    for combo in itertools.product(*(values for _, values in axes)):
        point = {axis: shown for (axis, _), (shown, _) in zip(axes, combo, strict=True)}
        settings = {k: v for _, dotted in combo for k, v in dotted.items()}
        launch = settings.pop("launch", "ddplab")
        for a in adaptations:  # applied where its condition holds, checked on every machine
            for name in (point_text(shown) for shown in point.values() if point_text(shown) in a.points):
                if a.holds:
                    settings.update(a.points[name])
                    continue
                try:
                    build_config(merge(merge_dotted(base, {**settings, **a.points[name]}), overrides or {}))
                except ConfigError as exc:
                    raise ConfigError(f"sweep file {path}: [adapt.{a.condition}] {name!r}: {exc}") from None
        if launch not in LAUNCHERS:
            raise ConfigError(
                f"launch={launch!r} in sweep point {point} is not valid: choose one of {', '.join(LAUNCHERS)}"
            )
        runs = []
        for r in range(meta["repeats"]):
            values = merge(merge_dotted(base, {**settings, SEED: seed0 + r}), overrides or {})
            run_name = unique(run_name_for(point, seed0 + r, meta["repeats"]), names)
            try:
                config = build_config(values)
            except ConfigError as exc:
                raise ConfigError(f"sweep run {run_name} ({point}): {exc}") from None
            runs.append(SweepRun(run_name, point, seed0 + r, config, launch))
        points.append(runs)
    if not points or not points[0]:
        raise ConfigError(f"sweep file {path} defines no runs")
    sweep = Sweep(
        name=meta["name"] or path.stem,
        description=meta["description"],
        axes=[a for a, _ in axes],
        repeats=meta["repeats"],
        runs=ordered(points, meta["order"]),
        file=path,
        profile=profile,
        order=meta["order"],
        unavailable=meta["unavailable"],
        not_measured=not_measured_table(spec.get("not_measured", {})),
        adaptations=adaptations,
    )
    for a in adaptations:
        unknown = [n for n in a.points if n not in sweep.point_names()]
        if unknown:
            raise ConfigError(
                f"sweep file {path}: [adapt.{a.condition}] names point(s) {', '.join(unknown)}, which no run "
                f"has (points: {', '.join(sweep.point_names())})"
            )
    sweep.sections = read_sections(spec.get("sections", []), sweep, path)
    return sweep


def sweep_settings(meta: dict[str, Any], path: Path) -> dict[str, Any]:
    unknown = set(meta) - SWEEP_KEYS
    if unknown:
        raise ConfigError(f"sweep file {path}: unknown [sweep] setting(s) {', '.join(sorted(unknown))}")
    repeats = meta.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or not 1 <= repeats <= MAX_RUNS:
        raise ConfigError(f"sweep.repeats={repeats!r} is not valid: must be an integer >= 1")
    for key, allowed in (("order", ORDERS), ("unavailable", UNAVAILABLE)):
        if meta.get(key, allowed[0]) not in allowed:
            raise ConfigError(f"sweep.{key}={meta[key]!r} is not valid: choose one of {', '.join(allowed)}")
    for key in ("name", "description"):
        if not isinstance(meta.get(key, ""), str):
            raise ConfigError(f"sweep.{key}={meta[key]!r} is not valid: expected text")
    return {
        "name": meta.get("name", ""),
        "description": meta.get("description", ""),
        "repeats": repeats,
        "order": meta.get("order", "listed"),
        "unavailable": meta.get("unavailable", "refuse"),
    }


def grid_axes(grid: dict[str, Any]) -> list[Axis]:
    axes = []
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid.{key} must be a non-empty list of values, got {values!r}")
        if key == SEED:
            raise ConfigError(
                f"grid.{SEED}: the seed is set by [sweep] repeats (seed, seed+1, ...) from "
                "[base.train] seed; a grid over it would name runs by seeds they do not train with"
            )
        check_dotted(key)
        no_repeats(values, f"grid.{key}")
        axes.append((key, [(v, {key: v}) for v in values]))
    return axes


def no_repeats(values: list[Any], where: str) -> None:
    """An axis lists each value once: a repeat would be the same run twice under two names (repeats do that,
    with their own seeds)."""
    seen = []
    for value in values:
        if value in seen:
            raise ConfigError(
                f"{where} lists {value!r} twice: the same point would run twice under two names "
                "(for repeats, use [sweep] repeats, which gives each its own seed)"
            )
        seen.append(value)


def variant_axes(variants: Any) -> list[Axis]:
    if isinstance(variants, list):
        sets = {"variant": variants}
    elif isinstance(variants, dict):
        sets = variants
    else:
        raise ConfigError(f"[variants] must be an array of tables or tables of them, got {variants!r}")
    axes = []
    for set_name, entries in sets.items():
        if not isinstance(entries, list):
            raise ConfigError(
                f"variants.{set_name} must be an array of tables ([[variants.{set_name}]]), got {entries!r}"
            )
        if entries:
            axis = [variant_entry(set_name, i, e) for i, e in enumerate(entries)]
            no_repeats([label for label, _ in axis], f"variants.{set_name} (labels)")
            axes.append((set_name, axis))
    return axes


def variant_entry(set_name: str, index: int, entry: Any) -> tuple[Any, dict[str, Any]]:
    if not isinstance(entry, dict):
        raise ConfigError(f"variants.{set_name}[{index}] must be a table of settings, got {entry!r}")
    settings = {k: v for k, v in entry.items() if k != "label"}
    for key in settings:
        if key == SEED:
            raise ConfigError(f"variants.{set_name}[{index}] sets {SEED}: the seed is set by [sweep] repeats")
        if key != "launch":
            check_dotted(key)
    label = entry.get("label") or ", ".join(f"{k}={v}" for k, v in settings.items()) or "default"
    if not isinstance(label, str):
        raise ConfigError(f"variants.{set_name}[{index}].label={label!r} is not valid: expected text")
    return label, settings


def check_dotted(key: str) -> None:
    section, dot, name = key.partition(".")
    if not dot or not name:
        raise ConfigError(f'sweep setting {key!r} is not valid: write section.field, e.g. "train.batch_size"')
    if section == "output" and name in ("out", "resume"):
        raise ConfigError(
            f"sweep setting {key!r} is not valid: the sweep names each run's folder and resumes runs itself"
        )


def check_one_source(axes: list[Axis], overrides: dict[str, dict[str, Any]], base: dict[str, Any]) -> None:
    """Every setting comes from one place: the base, one axis, or --set. Otherwise a point's name
    would promise a value that something else replaced."""
    owner: dict[str, str] = {}
    for axis, values in axes:
        for key in {k for _, settings in values for k in settings}:
            if key in owner:
                raise ConfigError(
                    f"{key} is set by two axes ({owner[key]} and {axis}): each point would train with "
                    "whichever came last; set it in one place"
                )
            owner[key] = axis
    for section, settings in overrides.items():
        for name in settings:
            key = f"{section}.{name}"
            if key == SEED:
                raise ConfigError(f"--set {SEED}: the seed is set by [sweep] repeats from [base.train] seed")
            check_dotted(key)
            if key in owner:
                raise ConfigError(
                    f"--set {key} would replace the sweep's own axis {owner[key]}: the runs would keep "
                    "names they no longer train with; change the sweep file instead"
                )
    output = base.get("output", {})
    for name in ("out", "resume"):
        if name in output:
            raise ConfigError(
                f"[base.output] {name} is not valid in a sweep: the sweep names each run's folder "
                "and resumes interrupted runs itself"
            )


def read_adaptations(table: Any, axes: list[Axis], path: Path, base: dict[str, Any]) -> list[Adaptation]:
    """The [adapt.NAME] tables, each condition checked on this machine once. An adaptation sets base settings
    only: an axis's own setting (or the seed) is what a point's name promises, so it is refused."""
    check_table(table, f"sweep file {path}: [adapt]")
    owned = {k for _, values in axes for _, settings in values for k in settings}
    out = []
    for condition, points in table.items():
        where = f"sweep file {path}: [adapt.{condition}]"
        if condition not in CONDITIONS:
            raise ConfigError(f"{where}: unknown condition; ddplab knows {', '.join(CONDITIONS)}")
        check_table(points, where)
        for name, settings in points.items():
            if not isinstance(settings, dict) or not settings:
                raise ConfigError(
                    f'{where}.{name!r} must be a table of settings, e.g. {{ "train.epochs" = 3 }}, got {settings!r}'
                )
            for key in settings:
                check_dotted(key)
                if key == SEED or key in owned:
                    raise ConfigError(
                        f"{where}: {name!r} sets {key}, which {'[sweep] repeats' if key == SEED else 'an axis'} "
                        "sets: an adaptation changes base settings only (the point's name promises the rest)"
                    )
        holds, detected = CONDITIONS[condition]()
        replaced = {}  # what the points it leaves alone keep, where the base sets it
        for key in {k for settings in points.values() for k in settings}:
            section, _, field_name = key.partition(".")
            if field_name in base.get(section, {}):
                replaced[key] = base[section][field_name]
        out.append(Adaptation(condition, holds, detected, {n: dict(s) for n, s in points.items()}, replaced))
    return out


def not_measured_table(table: Any) -> dict[str, str]:
    for name, reason in table.items():
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"not_measured.{name} must say why, as text, got {reason!r}")
    return dict(table)


def read_sections(entries: list[Any], sweep: Sweep, path: Path) -> list[SweepSection]:
    sections = []
    for i, entry in enumerate(entries):
        where = f"sweep file {path}: sections[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a table, got {entry!r}")
        unknown = set(entry) - SECTION_KEYS
        if unknown:
            raise ConfigError(
                f"{where}: unknown setting(s) {', '.join(sorted(unknown))}; a section has "
                + ", ".join(sorted(SECTION_KEYS))
            )
        if not isinstance(entry.get("title"), str) or not entry["title"].strip():
            raise ConfigError(f"{where} needs a title")
        for key in ("question", "note"):
            if not isinstance(entry.get(key, ""), str):
                raise ConfigError(f"{where}.{key}={entry[key]!r} is not valid: expected text")
        baseline = entry.get("baseline", [])
        baseline = [baseline] if isinstance(baseline, str) else baseline
        if not isinstance(baseline, list) or not all(isinstance(b, str) for b in baseline):
            raise ConfigError(f"{where}.baseline must be a point name or a list of them, got {entry['baseline']!r}")
        kind = entry.get("kind", "all")
        if kind not in KINDS:
            raise ConfigError(f"{where}.kind={kind!r} is not valid: choose one of {', '.join(KINDS)}")
        points = entry.get("points", [])
        if not isinstance(points, list) or not all(isinstance(p, str) for p in points):
            raise ConfigError(f"{where}.points must be a list of point names, got {points!r}")
        for name in points + baseline:
            if not sweep.runs_named(name) and name not in sweep.not_measured:
                values = sorted({point_text(v) for r in sweep.runs for v in r.point.values()})
                raise ConfigError(
                    f"{where} names point {name!r}, which no run has (points: {', '.join(values)}); "
                    f"if this {'profile' if sweep.profile else 'file'} leaves it out on purpose, say why "
                    "under [not_measured]"
                )
        if points and set(baseline) - set(points):
            raise ConfigError(
                f"{where}.baseline: {', '.join(sorted(set(baseline) - set(points)))} is not one of its points"
            )
        sections.append(
            SweepSection(
                title=entry["title"],
                question=entry.get("question", ""),
                kind=kind,
                points=tuple(points),
                baseline=tuple(baseline),
                note=entry.get("note", ""),
            )
        )
    return sections


def ordered(points: list[list[SweepRun]], order: str) -> list[SweepRun]:
    """Runs in running order. Interleaved: repeat r visits the points forwards when r is even, backwards
    when odd (A B C C B A ...), so a slow drift of the machine's load hits every point alike."""
    if order == "listed":
        return [run for runs in points for run in runs]
    out = []
    for r in range(max(len(runs) for runs in points)):
        sweep = points if r % 2 == 0 else points[::-1]
        out += [runs[r] for runs in sweep if r < len(runs)]
    return out


def merge_dotted(base: dict[str, Any], dotted: dict[str, Any]) -> dict[str, Any]:
    """`base` (TOML-shaped) with {"section.field": value} settings on top (typed values kept)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in dotted.items():
        section, _, name = key.partition(".")
        out.setdefault(section, {})[name] = value
    return out


def slug(value: Any) -> str:
    import re

    text = str(value).lower().replace(".", "p") if isinstance(value, float) else str(value).lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "x"


MAX_NAME = 120  # characters of a run's folder name (a file name may hold 255 bytes; its logs add a suffix)


def run_name_for(point: dict[str, Any], seed: int, repeats: int) -> str:
    """Readable and stable: `batch_size-32_2-workers_s0` (the seed only when there are repeats). A name past
    MAX_NAME keeps its start and ends in a hash of the whole, so long labels still name distinct folders."""
    import hashlib

    parts = [slug(v) if "." not in axis else f"{slug(axis.rsplit('.', 1)[1])}-{slug(v)}" for axis, v in point.items()]
    seed_part = f"_s{seed}" if repeats > 1 else ""
    name = "_".join(parts) or "run"
    if len(name) + len(seed_part) > MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:10]
        name = f"{name[: MAX_NAME - len(seed_part) - 11].rstrip('-_')}-{digest}"
    return name + seed_part


def unique(name: str, taken: set[str]) -> str:
    candidate, i = name, 2
    while candidate in taken:
        candidate, i = f"{name}-{i}", i + 1
    taken.add(candidate)
    return candidate
