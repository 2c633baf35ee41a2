#!/usr/bin/env python3
"""The speedrun preset over several seeds, timed as the CIFAR-10 speed records time a run.

    python benchmarks/speedrun.py --device cuda --seeds 5                 # the preset as it ships (step captured)
    python benchmarks/speedrun.py --device cuda --seeds 5 -- --train.cuda_graphs false   # the eager step
    python benchmarks/speedrun.py --device cpu --quick                    # checks the script in a minute

Each seed is one `ddplab train --preset speedrun --seed S` process. Its time is the run's
`time.record_s`: the whitening init from the data, every epoch's training and the final
evaluation with test-time augmentation, the device synchronized around each; compilation
(start-up warm-up) and the earlier epochs' evaluations are measured too and shown apart.
Reported: mean +- std over the seeds of the final test accuracy and of record_s, the FLOPs
of one run (3 x forward FLOPs per training image seen, plus the final evaluation's views),
and the floor time those FLOPs would take at this device's measured bf16 matmul rate.
Arguments after `--` go to every `ddplab train`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import _common as common

from ddplab.rundir import runfiles  # torch-free; _common puts src on the path


def parse_args(argv=None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p, "speedrun", repeats=1)
    p.add_argument("--seeds", type=int, default=5, help="runs, seeds 0..N-1 (the records report >= 5)")
    p.add_argument(
        "--runs-dir", type=Path, default=Path("runs") / "bench" / "speedrun", help="where the run folders go"
    )
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    args.extra = extra
    return args


def train_args(args: argparse.Namespace, seed: int) -> list[str]:
    base = ["--preset", "speedrun", "--seed", str(seed), "--device", args.device]
    if args.quick:  # tiny synthetic data, no compilation: checks the plumbing only
        base += [
            "--dataset",
            "synthetic",
            "--data.synthetic_size",
            "512",
            "--data.image_size",
            "16",
            "--data.num_classes",
            "4",
            "--model.width",
            "0.125",
            "--model.compile",
            "false",
            "--epochs",
            "2",
            "--batch-size",
            "128",
            "--train.eval_batch_size",
            "128",
            "--optim.lr",
            str(0.053 * 128),
        ]  # the preset's rate is 0.053 per image of its batch
    elif common.cifar_root(args.data_dir) is not None:
        base += ["--data-dir", str(args.data_dir), "--data.download", "false"]
    if args.device == "cpu" and not args.quick:
        base += ["--model.compile", "false"]  # compiling for a CPU costs minutes and gains little here
    return base + list(args.extra)


def floor_rate(device: str, quick: bool) -> dict:
    """This device's best bf16 matmul rate (the floor's denominator)."""
    import torch

    from ddplab.kernels.bench import measure_peaks

    peaks = measure_peaks(torch.device(device), torch.bfloat16, quick=quick)
    return {"bf16_tflops": peaks["tflops"], "how": peaks["how"]}


def run_flops(run_dir: Path, summary: dict) -> float:
    """Forward FLOPs x (3 per training image seen: forward + backward's two products) + the final evaluation's views."""
    import torch

    from ddplab.config import load_toml
    from ddplab.engine.tta import tta_views

    tta = load_toml(run_dir / runfiles.CONFIG).get("train", {}).get("tta", "none")  # the mode the run evaluated with
    views = len(tta_views(torch.zeros(1, 1, 2, 2), tta))
    per_image = summary["model"]["flops_per_image"]
    seen = summary["data"]["train_images"] * summary["run"]["epochs_done"]
    return per_image * (3 * seen + views * summary["data"]["eval_images"])


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = common.machine_info(args.device)
    env = common.child_env(args.threads)
    runs = []
    for seed in range(args.seeds):
        run_dir = args.runs_dir / f"seed-{seed}"
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        proc = common.run_ddplab(train_args(args, seed), run_dir, env=env)
        run = common.read_run(run_dir)
        s, t = run["summary"], run["summary"]["time"]
        last = run["metrics"][-1]
        runs.append(
            {
                "seed": seed,
                "test_acc": s["final"]["test_acc"],
                "record_s": t["record_s"],
                "data_init_s": t["data_init_s"],
                "train_s": t["train_s"],
                "final_eval_s": last.eval_s,
                "other_evals_s": t["eval_s"] - last.eval_s,
                "warmup_s": (t.get("warmup") or {}).get("s"),
                "startup_s": t["startup_s"],
                "process_s": proc["wall_s"],
                "summary": s,
            }
        )
        print(f"seed {seed}: test acc {runs[-1]['test_acc']:.2%}, record {runs[-1]['record_s']:.2f} s", flush=True)
    flops = run_flops(args.runs_dir / "seed-0", runs[0]["summary"])
    rate = floor_rate(args.device, args.quick)
    floor_s = flops / (rate["bf16_tflops"] * 1e12)
    acc, acc_std = mean_std([r["test_acc"] for r in runs])
    rec, rec_std = mean_std([r["record_s"] for r in runs])
    rows = [
        [
            r["seed"],
            f"{r['test_acc']:.2%}",
            f"{r['record_s']:.3f}",
            f"{r['data_init_s']:.3f}",
            f"{r['train_s']:.3f}",
            f"{r['final_eval_s']:.3f}",
            f"{r['warmup_s'] or 0:.1f}",
            f"{r['other_evals_s']:.2f}",
        ]
        for r in runs
    ]
    rows.append(["mean +- std", f"{acc:.2%} +- {acc_std:.2%}", f"{rec:.3f} +- {rec_std:.3f}", "", "", "", "", ""])
    table = common.markdown_table(
        [
            "seed",
            "test acc",
            "record s",
            "data init s",
            "train s",
            "final eval s (TTA)",
            "compile warm-up s (apart)",
            "other evals s (apart)",
        ],
        rows,
    )
    notes = [
        f"FLOPs per run: {flops:.3g} (forward {runs[0]['summary']['model']['flops_per_image'] / 1e6:.1f} "
        f"MFLOP/image); floor at the measured bf16 rate {rate['bf16_tflops']:.1f} TFLOP/s ({rate['how']}): "
        f"{floor_s:.3f} s; the mean run takes {rec / floor_s:.1f}x the floor"
    ]
    results = {
        "runs": [{k: v for k, v in r.items() if k != "summary"} for r in runs],
        "test_acc": {"mean": acc, "std": acc_std},
        "record_s": {"mean": rec, "std": rec_std},
        "flops_per_run": flops,
        "floor": {**rate, "seconds": floor_s},
        "train_args": train_args(args, 0),
    }
    common.finish("speedrun", args, machine, results, table, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
