"""Custom kernels, each opt-in and each checked against a pure-PyTorch reference.

    rgb_to_gray(x, impl="torch")      # impl: python_loop | torch | triton | cuda
    fused_conv_relu(x, weight, bias, stride, padding, dilation)
    FusedConvReLU(...), FusedConvReLU.from_conv(conv)
    fuse_conv_relu(model) -> int      # Conv2d -> ReLU pairs swapped for FusedConvReLU
    available_impls(device)           # what can run here, and why not

The ops are registered as `torch.ops.ddplab.rgb_to_gray` and `torch.ops.ddplab.conv_relu`
(torch.library.custom_op with fake and autograd registrations). Triton is optional
(`pip install 'ddplab[kernels]'`): without it, or on CPU without TRITON_INTERPRET=1, the
conv falls back to the reference path (see conv_relu.py for the exact rule). NOTES.md
beside this file holds the roofline numbers and measured times.
"""

from __future__ import annotations

import torch

from ddplab.kernels import conv_relu as _conv_relu
from ddplab.kernels import rgb_to_gray as _rgb_to_gray
from ddplab.kernels.conv_relu import FusedConvReLU, fused_conv_relu
from ddplab.kernels.fuse import fuse_conv_relu
from ddplab.kernels.rgb_to_gray import IMPLS as GRAY_IMPLS
from ddplab.kernels.rgb_to_gray import rgb_to_gray


def available_impls(device: torch.device | str | None = None) -> dict[str, dict[str, str | None]]:
    """Per op, each implementation -> None when it can run on `device`, else the reason why not.

    `device` defaults to "cuda" when a GPU is visible, else "cpu". Example on a CPU machine:
    {"rgb_to_gray": {"python_loop": None, "torch": None, "triton": "CPU tensors need
    TRITON_INTERPRET=1 ...", "cuda": "no CUDA device ..."}, "conv_relu": {"reference": None,
    "triton": "..."}}.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return {
        "rgb_to_gray": {impl: _rgb_to_gray.unavailable_reason(impl, device) for impl in GRAY_IMPLS},
        "conv_relu": {"reference": None, "triton": _conv_relu.triton_unavailable_reason(device)},
    }


__all__ = ["FusedConvReLU", "available_impls", "fuse_conv_relu", "fused_conv_relu", "rgb_to_gray"]
