#!/usr/bin/env python3
"""A process's fixed cost, started cold (a fresh interpreter each) and warm (forked from ddplab.launch.warm's server).

    python benchmarks/warm_start.py                  # the three shapes below, 5 repeats each side, interleaved
    python benchmarks/warm_start.py --quick          # one repeat, a 1-point sweep: checks the script only

Sides: `cold` is every process started by exec (DDPLAB_WARM=0 in its environment and in this
process's launch of it: ddplab as it was before warm starts); `warm` is the default now (the
command forked from this process's warm server, a DDP launcher's workers from its own).

Shapes, each a tiny synthetic run (256 images 16x16, simple_cnn at width 0.5, 2 epochs):
- `point`: one `ddplab train` as a sweep starts a point;
- `ddp`: the same with --strategy ddp --nproc 2 (Gloo);
- `sweep`: `ddplab sweep` of --points such runs (a learning-rate grid), serial, no estimate or report.

And `first step`: a warm DDP launcher (2 workers) from its starting each worker to each rank's first training
step, on one clock (CLOCK_MONOTONIC), through two hooks patched into the launcher before its own warm server is
forked from it (so its workers carry them too).

For `point` and `ddp`, fixed cost = the command's wall time - its epochs' training and evaluation
time (summary.json): starting the command to its first step, plus its last step to its exit. For
the sweep, its wall time and the sum of its runs' training and evaluation. The server is started
before the first measurement (a sweep or a test session starts it once); its own start-up is
measured apart (`server_start_s`: from starting it to its first fork answered).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _common as common

from ddplab.launch import process, warm
from ddplab.rundir import runfiles

NAME = "warm_start"
SIDES = ("cold", "warm")
TINY = ["--dataset", "synthetic", "--data.synthetic_size", "256", "--data.image_size", "16", "--data.num_classes",
        "4", "--model", "simple_cnn", "--model.width", "0.5", "--epochs", "2", "--batch-size", "32",
        "--device", "cpu", "--output.progress", "false", "--output.tensorboard", "false"]  # fmt: skip
DDP = ["--strategy", "ddp", "--nproc", "2", "--backend", "gloo"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p, NAME, repeats=5)
    p.add_argument("--points", type=int, default=20, help="runs in the sweep shape")
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    if args.quick:
        args.repeats, args.points = 1, 1
    return args


def side_env(side: str) -> dict[str, str]:
    env = common.child_env(threads=1)
    if side == "cold":
        env[warm.SWITCH] = "0"
    return env


def timed(cmd: list[str], log: Path, side: str) -> float:
    start = time.perf_counter()
    done = process.supervise(cmd, log, env=side_env(side), cwd=common.REPO, warm_start=side == "warm")
    wall = time.perf_counter() - start
    if done.code != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.code}):\n{log.read_text()[-3000:]}")
    return wall


def trained_s(run_dir: Path) -> float:
    t = json.loads((run_dir / runfiles.SUMMARY).read_text())["time"]
    return t["train_s"] + t["eval_s"]


def sweep_file(folder: Path, points: int) -> Path:
    """The TINY run as a sweep's base, a learning-rate grid of `points` over it."""
    lrs = ", ".join(f"{0.01 + 0.01 * i:.2f}" for i in range(points))
    path = folder / "grid.toml"
    path.write_text(
        '[sweep]\nname = "warm-start grid"\n\n'
        '[base.data]\ndataset = "synthetic"\nsynthetic_size = 256\nimage_size = 16\nnum_classes = 4\n\n'
        '[base.model]\nname = "simple_cnn"\nwidth = 0.5\n\n'
        '[base.train]\nepochs = 2\nbatch_size = 32\ndevice = "cpu"\n\n'
        f'[base.output]\ntensorboard = false\n\n[grid]\n"optim.lr" = [{lrs}]\n'
    )
    return path


FIRST_STEP = r"""
import shutil, sys, time
import ddplab.faults, ddplab.launch.warm as warm
from ddplab.cli import main
log, out, launch, inject = sys.argv[1], sys.argv[2], warm.WarmPopen._launch, ddplab.faults.maybe_inject
def started(self, process_obj):
    open(log, "a").write(f"start {time.monotonic()}\n")
    return launch(self, process_obj)
def stepped(rank, epoch, step):
    if (epoch, step) == (1, 1):
        open(log, "a").write(f"step {rank} {time.monotonic()}\n")
    return inject(rank, epoch, step)
warm.WarmPopen._launch, ddplab.faults.maybe_inject = started, stepped
warm.fork_own_server()
sys.exit(main(["train", *sys.argv[3:], "--out", out]))
"""


def first_steps(root: Path, repeat: int) -> list[float]:
    """Seconds from a warm launcher's first worker start to each rank's first step."""
    log = root / f"first-{repeat}.log"
    args = [str(log), str(root / f"first-{repeat}"), *TINY, *DDP]
    done = warm.run([sys.executable, "-c", FIRST_STEP, *args], env=side_env("warm"), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the first-step run failed:\n{done.stderr[-3000:]}")
    lines = [line.split() for line in log.read_text().splitlines()]
    start = min(float(x[1]) for x in lines if x[0] == "start")
    return sorted(round(float(x[2]) - start, 3) for x in lines if x[0] == "step")


def main(argv=None) -> dict:
    args = parse_args(argv)
    machine = common.machine_info("cpu")
    started = time.perf_counter()
    f = warm.factory()
    assert f is not None, "warm starts are off here (DDPLAB_WARM=0, or not Linux)"
    f.start()
    probe = warm.run([sys.executable, "-c", "pass"], env=side_env("warm"))
    assert probe.returncode == 0
    server_start_s = time.perf_counter() - started
    results: dict = {"server_start_s": round(server_start_s, 2), "shapes": {}}
    with tempfile.TemporaryDirectory(prefix="ddplab-warm-bench-") as tmp:
        root = Path(tmp)
        grid = sweep_file(root, args.points)
        walls: dict = {shape: {s: [] for s in SIDES} for shape in ("point", "ddp", "sweep")}
        fixed: dict = {shape: {s: [] for s in SIDES} for shape in ("point", "ddp", "sweep")}
        for r, side in common.interleaved(args.repeats, SIDES):
            for shape, extra in (("point", []), ("ddp", DDP)):
                out = root / f"{shape}-{side}-{r}"
                wall = timed(process.ddplab_command("train", *TINY, *extra, "--out", str(out)), root / "log", side)
                walls[shape][side].append(wall)
                fixed[shape][side].append(wall - trained_s(out))
            out = root / f"sweep-{side}-{r}"
            wall = timed(
                process.ddplab_command("sweep", str(grid), "--out", str(out), "--no-report", "--no-estimate"),
                root / "log",
                side,
            )
            walls["sweep"][side].append(wall)
            fixed["sweep"][side].append(wall - sum(trained_s(d) for d in (out / "runs").iterdir() if d.is_dir()))
            shutil.rmtree(out)
        results["first_step_s"] = [first_steps(root, r) for r in range(args.repeats)]
    rows = []
    labels = {"point": "one tiny run (a sweep point)", "ddp": "one tiny 2-worker DDP run",
              "sweep": f"a {args.points}-point sweep of tiny runs"}  # fmt: skip
    for shape in ("point", "ddp", "sweep"):
        c, w = common.median(fixed[shape]["cold"]), common.median(fixed[shape]["warm"])
        cw, ww = common.median(walls[shape]["cold"]), common.median(walls[shape]["warm"])
        results["shapes"][shape] = {"fixed_s": fixed[shape], "wall_s": walls[shape], "median_fixed_s": [c, w]}
        rows.append([labels[shape], f"{cw:.2f}", f"{ww:.2f}", f"{c:.2f}", f"{w:.2f}", f"{cw / ww:.1f}x"])
    table = common.markdown_table(
        ["shape", "cold wall s", "warm wall s", "cold fixed s", "warm fixed s", "wall cold / warm"], rows
    )
    latest = [max(steps) for steps in results["first_step_s"]]
    notes = [
        f"medians of {args.repeats} repeats a side, interleaved; fixed = wall - the runs' training and evaluation",
        f"warm DDP: the last rank's first step {common.median(latest):.2f} s after its launcher started the first "
        f"worker (median of {len(latest)}; each: {common.fmt_list(latest)})",
        f"the warm server's own start (once per command, before the first fork answered): {server_start_s:.2f} s",
    ]
    return common.finish(NAME, args, machine, results, table, notes)


if __name__ == "__main__":
    main()
