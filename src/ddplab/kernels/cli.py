"""`ddplab kernels bench|check`: hooked into ddplab's CLI by `add_parser(subparsers)`.

    ddplab kernels bench [--device auto|cpu|cuda] [--repeats N] [--quick] [--dtype ...] [--json PATH]
    ddplab kernels check [--device ...] [--interpret]

Also runnable alone: `python -m ddplab.kernels.cli bench --quick`. Handlers take the
parsed namespace and return an exit code, like ddplab's own commands; torch is imported
only inside them, so building the parser stays cheap.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

_DTYPES = ("float32", "bfloat16", "float16")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the `kernels` command (with `bench` and `check`) on an argparse subparsers object."""
    parser = subparsers.add_parser("kernels", help="custom GPU kernels: benchmark and self-test")
    sub = parser.add_subparsers(dest="kernels_command", required=True)
    p = sub.add_parser("bench", help="time grayscale and Conv+ReLU implementations (the seed's comparisons)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto (cuda if available)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per row; the median is shown")
    p.add_argument("--quick", action="store_true", help="fewer images and repeats; on CPU, no torch.compile")
    p.add_argument("--dtype", choices=_DTYPES, default="float32", help="Conv+ReLU dtype")
    p.add_argument("--json", type=Path, default=None, help="also write the rows and context as JSON")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("check", help="run every available kernel once against the reference")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto (cuda if available)")
    p.add_argument(
        "--interpret",
        action="store_true",
        help="on CPU, run the Triton kernels in Triton's interpreter (sets TRITON_INTERPRET=1)",
    )
    p.set_defaults(func=cmd_check)
    return parser


def _device(name: str):
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from ddplab.kernels.bench import format_table, run_bench

    if args.repeats < 1:
        print("ddplab kernels bench: --repeats must be >= 1", file=sys.stderr)
        return 2
    result = run_bench(args.device, repeats=args.repeats, quick=args.quick, dtype=getattr(torch, args.dtype))
    print(format_table(result))
    if args.json is not None:
        from ddplab.io import files

        files.write_json(args.json, result)
        print(f"\nwrote {args.json}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before the Triton kernels are first imported
    from ddplab.kernels.selftest import run_checks

    results = run_checks(_device(args.device))
    width = max(len(r["name"]) for r in results)
    for r in results:
        print(f"{r['name']:<{width}}  {r['status']:<8} {r['detail']}")
    failed = [r for r in results if r["status"] == "FAILED"]
    print(f"{len(results) - len(failed)} ok or skipped, {len(failed)} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddplab")
    add_parser(parser.add_subparsers(dest="command", required=True))
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "kernels":
        argv.insert(0, "kernels")  # `python -m ddplab.kernels.cli bench` == `ddplab kernels bench`
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
