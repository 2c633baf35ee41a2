#!/usr/bin/env python3
"""The speedrun preset over several seeds, timed as the CIFAR-10 speed records time a run.

    python benchmarks/speedrun.py --device cuda --seeds 5                 # the preset as it ships (step captured)
    python benchmarks/speedrun.py --device cuda --seeds 5 -- --train.cuda_graphs false   # the eager step
    python benchmarks/speedrun.py --device cpu --quick                    # checks the script in a minute
    python benchmarks/speedrun.py --device cuda --seeds 20 --against airbench --airbench-file airbench94_muon.py

Each seed is one `ddplab train --preset speedrun --seed S` process. Its time is the run's
`time.record_s`: the whitening init from the data, every epoch's training and the final
evaluation with test-time augmentation, the device synchronized around each; compilation
(start-up warm-up) and the earlier epochs' evaluations are measured too and shown apart.
Reported: mean +- std over the seeds of the final test accuracy and of record_s, the FLOPs
of one run (3 x forward FLOPs per training image seen, plus the final evaluation's views),
and the floor time those FLOPs would take at this device's measured bf16 matmul rate.
Arguments after `--` go to every `ddplab train`.

`--against airbench`: airbench94_muon (the CIFAR-10 speed record with Muon) on the same card and the same images,
from the file the user fetched at a commit _airbench.py knows (its sha256 names it; ddplab carries none of
airbench), its runs interleaved with the preset's (A B, B A, ...), each timed as the records time a run; both
sides' mean +- std of accuracy and time, the ratio of the mean times, and whether the preset reaches airbench's
mean accuracy in at most TIME_BAR of its time. The file's commit and sha256 and what is done around it at run time
are printed and saved beside the figures; a file of another hash runs only with --airbench-unverified, and its
figures are a stand-in's, labelled so.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import _airbench as airbench
import _common as common

from ddplab.rundir import runfiles  # torch-free; _common puts src on the path

TIME_BAR = 0.75  # the preset's mean time at most this share of airbench's, at no lower mean accuracy


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
    p.add_argument("--against", choices=["airbench"], help="run airbench94_muon beside the preset, interleaved")
    p.add_argument(
        "--airbench-file", type=Path, help="airbench94_muon.py as fetched from its repository (see _airbench.py)"
    )
    p.add_argument(
        "--airbench-unverified",
        action="store_true",
        help="run an --airbench-file of a hash this benchmark does not know, its figures labelled a stand-in's",
    )
    p.add_argument(
        "--airbench-compile-mode", default="max-autotune", help="torch.compile's mode for airbench (its own)"
    )
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    if args.seeds < 1:
        p.error(f"--seeds must be >= 1, got {args.seeds}")
    args.reference = None
    if args.against:
        if args.airbench_file is None:
            p.error(f"--against airbench needs --airbench-file: {airbench.NAME}.py fetched from {airbench.REPOSITORY}")
        try:
            args.reference = airbench.identify(args.airbench_file, unverified=args.airbench_unverified)
        except ValueError as exc:
            p.error(str(exc))
    if args.reference is not None and args.reference.commit is not None:  # airbench's own file (a stand-in: tests)
        if not args.device.startswith("cuda"):
            p.error("--against airbench: airbench94_muon runs on CUDA only; use --device cuda")
        if args.quick or common.cifar_root(args.data_dir) is None:
            p.error(
                "--against airbench: airbench94_muon trains on CIFAR-10: give its folder (--data-dir or $DDPLAB_DATA) "
                "and leave out --quick"
            )
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


def train_data(args: argparse.Namespace) -> tuple[str, str | None, dict]:
    """The dataset the preset's runs train on (load_dataset's name, root and options): what airbench reads too."""
    if args.quick:
        return "synthetic", None, {"synthetic_size": 512, "image_size": 16, "num_classes": 4}
    root = common.cifar_root(args.data_dir)
    return "cifar10", str(root) if root is not None else None, {}


def run_seed(args: argparse.Namespace, seed: int, env: dict[str, str]) -> dict:
    """One `ddplab train --preset speedrun` process and what its run folder says of it."""
    run_dir = args.runs_dir / f"seed-{seed}"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    proc = common.run_ddplab(train_args(args, seed), run_dir, env=env)
    run = common.read_run(run_dir)
    s, t = run["summary"], run["summary"]["time"]
    last = run["metrics"][-1]
    return {
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


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = common.machine_info(args.device)
    env = common.child_env(args.threads)
    runs, theirs = [], []
    worker = None
    if args.against:
        name, root, options = train_data(args)
        data = airbench.write_data(args.runs_dir / "airbench-data", name, root, **options)
        ref = args.reference
        print(f"against: {ref.label}: {ref.path}, sha256 {ref.sha256}"
              + (f", {airbench.REPOSITORY} at {ref.commit}" if ref.commit else ""), flush=True)  # fmt: skip
        for change in airbench.RUN_TIME:
            print(f"  at run time, around the unchanged file: {change}", flush=True)
        print(f"{ref.label}: compiling ({args.airbench_compile_mode}) and warming up ...", flush=True)
        worker = airbench.Worker(
            args.airbench_file, data, args.runs_dir / "airbench.log", compile_mode=args.airbench_compile_mode, env=env
        )
    try:
        for seed, side in common.interleaved(args.seeds, ["ddplab", "airbench"] if worker else ["ddplab"]):
            if side == "airbench":
                assert worker is not None
                theirs.append({"run": seed, **worker.run(seed)})
                print(f"{args.reference.label}, run {seed}: test acc {theirs[-1]['acc']:.2%}, "
                      f"{theirs[-1]['time_s']:.2f} s", flush=True)  # fmt: skip
                continue
            runs.append(run_seed(args, seed, env))
            print(f"seed {seed}: test acc {runs[-1]['test_acc']:.2%}, record {runs[-1]['record_s']:.2f} s", flush=True)
    finally:
        if worker is not None:
            worker.close()
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
    against = None
    if theirs:
        their_acc, their_acc_std = mean_std([r["acc"] for r in theirs])
        their_s, their_s_std = mean_std([r["time_s"] for r in theirs])
        ratio = rec / their_s
        against = {
            **args.reference.describe(),
            "runs": theirs,
            "test_acc": {"mean": their_acc, "std": their_acc_std},
            "time_s": {"mean": their_s, "std": their_s_std},
            "time_ratio": ratio,
            "meets": {"accuracy": acc >= their_acc, "time": ratio <= TIME_BAR},
            "compile_mode": args.airbench_compile_mode,
        }
        rows.append([args.reference.label, f"{their_acc:.2%} +- {their_acc_std:.2%}",
                     f"{their_s:.3f} +- {their_s_std:.3f}", "", "", "", "", ""])  # fmt: skip
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
    if against is not None:
        met = against["meets"]
        notes.append(
            f"against {args.reference.label} over {len(theirs)} runs each, interleaved on this device: the preset's "
            f"mean time is {against['time_ratio']:.2f}x its, mean accuracy {acc - against['test_acc']['mean']:+.2%}: "
            + (
                f"meets the bar (no lower accuracy in at most {TIME_BAR}x the time)"
                if met["accuracy"] and met["time"]
                else "does not meet the bar: "
                + "; ".join(
                    why
                    for ok, why in (
                        (met["accuracy"], "its mean accuracy is lower"),
                        (met["time"], f"its time is over {TIME_BAR}x"),
                    )
                    if not ok
                )
            )
        )
    results = {
        "runs": [{k: v for k, v in r.items() if k != "summary"} for r in runs],
        "test_acc": {"mean": acc, "std": acc_std},
        "record_s": {"mean": rec, "std": rec_std},
        "flops_per_run": flops,
        "floor": {**rate, "seconds": floor_s},
        "train_args": train_args(args, 0),
        "against": against,
    }
    common.finish("speedrun", args, machine, results, table, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
