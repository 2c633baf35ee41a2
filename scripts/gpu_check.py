#!/usr/bin/env python3
"""One command that checks everything a CUDA machine can check, and prints one table.

    python scripts/gpu_check.py                      # on a CUDA machine: tests + training matrix + kernels
    python scripts/gpu_check.py --device cpu --quick # the CPU-safe part (what CI runs in a test)

It runs (1) the CUDA-relevant tests, (2) a short training matrix, each row its own
`python -m ddplab train` process: fp32 / bf16 / fp16 / bf16+channels_last, DataParallel,
DDP with NCCL and with Gloo (one worker, and one per GPU when there are several), the bf16
comm hook with SyncBatchNorm, torch.compile, the fused Conv+ReLU kernel, and (3)
`ddplab kernels check` and `ddplab kernels bench`. Rows the machine cannot run say why.
The table (accuracy, times, peak memory per row) is printed and written with the raw
results to --out as gpu_check.md and gpu_check.json. Exit code 1 when anything failed.

Data: CIFAR-10 from --data-dir / $DDPLAB_DATA when it is there, else synthetic images.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Children import this checkout's ddplab, installed or not (the GPU machine runs it from source).
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
if str(REPO / "src") not in sys.path:  # and so does this script
    sys.path.insert(0, str(REPO / "src"))

from ddplab.compat import check_torch  # noqa: E402 (both torch-free)
from ddplab.errors import ConfigError  # noqa: E402
from ddplab.launch import process  # noqa: E402 (torch-free)
from ddplab.rundir import runfiles  # noqa: E402

# name, extra `ddplab train` arguments, what it needs: "any" | "cuda" | "multi" (2+ workers: GPUs, or CPU processes).
# The rows no GPU has run yet come first, so that a run cut short still has them. "ddp nccl x1" is world
# size 1, which takes the single-process path (no process group): it checks that the settings are accepted.
ROWS: list[tuple[str, list[str], str]] = [
    ("fp32", [], "any"),
    # 2 workers on one GPU over Gloo (--dist.share_device): the multi-worker CUDA path on a 1-GPU machine. A
    # correctness check (compare its accuracy with fp32's), never a speed figure. The bf16 comm hook needs NCCL,
    # which refuses two ranks on one device, so it cannot be checked this way.
    ("ddp x2 one gpu", ["--strategy", "ddp", "--nproc", "2", "--dist.share_device", "true"], "cuda"),
    (
        "ddp x2 one gpu sync_bn",
        [
            "--strategy",
            "ddp",
            "--nproc",
            "2",
            "--dist.share_device",
            "true",
            "--dist.sync_bn",
            "true",
            "--model.batchnorm",
            "true",
        ],
        "cuda",
    ),
    ("cuda graphs", ["--train.cuda_graphs", "true"], "cuda"),
    (
        "cuda graphs bf16 + accumulate 2",
        ["--train.cuda_graphs", "true", "--precision", "bf16", "--train.accumulate", "2"],
        "cuda",
    ),
    ("bf16", ["--precision", "bf16"], "any"),
    ("fp16", ["--precision", "fp16"], "any"),
    ("bf16 channels_last", ["--precision", "bf16", "--model.channels_last", "true"], "any"),
    ("fused conv+relu", ["--model.fuse_conv_relu", "true"], "any"),
    ("dp", ["--strategy", "dp"], "cuda"),
    ("ddp nccl x1", ["--strategy", "ddp", "--nproc", "1", "--backend", "nccl"], "cuda"),
    ("ddp nccl xN", ["--strategy", "ddp", "--nproc", "{n}", "--backend", "nccl"], "multi-cuda"),
    ("ddp gloo xN", ["--strategy", "ddp", "--nproc", "{n}", "--backend", "gloo"], "multi"),
    (
        "ddp bf16 hook + sync_bn",
        [
            "--strategy",
            "ddp",
            "--nproc",
            "{n}",
            "--dist.comm_hook",
            "bf16",
            "--dist.sync_bn",
            "true",
            "--model.batchnorm",
            "true",
        ],
        "multi-cuda",
    ),
    (
        "ddp nccl xN cuda graphs",
        ["--strategy", "ddp", "--nproc", "{n}", "--backend", "nccl", "--train.cuda_graphs", "true"],
        "multi-cuda",
    ),
    ("compile", ["--model.compile", "true"], "any"),
    ("compile reduce-overhead", ["--model.compile", "true", "--model.compile_mode", "reduce-overhead"], "any"),
]
CUDA_TESTS = [
    "tests/kernels",
    "tests/unit/data/test_loader.py",
    "tests/unit/engine/test_trainer.py",
    "tests/unit/test_compat.py",
    "tests/unit/engine/test_graphed.py",
    "tests/distributed",
    "tests/smoke",
]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--out", type=Path, default=Path("runs") / f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}")
    p.add_argument("--data-dir", default=os.environ.get("DDPLAB_DATA"), help="data root holding cifar-10-batches-bin")
    p.add_argument(
        "--tests",
        choices=("auto", "cuda", "all", "none"),
        default="auto",
        help="auto: the CUDA-relevant tests on CUDA, none on CPU; all: the whole suite",
    )
    p.add_argument("--rows", default=None, help="comma-separated row names to run (default: all)")
    p.add_argument("--quick", action="store_true", help="tiny synthetic runs (seconds each), kernels bench --quick")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--timeout", type=int, default=600, help="seconds per training run")
    return p.parse_args(argv)


def machine(on_cuda: bool) -> dict:
    """The machine as a run folder's env.json describes it, and the Triton the kernels use."""
    from ddplab.metrics.system import machine as describe

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {**describe("cuda" if on_cuda else "cpu"), "triton": triton_version}


def data_args(args, on_cuda: bool) -> list[str]:
    from ddplab.data.datasets import holds_cifar10  # imports torch: checked by now

    cifar = args.data_dir and holds_cifar10(args.data_dir)
    if args.quick or not cifar:
        size = "1024" if args.quick else "8192"
        return [
            "--dataset",
            "synthetic",
            "--data.synthetic_size",
            size,
            "--data.image_size",
            "16" if args.quick else "32",
            "--model.width",
            "0.5" if args.quick else "1.0",
            "--batch-size",
            "64",
        ]
    return [
        "--dataset",
        "cifar10",
        "--data-dir",
        args.data_dir,
        "--subset",
        "20000" if on_cuda else "4000",
        "--batch-size",
        "128",
    ]


def unmet(need: str, on_cuda: bool, gpus: int) -> str | None:
    """Why this machine cannot run a row, or None."""
    if need in ("cuda", "multi-cuda") and not on_cuda:
        return "needs CUDA"
    if need == "multi-cuda" and gpus < 2:
        return f"needs 2+ GPUs (this machine has {gpus})"
    if need == "multi" and on_cuda and gpus < 2:
        return f"needs 2+ GPUs (this machine has {gpus}); on a CPU it runs 2 processes"
    return None


def run_row(name: str, extra: list[str], common: list[str], out: Path, timeout: int) -> dict:
    run_dir = out / name.replace(" ", "_").replace("+", "")
    cmd = process.ddplab_command(
        "train", *common, *extra, "--out", str(run_dir), "--output.progress", "false", "--output.tensorboard", "false"
    )
    done = process.supervise(cmd, out / f"{run_dir.name}.log", timeout_s=timeout, env=ENV, timeout_from="--timeout")
    if done.code == process.TIMED_OUT:
        return {"row": name, "status": f"FAILED: no result within {timeout} s", "command": cmd}
    if done.code != 0:
        return {
            "row": name,
            "status": f"FAILED (exit {done.code}): {done.error[:200]}",
            "command": cmd,
            "wall_s": done.wall_s,
        }
    s = json.loads((run_dir / runfiles.SUMMARY).read_text())
    t, mem = s["time"], s["memory"]
    peak = mem.get("peak_alloc_mib", mem.get("peak_rss_mib"))
    return {
        "row": name,
        "status": "ok",
        "world_size": s["run"]["world_size"],
        "device": s["run"]["device"],
        "test_acc": s["final"]["test_acc"],
        "train_s": t["train_s"],
        "epoch_s_after_first": t["mean_epoch_s_after_first"],
        "startup_s": t["startup_s"],
        "warmup_s": (t.get("warmup") or {}).get("s"),
        "images_per_s": t["images_per_s"],
        "peak_mib": peak,
        "peak_kind": "peak_alloc_mib" if "peak_alloc_mib" in mem else "peak_rss_mib",
        "peak_reserved_mib": mem.get("peak_reserved_mib"),  # a CUDA graph's pool shows here only
        "wall_s": round(done.wall_s, 1),
        "command": cmd,
    }


def run_command(name: str, cmd: list[str], out: Path, timeout: int) -> dict:
    log = out / (name.replace(" ", "_") + ".log")
    done = process.supervise(cmd, log, timeout_s=timeout, env=ENV, cwd=REPO, timeout_from="--timeout")
    if done.code == process.TIMED_OUT:
        return {"row": name, "status": f"FAILED: no result within {timeout} s", "command": cmd}
    tail = process.error_line(log) if done.code else process.last_line(log)
    status = "ok" if done.code == 0 else f"FAILED (exit {done.code})"
    said = tail if len(tail) <= 100 else f"output in {log.name}"
    return {
        "row": name,
        "status": f"{status}: {said}" if said else status,
        "wall_s": round(done.wall_s, 1),
        "log": str(log),
        "command": cmd,
    }


def fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def table(results: list[dict]) -> str:
    lines = [
        "| row | status | world | test acc | train s | epoch s (after 1st) "
        "| start-up s (warm-up) | images/s | peak MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        warm = f" ({r['warmup_s']:.1f})" if r.get("warmup_s") is not None else ""
        peak = (
            f"{r['peak_mib']:,.0f} {'alloc' if r.get('peak_kind') == 'peak_alloc_mib' else 'RSS'}"
            if r.get("peak_mib")
            else ""
        )
        if r.get("peak_reserved_mib"):
            peak += f" / {r['peak_reserved_mib']:,.0f} reserved"
        lines.append(
            f"| {r['row']} | {r['status']} | {r.get('world_size', '')} | {fmt(r.get('test_acc'), '.2%')} | "
            f"{fmt(r.get('train_s'), '.1f')} | {fmt(r.get('epoch_s_after_first'), '.2f')} | "
            f"{fmt(r.get('startup_s'), '.1f')}{warm} | {fmt(r.get('images_per_s'), ',.0f')} | {peak} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        check_torch()  # no torch, or one below the floor: one line, as from every ddplab command
    except ConfigError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return exc.exit_code
    import torch

    on_cuda = torch.cuda.is_available() and args.device != "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: error: --device cuda, but CUDA is not available here; use --device cpu", file=sys.stderr)
        return 2
    info = machine(on_cuda)
    gpus = info["gpus"] if on_cuda else 0
    n = str(gpus if gpus >= 2 else 2)
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"gpu_check on {info['device_name']} ({gpus} GPU(s)), torch {info['torch']}, CUDA {info['cuda']}, "
        f"triton {info['triton']}; results in {args.out}",
        flush=True,
    )
    wanted = None if args.rows is None else {r.strip() for r in args.rows.split(",")}
    unknown = (wanted or set()) - {name for name, _, _ in ROWS} - {"tests", "kernels check", "kernels bench"}
    if unknown:
        print(
            f"gpu_check: error: unknown rows {sorted(unknown)}; rows are: " + ", ".join(r[0] for r in ROWS),
            file=sys.stderr,
        )
        return 2
    header = (
        f"gpu_check on {info['device_name']} ({gpus} GPU(s)), torch {info['torch']}, CUDA {info['cuda']}, "
        f"triton {info['triton']}, Python {info['python']}, {info['cpus']} CPUs\n\n"
    )
    results: list[dict] = []

    def save() -> None:  # after every row: a run stopped from outside still leaves what it measured
        (args.out / "gpu_check.md").write_text(header + table(results) + "\n")
        (args.out / "gpu_check.json").write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")

    tests = args.tests if args.tests != "auto" else ("cuda" if on_cuda else "none")
    if tests != "none" and (wanted is None or "tests" in wanted):
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        if _has_xdist():
            cmd += ["-n", str(min(8, os.cpu_count() or 1))]
        cmd += CUDA_TESTS if tests == "cuda" else []
        print(f"running tests: {' '.join(cmd[3:])}", flush=True)
        results.append(run_command("tests", cmd, args.out, timeout=3600))
        save()
    common = [*data_args(args, on_cuda), "--epochs", str(args.epochs), "--device", "cuda" if on_cuda else "cpu"]
    for name, extra, need in ROWS:
        if wanted is not None and name not in wanted:
            continue
        reason = unmet(need, on_cuda, gpus)
        if reason:
            results.append({"row": name, "status": f"skipped: {reason}"})
            continue
        print(f"training: {name}", flush=True)
        results.append(run_row(name, [a.replace("{n}", n) for a in extra], common, args.out, args.timeout))
        save()
        print(f"  {results[-1]['status']}", flush=True)
    kernel_device = "cuda" if on_cuda else "cpu"
    for name, sub in (
        ("kernels check", ["check", "--device", kernel_device]),
        ("kernels bench", ["bench", "--device", kernel_device, *(["--quick"] if args.quick or not on_cuda else [])]),
    ):
        if wanted is None or name in wanted:
            print(f"running: ddplab kernels {' '.join(sub)}", flush=True)
            results.append(
                run_command(name, [sys.executable, "-m", "ddplab", "kernels", *sub], args.out, timeout=args.timeout)
            )
    save()
    print(table(results))
    return 1 if any(r["status"].startswith("FAILED") for r in results) else 0


def _has_xdist() -> bool:
    import importlib.util

    return importlib.util.find_spec("xdist") is not None


if __name__ == "__main__":
    sys.exit(main())
