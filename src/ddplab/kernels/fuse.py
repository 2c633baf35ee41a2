"""`fuse_conv_relu(model)`: swap every Conv2d -> ReLU pair of a model for one FusedConvReLU.

A pair is an nn.Conv2d followed, inside the same nn.Sequential, by an nn.ReLU with only
nn.Identity modules between them (the registry's nets put `norm2d(...)`, an Identity when
batchnorm is off, between conv and ReLU). The conv's slot gets a FusedConvReLU holding the
conv's own Parameters, the ReLU's slot gets an nn.Identity, and the Identities in between
stay. Parameter names, hence state dicts and checkpoints, are unchanged, and with the
reference backend the outputs and gradients are bit-identical (tested).

Not fused: a BatchNorm (or anything but Identity) between the conv and the ReLU, a conv
that FusedConvReLU does not support (groups > 1, non-zero padding modes, string padding),
Conv2d subclasses (they may override forward), and pairs outside an nn.Sequential, whose
forward() may use the conv's output elsewhere.
"""

from __future__ import annotations

from typing import TypeGuard

from torch import nn

from ddplab.kernels.conv_relu import FusedConvReLU


def _fusable_conv(module: nn.Module) -> TypeGuard[nn.Conv2d]:
    return type(module) is nn.Conv2d and FusedConvReLU.unsupported_reason(module) is None


def _relu_after(children: list[nn.Module], start: int) -> int | None:
    """Index of the nn.ReLU that follows position `start` across Identities only, else None."""
    for j in range(start + 1, len(children)):
        if isinstance(children[j], nn.ReLU):
            return j
        if not isinstance(children[j], nn.Identity):
            return None
    return None


def fuse_conv_relu(model: nn.Module, backend: str = "auto") -> int:
    """Fuse the Conv2d -> ReLU pairs of `model` in place; returns how many were fused."""
    fused = 0
    for module in list(model.modules()):  # a snapshot: the loop edits containers
        if not isinstance(module, nn.Sequential):
            continue
        names = list(module._modules)
        children = [module._modules[name] for name in names]
        for i, child in enumerate(children):
            if not _fusable_conv(child):
                continue
            j = _relu_after(children, i)
            if j is None:
                continue
            module._modules[names[i]] = FusedConvReLU.from_conv(child, backend=backend)
            module._modules[names[j]] = nn.Identity()
            children[j] = module._modules[names[j]]
            fused += 1
    return fused
