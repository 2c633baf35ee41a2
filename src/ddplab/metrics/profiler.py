"""`--train.profile_steps N`: where a training step's time goes, from torch.profiler.

The window skips the session's first SKIP_STEPS optimizer steps (they pay once-only costs:
allocator growth, cuDNN's algorithm search, lazy initialization) and one more that the
profiler records and drops (its own start-up), then keeps up to N steps, all inside the
session's first epoch: an epoch's end would add its evaluation (and, under DDP, the
communication probe) to the last step. Each rank writes its own files, named after the
run's optimizer steps they hold, so a resumed run's profile does not replace an earlier one
(a DDP profile is read for the rank that waits):

    profile/trace_rank{R}_steps{A}-{B}.json   the timeline: https://ui.perfetto.dev or chrome://tracing
    profile/ops_rank{R}_steps{A}-{B}.txt      every op by self time (device time on CUDA, host on a CPU)

and the run's summary names the ops that took the most, with the step's wall time (and on
CUDA the share of it the GPU was busy). The profiler slows the steps it records (a few
microseconds per op): their epoch is slower than the run's others. A failure to profile is
a warning, never a lost run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from ddplab.io import files

log = logging.getLogger("ddplab")

SKIP_STEPS = 5
WARMUP_STEPS = 1
TOP_OPS = 5  # in the summary; the ops file lists them all
OUTSIDE_OPS = "outside any op"  # a CPU step's own self time: Python, the loop (the table's ProfilerStep*)
KERNELS_OUTSIDE_OPS = "kernels launched outside any op"  # on CUDA: e.g. a CUDA graph's replay
QUIET_KINETO = {"KINETO_LOG_LEVEL": "6"}  # its start/stop banners on a CPU; on CUDA its messages matter (CUPTI)


class StepProfiler:
    """A context around training; `step()` after every optimizer step; `result()` for the summary."""

    def __init__(
        self, steps: int, device: torch.device, rank: int, folder: Path, *, first_step: int, steps_per_epoch: int
    ):
        self.requested, self.device, self.rank, self.folder = steps, device, rank, Path(folder)
        self.first_step = first_step  # optimizer steps the run had taken before this session
        room = steps_per_epoch - SKIP_STEPS - WARMUP_STEPS
        self.steps = max(0, min(steps, room))
        self.too_short = (
            None
            if room > 0
            else (
                f"an epoch has {steps_per_epoch} optimizer steps; the window needs "
                f"{SKIP_STEPS + WARMUP_STEPS + 1} inside one"
            )
        )
        self.seen = 0  # this session's optimizer steps
        self.written: dict[str, Any] | None = None
        self.problem: str | None = None
        self._profile: torch.profiler.profile | None = None
        self._env: dict[str, str | None] = {}

    def window(self) -> tuple[int, int]:
        """The run's optimizer steps the window holds, counted from 1."""
        start = self.first_step + SKIP_STEPS + WARMUP_STEPS + 1
        return start, start + self.steps - 1

    def __enter__(self) -> StepProfiler:
        if self.steps == 0:
            return self
        from torch.profiler import ProfilerActivity, profile, schedule

        if self.device.type == "cpu":
            self._env = {k: os.environ.get(k) for k in QUIET_KINETO}
            for k, v in QUIET_KINETO.items():
                os.environ.setdefault(k, v)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        window = schedule(skip_first=SKIP_STEPS, wait=0, warmup=WARMUP_STEPS, active=self.steps, repeat=1)
        self._profile = profile(activities=activities, schedule=window, on_trace_ready=self._write)
        self._profile.__enter__()
        return self

    def step(self) -> None:
        self.seen += 1
        if self._profile is not None:
            self._profile.step()

    def __exit__(self, *exc) -> None:
        if self._profile is None:
            return
        profile = self._profile
        self._profile = None
        self.steps = min(self.steps, max(0, self.seen - SKIP_STEPS - WARMUP_STEPS))  # a run that ended early
        try:
            profile.__exit__(*exc)
        except Exception as error:  # noqa: BLE001 (an observer must not take the run down)
            self.failed(error)
        finally:
            for k, v in self._env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def failed(self, error: Exception) -> None:
        self.problem = f"profiling failed: {type(error).__name__}: {error}"
        log.warning("%s; the run goes on without its profile", self.problem)

    def _write(self, prof) -> None:
        if self.written is not None or self.steps == 0:
            return
        try:
            a, b = self.window()
            self.folder.mkdir(parents=True, exist_ok=True)
            tag = f"rank{self.rank}_steps{a}-{b}"
            trace, ops = self.folder / f"trace_{tag}.json", self.folder / f"ops_{tag}.txt"
            files.write_atomic(trace, lambda tmp: prof.export_chrome_trace(str(tmp)))
            averages = prof.key_averages()
            cuda = self.device.type == "cuda"
            files.write_text(
                ops,
                averages.table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total", row_limit=-1)
                + "\n",
            )
            self.written = {"trace": trace.name, "ops": ops.name, **step_figures(averages, cuda, self.steps)}
        except Exception as error:  # noqa: BLE001
            self.failed(error)

    def result(self) -> dict[str, Any]:
        """What the summary says of the profile: the window, the files, the ops that took the time."""
        if self.written is None:
            why = (
                self.problem
                or self.too_short
                or (
                    f"this session took {self.seen} optimizer steps; the window "
                    f"opens after its step {SKIP_STEPS + WARMUP_STEPS}"
                )
            )
            return {"steps": 0, "written": False, "reason": why}
        a, b = self.window()
        return {
            "steps": self.steps,
            "requested": self.requested,
            "first_step": a,
            "last_step": b,
            "folder": "profile",
            "time": "device" if self.device.type == "cuda" else "host",
            **self.written,
        }


def _is_cpu(event) -> bool:
    return getattr(event.device_type, "name", "CPU") == "CPU"


def step_figures(averages, cuda: bool, steps: int) -> dict[str, Any]:
    """The step's wall time, and the ops with the most self time per step with their share of it.

    On a CPU every row's self host time counts (the step's own row: the host time no op
    covers). On CUDA the time is the kernels': the total is summed over the kernel rows (not
    annotations, whose device "self time" is their whole span), and each op is charged the
    kernels it launched; what no op launched is named as such.
    """
    per_step = max(steps, 1)
    step_rows = [e for e in averages if e.key.startswith("ProfilerStep") and _is_cpu(e)]
    wall_us = sum(e.cpu_time_total for e in step_rows)
    if cuda:
        total = sum(
            e.self_device_time_total for e in averages if not _is_cpu(e) and not getattr(e, "is_user_annotation", False)
        )
        ops = [
            (e.key, e.self_device_time_total, e.count)
            for e in averages
            if _is_cpu(e) and not getattr(e, "is_user_annotation", False) and not e.key.startswith("ProfilerStep")
        ]
        outside = total - sum(t for _, t, _ in ops)
        if outside > 0:
            ops.append((KERNELS_OUTSIDE_OPS, outside, 0))
    else:
        ops = [
            (OUTSIDE_OPS if e.key.startswith("ProfilerStep") else e.key, e.self_cpu_time_total, e.count)
            for e in averages
        ]
        total = sum(t for _, t, _ in ops)
    ops.sort(key=lambda row: row[1], reverse=True)
    figures: dict[str, Any] = {"step_ms": round(wall_us / 1000 / per_step, 3)}
    if cuda:
        figures["device_busy_share"] = round(total / wall_us, 4) if wall_us else None
    figures["top_ops"] = [
        {
            "op": name,
            "ms_per_step": round(t / 1000 / per_step, 4),
            "share": round(t / (total or 1), 4),
            "calls_per_step": round(calls / per_step, 2),
        }
        for name, t, calls in ops[:TOP_OPS]
    ]
    return figures


def build_profiler(
    steps: int, device: torch.device, rank: int, run_dir: Path, *, first_step: int, steps_per_epoch: int
) -> StepProfiler | None:
    if not steps:
        return None
    profiler = StepProfiler(
        steps, device, rank, Path(run_dir) / "profile", first_step=first_step, steps_per_epoch=steps_per_epoch
    )
    if profiler.steps:
        a, b = profiler.window()
        fewer = (
            f" ({steps} asked; the window stays inside one epoch of {steps_per_epoch})"
            if profiler.steps < steps
            else ""
        )
        log.info(
            "profiling optimizer steps %d-%d with torch.profiler%s; they run slower for it: %s",
            a,
            b,
            fewer,
            profiler.folder,
        )
    return profiler
