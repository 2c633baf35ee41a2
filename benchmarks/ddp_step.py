#!/usr/bin/env python3
"""What DDP adds to a training step beyond the all-reduce, and how a step's time grows with its batch.

    python benchmarks/ddp_step.py --device cuda                 # four models, local batch 32 to 1024
    python benchmarks/ddp_step.py --device cpu                  # two models, batches 32 and 128 (minutes)
    python benchmarks/ddp_step.py --device cpu --quick          # seconds: checks the script only

The scaling planner (`ddplab plan`) predicts N workers from one measured run. Two things it must
know about the step that such a run does not show (issue 30's class 1 and its PER_IMAGE rule):

1. DDP's own work on every step: the reducer's autograd hooks, the copies of gradients into
   buckets and back, the launch of each bucket's all-reduce. Here the same model, batch and
   optimizer step plain and wrapped in DistributedDataParallel with one rank (NCCL on CUDA,
   Gloo on CPU, the process group of this one process): the all-reduce of one rank moves nothing,
   so the difference is DDP's own per-step cost.
2. How the step's time depends on the local batch (the planner scales compute per image): on a GPU a
   small batch leaves the device idle between kernel launches.

Both sides are stepped `--steps` times per measurement on device-resident random images (no data
path), the device synchronized once at the end; the sides alternate, A B then B A, `--repeats` times,
and the table gives medians. Writes everything to --out (JSON).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import _common as common
import torch
import torch.nn.functional as F

NAME = "ddp_step"
SIDES = ("plain", "ddp")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p, NAME, repeats=5)
    p.add_argument(
        "--models",
        help="comma-separated (default: simple_cnn,vgg_small,fastnet,resnet18 on CUDA; simple_cnn,vgg_small on CPU)",
    )
    p.add_argument(
        "--batches", help="local batches, comma-separated (default: 32,64,128,256,512,1024 on CUDA; 32,128 on CPU)"
    )
    p.add_argument("--steps", type=int, help="steps per measurement (default: 50 on CUDA, 5 on CPU)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket size (its default: 25)")
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    cuda = args.device.startswith("cuda")
    if args.quick:
        args.models, args.batches, args.steps, args.repeats = "simple_cnn", "16,32", 2, 2
    args.models = (args.models or ("simple_cnn,vgg_small,fastnet,resnet18" if cuda else "simple_cnn,vgg_small")).split(
        ","
    )
    args.batches = [int(b) for b in (args.batches or ("32,64,128,256,512,1024" if cuda else "32,128")).split(",")]
    args.steps = args.steps or (50 if cuda else 5)
    if min(args.batches) < 1 or args.steps < 1:
        p.error("--batches and --steps must be >= 1")
    return args


def stepper(model: torch.nn.Module, batch: int, device: torch.device):
    """One training step (forward, backward, SGD), on fixed device-resident images."""
    gen = torch.Generator(device="cpu").manual_seed(batch)
    x = torch.randn(batch, 3, 32, 32, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def measure(name: str, batch: int, args: argparse.Namespace, device: torch.device) -> dict:
    from ddplab.models import count_params, create_model

    torch.manual_seed(0)
    plain = create_model(name, num_classes=10).to(device)
    wrapped = torch.nn.parallel.DistributedDataParallel(
        copy.deepcopy(plain),
        device_ids=[device.index or 0] if device.type == "cuda" else None,
        bucket_cap_mb=args.bucket_cap_mb,
    )
    steps = {"plain": stepper(plain, batch, device), "ddp": stepper(wrapped, batch, device)}
    for side in SIDES:  # warm-up: cuDNN's search, the allocator, DDP's first-iteration bucket rebuild
        common.seconds_per_call(steps[side], 3, device)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for _, side in common.interleaved(args.repeats, SIDES):
        times[side].append(common.seconds_per_call(steps[side], args.steps, device))
    return {
        "model": name,
        "batch": batch,
        "params": count_params(plain),
        "tensors": len(list(plain.parameters())),
        "step_s": {side: times[side] for side in SIDES},
        "median_s": {side: common.median(times[side]) for side in SIDES},
        "ddp_adds_s": common.median([d - p for p, d in zip(times["plain"], times["ddp"], strict=True)]),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    common.apply_threads(args.threads)
    device = common.step_device(args.device)
    info = common.machine_info(args.device)
    rows = []
    with common.one_rank_group(device):
        for name in args.models:
            for batch in args.batches:
                row = measure(name, batch, args, device)
                rows.append(row)
                m = row["median_s"]
                print(
                    f"{name} batch {batch}: plain {m['plain'] * 1e3:.3f} ms, ddp {m['ddp'] * 1e3:.3f} ms "
                    f"({row['ddp_adds_s'] * 1e3:+.3f} ms)",
                    file=sys.stderr,
                    flush=True,
                )
    for name in args.models:  # a step's time per image against the largest batch's (the planner's PER_IMAGE)
        mine = [r for r in rows if r["model"] == name]
        largest = max(mine, key=lambda r: r["batch"])
        for r in mine:
            per_image = r["median_s"]["plain"] / r["batch"]
            r["per_image_over_largest"] = per_image / (largest["median_s"]["plain"] / largest["batch"])
    table = common.markdown_table(
        [
            "model",
            "params",
            "local batch",
            "plain step",
            "DDP step (1 rank)",
            "DDP adds",
            "adds",
            "time an image / at the largest batch",
        ],
        [
            [
                r["model"],
                f"{r['params']:,}",
                r["batch"],
                f"{r['median_s']['plain'] * 1e3:.3f} ms",
                f"{r['median_s']['ddp'] * 1e3:.3f} ms",
                f"{r['ddp_adds_s'] * 1e3:+.3f} ms",
                f"{r['ddp_adds_s'] / r['median_s']['plain']:+.1%}",
                f"{r['per_image_over_largest']:.2f}x",
            ]
            for r in rows
        ],
    )
    notes = [
        f"\n{args.steps} steps a measurement, {args.repeats} repeats a side, interleaved; medians. "
        f"DDP adds: the median of the paired differences. SGD with momentum, fp32, random 32x32 images on the device."
    ]
    common.finish(NAME, args, info, {"rows": rows, "steps": args.steps}, table, notes)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    sys.exit(main())
