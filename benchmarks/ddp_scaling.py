#!/usr/bin/env python3
"""One process vs N DDP workers on the same global batch and data: epoch time, images/s, speedup.

    DDPLAB_DATA=../shared/data/cifar10-jpeg python benchmarks/ddp_scaling.py --device cpu --repeats 3
    DDPLAB_DATA=... python benchmarks/ddp_scaling.py --device cuda --nproc 2 --subset 50000   # NCCL, 2 GPUs
    python benchmarks/ddp_scaling.py --device cpu --quick     # seconds, synthetic data: checks the script only

Each side is a `python -m ddplab train` run in its own process tree, read back from its run
folder (metrics.jsonl, summary.json):
- single: `--batch-size B` (global batch B), one process;
- ddp:    `--batch-size B/N --strategy ddp --nproc N --backend gloo` (NCCL on CUDA), the same
  global batch, the same images per epoch, split over N workers.
Same model, data, optimizer, schedule, seed. On a CPU, ddplab gives the workers of one node
an equal share of its cores (cores / N threads each) unless OMP_NUM_THREADS is set; the single
process uses all of them. --threads sets OMP_NUM_THREADS for both sides (then each worker
gets that many).

The two sides alternate (single, ddp, then ddp, single, ...), --repeats times each. Per run:
the training images/s over the epochs after the first (all of them in a one-epoch run), the
median epoch time (training + evaluation of the test set, which the workers split too) and
the share of training time in each phase. Reported: medians over the repeats, speedup
(ddp images/s / single images/s) and efficiency (speedup / N).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import _common as common

from ddplab.topology import resolve_backend  # torch-free; _common puts src on the path

NAME = "ddp_scaling"
SIDES = ("single", "ddp")
PHASES = ("data_s", "forward_backward_s", "optimizer_s", "comm_wait_s")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p, NAME, repeats=3)
    p.add_argument("--nproc", type=int, default=2, help="DDP workers")
    p.add_argument("--backend", default=None, help="DDP backend (default: gloo on CPU, nccl on CUDA)")
    p.add_argument("--model", default="simple_cnn")
    p.add_argument("--subset", type=int, default=10_000, help="train on the first N images (0: all)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run; the first is left out of images/s")
    p.add_argument("--batch-size", type=int, default=128, help="global batch; each DDP worker takes 1/nproc of it")
    p.add_argument("--ddplab-args", default="", help="extra `ddplab train` flags for both sides")
    p.add_argument(
        "--keep-runs", type=Path, default=None, help="keep the run folders here (default: a temporary folder)"
    )
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    if args.quick:
        args.data_dir, args.subset, args.epochs, args.batch_size, args.repeats = None, 0, 2, 64, min(args.repeats, 1)
    if args.nproc < 2:
        p.error("--nproc must be >= 2")
    if args.batch_size % args.nproc:
        p.error(f"--batch-size {args.batch_size} must divide evenly over --nproc {args.nproc} workers")
    if args.epochs < 1:
        p.error("--epochs must be >= 1")
    args.backend = resolve_backend(args.backend or "auto", on_cuda=args.device.startswith("cuda"))
    return args


def common_flags(args) -> tuple[str, list[str]]:
    root = common.cifar_root(args.data_dir)
    if args.quick or root is None:
        data = ["--dataset", "synthetic", "--data.synthetic_size", "512" if args.quick else str(args.subset or 8192)]
        if args.quick:
            data += ["--data.image_size", "16", "--model.width", "0.5"]
        name = "synthetic"
    else:
        data = ["--dataset", "cifar10", "--data-dir", str(root), "--data.download", "false"]
        data += ["--subset", str(args.subset)] if args.subset else []
        name = "cifar10"
    device = "cuda" if args.device.startswith("cuda") else args.device
    return name, [
        *data,
        "--model",
        args.model,
        "--epochs",
        str(args.epochs),
        "--device",
        device,
        *args.ddplab_args.split(),
    ]


def side_flags(args, side: str) -> list[str]:
    if side == "single":
        return ["--batch-size", str(args.batch_size)]
    return [
        "--batch-size",
        str(args.batch_size // args.nproc),
        "--strategy",
        "ddp",
        "--nproc",
        str(args.nproc),
        "--backend",
        args.backend,
    ]


def measure(run: dict, wall_s: float) -> dict:
    metrics, summary = run["metrics"], run["summary"]
    keep = metrics[1:] or metrics
    train_s = sum(r.train_s for r in keep)
    images = sum(r.train_samples for r in keep)
    phases = {
        p: sum(r.metric(p) or 0.0 for r in keep) / train_s for p in PHASES if any(r.metric(p) is not None for r in keep)
    }
    return {
        "world_size": summary["run"]["world_size"],
        "batch_local": summary["batch"]["local"],
        "batch_global": summary["batch"]["global"],
        "steps_per_epoch": summary["batch"]["steps_per_epoch"],
        "torch_threads": run["env"].get("torch_threads"),
        "train_images_per_epoch": [r.train_samples for r in metrics],
        "test_images_per_epoch": [r.test_samples for r in metrics],
        "epoch_s": [r.epoch_s for r in metrics],
        "train_s": [r.train_s for r in metrics],
        "eval_s": [r.eval_s for r in metrics],
        "median_epoch_s": common.median([r.epoch_s for r in keep]),
        "images_per_s": images / train_s,
        "phase_share": phases,
        "test_acc": summary["final"]["test_acc"],
        "startup_s": summary["time"]["startup_s"],
        "process_wall_s": wall_s,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = common.machine_info(args.device)
    dataset, flags = common_flags(args)
    env = common.child_env(args.threads)
    runs = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep_runs or Path(tmp)
        for repeat, side in common.interleaved(args.repeats, SIDES):
            print(f"repeat {repeat + 1}/{args.repeats}: {side} ...", file=sys.stderr, flush=True)
            run_dir = base / f"{side}-{repeat + 1}"
            proc = common.run_ddplab([*flags, *side_flags(args, side)], run_dir, env=env)
            runs[side].append(
                {"repeat": repeat + 1, "run_dir": str(run_dir), **measure(common.read_run(run_dir), proc["wall_s"])}
            )
    rates = {side: [r["images_per_s"] for r in runs[side]] for side in SIDES}
    result = common.compare("single", rates["single"], "ddp", rates["ddp"])
    speedup = result["ratio"]
    rows = []
    for side in SIDES:
        r0 = runs[side][0]
        threads = f"{r0['torch_threads']} thread{'s' if r0['torch_threads'] != 1 else ''}"
        label = f"single, {threads}" if side == "single" else f"ddp {args.backend}, {args.nproc} x {threads}"
        share = r0["phase_share"]
        s = 1.0 if side == "single" else speedup
        rows.append(
            [
                label,
                r0["world_size"],
                f"{r0['batch_local']}/{r0['batch_global']}",
                f"{r0['test_acc']:.2%}",
                f"{common.median([r['median_epoch_s'] for r in runs[side]]):.1f}",
                common.fmt_rate(result[side]["median"]),
                common.fmt_list(rates[side], 0),
                f"{s:.2f}x",
                f"{s / r0['world_size']:.0%}",
                *(
                    f"{common.median([r['phase_share'].get(p, 0.0) for r in runs[side]]):.0%}" if p in share else "-"
                    for p in PHASES
                ),
            ]
        )
    n_images = runs["single"][0]["train_images_per_epoch"][0]
    head = (
        f"{args.model}, {n_images:,} {dataset} training images, global batch {args.batch_size}, "
        f"{args.epochs} epochs per run (images/s after the first), "
        f"{args.repeats} repeat{'s' if args.repeats != 1 else ''} per side, alternating; ddplab defaults otherwise"
    )
    table = "\n".join(
        [
            head,
            "",
            common.markdown_table(
                [
                    "run",
                    "world",
                    "batch local/global",
                    "test acc",
                    "epoch s (median)",
                    f"train images/s (median of {args.repeats})",
                    "per repeat",
                    "speedup",
                    "efficiency",
                    "data",
                    "fwd+bwd",
                    "optim",
                    "comm wait",
                ],
                rows,
            ),
        ]
    )
    notes = [
        f"\nspeedup {speedup:.2f}x (median of the per-repeat speedups: {result['median_paired_ratio']:.2f}x), "
        f"efficiency {speedup / args.nproc:.0%} with {args.nproc} workers. Phases are shares of training time; "
        "comm wait is the part of fwd+bwd that waited for the gradient all-reduce (measured by a probe)."
    ]
    common.finish(
        NAME,
        args,
        machine,
        {
            "dataset": dataset,
            "nproc": args.nproc,
            "backend": args.backend,
            "runs": runs,
            "throughput": result,
            "speedup": speedup,
            "efficiency": speedup / args.nproc,
        },
        table,
        notes,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
