"""A sweep file -> many run configs -> one process tree each -> a manifest and a report.

    [sweep]
    name = "precision"               # the sweep folder defaults to runs/<name>
    description = "fp32 vs bf16 vs fp16 on 2 workers"
    repeats = 2                      # each point with seeds seed, seed+1, ...

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

    [profiles.cpu.base.train]        # --profile cpu: merged over the file (base deep, grid per
    epochs = 2                       # key, variants and [sweep] replaced)

Every run config is built and validated, with this machine's checks, before the first run
starts. Each run is its own process tree (`python -m ddplab train`, or torchrun), in its
own session, so a crash, a CUDA error or a hang cannot poison the next; it writes its own
run folder `runs/<name>`, named after its point. A failed run is recorded with its exit code
and error line and the sweep goes on. Running the same sweep again skips finished runs and
resumes interrupted ones from their checkpoints. `manifest.json` says which run is which
point, and is rewritten (atomically) whenever a run starts or ends.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddplab import files
from ddplab.config import RunConfig, build_config, check_environment, load_toml, merge, parse_dotted
from ddplab.errors import ConfigError

MANIFEST = "manifest.json"
LAUNCHERS = ("ddplab", "torchrun")
SWEEP_KEYS = {"name", "description", "repeats"}
TOP_KEYS = {"sweep", "base", "grid", "variants", "profiles"}


@dataclass
class SweepRun:
    name: str
    point: dict[str, Any]  # axis -> value (a variant set's label)
    seed: int
    config: RunConfig
    launch: str = "ddplab"


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


# ---- reading a sweep file -------------------------------------------------------------


def load_sweep(path: str | Path, profile: str | None = None, overrides: list[str] | None = None) -> Sweep:
    """The sweep in `path` with `profile` applied, then `overrides` ("section.field=value", on every
    run, over the file's own values: e.g. dist.nproc=1 on a one-GPU machine), every run validated."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {path} does not exist (bundled sweeps are in sweeps/*.toml)")
    spec = load_toml(path)
    unknown = set(spec) - TOP_KEYS
    if unknown:
        raise ConfigError(f"sweep file {path}: unknown table(s) {', '.join(sorted(unknown))}; "
                          f"a sweep file has {', '.join(sorted(TOP_KEYS))}")
    profiles = spec.get("profiles", {})
    if profile is None and profiles:
        profile = default_profile(profiles)
    if profile is not None:
        if profile not in profiles:
            raise ConfigError(f"sweep file {path} has no profile {profile!r}; it has: {', '.join(profiles) or 'none'}")
        spec = apply_profile(spec, profiles[profile])
    sweep = expand(spec, path, profile, parse_dotted(overrides or []))
    sweep.overrides = list(overrides or [])
    return sweep


def default_profile(profiles: dict[str, Any]) -> str | None:
    """"gpu" on a CUDA machine, else "cpu", when the file has them."""
    import torch

    preferred = "gpu" if torch.cuda.is_available() else "cpu"
    return preferred if preferred in profiles else None


def apply_profile(spec: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    for section, values in profile.get("base", {}).items():
        out.setdefault("base", {}).setdefault(section, {}).update(values)
    out.setdefault("grid", {}).update(profile.get("grid", {}))
    if "variants" in profile:
        out["variants"] = profile["variants"]
    out.setdefault("sweep", {}).update(profile.get("sweep", {}))
    return out


def expand(spec: dict[str, Any], path: Path, profile: str | None = None,
           overrides: dict[str, dict[str, Any]] | None = None) -> Sweep:
    meta = spec.get("sweep", {})
    unknown = set(meta) - SWEEP_KEYS
    if unknown:
        raise ConfigError(f"sweep file {path}: unknown [sweep] setting(s) {', '.join(sorted(unknown))}")
    name = str(meta.get("name") or path.stem)
    repeats = meta.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"sweep.repeats={repeats!r} is not valid: must be an integer >= 1")
    axes: list[tuple[str, list[tuple[Any, dict[str, Any]]]]] = []  # axis -> [(shown value, dotted settings)]
    for key, values in spec.get("grid", {}).items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid.{key} must be a non-empty list of values, got {values!r}")
        axes.append((key, [(v, {key: v}) for v in values]))
    variants = spec.get("variants", [])
    sets = {"variant": variants} if isinstance(variants, list) else dict(variants)
    for set_name, entries in sets.items():
        if entries:
            axes.append((set_name, [variant_entry(set_name, i, e) for i, e in enumerate(entries)]))
    base = spec.get("base", {})
    seed0 = base.get("train", {}).get("seed", 0)
    runs, names = [], set()
    for combo in itertools.product(*(values for _, values in axes)):
        point = {axis: shown for (axis, _), (shown, _) in zip(axes, combo)}
        settings: dict[str, Any] = {}
        for _, dotted in combo:
            settings.update(dotted)
        launch = settings.pop("launch", "ddplab")
        if launch not in LAUNCHERS:
            raise ConfigError(f"launch={launch!r} in sweep point {point} is not valid: choose one of {', '.join(LAUNCHERS)}")
        for r in range(repeats):
            values = merge(merge_dotted(base, {**settings, "train.seed": seed0 + r}), overrides or {})
            run_name = unique(run_name_for(point, seed0 + r, repeats), names)
            try:
                config = build_config(values)
            except ConfigError as exc:
                raise ConfigError(f"sweep run {run_name} ({point}): {exc}") from None
            runs.append(SweepRun(run_name, point, seed0 + r, config, launch))
    if not runs:
        raise ConfigError(f"sweep file {path} defines no runs")
    return Sweep(name=name, description=str(meta.get("description", "")), axes=[a for a, _ in axes], repeats=repeats,
                 runs=runs, file=path, profile=profile)


def variant_entry(set_name: str, index: int, entry: Any) -> tuple[Any, dict[str, Any]]:
    if not isinstance(entry, dict):
        raise ConfigError(f"variants.{set_name}[{index}] must be a table of settings, got {entry!r}")
    settings = {k: v for k, v in entry.items() if k != "label"}
    label = entry.get("label") or ", ".join(f"{k}={v}" for k, v in settings.items()) or "default"
    return str(label), settings


def merge_dotted(base: dict[str, Any], dotted: dict[str, Any]) -> dict[str, Any]:
    """`base` (TOML-shaped) with {"section.field": value} settings on top (typed values kept)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in dotted.items():
        section, dot, name = key.partition(".")
        if not dot or not name:
            raise ConfigError(f"sweep setting {key!r} is not valid: write section.field, e.g. \"train.batch_size\"")
        out.setdefault(section, {})[name] = value
    return out


def slug(value: Any) -> str:
    text = str(value).lower().replace(".", "p") if isinstance(value, float) else str(value).lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "x"


def run_name_for(point: dict[str, Any], seed: int, repeats: int) -> str:
    """Readable and stable: `batch_size-32_2-workers_s0` (the seed only when there are repeats)."""
    parts = [slug(v) if "." not in axis else f"{slug(axis.rsplit('.', 1)[1])}-{slug(v)}" for axis, v in point.items()]
    if repeats > 1:
        parts.append(f"s{seed}")
    return "_".join(parts) or "run"


def unique(name: str, taken: set[str]) -> str:
    candidate, i = name, 2
    while candidate in taken:
        candidate, i = f"{name}-{i}", i + 1
    taken.add(candidate)
    return candidate


# ---- running it ------------------------------------------------------------------------


def run_status(run_dir: Path) -> str:
    """finished | resumable | new, from what the run folder holds."""
    if (run_dir / "summary.json").is_file():
        return "finished"
    if (run_dir / "checkpoints" / "last.pt").is_file():
        return "resumable"
    return "new"


def command(run: SweepRun, config_file: Path, run_dir: Path, resume: bool) -> list[str]:
    args = ["train", "--config", str(config_file), "--out", str(run_dir), "--output.progress", "false",
            *(["--resume"] if resume else [])]
    if run.launch == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(run.config.dist.nproc), "-m", "ddplab", *args]
    return [sys.executable, "-m", "ddplab", *args]


def check_machine(sweep: Sweep) -> None:
    """This machine's checks for every run, before the first one starts."""
    for run in sweep.runs:
        try:
            check_environment(run.config)
        except ConfigError as exc:
            raise ConfigError(f"sweep run {run.name} ({run.point}) cannot run here: {exc}") from None


def manifest_of(sweep: Sweep, out: Path, previous: dict[str, dict]) -> dict[str, Any]:
    runs = []
    for run in sweep.runs:
        entry = {"name": run.name, "dir": f"runs/{run.name}", "point": run.point, "seed": run.seed, "launch": run.launch,
                 "config": f"configs/{run.name}.toml", "status": "pending", "exit_code": None, "error": None, "wall_s": None}
        old = previous.get(run.name)
        if old is not None:
            entry.update({k: old.get(k) for k in ("status", "exit_code", "error", "wall_s")})
        if run_status(out / entry["dir"]) == "finished":
            entry["status"] = "finished"
        runs.append(entry)
    return {"version": 1, "name": sweep.name, "description": sweep.description, "sweep_file": str(sweep.file),
            "profile": sweep.profile, "overrides": sweep.overrides, "axes": sweep.axes, "repeats": sweep.repeats, "runs": runs}


def read_manifest(out: Path) -> dict[str, dict]:
    path = out / MANIFEST
    if not path.is_file():
        return {}
    import json

    try:
        return {r["name"]: r for r in json.loads(path.read_text()).get("runs", [])}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}  # a damaged manifest is rebuilt from the run folders


def plan(sweep: Sweep, out: Path) -> list[tuple[SweepRun, str]]:
    """Each run with what a sweep would do with it now: run, resume or skip (finished)."""
    action = {"new": "run", "resumable": "resume", "finished": "skip (finished)"}
    return [(run, action[run_status(out / "runs" / run.name)]) for run in sweep.runs]


def format_plan(sweep: Sweep, out: Path) -> str:
    lines = [f"sweep {sweep.name}: {len(sweep.runs)} runs in {out}"
             + (f" (profile {sweep.profile})" if sweep.profile else "")]
    for run, action in plan(sweep, out):
        point = ", ".join(f"{k}={v}" for k, v in run.point.items())
        lines.append(f"  {run.name:<40} {action:<16} seed {run.seed}  {point}"
                     + ("  [torchrun]" if run.launch == "torchrun" else ""))
    return "\n".join(lines)


def run_sweep(sweep: Sweep, out: Path, *, timeout_s: float | None = None, echo=print) -> dict[str, Any]:
    """Run every unfinished run of `sweep` into `out`; returns the final manifest."""
    check_machine(sweep)
    for sub in ("runs", "configs", "logs"):
        files.make_dir(out / sub)
    if sweep.file.resolve() != (out / "sweep.toml").resolve():
        files.write_text(out / "sweep.toml", sweep.file.read_text())
    manifest = manifest_of(sweep, out, read_manifest(out))
    files.write_json(out / MANIFEST, manifest)
    todo = [(run, entry) for run, entry in zip(sweep.runs, manifest["runs"]) if entry["status"] != "finished"]
    echo(f"sweep {sweep.name}: {len(sweep.runs)} runs, {len(sweep.runs) - len(todo)} already finished, {len(todo)} to run")
    for i, (run, entry) in enumerate(todo, 1):
        run_dir = out / entry["dir"]
        config_file = out / entry["config"]
        files.write_text(config_file, run.config.to_toml())
        resume = run_status(run_dir) == "resumable"
        echo(f"[{i}/{len(todo)}] {run.name}: {'resuming' if resume else 'running'}")
        entry.update(status="running", exit_code=None, error=None)
        files.write_json(out / MANIFEST, manifest)
        code, wall_s, error = run_one(command(run, config_file, run_dir, resume), out / "logs" / f"{run.name}.log", timeout_s)
        status = "finished" if code == 0 and run_status(run_dir) == "finished" else "failed"
        if code == 0 and status == "failed":
            error = "the run exited 0 but left no summary.json"
        entry.update(status="interrupted" if code == 130 else status, exit_code=code, error=error, wall_s=round(wall_s, 1))
        files.write_json(out / MANIFEST, manifest)
        echo(f"[{i}/{len(todo)}] {run.name}: " + (f"finished in {wall_s:.1f} s" if status == "finished"
                                                   else f"FAILED (exit {code}): {error}"))
        if code == 130:
            raise KeyboardInterrupt
    return manifest


def run_one(cmd: list[str], log_path: Path, timeout_s: float | None) -> tuple[int, float, str | None]:
    """Run one command as its own process tree; (exit code, seconds, its error line or None)."""
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except KeyboardInterrupt:  # Ctrl-C at the sweep: stop the run the way Ctrl-C stops it alone
            stop_tree(proc, signal.SIGINT)
            code = 130
        except subprocess.TimeoutExpired:
            stop_tree(proc, signal.SIGTERM)
            log.write(f"\nddplab: error: the run did not finish within {timeout_s:g} s (sweep --timeout); stopped\n")
            code = 124
    return code, time.perf_counter() - start, error_line(log_path) if code else None


def stop_tree(proc: subprocess.Popen, sig: int, grace_s: float = 30) -> None:
    """Signal the run's whole process group, then SIGKILL whatever is left after `grace_s`."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def error_line(log_path: Path) -> str:
    lines = log_path.read_text(errors="replace").strip().splitlines()
    errors = [line.removeprefix("ddplab: error: ") for line in lines if line.startswith("ddplab: error:")]
    return errors[-1] if errors else (lines[-1][:300] if lines else "no output")


def default_out(sweep: Sweep) -> Path:
    return Path("runs") / slug(sweep.name)
