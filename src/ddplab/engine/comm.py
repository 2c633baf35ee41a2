"""What a DDP step's gradient all-reduce costs: DDP's own timers over an epoch, and the part backward waits for.

Both only where the time breakdown is on. DDP records a step's timings at the next synced forward, so an
epoch's window runs from just after its first step (whose forward recorded the step before it: the previous
epoch's last probe step) to its end: the epoch's steps but the last, none of the probe's. A captured step
never runs DDP's Python forward, so DDP times nothing of it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import torch

from ddplab import compat
from ddplab.distributed import DistContext, ddp_module, no_sync
from ddplab.metrics.system import Stopwatch


class CommTimers:
    """DDP's timers for one model, timing the steps the time breakdown times (`every`: each on a CPU, 1 in 20
    on CUDA)."""

    def __init__(self, model: torch.nn.Module, ctx: DistContext, *, every: int):
        self.model, self.device, self.distributed = model, ctx.device, ctx.is_distributed
        self.ddp = ddp_module(model)
        self.sample_every = compat.sample_ddp_every(self.ddp, every) if self.ddp is not None else 0

    def totals(self) -> dict[str, float] | None:
        """DDP's timing totals so far (taken after an epoch's first step, where its window starts)."""
        return compat.ddp_timing_totals(self.ddp, self.sample_every) if self.ddp is not None else None

    def epoch_means(self, start: dict[str, float] | None, *, captured: bool) -> dict[str, float]:
        """Each rank's DDP timings over this epoch's steps since `start`, NaN where none were timed: the same
        keys on every rank, as the loop gathers them; none for a model that is not DDP."""
        if self.ddp is None or not self.distributed:
            return {}
        means = None if captured else compat.ddp_epoch_means(start, self.totals())
        return means or dict.fromkeys(compat.DDP_TIMINGS, math.nan)

    def wait_per_step(
        self,
        micro_batch: tuple[torch.Tensor, torch.Tensor],
        forward_backward: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], object],
        zero_grad: Callable[[], None],
        repeats: int = 3,
    ) -> float:
        """Seconds per step that backward spends waiting for the gradient all-reduce.

        DDP overlaps the all-reduce with backward, so it cannot be timed on its own: the same step is timed
        with and without gradient sync and the difference is the part communication did not hide. Runs in eval
        mode and discards the gradients, so it changes no state (BatchNorm statistics, RNG, weights).
        """
        if not self.distributed or self.ddp is None:
            return 0.0
        was_training = self.model.training
        self.model.eval()
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(repeats):
            for sync in (True, False):
                clock = Stopwatch(self.device).start()
                with no_sync(self.model, skip_sync=not sync):
                    forward_backward([micro_batch])
                times[sync].append(clock.stop())
                zero_grad()
        self.model.train(was_training)
        return max(0.0, statistics.median(times[True]) - statistics.median(times[False]))
