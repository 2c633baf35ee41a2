#!/usr/bin/env python3
"""airbench94_muon beside ddplab's speedrun preset (`speedrun.py --against airbench --airbench-file PATH`).

airbench94_muon.py is Keller Jordan's (github.com/KellerJordan/cifar10-airbench, MIT); ddplab carries none of it.
The user fetches the file at a commit this module knows (KNOWN: its sha256 names the commit), for example

    curl -LO https://raw.githubusercontent.com/KellerJordan/cifar10-airbench/f1c599c4af24aca803e3e65a6a7e52a502e09d0e/airbench94_muon.py

and the benchmark runs it unchanged. A file whose hash it does not know is refused unless told to go on
(--airbench-unverified); its figures are then labelled as that file's (a stand-in's), never airbench94_muon's.
What the comparison needs is done around the file at run time, and printed and saved with the figures
(RUN_TIME): its `import torchvision` answered by a module of two functions (Normalize written out; CIFAR10 refuses
to download: the data is never fetched), its data read from ./cifar10 (CifarLoader's own path) where the
benchmark writes both sides' images from ddplab's CIFAR-10, its `code` read from itself, and each run's time read
from the `time_seconds` its final print_training_details call is given.

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
import hashlib
import importlib.util
import json
import os
import selectors
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME = "airbench94_muon"
REPOSITORY = "https://github.com/KellerJordan/cifar10-airbench"
KNOWN = {  # the file's sha256 -> the commit it was fetched at (the file is the same at every commit since)
    "704e29251a5207d8aed8a35adf13f772ff386b90a712aaddc2a28854385b536e": "f1c599c4af24aca803e3e65a6a7e52a502e09d0e",
}
RUN_TIME = [
    "`import torchvision` answered by a module of two: transforms.Normalize (the same arithmetic, written out) and "
    "datasets.CIFAR10, which refuses to download",
    "the data read from ./cifar10, CifarLoader's own path, where the benchmark writes ddplab's CIFAR-10 images",
    "sys.argv[0] set to the file, so its `code` is its own source",
    "each run's time read from the time_seconds its final print_training_details(locals(), ...) call is given",
]
READY_TIMEOUT_S = 1800  # compiling with max-autotune and the warm-up run
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Reference:
    """The file a comparison ran: where, its sha256, and the commit that hash names (None: not a known one)."""

    path: Path
    sha256: str
    commit: str | None

    @property
    def label(self) -> str:
        """The name its figures go under: airbench's only for airbench's own file."""
        if self.commit is not None:
            return f"{NAME} @ {self.commit[:7]}"
        return f"stand-in {self.path.name} (sha256 {self.sha256[:12]}, not a known {NAME}.py)"

    def describe(self) -> dict[str, Any]:
        return {"name": self.label, "file": str(self.path), "sha256": self.sha256, "commit": self.commit,
                "repository": REPOSITORY if self.commit else None, "run_time_changes": RUN_TIME}  # fmt: skip


def identify(path: Path, *, unverified: bool = False) -> Reference:
    """`path` as the reference recipe: a ValueError saying what to do where it is missing, or where its hash is
    unknown and `unverified` does not say to go on."""
    if not path.is_file():
        raise ValueError(
            f"--airbench-file {path}: no such file; fetch {NAME}.py from {REPOSITORY} at "
            f"{next(iter(KNOWN.values()))} (benchmarks/_airbench.py says how)"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    ref = Reference(path, digest, KNOWN.get(digest))
    if ref.commit is None and not unverified:
        raise ValueError(
            f"--airbench-file {path}: sha256 {digest} is no {NAME}.py this benchmark knows (known: "
            + ", ".join(f"{h[:12]} at {c[:7]}" for h, c in KNOWN.items())
            + "); fetch it at that commit, or pass --airbench-unverified to run it as a stand-in"
        )
    return ref


def write_data(out: Path, dataset: str, data_dir: str | None, **options: Any) -> Path:
    """`out`/cifar10/train.pt and test.pt, airbench's format, from ddplab's `dataset` (options: load_dataset's);
    `out` is the folder airbench runs in (its CifarLoader reads the relative path cifar10)."""
    import torch

    from ddplab.data.datasets import load_dataset

    (out / "cifar10").mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        data = load_dataset(dataset, data_dir, split, progress=False, **options)
        images = data.images.permute(0, 2, 3, 1).contiguous()  # NCHW -> NHWC, as torchvision's CIFAR10.data
        torch.save(
            {"images": images, "labels": data.labels, "classes": list(data.classes)}, out / "cifar10" / f"{split}.pt"
        )
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


def torchvision_answered() -> types.ModuleType:
    """What airbench94_muon takes from torchvision (PyPI's torchvision does not import beside a CPU torch, and the
    data is never downloaded): transforms.Normalize, the same arithmetic as torchvision's on a tensor, and a CIFAR10
    that refuses, since the benchmark has written the files airbench would otherwise make from it."""
    import torch

    def normalize(mean, std):
        def apply(tensor):
            m = torch.as_tensor(mean, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
            s = torch.as_tensor(std, dtype=tensor.dtype, device=tensor.device).view(-1, 1, 1)
            return tensor.sub(m).div(s)

        return apply

    def cifar10(*args, **kwargs):
        raise RuntimeError("the benchmark writes cifar10/train.pt and test.pt from ddplab's CIFAR-10: none is missing")

    vision = types.ModuleType("torchvision")
    vision.transforms = types.ModuleType("torchvision.transforms")  # type: ignore[attr-defined]
    vision.transforms.Normalize = normalize  # type: ignore[attr-defined]
    vision.datasets = types.ModuleType("torchvision.datasets")  # type: ignore[attr-defined]
    vision.datasets.CIFAR10 = cifar10  # type: ignore[attr-defined]
    return vision


def serve(airbench_file: Path, data: Path, compile_mode: str) -> int:
    """The worker's side: compile, warm up, then one run per line of stdin, one JSON line each on stdout. The file
    runs unchanged; RUN_TIME says what is done around it."""
    airbench_file = airbench_file.resolve()  # before the working directory changes
    vision = torchvision_answered()
    sys.modules.update({"torchvision": vision, "torchvision.transforms": vision.transforms,
                        "torchvision.datasets": vision.datasets})  # fmt: skip
    os.chdir(data)  # CifarLoader("cifar10", ...) reads ./cifar10/{train,test}.pt
    sys.argv[0] = str(airbench_file)  # it reads its own source as `code`
    spec = importlib.util.spec_from_file_location(NAME, airbench_file)
    assert spec is not None and spec.loader is not None
    airbench = importlib.util.module_from_spec(spec)
    answers = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # airbench's tables go to the log
        spec.loader.exec_module(airbench)
        import torch

        finals: list[dict[str, Any]] = []
        printed = airbench.print_training_details

        def print_training_details(variables, is_final_entry):
            if is_final_entry:  # main's last call: its locals hold the run's time_seconds
                finals.append({"time_s": float(variables["time_seconds"])})
            return printed(variables, is_final_entry)

        airbench.print_training_details = print_training_details  # main looks the name up when it calls it
        model = airbench.CifarNet().cuda().to(memory_format=torch.channels_last)  # as its __main__ builds it
        model.compile(mode=compile_mode)
        airbench.main("warmup", model)
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        finals.clear()
        with contextlib.redirect_stdout(sys.stderr):
            acc = airbench.main(int(line), model)
        if len(finals) != 1:
            raise RuntimeError(f"{airbench_file} printed {len(finals)} final rows in a run: not {NAME}'s main")
        print(json.dumps({"acc": float(acc), **finals[0]}), file=answers, flush=True)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("airbench_file", type=Path)
    p.add_argument("data", type=Path)
    p.add_argument("--compile-mode", default="max-autotune", help="torch.compile's mode (airbench's own: max-autotune)")
    a = p.parse_args()
    sys.exit(serve(a.airbench_file, a.data, a.compile_mode))
