#!/usr/bin/env python3
"""A checkpoint writer SIGKILLed at random points of its writes: does a restart always find the last whole one?

    python benchmarks/checkpoint_kills.py                 # 300 kills, 64 MiB checkpoints (a few minutes)
    python benchmarks/checkpoint_kills.py --quick         # 40 kills, 2 MiB: what the suite runs

A forked writer saves last.pt over and over with ddplab's own writer (rundir/checkpoint.save_atomic: a temporary
file, fsync, rename, the folder fsynced), saying on a pipe when each write starts and when its rename is done. Once
one write is whole, the next is cut by SIGKILL at a uniformly random moment of 1.25 times that whole write's
duration (as the machine writes then: some kills land after the rename). Then, as a resume does, the dead writer's
temporary file is removed (io/files.remove_dead_writers_files) and last.pt is loaded with ddplab's checks. A torn
checkpoint is one that fails to load, or holds a write older than the last one reported whole. Writes everything to
--out (JSON).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common as common
import torch

NAME = "checkpoint_kills"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p, NAME, repeats=1)
    p.add_argument("--trials", type=int, help="kills (default 300; 40 with --quick)")
    p.add_argument("--size-mb", type=float, help="checkpoint size in MiB (default 64; 2 with --quick)")
    p.add_argument("--folder", type=Path, help="where to write (default: a temporary folder; choose the disk)")
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    args.trials = args.trials or (40 if args.quick else 300)
    args.size_mb = args.size_mb or (2.0 if args.quick else 64.0)
    if args.trials < 1 or args.size_mb <= 0:
        p.error("--trials and --size-mb must be positive")
    return args


def state(n: int, weights: torch.Tensor) -> dict:
    """A last.pt as ddplab's checks read it, write `n` stamped in its counters. The weights are made once, before
    any fork: a forked child that runs an OpenMP-parallel op its parent ran deadlocks in the thread pool."""
    return {
        "model": {"weight": weights, "stamp": torch.tensor([n])},
        "optimizer": {},
        "scheduler": {},
        "scaler": {},
        "early_stopping": {},
        "train_state": {"epoch": n, "step": n, "history": []},
    }


def writer(path: Path, first: int, weights: torch.Tensor, pipe) -> None:
    """Write last.pt as write first, first + 1, ... until killed, saying each write's start and end."""
    from ddplab.rundir import checkpoint

    n = first
    while True:
        pipe.send(("start", n))
        checkpoint.save_atomic(state(n, weights), path)
        pipe.send(("whole", n))
        n += 1


def trial(folder: Path, first: int, weights: torch.Tensor, rng: random.Random) -> dict:
    """One writer (its writes numbered from `first`), one kill inside a write after a whole one (at a moment drawn
    from that whole one's duration, as this machine writes now), one restart's reading of last.pt."""
    from ddplab.io import files
    from ddplab.rundir import checkpoint

    path = folder / checkpoint.LAST
    ours, theirs = mp.get_context("fork").Pipe(duplex=False)
    proc = mp.get_context("fork").Process(target=writer, args=(path, first, weights, theirs), daemon=True)
    proc.start()
    whole, began, write_s = None, 0.0, 0.0
    while True:  # one whole write, then the start of the next: the kill lands inside it
        what, n = ours.recv()
        if what == "whole":
            whole, write_s = n, time.perf_counter() - began
        elif whole is not None:
            break
        else:
            began = time.perf_counter()
    delay = rng.uniform(0, 1.25 * write_s)
    time.sleep(delay)
    proc.kill()
    proc.join()
    assert proc.exitcode == -signal.SIGKILL
    while ours.poll():  # what it said before it died
        what, n = ours.recv()
        if what == "whole":
            whole = n
    left = files.remove_dead_writers_files(folder)
    try:
        saved = checkpoint.load(path)
        found = saved["train_state"]["step"]
        assert int(saved["model"]["stamp"]) == found and torch.equal(saved["model"]["weight"], weights)
    except Exception as exc:  # a torn checkpoint: what must never happen
        return {"delay_s": delay, "write_s": write_s, "torn": f"{type(exc).__name__}: {exc}", "temp_left": len(left)}
    return {
        "delay_s": delay,
        "write_s": write_s,
        "torn": None if found >= whole else f"holds write {found}, older than write {whole}, reported whole",
        "found_newer": found > whole,  # killed after the rename, before it said so
        "temp_left": len(left),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    info = common.machine_info("cpu")
    weights = torch.arange(int(args.size_mb * 2**20 / 4), dtype=torch.float32)
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        rows = [trial(Path(tmp), 10_000 * i, weights, rng) for i in range(args.trials)]
    write_s = statistics.median(r["write_s"] for r in rows)
    torn = [r for r in rows if r["torn"]]
    results = {
        "trials": len(rows),
        "size_mb": args.size_mb,
        "write_s": write_s,
        "torn": len(torn),
        "torn_examples": [r["torn"] for r in torn[:5]],
        "killed_before_the_rename": sum(1 for r in rows if not r["torn"] and not r["found_newer"]),
        "killed_after_the_rename": sum(1 for r in rows if not r["torn"] and r["found_newer"]),
        "temp_files_removed": sum(r["temp_left"] for r in rows),
        "rows": rows,
    }
    table = common.markdown_table(
        [
            "kills",
            "checkpoint",
            "one write",
            "torn",
            "last whole one found",
            "a newer whole one found",
            "temp files removed",
        ],
        [
            [
                results["trials"],
                f"{args.size_mb:g} MiB",
                f"{write_s * 1e3:.1f} ms",
                results["torn"],
                results["killed_before_the_rename"],
                results["killed_after_the_rename"],
                results["temp_files_removed"],
            ]
        ],
    )
    notes = [
        f"\nfolder: {args.folder or tempfile.gettempdir()}; each kill at a moment uniform in [0, 1.25 x the whole "
        "write before it]; one write: their median"
    ]
    common.finish(NAME, args, info, results, table, notes)
    return 1 if torn else 0


if __name__ == "__main__":
    sys.exit(main())
