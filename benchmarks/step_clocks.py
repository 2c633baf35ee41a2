#!/usr/bin/env python3
"""What each rank's step clocks cost a DDP step (who is slow: engine/clocks.py, metrics/stragglers.py).

    python benchmarks/step_clocks.py --device cuda              # four models, local batches 32 and 256
    python benchmarks/step_clocks.py --device cpu               # two models, batch 32 (a minute)
    python benchmarks/step_clocks.py --device cpu --quick       # seconds: checks the script only

The clocks are a DDP comm hook (torch's allreduce_hook in place of DDP's built-in all-reduce, plus one mark on
the first gradient bucket and one entry a bucket in the record of collectives a hang reads) and three marks a
step (the host's clock on a CPU, CUDA events on a GPU, read once at the end). Here the same model, batch and
optimizer step in DistributedDataParallel with one rank (NCCL on CUDA, Gloo on a CPU: the all-reduce moves
nothing, so what differs is the clocks' own cost), with and without them, `--steps` steps a measurement, the
sides alternating A B then B A `--repeats` times; medians, and the median of the paired differences. Writes
everything to --out (JSON).
"""

from __future__ import annotations

import argparse
import copy
import sys

import _common as common
import torch
import torch.nn.functional as F

NAME = "step_clocks"
SIDES = ("ddp", "clocked")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p, NAME, repeats=7)
    p.add_argument("--models", help="comma-separated (default: simple_cnn,vgg_small,fastnet,resnet18 on CUDA; "
                   "simple_cnn,vgg_small on CPU)")  # fmt: skip
    p.add_argument("--batches", help="local batches, comma-separated (default: 32,256 on CUDA; 32 on CPU)")
    p.add_argument("--steps", type=int, help="steps per measurement (default: 100 on CUDA, 20 on CPU)")
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    cuda = args.device.startswith("cuda")
    if args.quick:
        args.models, args.batches, args.steps, args.repeats = "simple_cnn", "16", 3, 2
    args.models = (args.models or ("simple_cnn,vgg_small,fastnet,resnet18" if cuda else "simple_cnn,vgg_small")).split(
        ","
    )
    args.batches = [int(b) for b in (args.batches or ("32,256" if cuda else "32")).split(",")]
    args.steps = args.steps or (100 if cuda else 20)
    if min(args.batches) < 1 or args.steps < 1:
        p.error("--batches and --steps must be >= 1")
    return args


def stepper(model: torch.nn.Module, batch: int, device: torch.device, clocks=None):
    """`steps(n)`: n training steps (forward, backward, SGD) on fixed device-resident images, each marked on
    `clocks` as the trainer marks it, and the clocks read once at the end, as at an epoch's end."""
    gen = torch.Generator(device="cpu").manual_seed(batch)
    x = torch.randn(batch, 3, 32, 32, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def steps(n: int) -> None:
        for _ in range(n):
            if clocks is not None:
                clocks.begin()
                clocks.fed()  # the batch is in hand (fixed here, as a device-resident loader's nearly is)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            if clocks is not None:
                clocks.released()
            opt.step()
            if clocks is not None:
                clocks.end()
        if clocks is not None:
            clocks.take()

    return steps


def measure(name: str, batch: int, args: argparse.Namespace, device: torch.device) -> dict:
    from ddplab.distributed import Collectives, register_comm_hook
    from ddplab.engine.clocks import StepClocks
    from ddplab.models import create_model

    torch.manual_seed(0)
    model = create_model(name, num_classes=10).to(device)
    ids = [device.index or 0] if device.type == "cuda" else None
    plain = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model), device_ids=ids)
    clocked = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model), device_ids=ids)
    clocks = StepClocks(device)
    register_comm_hook(clocked, "none", Collectives(), clocks.joined)  # as distributed.wrap_model registers it
    sides = {"ddp": stepper(plain, batch, device), "clocked": stepper(clocked, batch, device, clocks)}
    for side in SIDES:  # warm-up: cuDNN's search, the allocator, DDP's first-iteration bucket rebuild
        common.seconds_per_call(lambda side=side: sides[side](3), 1, device)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for _, side in common.interleaved(args.repeats, SIDES):
        run = sides[side]
        times[side].append(common.seconds_per_call(lambda run=run: run(args.steps), 1, device) / args.steps)
    return {
        "model": name,
        "batch": batch,
        "step_s": times,
        "median_s": {side: common.median(times[side]) for side in SIDES},
        "clocks_add_s": common.median([c - d for d, c in zip(times["ddp"], times["clocked"], strict=True)]),
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
                    f"{name} batch {batch}: ddp {m['ddp'] * 1e3:.3f} ms, with the clocks {m['clocked'] * 1e3:.3f}"
                    f" ms ({row['clocks_add_s'] * 1e3:+.3f} ms, {row['clocks_add_s'] / m['ddp']:+.2%})",
                    file=sys.stderr,
                    flush=True,
                )
    table = common.markdown_table(
        ["model", "local batch", "DDP step (1 rank)", "with the step clocks", "the clocks add", "adds"],
        [
            [
                r["model"],
                r["batch"],
                f"{r['median_s']['ddp'] * 1e3:.3f} ms",
                f"{r['median_s']['clocked'] * 1e3:.3f} ms",
                f"{r['clocks_add_s'] * 1e3:+.3f} ms",
                f"{r['clocks_add_s'] / r['median_s']['ddp']:+.2%}",
            ]
            for r in rows
        ],
    )
    notes = [
        f"\n{args.steps} steps a measurement, {args.repeats} repeats a side, interleaved; medians. The clocks add: "
        "the median of the paired differences. SGD with momentum, fp32, random 32x32 images on the device."
    ]
    common.finish(NAME, args, info, {"rows": rows, "steps": args.steps}, table, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
