#!/usr/bin/env python3
"""Training throughput: a plain PyTorch loop vs ddplab, same model, batch, optimizer and data.

    python benchmarks/loop_overhead.py --device cuda          # seed report D's recipe (vgg_small, batch 32),
                                                              # full CIFAR-10
    python benchmarks/loop_overhead.py --device cpu --model simple_cnn --subset 4096 --repeats 3
    python benchmarks/loop_overhead.py --device cpu --quick   # seconds, synthetic data: checks the script only

The plain loop is what the seed reports wrote: a DataLoader over the training images (2
worker processes, pinned memory on CUDA, per-sample float conversion and normalization), an
eager model, Adam, cross-entropy, no evaluation, no metrics. ddplab runs the same model
(built by the same registry, same seed), optimizer, batch and images through `ddplab.train`
with no augmentation, and its per-epoch `train_s` is what counts: training time only, both
sides synchronized before the clock is read, the first epoch of every run (warm-up: worker
start, allocator) left out.

One invocation measures both sides, interleaved: repeat 1 runs plain then ddplab, repeat 2
ddplab then plain, and so on, each run `--epochs` epochs from a fresh model. Each run gives
one throughput (images / training seconds over its epochs after the first); the table shows
each side's median over the repeats and their ratio, ddplab / plain (>= 1: ddplab is faster).
Because the two sides of a repeat run back to back, the ratio stays meaningful on a machine
shared with other work, where the absolute figures do not. Writes everything to --out (JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common as common
import torch
import torch.nn.functional as F

NAME = "loop_overhead"
SIDES = ("plain", "ddplab")
LABELS = {
    "plain": "plain PyTorch loop (DataLoader, {w} workers, per-sample normalize)",
    "ddplab": "ddplab (`ddplab.train`, device-resident data, time breakdown on)",
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p, NAME, repeats=3)
    p.add_argument("--model", default="vgg_small")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument(
        "--epochs", type=int, default=3, help="epochs per run (each side, each repeat); the first is warm-up"
    )
    p.add_argument("--subset", type=int, default=None, help="train on the first N images")
    p.add_argument("--workers", type=int, default=2, help="the plain loop's DataLoader worker processes")
    p.add_argument("--ddplab-args", default="", help="extra `--section.field value` settings for the ddplab side")
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    args.image_size = None  # native size; --quick makes the synthetic images small
    if args.quick:  # synthetic, tiny: a check that both sides run and agree on what they count
        args.model, args.subset, args.data_dir, args.image_size = "simple_cnn", 256, None, 16
        args.epochs, args.repeats = 2, min(args.repeats, 2)
    if args.epochs < 1 or args.batch_size < 1 or args.workers < 0:
        p.error("--epochs and --batch-size must be >= 1, --workers >= 0")
    return args


def load_train_set(args):
    from ddplab.data.datasets import load_dataset, make_splits

    root = common.cifar_root(args.data_dir)
    name = "cifar10" if root else "synthetic"
    kwargs = {} if root else {"synthetic_size": args.subset or 8192, "image_size": args.image_size}
    train = load_dataset(name, root, "train", download=False, progress=False, **kwargs)
    train, _, _ = make_splits(train, train, subset=args.subset, val_fraction=0.0, seed=0)
    return name, root, train


def plain_run(args, data) -> tuple[list[float], list[int]]:
    """Seconds and images of each epoch of one plain run (fresh model, loader and optimizer)."""
    from torch.utils.data import DataLoader, TensorDataset

    from ddplab.models import create_model

    device = torch.device(args.device)
    mean = torch.tensor(data.mean).view(3, 1, 1)
    std = torch.tensor(data.std).view(3, 1, 1)

    def collate(batch):  # per sample, as ToTensor + Normalize would
        xs = torch.stack([(x.float() / 255 - mean) / std for x, _ in batch])
        return xs, torch.stack([y for _, y in batch])

    loader = DataLoader(
        TensorDataset(data.images, data.labels),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        collate_fn=collate,
        persistent_workers=args.workers > 0,
    )
    torch.manual_seed(0)
    model = create_model(args.model, num_classes=data.num_classes, in_channels=3, image_size=data.image_shape[1:]).to(
        device
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    times, images = [], []
    for _ in range(args.epochs):
        model.train()
        seen = 0
        common.sync(device)
        start = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += len(y)
        common.sync(device)
        times.append(time.perf_counter() - start)
        images.append(seen)
    del loader  # stops the persistent workers before the other side runs
    return times, images


def ddplab_run(args, dataset: str, root: Path | None) -> tuple[list[float], list[int], dict]:
    """Seconds and images of each epoch of one `ddplab.train` run, and its `engine` summary."""
    from ddplab import train
    from ddplab.config import build_config, merge, parse_dotted

    with tempfile.TemporaryDirectory() as tmp:  # ddplab.train gives this process its torch settings back
        values = {
            "data": {
                "dataset": dataset,
                "subset": args.subset,
                "crop_padding": 0,
                "flip": False,
                "download": False,
                **(
                    {"data_dir": str(root)}
                    if root
                    else {"synthetic_size": args.subset or 8192, "image_size": args.image_size}
                ),
            },
            "model": {"name": args.model},
            "optim": {
                "name": "adam",
                "lr": args.lr,
                "weight_decay": args.weight_decay,
                "schedule": "none",
                "label_smoothing": 0.0,
            },
            "train": {"epochs": args.epochs, "batch_size": args.batch_size, "device": args.device},
            "output": {"out": str(Path(tmp) / "run"), "progress": False, "tensorboard": False},
        }
        values = {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in values.items()}
        extra = args.ddplab_args.split()
        overrides = parse_dotted([f"{k.lstrip('-')}={v}" for k, v in zip(extra[::2], extra[1::2], strict=False)])
        with contextlib.redirect_stdout(io.StringIO()):  # its summary; the log lines still go to stderr
            result = train(build_config(merge(values, overrides)))
        return (
            [r.train_s for r in result.history],
            [r.train_samples for r in result.history],
            result.summary.get("engine") or {},
        )


def throughput(times: list[float], images: list[int]) -> float:
    """Images per second over the epochs after the first (all of them when there is only one)."""
    keep = slice(1, None) if len(times) > 1 else slice(None)
    return sum(images[keep]) / sum(times[keep])


def main(argv=None) -> int:
    args = parse_args(argv)
    common.apply_threads(args.threads)
    machine = common.machine_info(args.device)
    dataset, root, data = load_train_set(args)
    runs = {side: [] for side in SIDES}
    engine: dict = {}
    for repeat, side in common.interleaved(args.repeats, SIDES):
        print(f"repeat {repeat + 1}/{args.repeats}: {side} ...", file=sys.stderr, flush=True)
        if side == "plain":
            times, images = plain_run(args, data)
        else:
            times, images, engine = ddplab_run(args, dataset, root)
        runs[side].append(
            {"repeat": repeat + 1, "epoch_s": times, "images": images, "images_per_s": throughput(times, images)}
        )
    rates = {side: [r["images_per_s"] for r in runs[side]] for side in SIDES}
    result = common.compare("plain", rates["plain"], "ddplab", rates["ddplab"])
    steady = {
        side: statistics.median([t for r in runs[side] for t in (r["epoch_s"][1:] or r["epoch_s"])]) for side in SIDES
    }
    images_per_epoch = {side: sorted({n for r in runs[side] for n in r["images"]}) for side in SIDES}
    rows = []
    for side in SIDES:
        rows.append(
            [
                LABELS[side].format(w=args.workers),
                common.fmt_rate(result[side]["median"]),
                f"{steady[side]:.2f}",
                common.fmt_list(rates[side], 0),
                "/".join(f"{n:,}" for n in images_per_epoch[side]),
            ]
        )
    head = (
        f"{args.model}, batch {args.batch_size}, Adam lr {args.lr:g}, {len(data):,} {dataset} images, "
        f"{args.epochs} epochs per run (first left out), "
        f"{args.repeats} repeat{'s' if args.repeats != 1 else ''} per side, interleaved"
    )
    table = "\n".join(
        [
            head,
            "",
            common.markdown_table(
                [
                    "loop",
                    f"images/s (median of {args.repeats})",
                    "s/epoch (median)",
                    "images/s per repeat",
                    "images/epoch",
                ],
                rows,
            ),
        ]
    )
    ratio = result["ratio"]
    notes = [
        f"\nddplab / plain throughput: {ratio:.3f}x (median of the per-repeat ratios: "
        f"{result['median_paired_ratio']:.3f}x; target >= 0.95x); ddplab engine: {engine}"
    ]
    common.finish(
        NAME,
        args,
        machine,
        {
            "dataset": dataset,
            "images": len(data),
            "images_per_epoch": images_per_epoch,
            "runs": runs,
            "throughput": result,
            "speed_ratio": ratio,
            "steady_epoch_s": steady,
            "engine": engine,
        },
        table,
        notes,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
