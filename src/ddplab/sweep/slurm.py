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

import argparse
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ddplab import stops
from ddplab.config import RunConfig, build_config, load_toml
from ddplab.errors import ConfigError, DataError
from ddplab.io import files
from ddplab.io.arguments import positive_whole
from ddplab.io.borders import INTEGER, SECONDS, TEXT, check, shown
from ddplab.launch.process import INTERRUPTED
from ddplab.rundir import runfiles
from ddplab.rundir.runlock import run_lock
from ddplab.sweep.estimate import duration
from ddplab.sweep.point import Point
from ddplab.sweepdir.folder import Manifest, Status, SweepFolder, ended_as
from ddplab.sweepdir.spec import Sweep, SweepRun, slug

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
        options = [
            f"--{name}={value}"
            for name, value in (
                ("partition", self.partition),
                ("account", self.account),
                ("time", self.time),
                ("gpus-per-node", self.gpus_per_node),
            )
            if value is not None
        ]
        try:
            return options + shlex.split(self.extra)
        except ValueError as exc:
            raise ConfigError(f"--slurm.extra {self.extra!r} cannot be split into options ({exc})") from None


def allocation(config: RunConfig) -> tuple[int, int]:
    """(nodes, tasks per node) of a point's allocation: its workers when they are several processes."""
    dist = config.dist
    if dist.strategy == "ddp" and (dist.nproc > 1 or dist.nnodes > 1):
        return dist.nnodes, dist.nproc
    return 1, 1


def batch_script(out: Path, name: str, runs: list[str], nodes: int, tasks: int, options: SlurmOptions) -> str:
    """One job array: task i runs the i-th of `runs` (named in the script, which Slurm keeps as submitted,
    so a later submission cannot change what an earlier array's pending tasks run)."""
    throttle = f"%{options.parallel}" if options.parallel else ""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --array=0-{len(runs) - 1}{throttle}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={tasks}",
        f"#SBATCH --output={out.resolve() / 'logs' / 'slurm-%A_%a.out'}",
        "# ddplab: each task runs one point of the sweep; its output goes to the point's log",
        f"RUNS=({' '.join(shlex.quote(run) for run in runs)})",
        "exec "
        + shlex.join([sys.executable, "-m", "ddplab.sweep.slurm", "task", str(out.resolve())])
        + ' "${RUNS[$SLURM_ARRAY_TASK_ID]}"',
    ]
    return "\n".join(lines) + "\n"


class SlurmExecutor:
    """Submits the points as job arrays (one per allocation shape) and returns; --wait waits for them."""

    name: ClassVar[str] = "slurm"
    waits: ClassVar[bool] = True
    summary: ClassVar[str] = "submitted to Slurm as job arrays (sbatch), which --wait waits for"
    OPTIONS = ("partition", "account", "time", "gpus_per_node", "extra")

    def __init__(self, options: SlurmOptions | None = None):
        self.options = options or SlurmOptions()

    @classmethod
    def add_options(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--slurm.partition", dest="slurm_partition", default=None, help="slurm: the partition (sbatch -p)"
        )
        parser.add_argument(
            "--slurm.account", dest="slurm_account", default=None, help="slurm: the account (sbatch -A)"
        )
        parser.add_argument(
            "--slurm.time",
            dest="slurm_time",
            default=None,
            metavar="HH:MM:SS",
            help="slurm: each point's time limit; a point stopped by it resumes when the sweep is submitted again",
        )
        parser.add_argument(
            "--slurm.gpus-per-node",
            dest="slurm_gpus_per_node",
            type=positive_whole,
            default=None,
            metavar="G",
            help="slurm: GPUs each point's allocation asks for per node",
        )
        parser.add_argument(
            "--slurm.extra",
            dest="slurm_extra",
            default="",
            metavar='"OPTIONS"',
            help='slurm: more sbatch options, after an = sign: --slurm.extra="--mem=16G --qos=short"',
        )

    @classmethod
    def options_given(cls, args: argparse.Namespace) -> list[str]:
        return [f"--slurm.{name.replace('_', '-')}" for name in cls.OPTIONS if getattr(args, f"slurm_{name}", None)]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SlurmExecutor:
        if args.timeout is not None:
            raise ConfigError(
                "--timeout stops runs of a local sweep; under Slurm give each point a limit with --slurm.time"
            )
        return cls(
            SlurmOptions(
                partition=args.slurm_partition,
                account=args.slurm_account,
                time=args.slurm_time,
                gpus_per_node=args.slurm_gpus_per_node,
                extra=args.slurm_extra,
                parallel=args.parallel if isinstance(args.parallel, int) and args.parallel > 1 else None,
            )
        )

    @classmethod
    def reading(cls) -> SlurmExecutor:
        return cls()

    def runs_on_gpus(self) -> bool | None:
        """The nodes the tasks ask for decide, never this login node."""
        return self.options.asks_gpus()

    def dry_run(self, sweep: Sweep, folder: SweepFolder) -> str:
        """Each batch script and its sbatch line, nothing written or submitted."""
        folder.refuse_run_folder()
        extra, lines = self.options.sbatch_options(), []
        for (name, nodes, tasks), runs in arrays(sweep.runs, sweep).items():
            lines.append(
                f"$ sbatch --parsable {shlex.join(extra)} {folder.own(FOLDER) / (name + '.sbatch')}".replace("  ", " ")
            )
            lines.append(batch_script(folder.root, name, [run.name for run in runs], nodes, tasks, self.options))
        return "\n".join(lines)

    def submit(self, sweep: Sweep, folder: SweepFolder, echo=print) -> Manifest:
        """Write the points' configs and batch scripts and submit one job array per allocation shape; the manifest
        records each point's job."""
        folder.refuse_run_folder()
        extra = self.options.sbatch_options()
        if shutil.which("sbatch") is None:
            slurm_tool(["sbatch", "--version"], "sbatch")  # says it is missing, before the folder is touched
        with run_lock(folder.root, "sweep"):
            earlier = folder.load() if folder.has_manifest() else None
            manifest, todo = folder.prepare(sweep, unavailable={}, executor=self.name, echo=echo)
            manifest.jobs = list(earlier.jobs) if earlier is not None else []
            queued = queued_jobs(manifest)
            self.update(
                folder, manifest, queued
            )  # a point whose task is still queued or running is not submitted twice
            folder.write(manifest)
            todo = [
                (run, entry)
                for run, entry in todo
                if (entry.job or "") not in queued and entry.status is not Status.FINISHED
            ]
            if not todo:
                echo(
                    f"sweep {sweep.name}: nothing to submit "
                    f"({'every point finished' if not queued else 'the rest is queued'})"
                )
                return manifest
            files.make_dir(folder.own(FOLDER))
            entries = {run.name: entry for run, entry in todo}
            for (name, nodes, tasks), runs in arrays([run for run, _ in todo], sweep).items():
                for run in runs:
                    files.write_text(folder.root / entries[run.name].config, run.config.to_toml())
                    outcome_file(folder, run.name).unlink(missing_ok=True)  # an earlier task's outcome
                script = folder.own(FOLDER) / f"{name}.sbatch"
                files.write_text(
                    script, batch_script(folder.root, name, [run.name for run in runs], nodes, tasks, self.options)
                )
                job = sbatch(script, extra)
                for i, run in enumerate(runs):
                    entry = entries[run.name]
                    entry.status, entry.job, entry.exit_code, entry.error = Status.SUBMITTED, f"{job}_{i}", None, None
                manifest.jobs.append(job)
                folder.write(manifest)  # each job recorded as soon as it exists: a later refusal loses none
                echo(
                    f"submitted job {job}: {len(runs)} point(s) of {nodes} node(s) x {tasks} task(s) "
                    f"({', '.join(run.name for run in runs)})"
                )
        echo(f"follow it: ddplab sweep {sweep.file} --out {folder.root} --status (or --wait for the report)")
        return manifest

    def refresh(self, folder: SweepFolder, manifest: Manifest) -> list[str]:
        self.update(folder, manifest, queued_jobs(manifest))
        down = (
            unavailable_nodes()
            if any(e.status in (Status.QUEUED, Status.RUNNING, Status.SUBMITTED) for e in manifest.runs)
            else []
        )
        return (
            [
                f"slurm: node(s) out of service: {', '.join(down)}; a point that needs them waits in the queue "
                "(or fails, when its task was running there)"
            ]
            if down
            else []
        )

    @staticmethod
    def update(folder: SweepFolder, manifest: Manifest, queued: dict[str, str]) -> None:
        """Each submitted point's status from its run folder, its task's outcome and the queue."""
        for entry in manifest.runs:
            if not entry.job or entry.status.settled:
                continue
            outcome = read_outcome(outcome_file(folder, entry.name))
            if runfiles.run_state(folder.root / entry.dir) == "finished":
                entry.ended(Status.FINISHED, 0, None, (outcome or {}).get("wall_s"), entry.wall_epochs)
            elif entry.job in queued:
                entry.status = Status.QUEUED if queued[entry.job] in QUEUED else Status.RUNNING
            elif outcome is not None:
                code = outcome.get("exit_code")
                entry.ended(
                    ended_as(code, summary_written=False),
                    code,
                    outcome.get("error"),
                    outcome.get("wall_s"),
                    entry.wall_epochs,
                )
            else:
                entry.status, entry.error = (
                    Status.FAILED,
                    (
                        f"its task (job {entry.job}) ended without an outcome: cancelled before it started, or killed; "
                        f"see {folder.root / 'logs'}/slurm-{entry.job}.out"
                    ),
                )

    def wait(self, folder: SweepFolder, echo=print, poll_s: float | None = None) -> Manifest:
        """Wait until none of the sweep's tasks is queued or running; the manifest with each point's outcome. A
        sweep none of whose points was ever submitted (its submission refused) is one line saying so: there is
        nothing to wait for, and "did not finish, run it again" would send the user to the wrong fix."""
        earlier = folder.load()
        if not earlier.jobs and any(e.status is Status.PENDING for e in earlier.runs):
            raise ConfigError(
                f"no point of {folder.root} was submitted to Slurm (its submission was refused, or never made): "
                "nothing to wait for; submit it with ddplab sweep FILE --executor slurm "
                f"--out {folder.root}, then --wait"
            )
        start, said = time.perf_counter(), None
        while queued := queued_jobs(folder.load()):  # read again: a submission meanwhile adds jobs
            waiting = sum(state in QUEUED for state in queued.values())
            summary = f"{waiting} queued, {len(queued) - waiting} running"
            if summary != said:
                echo(f"  slurm: {summary} ({duration(time.perf_counter() - start)} so far)")
                said = summary
            time.sleep(WAIT_POLL_S if poll_s is None else poll_s)
        with run_lock(folder.root, "sweep"):  # no submission writes the manifest between this read and write
            manifest = folder.load()
            self.update(folder, manifest, queued_jobs(manifest))
            folder.write(manifest)
        return manifest


def outcome_file(folder: SweepFolder, name: str) -> Path:
    return folder.own(FOLDER) / f"{name}.json"


def arrays(runs: list[SweepRun], sweep: Sweep) -> dict[tuple[str, int, int], list[SweepRun]]:
    """The points grouped into one array per allocation shape, each array named after the sweep and its shape."""
    groups: dict[tuple[str, int, int], list[SweepRun]] = {}
    for run in runs:
        nodes, tasks = allocation(run.config)
        groups.setdefault((f"ddplab-{slug(sweep.name)}-{nodes}x{tasks}", nodes, tasks), []).append(run)
    return groups


def slurm_tool(args: list[str], what: str) -> str:
    """A Slurm command's output; a missing tool or its refusal is one line (ConfigError)."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=60)  # any bytes
    except FileNotFoundError:
        raise ConfigError(
            f"{args[0]} is not installed here (or not on PATH): --executor slurm needs Slurm's "
            "client tools, on a machine that can submit to the cluster"
        ) from None
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
    answer = slurm_tool(
        ["sbatch", "--parsable", *extra, str(script)], shlex.join(["sbatch", *extra, script.name])
    ).strip()
    found = JOB_ID.fullmatch(answer.splitlines()[-1].strip() if answer else "")
    if found is None:
        raise ConfigError(
            f"sbatch answered {shown(answer, 80)}, not a job id (JOB or JOB;CLUSTER): {script.name} may or "
            "may not be queued; see squeue before submitting again"
        )
    return found.group(1)


def queued_jobs(manifest: Manifest) -> dict[str, str]:
    """The array tasks of this sweep's jobs that Slurm still holds, by "JOB_INDEX", with their state."""
    jobs = set(manifest.jobs)
    if not jobs:
        return {}
    # All of this user's array tasks, filtered here: asked by id, squeue refuses a job it has forgotten.
    text = slurm_tool(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T"], "squeue")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    tasks = {m[1]: m[2] for line in lines if (m := TASK_LINE.fullmatch(line))}
    if lines and not tasks:  # an answer that is not a queue: never read as "nothing queued"
        raise ConfigError(
            f"squeue answered {shown(text.strip(), 80)}, not lines of JOB_TASK|STATE: cannot tell what is "
            "queued; is this Slurm's squeue?"
        )
    return {task: state for task, state in tasks.items() if task.split("_")[0] in jobs}


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
            found[node.strip()] = f"{node.strip()} {state.strip()}" + (
                f" ({reason.strip()})" if reason.strip() not in ("", "none") else ""
            )
    return list(found.values())


# ---- inside an array task -------------------------------------------------------------------
def task(out: Path, name: str) -> int:
    """Run the point `name` of the sweep folder `out`; its exit code."""
    folder = SweepFolder(out)
    if runfiles.run_state(folder.run_dir(name)) == "finished":
        print(f"{name}: finished already", flush=True)
        return 0
    point = Point(folder, name, build_config(load_toml(folder.config_file(name))))
    nodes, tasks = allocation(point.config)
    # The workers are the step's tasks (topology: an srun step of several tasks).
    wrap = (
        ["srun", f"--nodes={nodes}", f"--ntasks={nodes * tasks}", f"--ntasks-per-node={tasks}"]
        if nodes * tasks > 1
        else []
    )
    env = {**os.environ, **allocated_threads(os.environ, tasks)}
    print(
        f"{name}: {'resuming' if point.resumes() else 'running'} on {socket.gethostname()} (log: {point.log})",
        flush=True,
    )
    terminated: list[bool] = []

    def on_sigterm(signum, frame) -> None:  # scancel, the time limit: stop resumable
        terminated.append(True)
        stops.raise_stopped(signum, frame)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        # SIGTERM: srun forwards it to the workers (one SIGINT only makes it print their state); stopped
        # within TASK_GRACE_S, before Slurm's SIGKILL (KillWait, 30 s by default), so the outcome is written.
        done = point.run(env, wrap=wrap, stop_signal=signal.SIGTERM, grace_s=TASK_GRACE_S)
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
    files.write_json(
        outcome_file(folder, name),
        {
            "name": name,
            "job": job,
            "host": socket.gethostname(),
            "exit_code": code,
            "error": error,
            "wall_s": round(done.wall_s, 1),
        },
    )
    print(f"{name}: exit {code}" + (f": {error}" if error else ""), flush=True)
    return code


def allocated_threads(env: Mapping[str, str], tasks_per_node: int) -> dict[str, str]:
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
        print(
            "usage: python -m ddplab.sweep.slurm task SWEEP_FOLDER RUN_NAME (run by ddplab's batch scripts)",
            file=sys.stderr,
        )
        return 2
    return run(Path(args[1]), args[2])


if __name__ == "__main__":
    sys.exit(main())
