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
import os
import sys
import traceback

from ddplab import compat, faults, stops
from ddplab.cli import data, hosts, plan, report, sweep, train
from ddplab.cli.common import Parser, given_options, one_mode, used_by
from ddplab.cli.plan import refuse_unmeasurable
from ddplab.cli.train import SHORTCUTS, config_from_args
from ddplab.errors import BROKEN_PIPE, DdplabError, file_error
from ddplab.launch import warm

__all__ = [
    "SHORTCUTS",
    "Parser",
    "build_parser",
    "config_from_args",
    "given_options",
    "main",
    "one_mode",
    "refuse_unmeasurable",
    "used_by",
]

# Commands that only read run folders: they work where torch cannot be imported (a laptop, a CI box).
TORCH_FREE = ("report", "compare", "plan", "hosts")  # plan imports torch only to --measure


def build_parser(with_kernels: bool = True) -> argparse.ArgumentParser:
    """Every command's parser, each from its command's module; `with_kernels=False` stands in a placeholder for
    `ddplab kernels`, whose parser imports torch."""
    parser = Parser(prog="ddplab", description="Train CNN image classifiers on one device or many.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (train.add_train, train.add_eval, data.add_data, report.add_compare, sweep.add_sweep,
                sweep.add_assignment, plan.add_plan, report.add_report, hosts.add_hosts, data.add_models):  # fmt: skip
        add(sub)
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


def main(argv: list[str] | None = None, *, whole_process: bool = False) -> int:
    """The `ddplab` command; its exit code. `whole_process`: this call is the process's whole life (the console
    script, `python -m ddplab`): once a stop signal has begun a stop, the rest are ignored until it has exited
    with 130. An in-process caller (a test, a notebook) gets its handlers back."""
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)  # known before parsing, which may fail too
    try:
        argv = sys.argv[1:] if argv is None else argv
        command = next((a for a in argv if not a.startswith("-")), None)
        args = build_parser(with_kernels=command == "kernels").parse_args(argv)
        if args.command not in TORCH_FREE:
            compat.check_torch()  # before the command imports an API an older torch lacks
        faults.check_env()  # a test hook obeys the contract of a flag, whatever the command (a sweep's runs inherit it)
        warm.enabled()  # DDPLAB_WARM=maybe: one line before anything starts, not the first time a process starts
        with stops.as_interrupts(to_exit=whole_process):  # SIGTERM and SIGHUP stop every command as Ctrl-C does
            code = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe is handled, not at exit
        return code
    except BrokenPipeError:  # the reader went away (ddplab models | head): stop quietly, as shell tools do
        quiet(sys.stdout)
        return BROKEN_PIPE
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
