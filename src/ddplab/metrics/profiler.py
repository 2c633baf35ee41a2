"""`--train.profile_steps N`: where a training step's time goes, from torch.profiler.

The window opens after the run's first SKIP_STEPS optimizer steps (they pay once-only costs:
allocator growth, cuDNN's algorithm search, lazy initialization), then one step the profiler
records and drops (its own start-up), then N steps it keeps. It counts optimizer steps
across epochs, so a window that reaches an epoch's end holds that epoch's evaluation too, as
it happened. Each rank writes its own files (a DDP profile is read for the rank that waits):

    profile/trace_rank{R}.json   the timeline: open it in https://ui.perfetto.dev or chrome://tracing
    profile/ops_rank{R}.txt      every op by self time (device time on CUDA, host time on a CPU)

and the run's summary names the ops that took the most. The profiler slows the steps it
records (a few microseconds per op): the epoch they fall in is slower than the run's others.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("ddplab")

SKIP_STEPS = 5
WARMUP_STEPS = 1
TOP_OPS = 5  # in the summary; the ops file lists them all
TABLE_ROWS = 60
OUTSIDE_OPS = "outside any op"  # the steps' own self time (the table's ProfilerStep*)


class StepProfiler:
    """A context around training; `step()` after every optimizer step; `result()` for the summary."""

    def __init__(self, steps: int, device: torch.device, rank: int, folder: Path):
        self.steps, self.device, self.rank, self.folder = steps, device, rank, Path(folder)
        self.seen = 0  # optimizer steps so far
        self.written: dict[str, Any] | None = None
        self._profile = None
        self._failed = False

    def __enter__(self) -> StepProfiler:
        from torch.profiler import ProfilerActivity, profile, schedule

        if self.device.type == "cpu":  # Kineto's start/stop banners on stderr; on CUDA its messages matter (CUPTI)
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        window = schedule(skip_first=SKIP_STEPS, wait=0, warmup=WARMUP_STEPS, active=self.steps, repeat=1)
        self._profile = profile(activities=activities, schedule=window, on_trace_ready=self._write)
        self._profile.__enter__()
        return self

    def step(self) -> None:
        self.seen += 1
        self._profile.step()

    def __exit__(self, *exc) -> None:
        self._failed = exc[0] is not None  # a failed run's partial window is not worth a second error
        self._profile.__exit__(*exc)

    def recorded_steps(self) -> int:
        return max(0, min(self.steps, self.seen - SKIP_STEPS - WARMUP_STEPS))

    def _write(self, prof) -> None:
        if self._failed or self.recorded_steps() == 0:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        trace, ops = self.folder / f"trace_rank{self.rank}.json", self.folder / f"ops_rank{self.rank}.txt"
        prof.export_chrome_trace(str(trace))
        averages = prof.key_averages()
        key = self_time_key(averages, self.device)
        ops.write_text(averages.table(sort_by=key, row_limit=TABLE_ROWS) + "\n")
        self.written = {"trace": trace.name, "ops": ops.name, "top_ops": top_ops(averages, key, self.recorded_steps())}

    def result(self) -> dict[str, Any]:
        """What the summary says of the profile: the window, the files, the ops that took the time."""
        first = SKIP_STEPS + WARMUP_STEPS + 1
        if self.written is None:
            why = (f"the run took {self.seen} optimizer steps; the window opens after step {first - 1}"
                   if self.recorded_steps() == 0 else "the run failed inside the window")
            return {"steps": 0, "written": False, "reason": why}
        return {"steps": self.recorded_steps(), "first_step": first, "folder": "profile",
                "time": "device" if self.device.type == "cuda" else "host", **self.written}


def self_time_key(averages, device: torch.device) -> str:
    """The sort key of an op's own time: the device's on CUDA (named self_cuda_* before torch 2.4's rename)."""
    if device.type != "cuda":
        return "self_cpu_time_total"
    return "self_device_time_total" if averages and hasattr(averages[0], "self_device_time_total") else "self_cuda_time_total"


def top_ops(averages, key: str, steps: int) -> list[dict[str, Any]]:
    """The ops with the most self time: milliseconds per recorded step and share of all ops' self time.

    The step's own marker holds, as its self time, what no op covers: Python, the loop, waiting.
    """
    times = [(OUTSIDE_OPS if event.key.startswith("ProfilerStep") else event.key, getattr(event, key), event.count)
             for event in averages]
    total = sum(t for _, t, _ in times) or 1.0
    times.sort(key=lambda row: row[1], reverse=True)
    return [{"op": name, "ms_per_step": round(t / 1000 / max(steps, 1), 4), "share": round(t / total, 4),
             "calls_per_step": round(calls / max(steps, 1), 2)} for name, t, calls in times[:TOP_OPS]]


def build_profiler(steps: int, device: torch.device, rank: int, run_dir: Path) -> StepProfiler | None:
    if not steps:
        return None
    log.info("profiling optimizer steps %d-%d with torch.profiler (they run slower for it): %s",
             SKIP_STEPS + WARMUP_STEPS + 1, SKIP_STEPS + WARMUP_STEPS + steps, Path(run_dir) / "profile")
    return StepProfiler(steps, device, rank, Path(run_dir) / "profile")
