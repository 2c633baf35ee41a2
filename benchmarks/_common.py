"""What every benchmark here shares: arguments, machine info, medians, tables, the JSON file.

Each script measures two sides of one comparison (or one quantity), repeats the measurement
and reports medians. On a shared machine the clock is noisy, so the two sides are run
interleaved (`interleaved`: A B, then B A, ...), which puts both under the same background
load on average; their ratio is then far steadier than either figure alone.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO / "src"))

from ddplab.compat import check_torch  # noqa: E402 (torch-free)
from ddplab.errors import ConfigError  # noqa: E402
from ddplab.rundir import runfiles  # noqa: E402 (torch-free)

try:  # no torch, or one below the floor: one line, as from every ddplab command
    check_torch()
except ConfigError as exc:
    print(f"{Path(sys.argv[0]).stem}: error: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)

import torch  # noqa: E402

from ddplab.data.datasets import holds_cifar10  # noqa: E402
from ddplab.launch import process  # noqa: E402
from ddplab.metrics.system import machine  # noqa: E402
from ddplab.rundir.epochs import EpochRecord, read_epochs  # noqa: E402
from ddplab.rundir.summary import read_summary  # noqa: E402


def step_device(name: str) -> torch.device:
    """The device a step benchmark runs on: a CUDA device made current, cuDNN autotuning on."""
    device = torch.device(name)
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    return device


@contextlib.contextmanager
def one_rank_group(device: torch.device) -> Iterator[None]:
    """This process as the whole process group (NCCL on CUDA, Gloo on a CPU), destroyed at the end: DDP with one
    rank, whose all-reduce moves nothing."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def add_common_args(parser: argparse.ArgumentParser, name: str, *, repeats: int = 3) -> None:
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu, cuda or cuda:N (default: cuda when available)",
    )
    parser.add_argument(
        "--repeats", type=int, default=repeats, help="measurements per side, interleaved; medians reported"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a few seconds on small synthetic data: checks the script, measures nothing useful",
    )
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("DDPLAB_DATA"),
        help="data root holding cifar-10-batches-bin (default: $DDPLAB_DATA; synthetic data without it)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs") / "bench" / f"{name}.json", help="JSON results file")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op CPU threads per process (default: torch's own choice, or $OMP_NUM_THREADS)",
    )


def check_common_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available on this machine; use --device cpu")


def apply_threads(threads: int | None) -> None:
    """--threads for the benchmarks that run in this process."""
    if threads is not None:
        torch.set_num_threads(threads)


def cifar_root(data_dir: str | os.PathLike | None) -> Path | None:
    """The data root if it holds CIFAR-10 (either format), else None (the caller uses synthetic data)."""
    if data_dir and holds_cifar10(data_dir):
        return Path(data_dir)
    return None


def machine_info(device: str) -> dict[str, Any]:
    """The machine a result was measured on (as a run folder's env.json says it), for the JSON and the table header."""
    return {
        **machine(device),
        "date": datetime.date.today().isoformat(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def describe_machine(info: dict[str, Any]) -> str:
    load = info.get("load_average_at_start")
    shared = f", load average {load[0]:.2f} at start" if load else ""
    return f"{info['device_name']}, {info['cpu_cores']} cores, torch {info['torch']}, {info['date']}{shared}"


def interleaved(repeats: int, sides: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(repeat, side) in the order A B, B A, A B, ...: each side goes first as often as the other,
    so a load that rises or falls during the benchmark does not favour either side."""
    for r in range(repeats):
        for side in sides if r % 2 == 0 else list(reversed(sides)):
            yield r, side


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def compare(name_a: str, a: Sequence[float], name_b: str, b: Sequence[float]) -> dict[str, Any]:
    """Medians of two sides' rates (higher is better), their ratio b/a, and the median of the
    per-repeat ratios (each repeat's two sides ran back to back, under the same load)."""
    paired = [y / x for x, y in zip(a, b, strict=True) if x > 0]
    med_a, med_b = median(a), median(b)
    return {
        name_a: {"median": med_a, "min": min(a), "max": max(a), "values": list(a)},
        name_b: {"median": med_b, "min": min(b), "max": max(b), "values": list(b)},
        "ratio": med_b / med_a if med_a > 0 else float("nan"),
        "ratio_of": f"{name_b} / {name_a}",
        "paired_ratios": paired,
        "median_paired_ratio": median(paired),
    }


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The report's Markdown table (ddplab.report.tables), for cells of any type."""
    from ddplab.report.tables import markdown_table as table

    return table(list(headers), [[str(c) for c in row] for row in rows])


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def fmt_list(values: Sequence[float], digits: int = 2) -> str:
    return ", ".join(f"{v:,.{digits}f}" for v in values)


def sync(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_call(fn, calls: int, device: torch.device | str) -> float:
    """Seconds a call of `fn`, the device synchronized before and after `calls` of them (none in between)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(device)
    return (time.perf_counter() - start) / calls


def command_line() -> str:
    """How this process was started, to print above its table."""
    argv = [Path(sys.argv[0]).as_posix()] + sys.argv[1:]
    try:
        argv[0] = Path(argv[0]).resolve().relative_to(Path.cwd()).as_posix()
    except ValueError:
        pass
    return "python " + " ".join(argv)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def finish(
    name: str,
    args: argparse.Namespace,
    machine: dict[str, Any],
    results: dict[str, Any],
    table: str,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Print the table (with its command and machine) and write everything to --out."""
    machine = dict(machine)
    machine["load_average_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    text = "\n".join([f"$ {command_line()}", describe_machine(machine), "", table, *notes])
    print(text, flush=True)
    payload = {
        "benchmark": name,
        "command": command_line(),
        "args": {k: v for k, v in vars(args).items()},
        "machine": machine,
        "results": results,
        "table": table,
        "notes": list(notes),
    }
    write_json(args.out, payload)
    print(f"(written to {args.out})", flush=True)
    return payload


# ---- benchmarks that run the `ddplab` command line and read its run folder ------------------
def child_env(threads: int | None = None) -> dict[str, str]:
    """This environment, with this checkout's `src` importable and --threads as OMP_NUM_THREADS."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_ddplab(
    train_args: Sequence[str], run_dir: Path, *, env: dict[str, str], poll=None, poll_s: float = 0.25
) -> dict[str, Any]:
    """`python -m ddplab train ... --out run_dir`, its output in run_dir.parent/<name>.log.

    Returns the process's wall time and exit code; `poll(elapsed_s)` is called every
    `poll_s` seconds while it runs (to watch metrics.jsonl grow). Raises on failure.
    """
    run_dir = Path(run_dir)
    log_path = run_dir.parent / f"{run_dir.name}.log"
    cmd = process.ddplab_command(
        "train", *train_args, "--output.progress", "false", "--output.tensorboard", "false", "--out", str(run_dir)
    )
    start = time.perf_counter()
    done = process.supervise(
        cmd,
        log_path,
        env=env,
        cwd=REPO,
        poll_s=poll_s,
        on_poll=None if poll is None else lambda: poll(time.perf_counter() - start),
    )
    wall_s = time.perf_counter() - start  # the clock `poll` read, so no poll's time exceeds it
    if done.code != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"ddplab train failed (exit {done.code}): {' '.join(cmd)}\n{tail}")
    return {"wall_s": wall_s, "returncode": done.code, "command": cmd, "log": str(log_path)}


def read_metrics(run_dir: Path) -> list[EpochRecord]:
    """The epochs a run has written so far (the last line may be being written)."""
    return read_epochs(Path(run_dir) / runfiles.METRICS, growing=True)


def read_run(run_dir: Path) -> dict[str, Any]:
    """A finished run folder's metrics (one record per epoch), summary and environment."""
    run_dir = Path(run_dir)
    return {
        "metrics": read_epochs(run_dir / runfiles.METRICS, run_dir),
        "summary": read_summary(run_dir),
        "env": json.loads((run_dir / runfiles.ENV).read_text()) if (run_dir / runfiles.ENV).is_file() else {},
    }
