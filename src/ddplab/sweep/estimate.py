"""How long a sweep will take: said before its first run, kept honest as runs finish.

A run costs what starting it costs (Python, torch, the data, the workers) plus its epochs.
Before anything runs, each point is priced from the best source there is:

- finished runs of the same point in this sweep folder (a sweep run again): their own times;
- otherwise a probe, one subprocess for the whole sweep (`python -m ddplab.engine.probe`):
  the time it took to import what a run imports and to load the first point's data is a
  run's start, and each point's model is timed at its own per-worker shape (local batch,
  threads, precision) for a few training steps and an evaluation batch, on images of the
  data's shape. A DDP point adds the all-reduce the sweep measured (links.json), and
  starts a second Python (the launcher, then its workers).

What the probe cannot see (data augmentation's cost, torch.compile, a busy machine) is why
the estimate is kept honest: each finished run replaces its point's probe, and the points
not yet run are scaled by how far the finished ones were from their probes.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddplab.config import RunConfig
from ddplab.errors import DataError
from ddplab.io.borders import LIST, SECONDS, WHOLE, check, number
from ddplab.sweepdir.spec import Sweep, SweepRun

PROBE_TIMEOUT_S = 300.0
# On a CPU, DDP's workers fill the node's cores: Gloo's all-reduce cannot hide behind the backward pass and
# competes with it, and each step waits for the slower worker. On ddp x2 of the assignment's CPU profile a
# step took 22.9 ms where the probe's step alone took 14 ms and the idle link (links.json) 2.2 ms an
# all-reduce (DDP's own timers: 4.4 and 6.0 ms of it communicating): about 4 link times a step beyond the
# step (2-core EPYC, torch 2.13).
CPU_DDP_STEP_IN_LINK_TIMES = 4.0


@dataclass
class PointCost:
    """What one run of a point is expected to take: its start (everything but epochs) and each epoch."""

    start_s: float
    epoch_s: float
    source: str  # "probe" | "finished runs"

    def run_s(self, epochs: float) -> float:
        return self.start_s + epochs * self.epoch_s


@dataclass
class Estimate:
    """Every run's expected wall time; updated as runs finish (`finished`)."""

    costs: dict[str, PointCost]  # point key -> cost
    runs: dict[str, tuple[str, int]]  # run name -> (point key, epochs it has left to train)
    probe_s: float | None = None  # the probe's own wall time (None: no probe was needed)
    measured: dict[str, list[float]] = field(default_factory=dict)  # point key -> its finished runs' wall per epoch
    ratios: list[tuple[float, float]] = field(default_factory=list)  # (measured, predicted) of runs with a probe
    said_s: float | None = None  # what the sweep said before its first run
    shared: int = 1  # points run at once on one CPU's cores, each that much slower than its probe

    def run_s(self, name: str) -> float:
        key, epochs = self.runs[name]
        if self.measured.get(key):
            return statistics.fmean(self.measured[key]) * epochs
        cost = self.costs[key]
        return cost.run_s(epochs) * (self.scale() if cost.source == "probe" else 1.0)

    def scale(self) -> float:
        """How much longer than their probes the finished runs took (1 before any finished)."""
        if not self.ratios:
            return 1.0
        return sum(m for m, _ in self.ratios) / sum(p for _, p in self.ratios)

    def total_s(self, names: list[str], at_once: int = 1) -> float:
        return sum(self.run_s(n) for n in names) / max(1, at_once)

    def describe(self, todo: list[SweepRun]) -> str:
        """Where the figure comes from, and each point's run in it."""
        by_point: dict[str, tuple[str, float]] = {}
        for run in todo:
            label = ", ".join(map(str, run.point.values())) or run.name
            by_point.setdefault(label, (self.costs[self.runs[run.name][0]].source, self.run_s(run.name)))
        sources = {source for source, _ in by_point.values()}
        how = (
            (f"each point probed in {self.probe_s:.1f} s" if self.probe_s is not None else "")
            + ("; " if len(sources) > 1 else "")
            + ("points with finished runs priced by them" if "finished runs" in sources else "")
        )
        return how + "; a run of " + ", ".join(f"{label} {duration(s)}" for label, (_, s) in by_point.items())

    def finished(self, name: str, wall_s: float) -> None:
        """Run `name` took `wall_s` for the epochs it had left: its point's other runs are priced by it, per epoch."""
        key, epochs = self.runs[name]
        if self.costs[key].source == "probe" and not self.measured.get(key):
            self.ratios.append((wall_s, self.costs[key].run_s(epochs)))
        self.measured.setdefault(key, []).append(wall_s / max(1, epochs))


def point_key(run: SweepRun) -> str:
    """Runs that cost the same: the config without its seed."""
    values = run.config.to_dict()
    values["train"].pop("seed", None)
    values.pop("output", None)
    return json.dumps(values, sort_keys=True, default=str) + run.launch


def estimate(
    sweep: Sweep,
    todo: list[SweepRun],
    done_epochs: dict[str, int],
    walls: Mapping[str, tuple[float | None, int | None]],
    links: Any = None,
    echo=print,
) -> Estimate | None:
    """The estimate for the runs in `todo` (`done_epochs`: epochs a resumed run has already trained; `walls`:
    this sweep's finished runs' (wall time, epochs their last process trained)); None when it cannot be made
    here (said in one line)."""
    keys = {run.name: point_key(run) for run in sweep.runs}
    runs = {run.name: (keys[run.name], run.config.train.epochs - done_epochs.get(run.name, 0)) for run in todo}
    costs: dict[str, PointCost] = {}
    for run in sweep.runs:  # a point with finished runs is priced by them: wall per epoch its last process trained
        wall, trained = walls.get(run.name, (None, None))
        if wall and trained:
            costs.setdefault(keys[run.name], PointCost(0.0, wall / trained, "finished runs"))
    probe_runs = list({keys[r.name]: r for r in todo if keys[r.name] not in costs}.values())
    probe_s = None
    if probe_runs:
        try:
            probed = run_probe([r.config for r in probe_runs])
        except ProbeFailed as exc:
            echo(f"sweep {sweep.name}: no time estimate before the first run ({exc}); each finished run gives one")
            return None
        probe_s = probed["wall_s"]
        for run, cost in zip(probe_runs, price(probe_runs, probed, links), strict=True):
            costs[keys[run.name]] = cost
    return Estimate(costs, runs, probe_s)


class ProbeFailed(Exception):
    pass


PROBE = {"torch_at": number(0), "ready_at": number(0), "done_at": number(0), "data_s": SECONDS, "points": LIST}
PROBED_POINT = {
    "step_s": number(above=0),
    "eval_image_s": SECONDS,
    "grad_bytes": WHOLE,
    "train_images": WHOLE,
    "eval_images": WHOLE,
}


def run_probe(configs: list[RunConfig], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """The probe subprocess's measurements: {"torch_s", "import_s", "data_s", "exit_s", "points": [{step_s,
    eval_image_s, ...}, ...]}: torch_s and import_s run from this process starting it to its having imported
    torch, then all a run imports; exit_s from its last line to its end. The probe starts as the points do
    (warm, from this process's server: torch already imported, so torch_s and import_s are what a warm point
    pays, a fraction of a second; cold with DDPLAB_WARM=0, seconds each, and a Python with torch loaded then
    takes a while to tear down)."""
    payload = json.dumps([c.to_dict() for c in configs])  # (the probe never downloads: the first run does, said)
    from ddplab.launch import warm
    from ddplab.sweep.point import IMPORTS

    try:  # the points start warm: the probe too, from a server already warm (its start is paid once a sweep)
        warm.run([sys.executable, "-c", "pass"], timeout=timeout_s, imports=(*IMPORTS, "ddplab.engine.probe"))
    except subprocess.TimeoutExpired:
        raise ProbeFailed(f"no warm server within {timeout_s:g} s") from None
    launched, started = time.time(), time.perf_counter()
    try:  # dies with the sweep, even one killed outright (warm or cold); Ctrl-C reaches it as it reaches the sweep
        done = warm.run(
            [sys.executable, "-m", "ddplab.engine.probe"],
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise ProbeFailed(f"the probe took over {timeout_s:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeFailed(f"the probe failed: {last[:200]}")
    ended = time.time()
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ProbeFailed(f"the probe printed no result: {done.stdout.strip()[-200:] or 'nothing'}") from None
    try:  # its own subprocess, but an answer all the same: checked before any arithmetic
        check(result, PROBE, "the probe's answer", required=tuple(PROBE))
        for i, point in enumerate(result["points"]):
            check(point, PROBED_POINT, "the probe's answer", prefix=f"points[{i}].", required=tuple(PROBED_POINT))
    except DataError as exc:
        raise ProbeFailed(str(exc)) from None
    if len(result["points"]) != len(configs):
        raise ProbeFailed(f"the probe timed {len(result['points'])} points of {len(configs)}")
    result["torch_s"] = result.pop("torch_at") - launched
    result["import_s"] = result.pop("ready_at") - launched
    result["exit_s"] = max(0.0, ended - result.pop("done_at"))
    result["wall_s"] = time.perf_counter() - started
    return result


def price(runs: list[SweepRun], probed: dict[str, Any], links: Any = None) -> list[PointCost]:
    """Each probed point's cost per run: its start (a Python with all a run imports, the data, its end; a DDP
    run's launcher first starts a Python with torch) and its epoch (training steps plus the all-reduce, and
    the evaluation)."""
    out = []
    for run, point in zip(runs, probed["points"], strict=False):
        c = run.config
        workers = c.world_size()
        launcher = probed["torch_s"] + probed["exit_s"] if c.dist.strategy == "ddp" else 0.0
        start = launcher + probed["import_s"] + probed["data_s"] + probed["exit_s"]
        steps = (
            math.ceil(point["train_images"] / (c.train.batch_size * workers * c.train.accumulate)) * c.train.accumulate
        )
        comm = 0.0
        if workers > 1 and links is not None:
            try:
                comm = links.for_ranks(workers).allreduce_s(point["grad_bytes"], workers)
            except (KeyError, ValueError, AttributeError):
                comm = 0.0
            if c.train.device == "cpu":
                comm *= CPU_DDP_STEP_IN_LINK_TIMES
        evaluated = point["eval_images"] / workers
        epoch = (
            steps * point["step_s"] + math.ceil(steps / c.train.accumulate) * comm + evaluated * point["eval_image_s"]
        )
        out.append(PointCost(start, epoch, "probe"))
    return out


def duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes}m{sec:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"
