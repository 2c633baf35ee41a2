"""`ddplab data` and `ddplab models`: what a dataset holds, and the models with their sizes."""

from __future__ import annotations

import argparse
from pathlib import Path

from ddplab.errors import DataError
from ddplab.io import files


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


def add_data(sub) -> None:
    p = sub.add_parser("data", help="dataset info, verification and download")
    p.add_argument("action", choices=("info", "verify", "download"))
    p.add_argument("dataset")
    p.add_argument(
        "--data-dir", type=files.user_path, default=None, help="data root (default: $DDPLAB_DATA, else ./data)"
    )
    p.set_defaults(func=cmd_data)


def add_models(sub) -> None:
    p = sub.add_parser("models", help="list models with parameter and FLOP counts")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=10)
    p.set_defaults(func=cmd_models)
