#!/usr/bin/env python3
"""A model's training step and evaluation in NCHW against channels_last, on one device.

    python benchmarks/memory_format.py --device cpu           # five models (a few minutes on 2 cores)
    python benchmarks/memory_format.py --device cuda          # the same on a GPU (--precision bf16: under autocast)
    python benchmarks/memory_format.py --device cpu --quick   # seconds: checks the script only

`model.channels_last` decides the memory format of a run's model and batches; its `auto` (the default) is
on for a CPU and off on CUDA. This measures what that choice is worth: each model steps `--steps` training
steps (forward, backward, Adam) and evaluates `--eval-batches` batches of 250, both on fixed random 32x32
images already in the format, once in each format, the two sides interleaved A B, B A, ... `--repeats`
times; the table gives medians of images a second and their ratio. The same seed builds both sides' model.
"""

from __future__ import annotations

import argparse
import sys

import _common as common
import torch
import torch.nn.functional as F

NAME = "memory_format"
SIDES = ("nchw", "channels_last")
EVAL_BATCH = 250
DEFAULT = "simple_cnn:0.5:32,simple_cnn:1:128,vgg_small:1:128,fastnet:1:128,resnet18:1:128"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p, NAME, repeats=3)
    p.add_argument("--models", default=DEFAULT, help=f"name:width:batch, comma-separated (default: {DEFAULT})")
    p.add_argument("--steps", type=int, default=10, help="training steps a measurement (default: 10)")
    p.add_argument("--eval-batches", type=int, default=4, help="evaluation batches of 250 a measurement")
    p.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: forward passes under autocast (fp32)"
    )
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    if args.quick:
        args.models, args.steps, args.eval_batches, args.repeats = "simple_cnn:0.25:8", 2, 1, 2
    try:
        args.models = [(n, float(w), int(b)) for n, w, b in (m.split(":") for m in args.models.split(","))]
    except ValueError:
        p.error(f"--models takes name:width:batch, comma-separated, e.g. {DEFAULT}")
    if args.steps < 1 or args.eval_batches < 1 or min(b for _, _, b in args.models) < 1:
        p.error("--steps, --eval-batches and each batch must be >= 1")
    return args


def sides(name: str, width: float, batch: int, device: torch.device, precision: str):
    """Per format: a training step and an evaluation pass, on the same model and images in that format."""
    from ddplab.models import create_model

    gen = torch.Generator().manual_seed(batch)
    x = torch.randn(batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    xe = torch.randn(EVAL_BATCH, 3, 32, 32, generator=gen)
    out = {}
    for side in SIDES:
        fmt = torch.channels_last if side == "channels_last" else torch.contiguous_format
        torch.manual_seed(0)
        model = create_model(name, num_classes=10, width=width).to(device).to(memory_format=fmt)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        images, held = (t.to(device).contiguous(memory_format=fmt) for t in (x, xe))
        labels = y.to(device)

        def autocast():
            return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

        def train(model=model, opt=opt, images=images, labels=labels) -> None:
            model.train()
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = F.cross_entropy(model(images).float(), labels)
            loss.backward()
            opt.step()

        @torch.no_grad()
        def evaluate(model=model, held=held) -> None:
            model.eval()
            with autocast():
                model(held)

        conv = next(q for q in model.parameters() if q.dim() == 4)
        in_format = conv.is_contiguous(memory_format=fmt) and images.is_contiguous(memory_format=fmt)
        out[side] = (train, evaluate, in_format and (side == "nchw") == conv.is_contiguous())
    return out


def rate(fn, calls: int, images: int, device: torch.device) -> float:
    """Images a second over `calls` calls of `fn`, each passing `images`."""
    return images / common.seconds_per_call(fn, calls, device)


def main(argv=None) -> int:
    args = parse_args(argv)
    common.apply_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    info = common.machine_info(args.device)
    rows = []
    for name, width, batch in args.models:
        steps = sides(name, width, batch, device, args.precision)
        for side in SIDES:  # warm-up: oneDNN's primitive cache, cuDNN's search, the allocator
            rate(steps[side][0], 2, batch, device)
            rate(steps[side][1], 1, EVAL_BATCH, device)
        train: dict[str, list[float]] = {s: [] for s in SIDES}
        evals: dict[str, list[float]] = {s: [] for s in SIDES}
        for _, side in common.interleaved(args.repeats, SIDES):
            train[side].append(rate(steps[side][0], args.steps, batch, device))
            evals[side].append(rate(steps[side][1], args.eval_batches, EVAL_BATCH, device))
        row = {
            "model": name,
            "width": width,
            "batch": batch,
            "train": common.compare(*SIDES[:1], train[SIDES[0]], SIDES[1], train[SIDES[1]]),
            "eval": common.compare(*SIDES[:1], evals[SIDES[0]], SIDES[1], evals[SIDES[1]]),
            "in_format": {side: steps[side][2] for side in SIDES},  # weights and images as the side says
        }
        rows.append(row)
        print(
            f"{name} x{width:g} batch {batch}: train {row['train']['ratio']:.2f}x, eval {row['eval']['ratio']:.2f}x",
            file=sys.stderr,
            flush=True,
        )
    table = common.markdown_table(
        [
            "model",
            "batch",
            "train NCHW img/s",
            "train channels_last",
            "ratio",
            "eval NCHW img/s",
            "eval channels_last",
            "ratio",
        ],
        [
            [
                f"{r['model']} x{r['width']:g}",
                r["batch"],
                common.fmt_rate(r["train"]["nchw"]["median"]),
                common.fmt_rate(r["train"]["channels_last"]["median"]),
                f"{r['train']['ratio']:.2f}x",
                common.fmt_rate(r["eval"]["nchw"]["median"]),
                common.fmt_rate(r["eval"]["channels_last"]["median"]),
                f"{r['eval']['ratio']:.2f}x",
            ]
            for r in rows
        ],
    )
    notes = [
        f"\n{args.steps} training steps (Adam, {args.precision}) and {args.eval_batches} evaluation batches of "
        f"{EVAL_BATCH} a measurement, {args.repeats} repeats a side, interleaved; medians of images a second, random "
        "32x32 images already on the device in each side's format."
    ]
    common.finish(NAME, args, info, {"rows": rows, "steps": args.steps}, table, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
