#!/usr/bin/env python3
"""Images per second of ddplab's data path alone vs a per-sample torch DataLoader doing the same work.

    DDPLAB_DATA=../shared/data/cifar10-jpeg python benchmarks/data_path.py --device cpu --repeats 3
    python benchmarks/data_path.py --device cuda --workers 8
    python benchmarks/data_path.py --device cpu --quick      # seconds, synthetic data: checks the script only

No model, no training: each side produces one epoch of augmented, normalized training
batches of --batch-size on --device, and the clock measures how fast.

- ddplab: `ddplab.data.loader.DeviceLoader` over the training set, built as `ddplab train`
  builds it by default (random crop after reflect padding 4, horizontal flip): the uint8
  set lives on the device, each batch is an index_select, a float conversion, one gather for
  the crop, a flip and a normalization, all batched.
- per-sample DataLoader: a `torch.utils.data.DataLoader` (shuffled, --workers processes,
  persistent, pinned memory on CUDA) whose dataset does the same work one image at a time,
  as torchvision's RandomCrop(padding=4, padding_mode="reflect") + RandomHorizontalFlip +
  ToTensor + Normalize would: uint8 -> float, reflect pad 4, random 32x32 window, flip with
  p = 0.5, (x - mean) / std; the default collate stacks the batch, which is then copied to
  the device.

Both sides warm up on a few batches first (worker start, allocator), then alternate one full
epoch each per repeat (A B, B A, ...). Reported: each side's median images/s over the repeats
and the ratio ddplab / DataLoader. The full CIFAR-10 training set when --data-dir (or
$DDPLAB_DATA) holds it, else synthetic images of the same size.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import _common as common
import torch
import torch.nn.functional as F

NAME = "data_path"
SIDES = ("dataloader", "ddplab")
WARMUP_BATCHES = 5


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p, NAME, repeats=3)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=2, help="the DataLoader's worker processes (0: in the main process)")
    p.add_argument("--crop-padding", type=int, default=4, help="reflect padding of the random crop (ddplab's default)")
    p.add_argument("--no-flip", dest="flip", action="store_false", help="leave out the random horizontal flip")
    p.add_argument("--synthetic-size", type=int, default=50_000, help="images when there is no CIFAR-10 (its size)")
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    if args.quick:
        args.data_dir, args.synthetic_size, args.repeats = None, 1024, min(args.repeats, 2)
    if args.batch_size < 1 or args.workers < 0 or args.crop_padding < 0:
        p.error("--batch-size must be >= 1, --workers and --crop-padding >= 0")
    return args


def load_train_set(args):
    from ddplab.data.datasets import load_dataset

    root = common.cifar_root(args.data_dir)
    if root:
        return "cifar10", load_dataset("cifar10", root, "train", download=False, progress=False)
    return "synthetic", load_dataset("synthetic", None, "train", synthetic_size=args.synthetic_size, progress=False)


class PerSampleAugmented(torch.utils.data.Dataset):
    """One image at a time: uint8 -> float, reflect-pad + random crop, flip, normalize."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean, std, padding: int, flip: bool) -> None:
        self.images, self.labels = images, labels
        c = images.shape[1]
        self.mean = torch.tensor(mean, dtype=torch.float32).view(c, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(c, 1, 1)
        self.padding, self.flip = padding, flip

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[i].float().div_(255)
        p = self.padding
        if p:
            _, h, w = x.shape
            padded = F.pad(x[None], (p, p, p, p), mode="reflect")[0]
            top, left = torch.randint(0, 2 * p + 1, (2,)).tolist()
            x = padded[:, top : top + h, left : left + w]
        if self.flip and torch.rand(()).item() < 0.5:
            x = x.flip(2)
        return (x - self.mean) / self.std, self.labels[i]


def build_dataloader(args, data):
    device = torch.device(args.device)
    dataset = PerSampleAugmented(data.images, data.labels, data.mean, data.std, args.crop_padding, args.flip)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=args.workers > 0,
    )


def build_device_loader(args, data):
    """As `ddplab.engine.worker.build_loaders` builds the training loader (default config, one rank)."""
    from ddplab.data.augment import AugmentSpec
    from ddplab.data.loader import DeviceLoader

    spec = AugmentSpec(crop_padding=args.crop_padding, flip=args.flip)
    return DeviceLoader(
        data, batch_size=args.batch_size, device=torch.device(args.device), train=True, augment=spec, seed=0
    )


def epoch(side: str, loader, device: torch.device, epoch_index: int, limit: int | None = None) -> dict:
    """Time one pass (or `limit` batches) of `loader`; batches end on `device`, synchronized."""
    if side == "ddplab":
        loader.set_epoch(epoch_index)
    images = batches = 0
    checksum = torch.zeros((), device=device)
    common.sync(device)
    start = time.perf_counter()
    for x, y in loader:
        if side == "dataloader":
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        images += len(y)
        batches += 1
        if batches == 1:
            checksum = x[0, 0, 0, 0]  # touch the batch: nothing is left queued at the clock's stop
        if limit is not None and batches >= limit:
            break
    common.sync(device)
    seconds = time.perf_counter() - start
    del checksum
    return {"seconds": seconds, "images": images, "batches": batches, "images_per_s": images / seconds}


def batch_stats(x: torch.Tensor) -> dict:
    """Shape, dtype and moments of one batch: both sides should give normalized float batches."""
    return {
        "shape": list(x.shape),
        "dtype": str(x.dtype),
        "mean": float(x.float().mean()),
        "std": float(x.float().std()),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    common.apply_threads(args.threads)
    machine = common.machine_info(args.device)
    device = torch.device(args.device)
    dataset, data = load_train_set(args)
    loaders, setup_s, first = {}, {}, {}
    for side, build in (("dataloader", build_dataloader), ("ddplab", build_device_loader)):
        start = time.perf_counter()
        loaders[side] = build(args, data)
        x, _ = next(iter(loaders[side]))  # starts the workers; DeviceLoader: builds its generator
        common.sync(device)
        setup_s[side] = time.perf_counter() - start
        first[side] = batch_stats(x)
        epoch(side, loaders[side], device, 0, limit=WARMUP_BATCHES)
    runs = {side: [] for side in SIDES}
    for repeat, side in common.interleaved(args.repeats, SIDES):
        print(f"repeat {repeat + 1}/{args.repeats}: {side} ...", file=sys.stderr, flush=True)
        runs[side].append({"repeat": repeat + 1, **epoch(side, loaders[side], device, repeat + 1)})
    del loaders  # stops the DataLoader's workers
    rates = {side: [r["images_per_s"] for r in runs[side]] for side in SIDES}
    result = common.compare("dataloader", rates["dataloader"], "ddplab", rates["ddplab"])
    labels = {
        "dataloader": f"per-sample DataLoader ({args.workers} workers{', pinned' if device.type == 'cuda' else ''})",
        "ddplab": "ddplab DeviceLoader (batched, on the device)",
    }
    rows = []
    for side in SIDES:
        seconds = common.median([r["seconds"] for r in runs[side]])
        rows.append(
            [
                labels[side],
                common.fmt_rate(result[side]["median"]),
                f"{seconds:.2f}",
                common.fmt_list(rates[side], 0),
                f"{runs[side][0]['images']:,}",
                runs[side][0]["batches"],
                f"{setup_s[side]:.2f}",
            ]
        )
    augment = (
        ", ".join(
            filter(
                None,
                [f"crop (reflect pad {args.crop_padding})" if args.crop_padding else "", "flip" if args.flip else ""],
            )
        )
        or "none"
    )
    head = (
        f"{len(data):,} {dataset} training images, batch {args.batch_size}, augmentation: {augment}, normalize; "
        f"one epoch per repeat, {args.repeats} repeat{'s' if args.repeats != 1 else ''} per side, interleaved"
    )
    table = "\n".join(
        [
            head,
            "",
            common.markdown_table(
                [
                    "data path",
                    f"images/s (median of {args.repeats})",
                    "s/epoch (median)",
                    "images/s per repeat",
                    "images/epoch",
                    "batches/epoch",
                    "set-up s (not timed)",
                ],
                rows,
            ),
        ]
    )
    notes = [
        f"\nddplab / DataLoader: {result['ratio']:.2f}x (median of the per-repeat ratios: "
        f"{result['median_paired_ratio']:.2f}x; target >= 5x)"
    ]
    common.finish(
        NAME,
        args,
        machine,
        {
            "dataset": dataset,
            "images": len(data),
            "expected_batches": math.ceil(len(data) / args.batch_size),
            "runs": runs,
            "throughput": result,
            "speed_ratio": result["ratio"],
            "setup_s": setup_s,
            "first_batch": first,
        },
        table,
        notes,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
