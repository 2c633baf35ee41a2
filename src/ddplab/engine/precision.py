"""Mixed precision: an autocast context and, for fp16, a gradient scaler.

fp32 master weights stay in the optimizer either way; only the forward pass runs in the
lower precision. fp16 needs loss scaling so small gradients do not flush to zero; bf16 has
fp32's exponent range and needs none.
"""

from __future__ import annotations

import contextlib

import torch

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, precision: str, device: torch.device, *, cache_casts: bool = True):
        """`cache_casts=False` under CUDA graph capture, where PyTorch asks for autocast without its cast cache."""
        self.precision = precision
        self.cache_casts = cache_casts
        self.device_type = device.type
        self.dtype = _DTYPES.get(precision)
        self.scaler = torch.amp.GradScaler(self.device_type) if precision == "fp16" else None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype, cache_enabled=self.cache_casts)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to true scale (needed before clipping; a fused step does it itself)."""
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)  # skips the step when gradients overflowed
            self.scaler.update()
        else:
            optimizer.step()

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler and state:
            self.scaler.load_state_dict(state)
