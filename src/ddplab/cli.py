"""Command line: parse, build a config, call one function. No training logic lives here.

    ddplab train [--config FILE] [--dataset ... shortcuts] [--section.field VALUE ...]
    ddplab eval RUN_DIR [--weights final|best]
    ddplab data info|verify|download DATASET [--data-dir DIR]
    ddplab compare RUN_DIR [RUN_DIR ...]
    ddplab sweep FILE.toml [--out DIR] [--profile cpu|gpu] [--parallel N|auto] [--dry-run] [--status]
                           [--executor slurm [--slurm.partition P ...] [--wait]]
    ddplab report RUN_OR_SWEEP_DIR ... [--out DIR]
    ddplab plan [RUN [--gpus 1,2,4,8] [--nodes 1,2] [--batch 16,32] [--link NAME|measured]] [--published|--corpus]
                [--measure [--backend gloo|nccl] [--nproc N] [--nnodes M --rdzv-endpoint HOST:PORT]]
    ddplab models [--image-size N] [--num-classes K]
    ddplab hosts up N [--link RATE] | down | status | link I up|down | shape RATE | exec I -- CMD

Errors meant for the user (`DdplabError`) print one line and exit with their code (2 for
config errors); `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import os
import sys
import traceback
import typing
from pathlib import Path
from typing import Any

from ddplab import compat, faults, files, runfiles, stops
from ddplab.arguments import (
    endpoint_parts,
    given,
    parallel_points,
    positive_seconds,
    positive_whole,
    rdzv_endpoint,
    whole_list,
)
from ddplab.config import SECTIONS, RunConfig, build_config, coerce, field_types, load_toml, merge, parse_dotted
from ddplab.errors import ConfigError, DataError, DdplabError, SweepError, file_error

# Commands that only read run folders: they work where torch cannot be imported (a laptop, a CI box).
TORCH_FREE = ("report", "compare", "plan", "hosts")  # plan imports torch only to --measure

# Short flags for the settings people change most; every setting also has --section.field.
SHORTCUTS: dict[str, str] = {
    "--dataset": "data.dataset",
    "--data-dir": "data.data_dir",
    "--subset": "data.subset",
    "--model": "model.name",
    "--optimizer": "optim.name",
    "--lr": "optim.lr",
    "--schedule": "optim.schedule",
    "--epochs": "train.epochs",
    "--batch-size": "train.batch_size",
    "--accumulate": "train.accumulate",
    "--precision": "train.precision",
    "--device": "train.device",
    "--seed": "train.seed",
    "--strategy": "dist.strategy",
    "--nproc": "dist.nproc",
    "--backend": "dist.backend",
    "--nnodes": "dist.nnodes",
    "--node-rank": "dist.node_rank",
    "--rdzv-endpoint": "dist.rdzv_endpoint",
    "--max-restarts": "dist.max_restarts",
    "--out": "output.out",
}


def _is_bool(hint: Any) -> bool:
    return hint is bool or bool in typing.get_args(hint)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=files.user_path, default=argparse.SUPPRESS, help="TOML config file (e.g. a run's config.toml)"
    )
    parser.add_argument(
        "--preset",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help="a recipe that ships with ddplab, as a base for the flags: " + ", ".join(list_presets()),
    )
    for flag, key in SHORTCUTS.items():
        section, name = key.split(".")
        parser.add_argument(flag, dest=key, metavar=name.upper(), default=argparse.SUPPRESS, help=f"same as --{key}")
    parser.add_argument(
        "--resume",
        dest="output.resume",
        action="store_const",
        const="true",
        default=argparse.SUPPRESS,
        help="continue the run in --out from its last checkpoint",
    )
    parser.add_argument(
        "--debug",
        dest="output.debug",
        action="store_const",
        const="true",
        default=argparse.SUPPRESS,
        help="show tracebacks",
    )
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"[{section}] settings")
        hints = field_types(section)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
            kwargs: dict[str, Any] = dict(
                dest=f"{section}.{f.name}",
                default=argparse.SUPPRESS,
                help=f"{f.metadata.get('help', '')} (default: {default})",
            )
            if _is_bool(hints[f.name]):
                kwargs.update(nargs="?", const="true", metavar="BOOL")
            else:
                kwargs.update(metavar=f.name.upper())
            group.add_argument(f"--{section}.{f.name}", **kwargs)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Config file (or a resumed run's config.toml), then every flag given, validated."""
    return config_and_saved(args)[0]


def config_and_saved(args: argparse.Namespace) -> tuple[RunConfig, RunConfig | None]:
    """The config, and for `--resume` the run's saved config.toml as read here: the run's plan compares
    the two without reading the file again."""
    saved = None
    overrides = parse_dotted([f"{k}={v}" for k, v in vars(args).items() if "." in k])
    output = overrides.get("output", {})
    resume = coerce("output.resume", output.get("resume", False), bool)
    if hasattr(args, "config") and hasattr(args, "preset"):
        raise ConfigError(
            "--config and --preset both give a base recipe: choose one, and change single settings with flags"
        )
    if hasattr(args, "preset"):
        base = load_toml(preset_path(args.preset))
    elif hasattr(args, "config"):
        base = load_toml(args.config)
    elif resume and "out" in output:  # resume with the run's own settings
        from ddplab.runfolder import saved_config

        path = Path(output["out"]) / runfiles.CONFIG
        if not path.is_file():
            raise ConfigError(
                f"output.resume: {output['out']} holds no run to resume (no config.toml there); "
                "start a new run there without --resume"
            )
        saved = saved_config(path.parent)
        base = saved.to_dict()
    else:
        base = {}
    return build_config(merge(base, overrides)), saved


PRESETS = Path(__file__).parent / "presets"


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.toml"))


def preset_path(name: str) -> Path:
    path = PRESETS / f"{name}.toml"
    if name not in list_presets():
        raise ConfigError(f"--preset {name!r} does not exist: presets are " + ", ".join(list_presets()))
    return path


def cmd_train(args: argparse.Namespace) -> int:
    config, saved = config_and_saved(args)  # validated before torch is imported: a bad value is answered at once
    if config.dist.nnodes > 1:
        quiet_native_logs(config.output.debug)
    from ddplab.launch import launch

    launch(config, saved=saved)
    return 0


def quiet_native_logs(debug: bool) -> None:
    """Before torch loads, which reads it once (a warm child's torch has: then at once): c10d's socket logs
    across nodes (a reverse lookup that fails, each retry of a connect to a host not up yet) would bury the
    one line ddplab says for each network fault. --debug keeps them."""
    if not debug:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
        if "torch" in sys.modules:  # a warm child: its torch loaded in the server, before this was said
            from ddplab import compat

            compat.set_cpp_log_level(os.environ["TORCH_CPP_LOG_LEVEL"])


def cmd_eval(args: argparse.Namespace) -> int:
    from ddplab.engine.evaluate import evaluate_run

    data_dir = str(args.data_dir) if args.data_dir is not None else None
    result = evaluate_run(args.run_dir, weights=args.weights, device=args.device, data_dir=data_dir, tta=args.tta)
    views = "" if result["tta"] == "none" else f", tta {result['tta']}"
    print(
        f"{result['run_dir']} ({result['weights']} weights, epoch {result['epoch']}{views}): "
        f"{result['split']} acc {result['acc']:.4%} ({result['correct']}/{result['count']}), "
        f"{result['split']} loss {result['loss']:.4f}"
    )
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from ddplab.data import datasets, download

    root = Path(args.data_dir) if args.data_dir else datasets.default_root()
    if args.action == "download":
        folder = download.ensure_dataset(args.dataset, root, download=True)
        print(f"{args.dataset}: ready in {folder}")
        return 0
    if args.action == "info":
        print(format_info(datasets.dataset_info(args.dataset, root)))
        return 0
    problems = datasets.verify_dataset(args.dataset, root)
    for line in problems:
        print(line)
    errors = sum(p.startswith("error:") for p in problems)
    verdict = f"{args.dataset} in {root}: {{}} ({sum(p.startswith('warning:') for p in problems)} warning(s))"
    if errors:  # exit 3, as `train` exits on the same data
        raise DataError(verdict.format(f"FAILED, {errors} error(s) listed above"))
    print(verdict.format("usable"))
    return 0


def format_info(info: dict, indent: str = "") -> str:
    lines = []
    for key, value in info.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:")
            lines.append(format_info(value, indent + "  "))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{indent}{key}:")
            lines += [f"{indent}  - " + ", ".join(f"{k}={v}" for k, v in item.items()) for item in value]
        else:
            lines.append(f"{indent}{key}: {value}")
    return "\n".join(lines)


def cmd_models(args: argparse.Namespace) -> int:
    from ddplab.models import describe_models

    rows = describe_models(image_size=args.image_size, num_classes=args.num_classes)
    print(
        f"{'model':<12} {'params':>12} {'MFLOP/image':>12}  defaults   "
        f"(input 3x{args.image_size}x{args.image_size}, {args.num_classes} classes)"
    )
    for r in rows:
        defaults = ", ".join(f"{k}={v}" for k, v in r["defaults"].items())
        print(f"{r['name']:<12} {r['params']:>12,} {r['flops'] / 1e6:>12,.1f}  {defaults}")
    return 0


def one_mode(command: str, modes: list[tuple[str, bool]]) -> None:
    """Modes of a command that exclude each other: two given is one line, never one of them dropped in silence."""
    given = [name for name, on in modes if on]
    if len(given) > 1:
        raise ConfigError(
            f"ddplab {command}: {given[0]} and {given[1]} cannot go together (each is a mode of its own): give one"
        )


def cmd_sweep(args: argparse.Namespace) -> int:
    from ddplab.sweep import bundled_sweeps, executor
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
            f"{result.folder / 'manifest.json'}); run the sweep again to retry them"
        )
    return 0


def waited_for(args: argparse.Namespace, runner: Any, given: dict[str, Any]) -> Any:
    """With --wait and an executor that does not wait itself: the one an earlier command submitted with."""
    from ddplab.sweep import executor
    from ddplab.sweep.run import load

    if not args.wait or runner.waits:
        return None
    _, folder = load(args.file, runner, **given)
    waiting = [name for name, each in executor.registered().items() if each.waits]
    earlier = executor.named(folder.load().executor) if folder.has_manifest() else None
    if earlier is None or not earlier.waits:
        raise ConfigError(
            f"--wait waits for a sweep submitted with --executor {' or '.join(waiting)}, and {folder.root} holds none"
        )
    return earlier


def add_sweep_options(p: argparse.ArgumentParser) -> None:
    from ddplab.sweep import executor

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
        help="where the points run: local (here; the default) or slurm (submitted as job arrays, sbatch)",
    )
    p.add_argument("--wait", action="store_true", help="with slurm: wait for the sweep's jobs, then write the report")
    for each in executors.values():
        each.add_options(p)


OVERSUBSCRIBED = 4  # ranks a CPU core may hold while a link is timed: past this, the timing is the scheduler's


def refuse_unmeasurable(args: argparse.Namespace) -> None:
    """plan --measure's values it would cap or could not honour, refused or said before any process starts."""
    from ddplab.planner.links import MIB, SIZES
    from ddplab.topology import usable_cores

    if args.max_mib * MIB > SIZES[-1]:
        raise ConfigError(
            f"--max-mib {args.max_mib}: messages are timed from 4 KiB up by 4x to {SIZES[-1] // MIB} MiB; "
            f"give 1 to {SIZES[-1] // MIB}"
        )
    largest = max(s for s in SIZES if s <= args.max_mib * MIB)
    if largest != args.max_mib * MIB:
        print(
            f"ddplab: note: --max-mib {args.max_mib}: messages are timed from 4 KiB up by 4x, so the largest is "
            f"{largest // MIB} MiB",
            file=sys.stderr,
        )
    if args.rdzv_endpoint is not None:
        try:
            endpoint_parts(args.rdzv_endpoint, nodes=args.nnodes)
        except ValueError as exc:
            raise ConfigError(f"--rdzv-endpoint {args.rdzv_endpoint} with --nnodes {args.nnodes}: {exc}") from None
    cores = len(usable_cores())
    if args.backend != "nccl" and max(args.nproc) > OVERSUBSCRIBED * cores:
        raise ConfigError(
            f"--nproc {max(args.nproc)}: this process may use {cores} CPU core(s); past "
            f"{OVERSUBSCRIBED * cores} processes ({OVERSUBSCRIBED} a core) the all-reduce's time is the "
            "scheduler's, not the link's"
        )


PLAN_PREDICTS = ("--gpus", "--nodes", "--batch", "--link", "--inter-link", "--links-file", "--out")
PLAN_MEASURES = (
    "--measure",
    "--backend",
    "--nproc",
    "--max-mib",
    "--nnodes",
    "--rdzv-endpoint",
    "--timeout-s",
    "--out",
)


def cmd_plan(args: argparse.Namespace) -> int:
    """A run's prediction, the published cases, the published links, or (--measure) this machine's all-reduce:
    the options checked against the mode here, the work in planner/command.py."""
    one_mode(
        "plan",
        [
            ("a run folder", args.run is not None),
            ("--measure", args.measure),
            ("--published", args.published),
            ("--corpus", args.corpus),
        ],
    )
    if args.run is not None:
        used_by("plan", "for a run folder's prediction (those options are --measure's)", args, PLAN_PREDICTS)
    elif args.measure:
        used_by("plan", "with --measure (those options are for a run folder's prediction)", args, PLAN_MEASURES)
        refuse_unmeasurable(args)
    else:
        used_by(
            "plan",
            "with --published"
            if args.published
            else "with --corpus"
            if args.corpus
            else "without a run folder or --measure (it lists the published links)",
            args,
            ("--published", "--corpus"),
        )
    from ddplab.planner import command

    if args.run is not None:
        return command.predict_run(
            args.run,
            gpus=args.gpus,
            nodes=args.nodes,
            batches=args.batch,
            link=args.link,
            inter_link=args.inter_link,
            links_file=args.links_file,
            out=args.out,
        )
    if args.published:
        return command.show_published()
    if args.corpus:
        return command.show_corpus()
    if not args.measure:
        return command.list_links()
    if args.nnodes > 1:
        quiet_native_logs(args.debug)
    compat.check_torch()
    from ddplab.allreduce import measure_links

    return measure_links(
        args.backend,
        args.nproc,
        nnodes=args.nnodes,
        max_mib=args.max_mib,
        rdzv_endpoint=args.rdzv_endpoint,
        timeout_s=args.timeout_s,
        out=args.out,
    )


def cmd_hosts(args: argparse.Namespace) -> int:
    """A test cluster of hosts with their own addresses on this machine (ddplab/hosts.py)."""
    from ddplab import hosts

    if args.action == "up":
        made = hosts.up(args.count, args.link, name=args.name)
        print(f"{made.hosts} host(s) up in cluster {made.name!r}, each link {hosts.rate_text(made.rate_bit_s)}:")
    elif args.action == "down":
        stopped = hosts.down(args.name)
        print(
            f"cluster {args.name!r} is down" + (f"; {len(stopped)} process(es) in it were stopped" if stopped else "")
        )
        return 0
    elif args.action == "link":
        made = hosts.find(args.name)
        made.host(args.host)  # names the hosts there are
        hosts.set_link(made, args.host, args.state)
    elif args.action == "shape":
        made = hosts.reshape(args.name, args.rate)
    elif args.action == "exec":
        command = list(args.cmd)
        while command[:1] == ["--name"] and len(command) > 1:  # after I, the rest is the command's, but for --name
            args.name, command = command[1], command[2:]
        made = hosts.find(args.name)
        command = command[1:] if command[:1] == ["--"] else command
        if not command:
            raise ConfigError("ddplab hosts exec I -- COMMAND: no command given")
        os.execvp("ip", [*made.exec_prefix(args.host), *command])
    for row in hosts.status(args.name):
        print(
            f"  host {row['host']}  {row['address']:<12} link {row['link']:<4} {row['rate']:<9} "
            f"{row['processes']} process(es)   run in it: ddplab hosts exec {row['host']} -- CMD"
        )
    if args.action == "up":
        print(
            f"a run across them: ddplab hosts exec I -- ddplab train ... --nnodes {made.hosts} "
            f"--rdzv-endpoint {made.endpoint()}   (I = 0..{made.hosts - 1}); ddplab hosts down when done"
        )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ddplab.sweep.folder import SweepFolder

    only = args.paths[0] if len(args.paths) == 1 else None
    out = args.out or (only / "report" if only is not None and SweepFolder(only).has_manifest() else Path("report"))
    from ddplab.report.build import build_and_say

    build_and_say(out, args.paths, title=args.title)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from ddplab.report.compare import format_rows, scaling_rows
    from ddplab.runread import finished_run

    given: dict[Path, Path] = {}  # each folder once: a run set against itself is no comparison
    for d in args.run_dirs:
        if d.resolve() in given:
            again = f"{d} given twice" if d == given[d.resolve()] else f"{d} is {given[d.resolve()]}, given again"
            print(f"ddplab: note: {again}: compared once", file=sys.stderr)
        given.setdefault(d.resolve(), d)
    rows = scaling_rows([finished_run(d) for d in given.values()])
    print(json.dumps(rows, indent=2, default=str) if args.json else format_rows(rows))
    return 0


class Parser(argparse.ArgumentParser):
    """ddplab's argument parser: a usage error is one line with a pointer to --help (never the usage
    screen), and flags are never abbreviated: `--train.epoch` is an error that names
    `--train.epochs`, not a silent match. Subcommands inherit it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"ddplab: error: {message}{self.suggestion(message)} (see {self.prog} --help)\n")

    def suggestion(self, message: str) -> str:
        """'; did you mean --x?' for the first unknown flag of an 'unrecognized arguments' message."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        unknown = next((w.split("=")[0] for w in message.split(":", 1)[1].split() if w.startswith("--")), None)
        if unknown is None:
            return ""
        owners = self.all_flags()
        if unknown in owners:  # a flag of another command: the typo is the command's, not the flag's
            return f"; {unknown} is an option of {' and '.join(owners[unknown])}"
        named = next((w for w in self.given if not w.startswith("-")), None)  # the command, as main() finds it
        own = [f for f, progs in owners.items() if any(p.split()[1:2] == [named] for p in progs)] or list(owners)
        close = difflib.get_close_matches(unknown, own, n=1)
        if close:
            return f"; did you mean {close[0]}?"
        other = difflib.get_close_matches(unknown, list(owners), n=1)  # another command's, said as such
        return f"; did you mean {other[0]} (an option of {' and '.join(owners[other[0]])})?" if other else ""

    given: tuple[str, ...] = ()  # the words of the command line being parsed (which command it names)

    def parse_args(self, args=None, namespace=None):
        Parser.given = tuple(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def all_flags(self) -> dict[str, list[str]]:
        """Each long flag of this parser and its subcommands' (argparse reports a subcommand's unknown
        flags here), with the commands that have it."""
        flags: dict[str, list[str]] = {f: [self.prog] for f in self._option_string_actions if f.startswith("--")}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for p in action.choices.values():
                    if isinstance(p, Parser):
                        for flag, progs in p.all_flags().items():
                            flags.setdefault(flag, []).extend(progs)
        return flags


def build_parser(with_kernels: bool = True) -> argparse.ArgumentParser:
    """Every command's parser; `with_kernels=False` stands in a placeholder for `ddplab kernels`, whose
    parser imports torch."""
    parser = Parser(prog="ddplab", description="Train CNN image classifiers on one device or many.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a model (see --help for every setting)")
    add_config_arguments(p)
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("eval", help="test loss/accuracy of a run's final or best weights")
    p.add_argument("run_dir", type=files.user_path)
    p.add_argument("--weights", choices=("final", "best"), default="final")
    p.add_argument("--device", default="auto")
    p.add_argument("--data-dir", type=files.user_path, default=None, help="data root, if it moved since training")
    p.add_argument(
        "--tta", default=None, help="test-time augmentation: none | flip | flip_translate (default: the run's own)"
    )
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("data", help="dataset info, verification and download")
    p.add_argument("action", choices=("info", "verify", "download"))
    p.add_argument("dataset")
    p.add_argument(
        "--data-dir", type=files.user_path, default=None, help="data root (default: $DDPLAB_DATA, else ./data)"
    )
    p.set_defaults(func=cmd_data)
    p = sub.add_parser("compare", help="runs side by side: accuracy, throughput, scaling, where the time went")
    p.add_argument("run_dirs", nargs="+", type=files.user_path)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("sweep", help="run every point of a sweep file, each in its own process tree, then report")
    p.add_argument(
        "file", nargs="?", default=None, help="sweep file, or the name of a bundled sweep (ddplab sweep --list)"
    )
    p.add_argument("--list", action="store_true", help="list the bundled sweeps")
    add_sweep_options(p)
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("assignment", help="the distributed-ML assignment's six questions in one sweep, then one report")
    add_sweep_options(p)
    p.set_defaults(func=cmd_sweep, file="assignment", list=False)
    p = sub.add_parser("plan", help="what more workers or nodes would give a measured run; the links they would use")
    p.add_argument(
        "run", nargs="?", type=files.user_path, default=None, help="a finished run folder (single process or DDP)"
    )
    p.add_argument(
        "--gpus",
        type=whole_list,
        default=None,
        metavar="1,2,4,8",
        help="workers per node to predict: GPUs on CUDA, processes on a CPU (default 1,2,4,8 on CUDA, 1,2 on a CPU)",
    )
    p.add_argument("--nodes", type=whole_list, default=[1], metavar="1,2", help="nodes to predict (default 1)")
    p.add_argument(
        "--batch",
        type=whole_list,
        default=None,
        metavar="16,32,...",
        help="local batch sizes to predict (default: the run's)",
    )
    p.add_argument(
        "--link",
        type=given,
        default=None,
        help="the link within a node: a published one (ddplab plan lists them) or "
        "measured (--links-file); default nvlink on CUDA, measured on a CPU",
    )
    p.add_argument("--inter-link", type=given, default="ib", help="the link between nodes (default ib)")
    p.add_argument(
        "--links-file", type=files.user_path, default=Path("links.json"), help="ddplab plan --measure's output"
    )
    p.add_argument(
        "--published",
        action="store_true",
        help="published scaling figures (PyTorch's DDP benchmark, DAWNBench) against the model's predictions",
    )
    p.add_argument(
        "--corpus",
        action="store_true",
        help="the model against every published scaling figure in planner/figures (errors by source and by kind)",
    )
    p.add_argument(
        "--measure",
        action="store_true",
        help="time all-reduce from 4 KiB up with --nproc processes, fit latency and bus bandwidth, write --out",
    )
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto", help="auto: nccl on CUDA, else gloo")
    p.add_argument(
        "--nproc",
        type=whole_list,
        default=[2],
        help="processes (ranks) to measure with; a list (2,4) measures each, for predictions of as many",
    )
    p.add_argument("--max-mib", type=positive_whole, default=256, help="the largest message, MiB")
    p.add_argument(
        "--nnodes",
        type=positive_whole,
        default=1,
        help="--measure across this many nodes: run the same command on each (default 1)",
    )
    p.add_argument(
        "--rdzv-endpoint",
        type=rdzv_endpoint,
        default=None,
        metavar="HOST:PORT",
        help="with --nnodes: node 0's address and a free port, the same on every node",
    )
    p.add_argument(
        "--timeout-s", type=positive_whole, default=600, help="with --nnodes: how long nodes wait for each other"
    )
    p.add_argument(
        "--out",
        type=files.user_path,
        default=None,
        help="where --measure writes links.json, or RUN's prediction plan.json (default: ./links.json, ./plan.json)",
    )
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("report", help="tables, plots and an HTML page from run and sweep folders")
    p.add_argument("paths", nargs="+", type=files.user_path, help="run folders, sweep folders, or folders holding them")
    p.add_argument(
        "--out",
        type=files.user_path,
        default=None,
        help="report folder (default: SWEEP/report for one sweep, else ./report)",
    )
    p.add_argument("--title", default=None)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser(
        "hosts",
        help="a test cluster on this machine: hosts with their own addresses and links of a set "
        "rate (network namespaces; needs root)",
    )
    hosts_sub = p.add_subparsers(dest="action", required=True)
    q = hosts_sub.add_parser("up", help="make N hosts on a switch, at 10.211.0.1, .2, ...")
    q.add_argument("count", type=positive_whole, metavar="N")
    q.add_argument(
        "--link",
        default=None,
        metavar="RATE",
        help="each host's link rate, both ways: 100mbit, 1gbit, ... (default: unshaped)",
    )
    q = hosts_sub.add_parser("down", help="stop what runs in the hosts and remove them")
    q = hosts_sub.add_parser("status", help="each host's address, link and processes")
    q = hosts_sub.add_parser("link", help="pull a host's cable (down) or plug it back (up)")
    q.add_argument("host", type=int, metavar="I")
    q.add_argument("state", choices=("up", "down"))
    q = hosts_sub.add_parser("shape", help="set every link's rate (or none)")
    q.add_argument("rate", metavar="RATE")
    q = hosts_sub.add_parser("exec", help="run a command in host I")
    q.add_argument("host", type=int, metavar="I")
    q.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")
    for q in hosts_sub.choices.values():
        q.add_argument(
            "--name", default="ddplab", help="the cluster's name (default ddplab); several may exist at once"
        )
    p.set_defaults(func=cmd_hosts)
    p = sub.add_parser("models", help="list models with parameter and FLOP counts")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=10)
    p.set_defaults(func=cmd_models)
    add_kernels_placeholder(sub) if not with_kernels else add_kernels_parser(sub)
    add_debug(parser)
    return parser


def add_kernels_parser(sub) -> None:
    try:
        from ddplab.kernels.cli import add_parser
    except (ImportError, AttributeError):  # no torch, or one below the floor: `main` says which, in one line
        add_kernels_placeholder(sub)
        return
    add_parser(sub)


def add_kernels_placeholder(sub) -> None:
    """`ddplab kernels` without its own parser: importing the kernels imports torch (3 s here), which
    no other command's parsing needs, and which may be missing or too old (`main` then says so)."""
    p = sub.add_parser("kernels", help="custom GPU kernels: benchmark and self-test (needs torch)")
    p.add_argument("rest", nargs=argparse.REMAINDER)


def add_debug(parser: argparse.ArgumentParser) -> None:
    """`--debug` on every command (train's also sets output.debug): an error keeps its line and exit
    code and adds the traceback (main reads the flag before parsing)."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subcommands:
        for p in action.choices.values():
            add_debug(p)
    if not subcommands and "--debug" not in parser._option_string_actions:
        parser.add_argument("--debug", action="store_true", help="on an error, show the traceback too")
    if not subcommands:
        parser.set_defaults(command_parser=parser)  # for `given_options`


def given_options(args: argparse.Namespace) -> list[str]:
    """The options of `args`' command set to something other than their default: what the user asked for."""
    parser = getattr(args, "command_parser", None)
    return [
        a.option_strings[-1]
        for a in (parser._actions if parser else [])
        if a.option_strings and a.default is not argparse.SUPPRESS and getattr(args, a.dest, a.default) != a.default
    ]


def used_by(command: str, mode: str, args: argparse.Namespace, uses: tuple[str, ...]) -> None:
    """Options given that `mode` does nothing with: one line, never dropped in silence."""
    unused = [o for o in given_options(args) if o not in (*uses, "--debug")]
    if unused:
        them = "it" if len(unused) == 1 else "them"
        raise ConfigError(
            f"ddplab {command}: {', '.join(unused)} {'does' if len(unused) == 1 else 'do'} nothing {mode}: "
            f"leave {them} out"
        )


def main(argv: list[str] | None = None) -> int:
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)  # known before parsing, which may fail too
    try:
        argv = sys.argv[1:] if argv is None else argv
        command = next((a for a in argv if not a.startswith("-")), None)
        args = build_parser(with_kernels=command == "kernels").parse_args(argv)
        if args.command not in TORCH_FREE:
            compat.check_torch()  # before the command imports an API an older torch lacks
        faults.check_env()  # a test hook obeys the contract of a flag, whatever the command (a sweep's runs inherit it)
        with stops.as_interrupts():  # SIGTERM and SIGHUP stop every command as Ctrl-C does
            code = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe is handled, not at exit
        return code
    except BrokenPipeError:  # the reader went away (ddplab models | head): stop quietly, as shell tools do
        quiet(sys.stdout)
        return 141
    except (DdplabError, OSError) as exc:
        error = exc if isinstance(exc, DdplabError) else file_error(exc, "use")  # a read-only or full disk, ...
        if debug:
            traceback.print_exc()  # and still the one line and the documented exit code
        say_last(f"ddplab: error: {error}")
        return error.exit_code
    except KeyboardInterrupt as exc:
        say_last(stops.interrupted_line(exc))
        return stops.EXIT_CODE


def quiet(stream) -> None:
    """Point `stream` at /dev/null, so that Python's flush at exit does not hit its closed pipe or gone terminal
    again (a traceback, or exit code 120)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError):  # no file (captured, closed): nothing to flush there
        pass


def say_last(line: str) -> None:
    """The command's last line on stderr, where it can still be written: after SIGHUP the terminal may be gone
    (EIO); a stream that can no longer be flushed is quieted for the exit's flush."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            quiet(stream)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
