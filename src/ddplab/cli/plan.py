"""`ddplab plan`: a run's prediction, the published figures, the links, or this machine's all-reduce measured
(planner/command.py prints and writes them; allreduce.py measures)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddplab import compat
from ddplab.cli.common import one_mode, quiet_native_logs, used_by
from ddplab.errors import ConfigError
from ddplab.io import files
from ddplab.io.arguments import (
    endpoint_parts,
    given,
    positive_whole,
    rdzv_endpoint,
    whole_list,
)

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
    check_plan_mode(args)
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
    from ddplab.launch.allreduce import measure_links

    return measure_links(
        args.backend,
        args.nproc,
        nnodes=args.nnodes,
        max_mib=args.max_mib,
        rdzv_endpoint=args.rdzv_endpoint,
        timeout_s=args.timeout_s,
        out=args.out,
    )


def add_plan(sub) -> None:
    p = sub.add_parser("plan", help="what more workers or nodes would give a measured run; the links they would use")
    add_prediction_options(p)
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
    add_measure_options(p)
    p.add_argument(
        "--out",
        type=files.user_path,
        default=None,
        help="where --measure writes links.json, or RUN's prediction plan.json (default: ./links.json, ./plan.json)",
    )
    p.set_defaults(func=cmd_plan)


def add_prediction_options(p: argparse.ArgumentParser) -> None:
    """A run folder's prediction: the workers, nodes, batches and links to plan for."""
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
        help="the link within a node: a published one (ddplab plan lists them), measured (--links-file) or a "
        "links file's path (.json); default nvlink on CUDA, measured on a CPU",
    )
    p.add_argument(
        "--inter-link", type=given, default="ib", help="the link between nodes, as --link names one (default ib)"
    )
    p.add_argument(
        "--links-file", type=files.user_path, default=Path("links.json"), help="ddplab plan --measure's output"
    )


def add_measure_options(p: argparse.ArgumentParser) -> None:
    """--measure: the backend, ranks, messages and nodes to time the all-reduce with."""
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


def check_plan_mode(args: argparse.Namespace) -> None:
    """One mode, and no option given that the mode does nothing with."""
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
