"""`ddplab sweep` and `ddplab assignment`: the CLI's modes (--list, --status, --dry-run, --wait alone), then
ddplab.sweep.run_sweep, whose unfinished points become the exit code."""

from __future__ import annotations

import argparse
from typing import Any

from ddplab.cli.common import one_mode, used_by
from ddplab.errors import ConfigError, SweepError
from ddplab.io import files
from ddplab.io.arguments import (
    parallel_points,
    positive_seconds,
)


def cmd_sweep(args: argparse.Namespace) -> int:
    from ddplab.sweep import MANIFEST, bundled_sweeps, executor
    from ddplab.sweep.run import load, run_sweep

    one_mode(
        "sweep", [("--list", args.list), ("--status", args.status), ("--dry-run", args.dry_run), ("--wait", args.wait)]
    )
    one_mode("sweep", [("--list", args.list), ("a sweep file", args.file is not None)])
    if args.list:
        used_by("sweep", "with --list", args, ("--list",))
        for name, description in bundled_sweeps().items():
            print(f"{name:<16} {description}")
        return 0
    if args.status:
        used_by(
            "sweep",
            "with --status (it reads the sweep folder, runs nothing)",
            args,
            ("--status", "--out", "--profile", "--set"),
        )
    if args.file is None:
        raise ConfigError("ddplab sweep: give a sweep file or a bundled sweep's name (ddplab sweep --list)")
    runner = executor.from_args(args)
    given = dict(out=args.out, profile=args.profile, overrides=args.set, mlflow=args.mlflow)
    if args.status or args.dry_run:
        sweep, folder = load(args.file, runner, **given)
        print("\n".join(executor.status(folder)) if args.status else runner.dry_run(sweep, folder))
        return 0
    earlier = waited_for(args, runner, given)
    if earlier is not None:  # --wait alone: what an earlier command queued
        runner = earlier.reading()
    result = run_sweep(
        args.file, executor=runner, report=not args.no_report, wait=args.wait, submit=earlier is None, **given
    )
    if result.unfinished:
        raise SweepError(
            f"{len(result.unfinished)} of {len(result.manifest.runs)} runs did not finish (see "
            f"{result.folder / MANIFEST}); run the sweep again to retry them"
        )
    return 0


def waited_for(args: argparse.Namespace, runner: Any, given: dict[str, Any]) -> Any:
    """With --wait and an executor that does not wait itself: the one an earlier command submitted with."""
    from ddplab.sweep import executor
    from ddplab.sweep.run import load

    if not args.wait or runner.waits:
        return None
    _, folder = load(args.file, runner, **given, echo=lambda line: None)  # run_sweep says the profile, once
    waiting = [name for name, each in executor.registered().items() if each.waits]
    earlier = executor.named(folder.load().executor) if folder.has_manifest() else None
    if earlier is None or not earlier.waits:
        raise ConfigError(
            f"--wait waits for a sweep submitted with --executor {' or '.join(waiting)}, and {folder.root} holds none"
        )
    return earlier


def add_sweep_options(p: argparse.ArgumentParser) -> None:
    """What a sweep is: its folder, profile, settings and tracking."""
    p.add_argument(
        "--out",
        type=files.user_path,
        default=None,
        help="sweep folder (default: runs/<sweep name>); re-running resumes it",
    )
    p.add_argument(
        "--profile",
        default=None,
        help="a [profiles.NAME] of the file (default: gpu where the points run on CUDA, else cpu, if present)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="a setting for every run that no axis of the sweep sets (repeatable), e.g. --set train.epochs=3",
    )
    p.add_argument(
        "--output.mlflow",
        dest="mlflow",
        default=None,
        metavar="URI",
        help="log the sweep to MLflow (e.g. sqlite:///runs/mlflow.db): a parent run, a child run per point, "
        "the report on the parent (default: $MLFLOW_TRACKING_URI when set; off: never)",
    )
    add_how_options(p)


def add_how_options(p: argparse.ArgumentParser) -> None:
    """How the points run and what happens after: modes, bounds, the executor and its own options."""
    from ddplab.sweep import executor

    p.add_argument("--dry-run", action="store_true", help="list the runs and what would happen to each; run nothing")
    p.add_argument(
        "--timeout", type=positive_seconds, default=None, help="seconds one run may take before it is stopped"
    )
    p.add_argument(
        "--parallel",
        type=parallel_points,
        default=None,
        metavar="N|auto",
        help="run up to N points at once, each on its own CPU cores and GPUs (auto: one per GPU, "
        "1 on a CPU; default 1 here, on Ray as many as the cluster fits); their timings are measured under each "
        "other's load",
    )
    p.add_argument("--no-report", action="store_true", help="skip the report at the end")
    p.add_argument(
        "--no-estimate",
        action="store_true",
        help="start the first run at once, without the probe that says how long the sweep will take",
    )
    p.add_argument("--status", action="store_true", help="each point's state (run folder, Slurm queue) and exit")
    executors = executor.registered()
    p.add_argument(
        "--executor",
        choices=tuple(executors),
        default=next(iter(executors)),
        help="where the points run: "
        + "; ".join(
            f"{name}: {each.summary}" + (" (the default)" if i == 0 else "")
            for i, (name, each) in enumerate(executors.items())
        ),  # fmt: skip
    )
    p.add_argument("--wait", action="store_true", help="with slurm: wait for the sweep's jobs, then write the report")
    for each in executors.values():
        each.add_options(p)


def add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="run every point of a sweep file, each in its own process tree, then report")
    p.add_argument(
        "file", nargs="?", default=None, help="sweep file, or the name of a bundled sweep (ddplab sweep --list)"
    )
    p.add_argument("--list", action="store_true", help="list the bundled sweeps")
    add_sweep_options(p)
    p.set_defaults(func=cmd_sweep)


def add_assignment(sub) -> None:
    p = sub.add_parser("assignment", help="the distributed-ML assignment's six questions in one sweep, then one report")
    add_sweep_options(p)
    p.set_defaults(func=cmd_sweep, file="assignment", list=False)
