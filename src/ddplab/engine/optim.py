"""Optimizers and per-step learning-rate schedules built from `OptimConfig`.

Every schedule steps once per optimizer step (not per epoch), so accumulation and world
size change the number of steps but never the shape of the curve over the run.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, OneCycleLR

from ddplab.config import OptimConfig


def build_optimizer(
    params, cfg: OptimConfig, device: torch.device | str = "cpu", *, capturable: bool = False
) -> Optimizer:
    """`capturable`: the update may be recorded in a CUDA graph (state and step count stay on the device)."""
    params = list(params)
    if cfg.name == "muon":
        from ddplab.engine.muon import Muon, split_params

        return Muon(
            split_params(params),
            lr=cfg.muon_lr,
            other_lr=cfg.lr,
            momentum=cfg.momentum if cfg.muon_momentum is None else cfg.muon_momentum,
            other_momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            weight_decay=cfg.weight_decay,
            ns_steps=cfg.muon_ns_steps,
            normalize=cfg.muon_normalize,
            normalize_every=cfg.muon_normalize_every,
            momentum_precision=cfg.muon_momentum_precision,
        )
    options: dict[str, tuple[type[Any], dict[str, Any]]] = {
        "sgd": (torch.optim.SGD, dict(momentum=cfg.momentum, nesterov=cfg.nesterov)),
        "adam": (torch.optim.Adam, dict(betas=tuple(cfg.betas), eps=cfg.eps)),
        "adamw": (torch.optim.AdamW, dict(betas=tuple(cfg.betas), eps=cfg.eps)),
        "rmsprop": (torch.optim.RMSprop, dict(alpha=cfg.alpha, eps=cfg.eps, momentum=cfg.momentum)),
    }
    cls, kwargs = options[cfg.name]
    if capturable and "capturable" in inspect.signature(cls).parameters:
        kwargs["capturable"] = True
    return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **kwargs, **fused_kwargs(cls, torch.device(device)))


def fused_kwargs(cls: type, device: torch.device) -> dict[str, bool]:
    """`fused=True` on CUDA where the optimizer has a fused kernel (Adam, AdamW; SGD from torch 2.3).

    One kernel for the whole update instead of several per parameter group, and with an fp16
    gradient scaler no device-to-host sync per step: the scaler hands its inf check to the
    kernel instead of reading it on the host.
    """
    if device.type != "cuda" or "fused" not in inspect.signature(cls).parameters:
        return {}
    return {"fused": True}


class _WarmupDecay:
    """Linear warm-up from ~0 to 1, then cosine or straight down from 1 to `min_ratio` (a picklable lambda)."""

    def __init__(self, warmup_steps: int, total_steps: int, min_ratio: float, shape: str = "cosine"):
        self.warmup_steps, self.total_steps, self.min_ratio, self.shape = warmup_steps, total_steps, min_ratio, shape

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        left = 1 - progress if self.shape == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return self.min_ratio + (1 - self.min_ratio) * left


class _StepDecay:
    def __init__(self, every_steps: int, gamma: float):
        self.every_steps, self.gamma = every_steps, gamma

    def __call__(self, step: int) -> float:
        return self.gamma ** (step // self.every_steps)


def _constant(step: int) -> float:
    return 1.0


def build_scheduler(optimizer: Optimizer, cfg: OptimConfig, *, epochs: int, steps_per_epoch: int) -> LRScheduler:
    total = epochs * steps_per_epoch
    warmup = min(total - 1, round(cfg.warmup_epochs * steps_per_epoch))
    if cfg.schedule == "onecycle":
        total = max(total, 2)
        # OneCycleLR divides by the length of each phase: keep both at least half a step long.
        pct = min(max(warmup, 1.5) / total, (total - 0.5) / total)
        peaks = [group["lr"] for group in optimizer.param_groups]  # Muon: its filters' rate and the others'
        return OneCycleLR(
            optimizer,
            max_lr=peaks,
            total_steps=total,
            pct_start=pct,
            anneal_strategy="linear",
            div_factor=10.0,
            final_div_factor=100.0,
            cycle_momentum=False,
        )
    if cfg.schedule in ("cosine", "linear"):
        return LambdaLR(optimizer, _WarmupDecay(max(warmup, 0), total, cfg.min_lr_ratio, cfg.schedule))
    if cfg.schedule == "step":
        return LambdaLR(optimizer, _StepDecay(cfg.step_epochs * steps_per_epoch, cfg.gamma))
    return LambdaLR(optimizer, _constant)
