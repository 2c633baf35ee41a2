"""A sweep sent to a Slurm cluster: job arrays of one task per point, their state, and waiting for them.

The sweep folder must be on a file system the compute nodes share (as a cluster's home and
scratch are), and ddplab importable there by the same interpreter path. Submitting checks
every point's config (not against this machine: a login node is not where they run),
writes each point's config as the local runner does, and one batch script per shape of
allocation (nodes x tasks per node): a point whose workers are several processes gets them
all in its allocation and runs them with `srun`, whose workers ddplab accepts (topology.py).
`--parallel N` throttles each array to N tasks at once (`%N`).

Each array task runs `python -m ddplab.sweep.slurm task OUT NAME`: it skips a point
that finished, resumes one that has a checkpoint (a preempted, timed-out or cancelled task
is resumed by submitting again), runs `ddplab train` as the local runner does (its own
process tree, output appended to the point's log, SIGTERM from scancel or the time limit
stopping it resumable) and writes its outcome to `slurm/<name>.json`. Tasks never touch
the manifest, so no two write one file; the submitter reads the outcomes, squeue and the
run folders (`refresh`) for `--status`, `--wait` and the report. Only sbatch, squeue,
scancel (by the user) and srun are used: the scheduling is Slurm's.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddplab import files, runfiles
from ddplab.borders import INTEGER, SECONDS, TEXT, check, shown
from ddplab.config import build_config, load_toml
from ddplab.engine.runlock import live_owner, run_lock
from ddplab.errors import ConfigError, DataError
from ddplab.metrics.records import read_epochs
from ddplab.process import INTERRUPTED, supervise
from ddplab.sweep.manifest import MANIFEST, load, write_manifest
from ddplab.sweep.runner import check_out, command, duration, prepare_folder, raise_terminated
from ddplab.sweep.spec import Sweep, SweepRun, slug

FOLDER = "slurm"  # batch scripts and each task's outcome
WAIT_POLL_S = 2.0
TASK_GRACE_S = 20  # a cancelled task's run is SIGKILLed after this; below Slurm's default KillWait (30 s)
SIGTERM_WAIT_S = 5  # how long a task whose workers died of SIGTERM waits to hear whether it was cancelled too
QUEUED = ("PENDING", "CONFIGURING", "REQUEUED", "RESV_DEL_HOLD", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED")


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time: str | None = None  # the time limit of each task, as sbatch takes it (HH:MM:SS, D-HH:MM)
    gpus_per_node: int | None = None
    extra: str = ""  # more sbatch options, e.g. "--mem=16G --qos=short"
    parallel: int | None = None  # tasks of one array at once (None: as many as Slurm gives)

    def asks_gpus(self) -> bool:
        """Whether the tasks get GPUs: --slurm.gpus-per-node, or a GPU request among the extra options."""
        return bool(self.gpus_per_node) or re.search(r"--(gpus|gres=\S*gpu|gpus-per-\w+)\b", self.extra) is not None

    def sbatch_options(self) -> list[str]:
        options = [f"--{name}={value}" for name, value in (("partition", self.partition), ("account", self.account),
                                                           ("time", self.time), ("gpus-per-node", self.gpus_per_node))
                   if value is not None]
        try:
            return options + shlex.split(self.extra)
        except ValueError as exc:
            raise ConfigError(f"--slurm.extra {self.extra!r} cannot be split into options ({exc})") from None


def shape(run: SweepRun) -> tuple[int, int]:
    """(nodes, tasks per node) of a point's allocation: its workers when they are several processes."""
    dist = run.config.dist
    if dist.strategy == "ddp" and (dist.nproc > 1 or dist.nnodes > 1):
        return dist.nnodes, dist.nproc
    return 1, 1


def batch_script(out: Path, name: str, runs: list[str], nodes: int, tasks: int, options: SlurmOptions) -> str:
    """One job array: task i runs the i-th of `runs` (named in the script, which Slurm keeps as submitted,
    so a later submission cannot change what an earlier array's pending tasks run)."""
    throttle = f"%{options.parallel}" if options.parallel else ""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --array=0-{len(runs) - 1}{throttle}",
             f"#SBATCH --nodes={nodes}", f"#SBATCH --ntasks-per-node={tasks}",
             f"#SBATCH --output={out.resolve() / 'logs' / 'slurm-%A_%a.out'}",
             "# ddplab: each task runs one point of the sweep; its output goes to the point's log",
             f"RUNS=({' '.join(shlex.quote(run) for run in runs)})",
             "exec " + shlex.join([sys.executable, "-m", "ddplab.sweep.slurm", "task", str(out.resolve())])
             + ' "${RUNS[$SLURM_ARRAY_TASK_ID]}"']
    return "\n".join(lines) + "\n"


def submit(sweep: Sweep, out: Path, options: SlurmOptions, *, dry_run: bool = False, echo=print) -> dict[str, Any]:
    """Write the points' configs and batch scripts and submit one job array per allocation shape (dry run:
    print them, submit and write nothing); the manifest records each point's job."""
    check_out(out)
    extra = options.sbatch_options()
    if not dry_run and shutil.which("sbatch") is None:
        slurm_tool(["sbatch", "--version"], "sbatch")  # says it is missing, before the folder is touched
    if dry_run:
        groups = arrays(sweep.runs, sweep)
        for (name, nodes, tasks), runs in groups.items():
            echo(f"$ sbatch --parsable {shlex.join(extra)} {out / FOLDER / (name + '.sbatch')}".replace("  ", " "))
            echo(batch_script(out, name, [run.name for run in runs], nodes, tasks, options))
        return {}
    with run_lock(out, "sweep"):
        earlier = load(out) if (out / MANIFEST).is_file() else {}
        manifest, todo = prepare_folder(sweep, out, unavailable={}, echo=echo)
        manifest["slurm_jobs"] = list(earlier.get("slurm_jobs") or [])
        queued = queued_jobs(manifest)
        refresh(out, manifest, queued)  # a point whose task is still queued or running is not submitted twice
        todo = [(run, entry) for run, entry in todo if job_of(entry) not in queued and entry["status"] != "finished"]
        if not todo:
            echo(f"sweep {sweep.name}: nothing to submit ({'every point finished' if not queued else 'the rest is queued'})")
            return manifest
        files.make_dir(out / FOLDER)
        entries = {run.name: entry for run, entry in todo}
        manifest["executor"] = "slurm"
        for (name, nodes, tasks), runs in arrays([run for run, _ in todo], sweep).items():
            for run in runs:
                files.write_text(out / entries[run.name]["config"], run.config.to_toml())
                (out / FOLDER / f"{run.name}.json").unlink(missing_ok=True)  # an earlier task's outcome
            script = out / FOLDER / f"{name}.sbatch"
            files.write_text(script, batch_script(out, name, [run.name for run in runs], nodes, tasks, options))
            job = sbatch(script, extra)
            for i, run in enumerate(runs):
                entries[run.name].update(status="submitted", job=f"{job}_{i}", exit_code=None, error=None)
            manifest["slurm_jobs"].append(job)
            write_manifest(out, manifest)  # each job recorded as soon as it exists: a later refusal loses none
            echo(f"submitted job {job}: {len(runs)} point(s) of {nodes} node(s) x {tasks} task(s) "
                 f"({', '.join(run.name for run in runs)})")
    echo(f"follow it: ddplab sweep {sweep.file} --out {out} --status (or --wait for the report)")
    return manifest


def arrays(runs: list[SweepRun], sweep: Sweep) -> dict[tuple[str, int, int], list[SweepRun]]:
    """The points grouped into one array per allocation shape, each array named after the sweep and its shape."""
    groups: dict[tuple[str, int, int], list[SweepRun]] = {}
    for run in runs:
        nodes, tasks = shape(run)
        groups.setdefault((f"ddplab-{slug(sweep.name)}-{nodes}x{tasks}", nodes, tasks), []).append(run)
    return groups


def slurm_tool(args: list[str], what: str) -> str:
    """A Slurm command's output; a missing tool or its refusal is one line (ConfigError)."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ConfigError(f"{args[0]} is not installed here (or not on PATH): --executor slurm needs Slurm's "
                          "client tools, on a machine that can submit to the cluster") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{args[0]} did not answer within 60 s: is the Slurm controller up?") from None
    if proc.returncode != 0:
        said = [line for line in proc.stderr.splitlines() if line.strip()]
        raise ConfigError(f"{what} failed: {said[-1].strip() if said else f'exit {proc.returncode}'}")
    return proc.stdout


JOB_ID = re.compile(r"(\d+)(;[\w.-]+)?")  # sbatch --parsable: JOB or JOB;CLUSTER
TASK_LINE = re.compile(r"(\d+_\d+)\|([A-Z_]+)")  # squeue -r -o %i|%T: one array task a line


def sbatch(script: Path, extra: list[str]) -> str:
    """Submit `script`; the job id. An answer that is not one (a site's wrapper, an error page) is one line:
    it is never recorded as a job."""
    answer = slurm_tool(["sbatch", "--parsable", *extra, str(script)], shlex.join(["sbatch", *extra, script.name])).strip()
    found = JOB_ID.fullmatch(answer.splitlines()[-1].strip() if answer else "")
    if found is None:
        raise ConfigError(f"sbatch answered {shown(answer, 80)}, not a job id (JOB or JOB;CLUSTER): {script.name} may or "
                          "may not be queued; see squeue before submitting again")
    return found.group(1)


def job_of(entry: dict[str, Any]) -> str:
    return str(entry.get("job") or "")


def queued_jobs(manifest: dict[str, Any]) -> dict[str, str]:
    """The array tasks of this sweep's jobs that Slurm still holds, by "JOB_INDEX", with their state."""
    jobs = set(manifest.get("slurm_jobs") or [])
    if not jobs:
        return {}
    # All of this user's array tasks, filtered here: asked by id, squeue refuses a job it has forgotten.
    text = slurm_tool(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T"], "squeue")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    tasks = dict(m.groups() for line in lines if (m := TASK_LINE.fullmatch(line)))
    if lines and not tasks:  # an answer that is not a queue: never read as "nothing queued"
        raise ConfigError(f"squeue answered {shown(text.strip(), 80)}, not lines of JOB_TASK|STATE: cannot tell what is "
                          "queued; is this Slurm's squeue?")
    return {task: state for task, state in tasks.items() if task.split("_")[0] in jobs}


def refresh(out: Path, manifest: dict[str, Any], queued: dict[str, str], *, write: bool = True) -> None:
    """Each submitted point's status from its run folder, its task's outcome and the queue."""
    for entry in manifest["runs"]:
        if not entry.get("job") or entry["status"] in ("finished", "skipped"):
            continue
        outcome = read_outcome(out / FOLDER / f"{entry['name']}.json")
        if runfiles.run_state(out / entry["dir"]) == "finished":
            entry.update(status="finished", exit_code=0, error=None, wall_s=(outcome or {}).get("wall_s"))
        elif job_of(entry) in queued:
            entry["status"] = "queued" if queued[job_of(entry)] in QUEUED else "running"
        elif outcome is not None:
            code = outcome.get("exit_code")
            entry.update(status="interrupted" if code == INTERRUPTED else "failed", exit_code=code,
                         error=outcome.get("error"), wall_s=outcome.get("wall_s"))
        else:
            entry.update(status="failed", error=f"its task (job {job_of(entry)}) ended without an outcome: cancelled "
                                                f"before it started, or killed; see {out / 'logs'}/slurm-{job_of(entry)}.out")
    if write:
        write_manifest(out, manifest)


OUTCOME = {"exit_code": INTEGER, "error": TEXT | None, "wall_s": SECONDS | None}  # what `task` writes


def read_outcome(path: Path) -> dict[str, Any] | None:
    """A task's outcome file, checked; None when there is none. One that is not what `task` writes (cut short,
    edited) is the task's failure, naming the file: never a traceback, never a status it did not say."""
    if not path.is_file():
        return None
    try:
        return check(runfiles.read_json(path, path.parent), OUTCOME, str(path), required=("exit_code",))
    except (ConfigError, DataError) as exc:
        return {"exit_code": None, "error": f"its outcome cannot be read: {exc}", "wall_s": None}


def status(out: Path) -> list[str]:
    """One line per point: what it is doing, from the queue, its outcome and its run folder (the manifest
    is only read: `--wait` and the runners write it)."""
    manifest = load(out)
    if manifest.get("executor") == "slurm":
        refresh(out, manifest, queued_jobs(manifest), write=False)
    for entry in manifest["runs"]:
        if entry["status"] == "running" and manifest.get("executor") != "slurm" and live_owner(out / entry["dir"]) is None:
            entry["status"] = "stopped"  # its sweep was killed outright: nothing trains it any more
    lines = []
    for entry in manifest["runs"]:
        run_dir = out / entry["dir"]
        epochs = len(read_epochs(run_dir / runfiles.METRICS, growing=True))
        where = f" (job {entry['job']})" if entry.get("job") else ""
        error = f": {entry['error']}" if entry.get("error") and entry["status"] != "finished" else ""
        lines.append(f"  {entry['name']:<40} {entry['status']:<12} {epochs} epoch(s) recorded{where}{error}")
    counts: dict[str, int] = {}
    for entry in manifest["runs"]:
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    down = unavailable_nodes() if manifest.get("executor") == "slurm" and any(
        entry["status"] in ("queued", "running", "submitted") for entry in manifest["runs"]) else []
    nodes = [f"slurm: node(s) out of service: {', '.join(down)}; a point that needs them waits in the queue "
             "(or fails, when its task was running there)"] if down else []
    return [f"sweep {manifest.get('name')}: " + ", ".join(f"{n} {s}" for s, n in counts.items()), *nodes, *lines]


UNAVAILABLE = ("down", "drain", "fail", "not_responding", "maint", "inval", "future", "power_down")


def unavailable_nodes() -> list[str]:
    """'NODE STATE (reason)' for each node Slurm will not run work on now; none when sinfo cannot be asked."""
    try:
        text = slurm_tool(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], "sinfo")
    except ConfigError:
        return []
    found = {}
    for line in text.splitlines():
        node, state, reason = (line.split("|", 2) + ["", ""])[:3]
        if any(word in state.lower() for word in UNAVAILABLE):
            found[node.strip()] = f"{node.strip()} {state.strip()}" + (f" ({reason.strip()})" if reason.strip() not in ("", "none") else "")
    return list(found.values())


def wait(out: Path, echo=print, poll_s: float = WAIT_POLL_S) -> dict[str, Any]:
    """Wait until none of the sweep's tasks is queued or running; the manifest with each point's outcome."""
    start, shown = time.perf_counter(), None
    while queued := queued_jobs(load(out)):  # read again: a submission meanwhile adds jobs
        waiting = sum(state in QUEUED for state in queued.values())
        summary = f"{waiting} queued, {len(queued) - waiting} running"
        if summary != shown:
            echo(f"  slurm: {summary} ({duration(time.perf_counter() - start)} so far)")
            shown = summary
        time.sleep(poll_s)
    with run_lock(out, "sweep"):  # no submission writes the manifest between this read and write
        manifest = load(out)
        refresh(out, manifest, queued_jobs(manifest))
    return manifest


# ---- inside an array task -------------------------------------------------------------------
def task(out: Path, name: str) -> int:
    """Run the point `name` of the sweep folder `out`; its exit code."""
    run_dir, config_file, log_path = out / "runs" / name, out / "configs" / f"{name}.toml", out / "logs" / f"{name}.log"
    if runfiles.run_state(run_dir) == "finished":
        print(f"{name}: finished already", flush=True)
        return 0
    config = build_config(load_toml(config_file))
    resume = (run_dir / runfiles.CHECKPOINTS / runfiles.LAST_CHECKPOINT).is_file()
    point = SweepRun(name, {}, config.train.seed, config)
    cmd = command(point, config_file, run_dir, resume)
    nodes, tasks = shape(point)
    if nodes * tasks > 1:  # the workers are the step's tasks (topology: an srun step of several tasks)
        cmd = ["srun", f"--nodes={nodes}", f"--ntasks={nodes * tasks}", f"--ntasks-per-node={tasks}", *cmd]
    env = {**os.environ, **allocated_threads(os.environ, tasks)}
    print(f"{name}: {'resuming' if resume else 'running'} on {socket.gethostname()} (log: {log_path})", flush=True)
    terminated: list[bool] = []

    def on_sigterm(signum, frame) -> None:  # scancel, the time limit: stop resumable
        terminated.append(True)
        raise_terminated(signum, frame)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        # SIGTERM: srun forwards it to the workers (one SIGINT only makes it print their state); stopped
        # within TASK_GRACE_S, before Slurm's SIGKILL (KillWait, 30 s by default), so the outcome is written.
        done = supervise(cmd, log_path, env=env, stop_signal=signal.SIGTERM, grace_s=TASK_GRACE_S)
    finally:
        signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(True))
    code, error = done.code, done.error
    if nodes * tasks > 1 and code in (128 + signal.SIGTERM, -signal.SIGTERM):
        # scancel and the time limit send SIGTERM to every step: the workers' step often ends before this
        # batch step hears its own, and srun says 143. Stopped, not failed, when this step was told too.
        deadline = time.monotonic() + SIGTERM_WAIT_S
        while not terminated and time.monotonic() < deadline:
            time.sleep(0.1)
        if terminated:
            code, error = INTERRUPTED, "stopped by SIGTERM (scancel, the time limit): submit again to resume"
    signal.signal(signal.SIGTERM, previous)
    job = f"{os.environ.get('SLURM_ARRAY_JOB_ID', '?')}_{os.environ.get('SLURM_ARRAY_TASK_ID', '?')}"
    files.write_json(out / FOLDER / f"{name}.json", {"name": name, "job": job, "host": socket.gethostname(),
                                                    "exit_code": code, "error": error, "wall_s": round(done.wall_s, 1)})
    print(f"{name}: exit {code}" + (f": {error}" if error else ""), flush=True)
    return code


def allocated_threads(env: dict[str, str], tasks_per_node: int) -> dict[str, str]:
    """OMP_NUM_THREADS for a point's processes: the CPUs Slurm gave each task (unless the user set it).

    Without it, each process starts one thread per core of the node, whatever it was allocated
    (task/none binds nothing): two 1-CPU tasks on a 2-core node then ran 4 threads and trained
    8x slower than one alone (BENCHMARKS.md)."""
    if "OMP_NUM_THREADS" in env:
        return {}
    per_task = env.get("SLURM_CPUS_PER_TASK")
    if not (per_task or "").isdigit():
        on_node = env.get("SLURM_CPUS_ON_NODE", "")
        per_task = str(int(on_node) // tasks_per_node) if on_node.isdigit() else None
    return {"OMP_NUM_THREADS": str(max(1, int(per_task)))} if per_task else {}


def main(argv: list[str] | None = None, run: Callable[[Path, str], int] = task) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "task" or not args[2]:
        print("usage: python -m ddplab.sweep.slurm task SWEEP_FOLDER RUN_NAME (run by ddplab's batch scripts)",
              file=sys.stderr)
        return 2
    return run(Path(args[1]), args[2])


if __name__ == "__main__":
    sys.exit(main())
