#!/usr/bin/env python3
"""Seconds per training epoch: a plain PyTorch loop vs ddplab, same model, batch, optimizer and data.

    python scripts/bench_loop.py --device cuda                      # seed report D's recipe, full CIFAR-10
    python scripts/bench_loop.py --device cpu --subset 2048 --model simple_cnn

The plain loop is what the seed reports wrote: a DataLoader over the training images (2
worker processes, pinned memory on CUDA, per-sample float conversion and normalization), an
eager model, Adam, cross-entropy, no evaluation, no metrics. ddplab runs the same model
(built by the same registry, same seed), optimizer, batch and images through `ddplab.train`
with no augmentation, and its `train_s` per epoch is compared: training time only, the first
epoch (warm-up) left out, both sides synchronized before the clock is read. Prints one table
and writes it with the raw times to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="vgg_small")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--epochs", type=int, default=3, help="the first is warm-up; the others are compared")
    p.add_argument("--subset", type=int, default=None, help="train on the first N images")
    p.add_argument("--data-dir", default=os.environ.get("DDPLAB_DATA"), help="root holding cifar-10-batches-bin")
    p.add_argument("--ddplab-args", default="", help="extra `--section.field value` settings for the ddplab side")
    p.add_argument("--out", type=Path, default=Path("runs") / "bench-loop.json")
    return p.parse_args(argv)


def load_train_set(args):
    from ddplab.data.datasets import load_dataset, make_splits

    cifar = args.data_dir and (Path(args.data_dir) / "cifar-10-batches-bin" / "test_batch.bin").is_file()
    name = "cifar10" if cifar else "synthetic"
    kwargs = {} if cifar else {"synthetic_size": args.subset or 8192}
    train = load_dataset(name, args.data_dir, "train", download=False, progress=False, **kwargs)
    train, _, _ = make_splits(train, train, subset=args.subset, val_fraction=0.0, seed=0)
    return name, train


def plain_loop(args, data) -> list[float]:
    from torch.utils.data import DataLoader, TensorDataset

    from ddplab.models import create_model

    device = torch.device(args.device)
    mean = torch.tensor(data.mean).view(3, 1, 1)
    std = torch.tensor(data.std).view(3, 1, 1)

    def collate(batch):  # per sample, as ToTensor + Normalize would
        xs = torch.stack([(x.float() / 255 - mean) / std for x, _ in batch])
        return xs, torch.stack([y for _, y in batch])

    loader = DataLoader(TensorDataset(data.images, data.labels), batch_size=args.batch_size, shuffle=True,
                        num_workers=2, pin_memory=device.type == "cuda", collate_fn=collate, persistent_workers=True)
    torch.manual_seed(0)
    model = create_model(args.model, num_classes=data.num_classes, in_channels=3, image_size=data.image_shape[1:]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    times = []
    for _ in range(args.epochs):
        model.train()
        sync(device)
        start = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def ddplab_loop(args, dataset: str) -> tuple[list[float], dict]:
    from ddplab import train
    from ddplab.config import build_config, merge, parse_dotted

    with tempfile.TemporaryDirectory() as tmp:
        values = {
            "data": {"dataset": dataset, "subset": args.subset, "crop_padding": 0, "flip": False, "download": False,
                     **({"data_dir": args.data_dir} if dataset == "cifar10" else {"synthetic_size": args.subset or 8192})},
            "model": {"name": args.model},
            "optim": {"name": "adam", "lr": args.lr, "weight_decay": args.weight_decay, "schedule": "none",
                      "label_smoothing": 0.0},
            "train": {"epochs": args.epochs, "batch_size": args.batch_size, "device": args.device},
            "output": {"out": str(Path(tmp) / "run"), "progress": False, "tensorboard": False},
        }
        values = {k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in values.items()}
        extra = args.ddplab_args.split()
        overrides = parse_dotted([f"{k.lstrip('-')}={v}" for k, v in zip(extra[::2], extra[1::2])])
        result = train(build_config(merge(values, overrides)))
        return [r["train_s"] for r in result.history], result.summary.get("engine") or {}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> int:
    args = parse_args(argv)
    dataset, data = load_train_set(args)
    plain = plain_loop(args, data)
    ours, engine = ddplab_loop(args, dataset)
    steady = {"plain": statistics.median(plain[1:] or plain), "ddplab": statistics.median(ours[1:] or ours)}
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"CPU ({torch.get_num_threads()} threads)"
    print(f"{args.model}, batch {args.batch_size}, Adam lr {args.lr:g}, {len(data):,} {dataset} images, {device}, "
          f"torch {torch.__version__}")
    print("| loop | seconds per epoch (median after the first) | all epochs |")
    print("|---|---|---|")
    for name, times in (("plain PyTorch loop", plain), ("ddplab", ours)):
        key = "plain" if name.startswith("plain") else "ddplab"
        print(f"| {name} | {steady[key]:.2f} | {', '.join(f'{t:.2f}' for t in times)} |")
    ratio = steady["plain"] / steady["ddplab"]
    print(f"ddplab is {ratio:.2f}x the plain loop's speed ({'faster' if ratio >= 1 else 'slower'}); engine: {engine}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "device": device,
                                    "torch": torch.__version__, "images": len(data), "plain_s": plain, "ddplab_s": ours,
                                    "steady_s": steady, "speed_ratio": ratio, "engine": engine}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
