"""Run a `Sweep`: every run its own process tree, supervised, one after another, with its progress shown.

Every run config is checked against this machine before the first starts (a run it cannot
start stops the sweep, or with `unavailable = "skip"` is recorded as not measured). Each run
is `python -m ddplab train` (or torchrun) in its own session, so a crash, a CUDA error or a
hang cannot poison the next; it writes its own run folder `runs/<name>`. While it trains
the sweep shows one line per epoch (accuracy, seconds per epoch, time left) and where its
log is. A failed run is recorded with its exit code and error line and the sweep goes on.
Running the same sweep again skips finished runs and resumes interrupted ones, after
checking that each was trained with the settings the file asks for now. Ctrl-C or SIGTERM
stops the current run as Ctrl-C stops a run (it stays resumable) and ends the sweep with 130;
a run whose sweep is killed outright is sent SIGTERM by the kernel (Linux).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

from ddplab import files, runfiles
from ddplab.process import INTERRUPTED, POLL_S, STOP_GRACE_S, ddplab_command, supervise
from ddplab.config import build_config, check_environment, load_toml
from ddplab.engine.runlock import describe, live_owner, run_lock
from ddplab.errors import ConfigError
from ddplab.metrics.records import read_epochs
from ddplab.sweep.manifest import manifest_of, read_manifest, write_manifest
from ddplab.sweep.spec import Sweep, SweepRun, slug



def run_states(sweep: Sweep, out: Path) -> dict[str, str]:
    """Each run's folder as it stands: new | finished | unfinished | foreign (runfiles.run_state)."""
    return {run.name: runfiles.run_state(out / "runs" / run.name) for run in sweep.runs}


def unavailable_runs(sweep: Sweep) -> dict[str, str]:
    """Runs this machine cannot start, with the reason; with `unavailable = "refuse"` the first is an error."""
    found = {}
    for run in sweep.runs:
        try:
            check_environment(run.config)
        except ConfigError as exc:
            if sweep.unavailable == "refuse":
                raise ConfigError(f"sweep run {run.name} ({run.point}) cannot run here: {exc}") from None
            found[run.name] = f"not run on this machine: {exc}"
    return found


def check_machine(sweep: Sweep) -> None:
    """This machine's checks for every run, before the first one starts."""
    unavailable_runs(sweep)


def stale_reason(run: SweepRun, out: Path, state: str) -> str | None:
    """Why a run folder cannot be kept or continued for this run, or None: not a run folder, or trained
    with other settings than the file asks for now (its results would be reported under a wrong name)."""
    from ddplab.engine.rundir import config_differences

    run_dir = out / "runs" / run.name
    if state == "foreign":
        return f"{run_dir} exists and is not a ddplab run folder: move it, or use another --out"
    if state in ("finished", "unfinished"):
        differing = config_differences(build_config(load_toml(run_dir / runfiles.CONFIG)), run.config)
        if state == "unfinished":
            differing -= {"train.profile_steps"}  # changes no number (as --resume allows)
        if differing:
            return (f"{run_dir} was trained with other settings than the sweep now asks for "
                    f"({', '.join(sorted(differing))} differ): the sweep file, its profile or --set changed since; "
                    "use another --out, or move that run folder away")
    return None


def stale_runs(sweep: Sweep, out: Path, states: dict[str, str]) -> None:
    """Refuse, before anything runs, a sweep with a run folder it cannot keep or continue."""
    for run in sweep.runs:
        reason = stale_reason(run, out, states[run.name])
        if reason:
            raise ConfigError(reason)


def plan(sweep: Sweep, out: Path) -> list[tuple[SweepRun, str, str | None]]:
    """Each run with what a sweep would do with it now, and why the sweep would refuse its folder
    (None: it would not; `stale_reason`)."""
    states = run_states(sweep, out)
    unavailable = unavailable_runs(sweep)
    action = {"new": "run", "unfinished": "resume", "finished": "skip (finished)", "foreign": "refuse (not a run)"}
    rows = []
    for run in sweep.runs:
        state, reason = states[run.name], stale_reason(run, out, states[run.name])
        if run.name in unavailable:
            what = "skip (unavailable)"
        elif reason and state != "foreign":
            what = "refuse (other settings)"
        else:
            what = action[state]
        rows.append((run, what, reason))
    return rows


def format_plan(sweep: Sweep, out: Path) -> str:
    lines = [f"sweep {sweep.name}: {len(sweep.runs)} runs in {out}" + (f" (profile {sweep.profile})" if sweep.profile else "")
             + (", interleaved" if sweep.order == "interleaved" else "")]
    rows = plan(sweep, out)
    for run, action, _ in rows:
        point = ", ".join(f"{k}={v}" for k, v in run.point.items())
        lines.append(f"  {run.name:<40} {action:<18} seed {run.seed}  {point}"
                     + ("  [torchrun]" if run.launch == "torchrun" else ""))
    for name, reason in sweep.not_measured.items():
        lines.append(f"  {'(' + name + ')':<40} {'not in this sweep':<18} {reason}")
    refused = next((reason for _, _, reason in rows if reason), None)
    if refused:
        lines.append(f"the sweep would stop before running anything: {refused}")
    return "\n".join(lines)


def command(run: SweepRun, config_file: Path, run_dir: Path, resume: bool) -> list[str]:
    args = ["train", "--config", str(config_file), "--out", str(run_dir), "--output.progress", "false",
            *(["--resume"] if resume else [])]
    if run.launch == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                str(run.config.dist.nproc), "-m", "ddplab", *args]
    return ddplab_command(*args)


class Terminated(KeyboardInterrupt):
    """SIGTERM at the sweep: handled as Ctrl-C is (the run stops resumable, the sweep exits 130)."""


def raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def run_sweep(sweep: Sweep, out: Path, *, timeout_s: float | None = None, echo=print) -> dict[str, Any]:
    """Run every unfinished run of `sweep` into `out`, which it holds for the whole sweep (one sweep per
    folder, as one run per run folder); returns the final manifest."""
    if any((out / name).is_file() for name in (runfiles.CONFIG, runfiles.METRICS)):
        raise ConfigError(f"--out {out} is a run folder, not a sweep folder (a run folder is never rewritten): "
                          "choose another --out")
    with run_lock(out, "sweep"):
        return run_held(sweep, out, timeout_s, echo)


def run_held(sweep: Sweep, out: Path, timeout_s: float | None, echo) -> dict[str, Any]:
    unavailable = unavailable_runs(sweep)
    states = run_states(sweep, out)
    stale_runs(sweep, out, states)
    for sub in ("runs", "configs", "logs"):
        files.make_dir(out / sub)
    if sweep.file.resolve() != (out / "sweep.toml").resolve():
        files.write_text(out / "sweep.toml", sweep.file.read_text())
    manifest = manifest_of(sweep, read_manifest(out), states, unavailable)
    write_manifest(out, manifest)
    todo = [(run, entry) for run, entry in zip(sweep.runs, manifest["runs"]) if entry["status"] not in ("finished", "skipped")]
    skipped = sum(e["status"] == "skipped" for e in manifest["runs"])
    echo(f"sweep {sweep.name}: {len(sweep.runs)} runs, {len(sweep.runs) - len(todo) - skipped} already finished, "
         f"{len(todo)} to run" + (f", {skipped} not runnable here (see the report)" if skipped else ""))
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    started = time.perf_counter()
    try:
        for i, (run, entry) in enumerate(todo, 1):
            run_one(run, entry, out, manifest, f"[{i}/{len(todo)}] {run.name}", timeout_s, echo)
            echo(f"  sweep: {i} of {len(todo)} done, {duration(time.perf_counter() - started)} so far")
    finally:
        signal.signal(signal.SIGTERM, previous)
    return manifest


def run_one(run: SweepRun, entry: dict[str, Any], out: Path, manifest: dict[str, Any], tag: str,
            timeout_s: float | None, echo) -> None:
    run_dir, config_file, log_path = out / entry["dir"], out / entry["config"], out / "logs" / f"{run.name}.log"
    wait_for_owner(run_dir, tag, echo)
    if (run_dir / runfiles.SUMMARY).is_file():  # the owner waited for was this run, and it finished
        entry.update(status="finished", exit_code=0, error=None)
        write_manifest(out, manifest)
        echo(f"{tag}: finished (by the process waited for)")
        return
    files.write_text(config_file, run.config.to_toml())
    resume = (run_dir / runfiles.CHECKPOINTS / runfiles.LAST_CHECKPOINT).is_file()
    echo(f"{tag}: {'resuming' if resume else 'running'} (log: {log_path})")
    entry.update(status="running", exit_code=None, error=None)
    write_manifest(out, manifest)
    watch = EpochWatch(run_dir / runfiles.METRICS, run.config.train.epochs)
    done = supervise(command(run, config_file, run_dir, resume), log_path, timeout_s=timeout_s,
                     on_poll=lambda: [echo(f"{tag}: {line}") for line in watch.new_lines()], timeout_from="sweep --timeout")
    code, wall_s, error = done.code, done.wall_s, done.error
    status = "finished" if code == 0 and (run_dir / runfiles.SUMMARY).is_file() else "failed"
    if code == 0 and status == "failed":
        error = "the run exited 0 but left no summary.json"
    entry.update(status="interrupted" if code == INTERRUPTED else status, exit_code=code, error=error, wall_s=round(wall_s, 1))
    write_manifest(out, manifest)
    echo(f"{tag}: " + (f"finished in {duration(wall_s)}" if status == "finished" else f"FAILED (exit {code}): {error}"))
    if code == INTERRUPTED:
        raise KeyboardInterrupt


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
            raise ConfigError(f"{run_dir} is still in use by {describe(owner)} after {grace_s:g} s: a run of an "
                              "earlier sweep training on? stop it or let it end, then run the sweep again")
        time.sleep(POLL_S / 10)


class EpochWatch:
    """The epochs a running run adds to its metrics.jsonl, as progress lines with the time left."""

    def __init__(self, path: Path, epochs: int):
        self.path, self.epochs = path, epochs
        self.seen = self.count()  # a resumed run's earlier epochs are not news
        self.times: list[float] = []

    def count(self) -> int:
        return len(read_epochs(self.path, growing=True))

    def new_lines(self) -> list[str]:
        records = read_epochs(self.path, growing=True)  # a line being written: read next time
        lines = []
        for record in records[self.seen:]:
            self.times.append(record.epoch_s)
            left = (self.epochs - record.epoch) * sum(self.times) / len(self.times)
            lines.append(f"epoch {record.epoch}/{self.epochs}, test acc {record.test_acc:.2%}, "
                         f"{self.times[-1]:.1f} s/epoch" + (f", about {duration(left)} left" if left > 0 else ""))
        self.seen = len(records)
        return lines


def duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes}m{sec:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def default_out(sweep: Sweep) -> Path:
    return Path("runs") / slug(sweep.name)
