"""Lookahead (Zhang et al., 2019): slow weights that follow the optimizer's fast ones at a distance.

Every `every` steps the slow weights move a fraction `alpha` of the way to the fast ones,
and the fast ones restart from there. It damps the noise of short, high-learning-rate runs
(the CIFAR-10 speed records use it). The slow weights are synced into the model at the end
of each epoch's training too, so evaluation and checkpoints see them and a resumed run
needs no extra state: at an epoch boundary slow and fast weights are equal.
"""

from __future__ import annotations

import torch


class Lookahead:
    def __init__(self, params, *, every: int, alpha: float):
        if every < 1 or not 0.0 < alpha <= 1.0:
            raise ValueError(f"Lookahead needs every >= 1 and alpha in (0, 1], got every={every}, alpha={alpha}")
        self.params = [p for p in params if p.requires_grad]
        self.every, self.alpha = every, alpha
        self.slow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def reset(self) -> None:
        """Slow weights := the model's (at the start of an epoch, e.g. after a resume)."""
        for slow, fast in zip(self.slow, self.params, strict=True):
            slow.copy_(fast)

    def after_step(self, step: int) -> None:
        if step % self.every == 0:
            self.sync()

    @torch.no_grad()
    def sync(self) -> None:
        for slow, fast in zip(self.slow, self.params, strict=True):
            slow.lerp_(fast, self.alpha)
            fast.copy_(slow)
