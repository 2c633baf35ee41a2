#!/usr/bin/env python3
"""airbench94_muon beside ddplab's speedrun preset (`speedrun.py --against airbench`).

Both read the same images: airbench's data files (train.pt, test.pt: uint8 HWC images, int64 labels, class names,
as its CifarLoader reads them) are written from the dataset ddplab trains on. airbench runs as its own __main__
runs it: one process that compiles its model once, warms it up on a run of random labels, then trains run after
run on the same compiled model; here that process is a worker the benchmark asks for one run at a time (a line
on its stdin), so that its runs interleave with ddplab's. Each answer is one JSON line on its stdout: the run's
TTA test accuracy and its time, CUDA events around the whitening init, each epoch's training and the TTA
evaluation (the per-epoch evaluations between are outside it), which is what ddplab's `time.record_s` times.
Everything airbench prints goes to the worker's stderr (the benchmark's log).

    python benchmarks/_airbench.py AIRBENCH_FILE DATA_FOLDER [--compile-mode MODE]   (started by speedrun.py)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
AIRBENCH_FILE = BENCH / "airbench94_muon.py"
READY_TIMEOUT_S = 1800  # compiling with max-autotune and the warm-up run
RUN_TIMEOUT_S = 600


def write_data(out: Path, dataset: str, data_dir: str | None, **options: Any) -> Path:
    """`out`/train.pt and test.pt, airbench's format, from ddplab's `dataset` (options: load_dataset's)."""
    import torch

    from ddplab.data.datasets import load_dataset

    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        data = load_dataset(dataset, data_dir, split, progress=False, **options)
        images = data.images.permute(0, 2, 3, 1).contiguous()  # NCHW -> NHWC, as torchvision's CIFAR10.data
        torch.save({"images": images, "labels": data.labels, "classes": list(data.classes)}, out / f"{split}.pt")
    return out


class Worker:
    """The airbench process: started, warmed up, then asked for runs."""

    def __init__(self, airbench_file: Path, data: Path, log: Path, *, compile_mode: str, env: dict[str, str]):
        self.log = log.open("w")
        cmd = [sys.executable, str(Path(__file__).resolve()), str(airbench_file), str(data)]
        self.proc = subprocess.Popen(
            [*cmd, "--compile-mode", compile_mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self.answer(READY_TIMEOUT_S)  # {"ready": ...}: compiled and warmed up

    def answer(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                self.close()
                raise RuntimeError(f"airbench gave no answer within {timeout_s:.0f} s (its log: {self.log.name})")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"airbench ended (exit {code}); its log: {self.log.name}")
        return json.loads(line)

    def run(self, index: int) -> dict[str, Any]:
        """One airbench run: {"acc": TTA test accuracy, "time_s": its timed seconds, "wall_s": the request's}."""
        assert self.proc.stdin is not None
        start = time.perf_counter()
        self.proc.stdin.write(f"{index}\n")
        self.proc.stdin.flush()
        got = self.answer(RUN_TIMEOUT_S)
        return {**got, "wall_s": time.perf_counter() - start}

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def serve(airbench_file: Path, data: Path, compile_mode: str) -> int:
    """The worker's side: compile, warm up, then one run per line of stdin, one JSON line each on stdout."""
    os.environ["AIRBENCH_DATA"] = str(data)
    spec = importlib.util.spec_from_file_location("airbench94_muon", airbench_file)
    assert spec is not None and spec.loader is not None
    airbench = importlib.util.module_from_spec(spec)
    answers = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # airbench's tables go to the log
        spec.loader.exec_module(airbench)
        import torch

        model = airbench.CifarNet().cuda().to(memory_format=torch.channels_last)  # as its __main__ builds it
        model.compile(mode=compile_mode)
        airbench.main("warmup", model)
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        with contextlib.redirect_stdout(sys.stderr):
            acc, time_s = airbench.main(int(line), model)
        print(json.dumps({"acc": float(acc), "time_s": float(time_s)}), file=answers, flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("airbench_file", type=Path)
    p.add_argument("data", type=Path)
    p.add_argument("--compile-mode", default="max-autotune", help="torch.compile's mode (airbench's own: max-autotune)")
    a = p.parse_args()
    sys.exit(serve(a.airbench_file, a.data, a.compile_mode))
