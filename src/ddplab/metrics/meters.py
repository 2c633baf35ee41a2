"""Running sums kept on the device, read once per epoch.

Loss and accuracy are accumulated as (loss x count, correct, count) so the global figure
is the all-reduced sum divided once (contract 1, STYLE rule 9). Reading them is a
device-to-host sync, so it happens at epoch end and at progress updates only.
"""

from __future__ import annotations

from typing import Any

import torch


class ClassificationMeter:
    def __init__(self, device: torch.device):
        # [loss_sum, correct] in float64 so sums over 50k samples stay exact; on the device.
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)
        self.count = 0  # known on the host: no tensor built from host data per batch

    def update(self, loss_sum: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> None:
        correct = (logits.argmax(dim=1) == targets).sum()
        self.sums += torch.stack([loss_sum.detach().double(), correct.double()])
        self.count += len(targets)

    def add(self, sums: torch.Tensor, count: int) -> None:
        """Fold in another meter's [loss_sum, correct] over `count` samples (a captured step's)."""
        self.sums += sums
        self.count += count

    def reduced(self, all_reduce_sum) -> dict[str, Any]:
        """Global loss, accuracy and count; `all_reduce_sum` sums a tensor over ranks."""
        count = torch.full((1,), float(self.count), dtype=torch.float64, device=self.sums.device)
        totals = all_reduce_sum(torch.cat([self.sums, count]))
        loss_sum, correct, count = totals.tolist()  # sync point
        count = max(count, 1.0)
        return {"loss": loss_sum / count, "acc": correct / count, "correct": int(correct), "count": int(count)}
