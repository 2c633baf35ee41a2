"""Each rank's own clock, every optimizer step: how long the step took, how long it waited for its data, and how
long the rank worked before it joined the step's first gradient all-reduce (metrics/stragglers.py reads them; the
wait in that all-reduce is read from every rank's join time, not measured here). That work is counted from the
moment the previous step's all-reduce released every rank together (the end of its backward), so whatever a rank
does between two all-reduces counts: its optimizer step, its logging, its data, its forward and backward; an
epoch's first step counts from its own start, after the evaluation's collectives. No host sync inside a step: on
CUDA each mark is an event recorded on the stream, and the epoch's events are read once, at its end; on a CPU a
mark is the host's clock, which is the device's.
"""

from __future__ import annotations

import math
import time

import torch


class StepClocks:
    """`begin` and `end` around each optimizer step; `fed` when its batches are in hand; `joined` from the DDP
    comm hook when the step's first gradient bucket is all-reduced (once a step; a call outside a step, as the
    communication probe's, is not counted); `released` when its backward, and so its all-reduce, is done; `take`
    at the epoch's end: (step_s, joined_s, data_s) per step, NaN where the rank joined none (or was not fed: a
    step with no `fed`)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[list] = []  # per step: [begin, fed, joined, released, end] (None: not marked), times or events
        self.open = False

    def now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin(self) -> None:
        self.marks.append([self.now(), None, None, None, None])
        self.open = True

    def fed(self) -> None:
        if self.open and self.marks[-1][1] is None:
            self.marks[-1][1] = self.now()

    def joined(self) -> None:
        if self.open and self.marks[-1][2] is None:
            self.marks[-1][2] = self.now()

    def released(self) -> None:
        if self.open and self.marks[-1][2] is not None:
            self.marks[-1][3] = self.now()

    def end(self) -> None:
        if self.open:
            self.marks[-1][4] = self.now()
            self.open = False

    def take(self) -> tuple[list[float], list[float], list[float]]:
        """This epoch's step, join and data times (seconds from the step's start), and a fresh start."""
        marks, self.marks, self.open = self.marks, [], False
        if self.cuda and marks and marks[-1][4] is not None:
            marks[-1][4].synchronize()  # the epoch's one wait, for its last event: every earlier one is done too
        step_s, joined_s, data_s = [], [], []
        before = None  # the previous step's release
        for begin, fed, joined, released, end in marks:
            step_s.append(self.seconds(begin, end))
            data_s.append(self.seconds(begin, fed))
            joined_s.append(self.seconds(before if before is not None else begin, joined))
            before = released
        return step_s, joined_s, data_s

    def seconds(self, start, stop) -> float:
        if stop is None:
            return math.nan
        return start.elapsed_time(stop) / 1000 if self.cuda else stop - start
