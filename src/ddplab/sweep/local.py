"""The local executor: a sweep's points run here, one after another or a few at once, with their
progress shown.

Every point's config is checked against this machine before the first starts (a point it cannot
start stops the sweep, or with `unavailable = "skip"` is recorded as not measured). Each point is
its own process tree (point.py), so a crash, a CUDA error or a hang cannot poison the next. With
`--parallel N` up to N run at once, each on its own cores and GPUs (sweep/slots.py). While they
train the sweep shows one line per epoch (accuracy, seconds per epoch, time left), where each log
is, and after each point how many are done and about how long the rest will take. A failed point
is recorded with its exit code and error line and the sweep goes on. Running the same sweep again
skips finished points and resumes interrupted ones, after checking that each was trained with the
settings the file asks for now. Ctrl-C or SIGTERM stops every running point as Ctrl-C stops a run
(each stays resumable) and ends the sweep with 130; a point whose sweep is killed outright is sent
SIGTERM by the kernel (Linux).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ddplab import stops
from ddplab.errors import ConfigError, DataError
from ddplab.io import files
from ddplab.io.borders import shown
from ddplab.launch.process import INTERRUPTED, POLL_S, STOP_GRACE_S, Child, Finished, stop_all, wait_any
from ddplab.machine import check_environment
from ddplab.rundir import runfiles
from ddplab.rundir.epochs import read_epochs
from ddplab.rundir.runlock import describe, live_owner, run_lock
from ddplab.sweep.estimate import duration
from ddplab.sweep.point import Point
from ddplab.sweep.slots import Slot, SlotPool, points_at_once, visible_gpus
from ddplab.sweepdir.folder import Entry, Manifest, Status, SweepFolder
from ddplab.sweepdir.spec import Sweep, SweepRun, slug
from ddplab.topology import resolve_backend


class LocalExecutor:
    """Runs the points here, up to `parallel` at once; submit returns when they have ended."""

    name: ClassVar[str] = "local"
    waits: ClassVar[bool] = False
    summary: ClassVar[str] = "here, up to --parallel at once"

    def __init__(
        self,
        *,
        parallel: int | str = 1,
        timeout_s: float | None = None,
        measure_link: bool = False,
        estimate: bool = False,
    ):
        points_at_once(parallel, type(self).__name__)
        seconds = isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
        if timeout_s is not None and not (seconds and 0 < timeout_s < float("inf")):
            raise ConfigError(f"LocalExecutor(timeout_s={shown(timeout_s)}): seconds a run may take, > 0, or None")
        self.parallel, self.timeout_s, self.measure_link, self.estimate = parallel, timeout_s, measure_link, estimate

    @classmethod
    def add_options(cls, parser: argparse.ArgumentParser) -> None:
        pass  # --parallel, --timeout and --no-estimate are `ddplab sweep`'s own: the local executor's by default

    @classmethod
    def options_given(cls, args: argparse.Namespace) -> list[str]:
        return []

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LocalExecutor:
        return cls(
            parallel=args.parallel if args.parallel is not None else 1,
            timeout_s=args.timeout,
            measure_link=not args.no_report,
            estimate=not args.no_estimate,
        )

    @classmethod
    def reading(cls) -> LocalExecutor:
        return cls()

    def runs_on_gpus(self) -> bool | None:
        return None  # this machine's CUDA

    def dry_run(self, sweep: Sweep, folder: SweepFolder) -> str:
        return dry_run_text(sweep, folder)

    def submit(self, sweep: Sweep, folder: SweepFolder, echo=print) -> Manifest:
        """Run every unfinished point into `folder`, holding it for the whole sweep (one sweep per folder, as one
        run per run folder); the final manifest. `measure_link`: a sweep with multi-worker points first measures
        this machine's all-reduce into links.json, from which the report predicts their speedups (planner/).
        `estimate`: say how long the sweep will take before its first point (a probe, sweep/estimate.py) and keep
        saying it as points finish."""
        folder.refuse_run_folder()
        slots = SlotPool(self.parallel)
        slots.refuse_fixed_devices([(run.name, run.config) for run in sweep.runs])
        with run_lock(folder.root, "sweep"):
            if self.measure_link:
                measure_sweep_link(sweep, folder, echo)
            return self.run_held(sweep, folder, slots, echo)

    def run_held(self, sweep: Sweep, folder: SweepFolder, slots: SlotPool, echo) -> Manifest:
        manifest, todo = folder.prepare(sweep, unavailable_runs(sweep), self.name, echo)
        skipped = len(manifest.skipped())
        echo(
            f"sweep {sweep.name}: {len(sweep.runs)} runs, {len(sweep.runs) - len(todo) - skipped} already finished, "
            f"{len(todo)} to run"
            + (f", {skipped} not runnable here (see the report)" if skipped else "")
            + (f"; {slots.describe()}" if slots.requested != 1 else "")
        )
        with stops.as_interrupts():  # SIGTERM, SIGHUP during the probe too: Ctrl-C's way out (exit 130)
            points = [run for run, _ in todo]
            expected = expect(sweep, folder, manifest, points, slots, echo) if todo and self.estimate else None
            scheduler = Scheduler(folder, manifest, slots, self.timeout_s, echo, expected)
            scheduler.run(todo)
        if expected is not None and expected.said_s:
            took = time.perf_counter() - scheduler.started
            echo(
                f"sweep {sweep.name}: {len(todo)} runs in {duration(took)}; expected {duration(expected.said_s)} "
                f"before the first ({(expected.said_s - took) / took:+.0%})"
            )
        return manifest

    def refresh(self, folder: SweepFolder, manifest: Manifest) -> list[str]:
        for entry in manifest.runs:
            if entry.status is Status.RUNNING and live_owner(folder.root / entry.dir) is None:
                entry.status = Status.STOPPED  # its sweep was killed outright: nothing trains it any more
        return []

    def wait(self, folder: SweepFolder, echo=print) -> Manifest:
        return folder.load()  # submit ran them


def unavailable_runs(sweep: Sweep) -> dict[str, str]:
    """Points this machine cannot start, with the reason; with `unavailable = "refuse"` the first is an error."""
    found = {}
    for run in sweep.runs:
        try:
            check_environment(run.config)
        except ConfigError as exc:
            if sweep.unavailable == "refuse":
                raise ConfigError(f"sweep run {run.name} ({run.point}) cannot run here: {exc}") from None
            found[run.name] = f"not run on this machine: {exc}"
    return found


def dry_run_rows(sweep: Sweep, folder: SweepFolder, here: bool = True) -> list[tuple[SweepRun, str, str | None]]:
    """Each point with what a local sweep would do with it now, and why the sweep would refuse its folder
    (None: it would not; `SweepFolder.stale_reason`)."""
    states = folder.run_states(sweep)
    unavailable = unavailable_runs(sweep) if here else {}  # here: checked against this machine (the local runner)
    action = {"new": "run", "unfinished": "resume", "finished": "skip (finished)", "foreign": "refuse (not a run)"}
    rows = []
    for run in sweep.runs:
        state, reason = states[run.name], folder.stale_reason(run, states[run.name])
        if run.name in unavailable:
            what = "skip (unavailable)"
        elif reason and state != "foreign":
            what = "refuse (other settings)"
        else:
            what = action[state]
        rows.append((run, what, reason))
    return rows


def dry_run_text(sweep: Sweep, folder: SweepFolder, here: bool = True) -> str:
    lines = [
        f"sweep {sweep.name}: {len(sweep.runs)} runs in {folder.root}"
        + (f" (profile {sweep.profile})" if sweep.profile else "")
        + (", interleaved" if sweep.order == "interleaved" else "")
    ]
    rows = dry_run_rows(sweep, folder, here)
    for run, action, _ in rows:
        point = ", ".join(f"{k}={v}" for k, v in run.point.items())
        lines.append(
            f"  {run.name:<40} {action:<18} seed {run.seed}  {point}"
            + ("  [torchrun]" if run.launch == "torchrun" else "")
        )
    for name, reason in sweep.not_measured.items():
        lines.append(f"  {'(' + name + ')':<40} {'not in this sweep':<18} {reason}")
    lines += [f"adapted to this machine: {a.text()}" for a in sweep.adaptations]
    refused = next((reason for _, _, reason in rows if reason), None)
    if refused:
        lines.append(f"the sweep would stop before running anything: {refused}")
    return "\n".join(lines)


def measure_sweep_link(sweep: Sweep, folder: SweepFolder, echo) -> None:
    """out/links.json for the report's predictions: this machine's all-reduce measured with each number of DDP
    workers the sweep runs (on CUDA, up to its GPUs), keeping what a links file there already holds. Each
    count measured on its own: a failure costs that count's predictions, never the sweep."""
    from ddplab.errors import Interrupted
    from ddplab.launch.allreduce import measure
    from ddplab.planner import links

    wanted = {r.config.dist.nproc for r in sweep.runs if r.config.dist.strategy == "ddp" and r.config.dist.nproc > 1}
    gpus = len(visible_gpus())
    on_cuda = any(r.config.train.device != "cpu" for r in sweep.runs) and gpus >= 2
    if on_cuda:  # NCCL needs a GPU per rank: more workers than GPUs share them, measured with all the GPUs
        wanted = {min(n, gpus) for n in wanted}
    path = folder.links
    try:
        kept = links.measurements(path) if path.is_file() else []
    except (OSError, DataError):
        kept = []  # not a links file: measured again
    ranks = sorted(wanted - {m["ranks"] for m in kept})
    if not ranks:
        return
    backend = resolve_backend("auto", on_cuda=on_cuda)
    echo(
        f"sweep {sweep.name}: measuring this machine's all-reduce ({backend} x{', x'.join(map(str, ranks))}) for the "
        f"report's predicted speedups (ddplab plan --measure) ..."
    )
    new = []
    for n in ranks:
        try:
            result = measure(backend, n, device="cuda" if on_cuda else "cpu", max_bytes=64 * links.MIB)
            link = links.measured_link(result)
        except Interrupted:  # a stop signal stops the sweep, before any run starts (exit 130)
            raise
        except Exception as exc:  # noqa: BLE001 (the predictions are extra: any failure is said and passed over)
            echo(
                f"  x{n}: could not measure it ({type(exc).__name__}: {str(exc)[:200]}); "
                f"{n} workers are predicted over the nearest count measured"
            )
            continue
        new.append(result)
        echo(
            f"  x{n}: alpha {link.alpha_s * 1e6:,.0f} us, bus bandwidth {link.busbw_gbps:,.3g} GB/s "
            f"({result['wall_s']} s)"
        )
    if new:
        files.make_dir(folder.root)
        links.save_links(path, kept + new)


def expect(sweep: Sweep, folder: SweepFolder, manifest: Manifest, todo: list[SweepRun], slots: SlotPool, echo):
    """The sweep's time, said before its first point (sweep/estimate.py); None when it cannot be made."""
    from ddplab.planner.links import read_links
    from ddplab.sweep import estimate

    walls = {e.name: (e.wall_s, e.wall_epochs) for e in manifest.runs if e.status is Status.FINISHED and e.wall_s}
    # Epochs a point will not train again: those its metrics hold, when a checkpoint lets it resume from them.
    done = {}
    for run in todo:
        point = Point(folder, run.name, run.config, run.launch)
        done[run.name] = len(read_epochs(point.run_dir / runfiles.METRICS, growing=True)) if point.resumes() else 0
    found = estimate.estimate(sweep, todo, done, walls, links=read_links(folder.links), echo=echo)
    if found is None:
        return None
    at_once = max(1, min(slots.parallel, len(todo)))
    # Points at once on a CPU share its cores: each is about that much slower than the probe (which had them all).
    shared = at_once if all(run.config.train.device == "cpu" for run in todo) else 1
    found.said_s = found.total_s([run.name for run in todo], at_once) * shared
    found.shared = shared
    echo(
        f"sweep {sweep.name}: expected to take about {duration(found.said_s)}"
        + (f" ({at_once} at a time)" if at_once > 1 else "")
        + f": {found.describe(todo)}"
    )
    return found


@dataclass
class Running:
    run: SweepRun
    entry: Entry
    tag: str
    slot: Slot
    child: Child
    watch: EpochWatch
    point: Point


class Scheduler:
    """Starts the sweep's points in order as slots free up, shows their epochs, records each outcome in the
    manifest (rewritten whole, so valid at every moment) and, on Ctrl-C or SIGTERM, stops every running
    tree at once, each left resumable."""

    def __init__(
        self, folder: SweepFolder, manifest: Manifest, slots: SlotPool, timeout_s: float | None, echo, expected=None
    ):
        self.folder, self.manifest, self.slots, self.timeout_s, self.echo = folder, manifest, slots, timeout_s, echo
        self.expected = expected  # estimate.Estimate, or None: the mean finished run prices the rest
        self.running: list[Running] = []
        self.walls: list[float] = []
        self.started = time.perf_counter()

    def run(self, todo: list[tuple[SweepRun, Entry]]) -> None:
        pending = [(f"[{i}/{len(todo)}] {run.name}", run, entry) for i, (run, entry) in enumerate(todo, 1)]
        self.total = len(todo)
        self.pending = pending
        try:
            while pending or self.running:
                while pending and (slot := self.slots.take(pending[0][1].config)) is not None:
                    tag, run, entry = pending.pop(0)
                    if not self.start(tag, run, entry, slot):
                        self.slots.give_back(slot)
                if pending and not self.running and not self.slots.fits(pending[0][1].config):
                    raise ConfigError(f"sweep run {pending[0][1].name} needs more GPUs than this machine has")
                wait_any([r.child for r in self.running], POLL_S)
                for r in list(self.running):
                    for line in r.watch.new_lines():
                        self.echo(f"{r.tag}: {line}")
                    if (done := r.child.poll()) is not None:
                        self.finish(r, done, left=len(pending))
        except KeyboardInterrupt:
            running, self.running = self.running, []
            for r, done in zip(running, stop_all([r.child for r in running]), strict=True):
                self.record(r, done)
            raise

    def start(self, tag: str, run: SweepRun, entry: Entry, slot: Slot) -> bool:
        """Start a point in `slot`; False when there was nothing left to run (the owner waited for finished it)."""
        point = Point(self.folder, run.name, run.config, run.launch)
        wait_for_owner(point.run_dir, tag, self.echo)
        if point.finished():  # the owner waited for was this point, and it finished
            entry.ended(Status.FINISHED, 0, None, entry.wall_s, entry.wall_epochs)
            self.folder.write(self.manifest)
            self.echo(f"{tag}: finished (by the process waited for)")
            return False
        files.write_text(point.config_file, run.config.to_toml())
        where = f", on {slot.describe()}" if slot.cores else ""
        self.echo(f"{tag}: {'resuming' if point.resumes() else 'running'} (log: {point.log}{where})")
        entry.status, entry.exit_code, entry.error = Status.RUNNING, None, None
        self.folder.write(self.manifest)
        watch = EpochWatch(point.run_dir / runfiles.METRICS, run.config.train.epochs)
        child = None
        try:
            child = point.start(
                slot.env(os.environ), cpus=slot.cores, timeout_s=self.timeout_s, timeout_from="sweep --timeout"
            )
            self.running.append(Running(run, entry, tag, slot, child, watch, point))
        except KeyboardInterrupt:  # between the start and the append: the child is stopped with the others
            if child is not None and not any(r.child is child for r in self.running):
                self.running.append(Running(run, entry, tag, slot, child, watch, point))
            raise
        return True

    def finish(self, r: Running, done: Finished, left: int) -> None:
        self.running.remove(r)
        self.slots.give_back(r.slot)
        for line in r.watch.new_lines():
            self.echo(f"{r.tag}: {line}")
        self.record(r, done)
        self.walls.append(done.wall_s)
        finished = len(self.walls)
        at_once = max(1, min(self.slots.parallel, left + len(self.running)))
        if self.expected is not None:
            if done.code == 0:
                self.expected.finished(r.run.name, done.wall_s)
            now = time.perf_counter()
            shared = self.expected.shared  # each run that much slower than priced, running beside the others
            eta = (
                sum(self.expected.run_s(run.name) * shared for _, run, _ in self.pending)
                + sum(max(0.0, self.expected.run_s(x.run.name) * shared - (now - x.child.start)) for x in self.running)
            ) / at_once
            said = self.expected.said_s
            overall = now - self.started + eta
            eta_note = (
                f" (all told about {duration(overall)}; {duration(said)} expected at the start)" if eta and said else ""
            )
        else:
            eta = sum(self.walls) / finished * (left + len(self.running)) / at_once if left + len(self.running) else 0.0
            eta_note = ""
        self.echo(
            f"  sweep: {finished} of {self.total} done"
            + (f", {len(self.running)} running" if self.running else "")
            + f", {duration(time.perf_counter() - self.started)} so far"
            + (f", about {duration(eta)} left{eta_note}" if eta else "")
        )
        if done.code == INTERRUPTED:  # stopped on its own by Ctrl-C: the sweep stops too
            raise KeyboardInterrupt

    def record(self, r: Running, done: Finished) -> None:
        outcome = r.point.ended(done)
        r.entry.ended(
            outcome.status,
            outcome.exit_code,
            outcome.error,
            outcome.wall_s,
            wall_epochs=r.watch.count() - r.watch.started,
        )
        self.folder.write(self.manifest)
        self.echo(
            f"{r.tag}: "
            + (
                f"finished in {duration(done.wall_s)}"
                if outcome.status is Status.FINISHED
                else "interrupted (resumable)"
                if outcome.status is Status.INTERRUPTED
                else f"FAILED (exit {outcome.exit_code}): {outcome.error}"
            )
        )


def wait_for_owner(run_dir: Path, tag: str, echo, grace_s: float = STOP_GRACE_S) -> None:
    """Wait, up to `grace_s`, for a live process that holds `run_dir` to let go of it.

    Such an owner is usually the run of a sweep killed a moment ago, still stopping (the
    kernel sent it SIGTERM). Starting beside it would fail the run ("in use") and mix two
    processes' output in one log; one still there after the grace is an error for the
    whole sweep, naming it: nothing of it is marked failed.
    """
    owner = live_owner(run_dir)
    if owner is None:
        return
    echo(f"{tag}: waiting for {describe(owner)} to let go of its folder (a run of an earlier sweep, stopping?)")
    deadline = time.monotonic() + grace_s
    while (owner := live_owner(run_dir)) is not None:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"{run_dir} is still in use by {describe(owner)} after {grace_s:g} s: a run of an "
                "earlier sweep training on? stop it or let it end, then run the sweep again"
            )
        time.sleep(POLL_S / 10)


class EpochWatch:
    """The epochs a running run adds to its metrics.jsonl, as progress lines with the time left."""

    def __init__(self, path: Path, epochs: int):
        self.path, self.epochs = path, epochs
        self.seen = self.started = self.count()  # a resumed run's earlier epochs are not news
        self.times: list[float] = []

    def count(self) -> int:
        return len(read_epochs(self.path, growing=True))

    def new_lines(self) -> list[str]:
        records = read_epochs(self.path, growing=True)  # a line being written: read next time
        lines = []
        for record in records[self.seen :]:
            self.times.append(record.epoch_s)
            left = (self.epochs - record.epoch) * sum(self.times) / len(self.times)
            lines.append(
                f"epoch {record.epoch}/{self.epochs}, test acc {record.test_acc:.2%}, "
                f"{self.times[-1]:.1f} s/epoch" + (f", about {duration(left)} left" if left > 0 else "")
            )
        self.seen = len(records)
        return lines


def default_out(sweep: Sweep) -> Path:
    return Path("runs") / slug(sweep.name)
