"""`ddplab report` and `ddplab compare`: run and sweep folders read, never changed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ddplab.io import files


def cmd_report(args: argparse.Namespace) -> int:
    from ddplab.sweepdir.folder import SweepFolder

    only = args.paths[0] if len(args.paths) == 1 else None
    out = args.out or (only / "report" if only is not None and SweepFolder(only).has_manifest() else Path("report"))
    from ddplab.report.build import build_and_say

    build_and_say(out, args.paths, title=args.title)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from ddplab.report.compare import format_rows, scaling_rows
    from ddplab.rundir.runread import finished_run

    given: dict[Path, Path] = {}  # each folder once: a run set against itself is no comparison
    for d in args.run_dirs:
        if d.resolve() in given:
            again = f"{d} given twice" if d == given[d.resolve()] else f"{d} is {given[d.resolve()]}, given again"
            print(f"ddplab: note: {again}: compared once", file=sys.stderr)
        given.setdefault(d.resolve(), d)
    runs = [finished_run(d) for d in given.values()]
    rows = scaling_rows(runs)
    print(json.dumps(rows, indent=2, default=str) if args.json else format_rows(rows, runs))
    return 0


def add_compare(sub) -> None:
    p = sub.add_parser("compare", help="runs side by side: accuracy, throughput, scaling, where the time went")
    p.add_argument("run_dirs", nargs="+", type=files.user_path)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_compare)


def add_report(sub) -> None:
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
