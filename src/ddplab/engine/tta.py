"""Evaluation over a loader, each sample once, plain or with test-time augmentation (the mean of the logits
over mirrored and shifted views). The training loop's evaluation and `ddplab eval` both use it."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ddplab.distributed import DistContext
from ddplab.engine.precision import Precision
from ddplab.metrics.meters import ClassificationMeter


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, loader, precision: Precision, ctx: DistContext, tta: str = "none"
) -> dict[str, Any]:
    """Plain cross-entropy and accuracy over the whole evaluation set, each sample once.

    The loader shards without padding, so the all-reduced sums count every sample exactly
    once whatever the world size (contract 1). With test-time augmentation the loss and
    accuracy are those of the logits averaged over the views.
    """
    model.eval()
    meter = ClassificationMeter(ctx.device)
    for x, y in loader:
        with precision.autocast():
            views = tta_views(x, tta)
            logits = sum(w * model(v).float() for v, w in zip(views, tta_weights(tta), strict=True))
        meter.update(F.cross_entropy(logits, y, reduction="sum"), logits, y)
    return meter.reduced(ctx.all_reduce_sum)


def tta_views(x: torch.Tensor, mode: str) -> list[torch.Tensor]:
    """The batch, its mirror image, and (flip_translate) both shifted one pixel down-right and up-left."""
    if mode == "none":
        return [x]
    views = [x]
    if mode == "flip_translate":
        padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
        h, w = x.shape[-2:]
        views += [padded[..., :h, :w], padded[..., 2:, 2:]]
    return views + [v.flip(-1) for v in views]


def tta_weights(mode: str) -> list[float]:
    """Weights of `tta_views`' logits: the unshifted image counts as much as its two shifts together
    (as the speed records weigh them: a shift is the less likely view of a test image)."""
    return {"none": [1.0], "flip": [0.5, 0.5], "flip_translate": [0.25, 0.125, 0.125] * 2}[mode]
