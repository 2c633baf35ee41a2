"""Where a training step's time goes, phase by phase (data, forward+backward, optimizer, ...)."""

from __future__ import annotations

import time

import torch

from ddplab.metrics.system import synchronize


class PhaseTimer:
    """Wall time per phase of a step, the device synchronized at each boundary of timed steps.

    The syncs stop the host from running ahead of a CUDA device, so each phase is charged
    its own work. On a GPU they would also stop the host from queueing the next step while
    the device works, so there only 1 step in `every` is timed and the epoch's totals are
    extrapolated from those steps; on a CPU, where a sync costs nothing, every step is.
    """

    def __init__(self, device: torch.device, enabled: bool, every: int = 1):
        self.device, self.enabled, self.every = device, enabled, every
        self.sums: dict[str, float] = {}
        self.timed_steps = 0
        self.active = False
        self.last = time.perf_counter()

    def begin_step(self, index: int) -> None:
        self.active = self.enabled and index % self.every == 0
        if self.active:
            synchronize(self.device)
            self.timed_steps += 1
            self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        if not self.active:
            return
        synchronize(self.device)
        now = time.perf_counter()
        self.sums[phase] = self.sums.get(phase, 0.0) + now - self.last
        self.last = now

    def totals(self, num_steps: int) -> dict[str, float]:
        """Each phase's seconds over the epoch's `num_steps` steps."""
        scale = num_steps / self.timed_steps if self.timed_steps else 0.0
        return {phase: seconds * scale for phase, seconds in self.sums.items()}
