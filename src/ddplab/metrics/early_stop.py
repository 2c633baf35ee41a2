"""Early stopping on a global metric.

The metric is already reduced over ranks when it gets here, so every rank takes the same
decision and none is left waiting in a collective (PITFALLS row 5).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EarlyStopping:
    metric: str | None
    patience: int
    min_delta: float = 0.0
    best: float | None = None
    best_epoch: int = -1
    bad_epochs: int = 0

    @property
    def mode(self) -> str:
        return "max" if (self.metric or "").endswith("_acc") else "min"

    def improved(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, epoch: int, value: float | None) -> bool:
        """Record this epoch's value of the metric; True when training should stop."""
        if self.metric is None or value is None:
            return False
        value = float(value)
        if self.improved(value):
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs >= self.patience

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)
