"""FastNet: a small, fast CIFAR net in the style of the speed records (airbench, ResNet-9).

stem conv3x3 (32) -> BN -> GELU, then three ConvGroups of widths 64/256/256, each
conv3x3 -> maxpool2 -> BN -> GELU -> conv3x3 -> BN -> GELU, then a global max pool and a
bias-free linear head whose logits are multiplied by a fixed 1/9.

What differs from airbench94, and why:
- The stem is a plain learned 3x3 conv (+BN, GELU) instead of a 2x2 conv initialized by
  whitening the training patches: a data-dependent init is training code, which models do
  not hold, and a padded 3x3 stem also works on images as small as 1x1.
- BatchNorm keeps PyTorch's defaults (affine, momentum 0.1, eps 1e-5) and convs keep the
  default init (no dirac init): the trainer's recipe, not the model, owns those speed tricks.
- The final pool is adaptive (global max over any H x W) rather than MaxPool2d(3) on 4x4.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from ddplab.errors import ConfigError
from ddplab.models.registry import norm2d, register_model, scale_channels

# airbench's `scaling_factor` (found by tuning there): a fixed softmax temperature. The
# global max of BN'd GELU outputs is positive and O(1) per feature (mean ~1.7 at init), so
# the raw logits start with a spread of ~1; divided by 9 (~0.1) the first predictions are
# near uniform, and the gradient into the head is scaled by 1/9 too, which keeps a short,
# high-learning-rate run from fitting overconfident logits early. A constant, not a parameter.
LOGIT_SCALE = 1 / 9


def _conv3x3(c_in: int, c_out: int, bias: bool) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=bias)


class ConvGroup(nn.Module):
    """conv3x3 -> maxpool2 -> BN -> GELU -> conv3x3 -> BN -> GELU.

    Pooling straight after the first conv (airbench's order) runs the norm and activation
    on 4x fewer pixels; ceil_mode keeps odd sizes whole and never reaches 0.
    """

    def __init__(
        self,
        c_in: int,
        c_out: int,
        batchnorm: bool,
        norm: Callable[[int], nn.Module] | None = None,
        ceil_mode: bool = True,
    ) -> None:
        super().__init__()
        norm = norm or partial(norm2d, batchnorm=batchnorm)
        self.conv1 = _conv3x3(c_in, c_out, bias=not batchnorm)
        self.pool = nn.MaxPool2d(2, ceil_mode=ceil_mode)
        self.norm1 = norm(c_out)
        self.conv2 = _conv3x3(c_out, c_out, bias=not batchnorm)
        self.norm2 = norm(c_out)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm1(self.pool(self.conv1(x))))
        return self.act(self.norm2(self.conv2(x)))


class FastNet(nn.Module):
    """Stem, ConvGroups, global max pool, dropout, bias-free linear head times LOGIT_SCALE."""

    def __init__(
        self,
        *,
        num_classes: int,
        in_channels: int,
        stem_width: int = 32,
        widths: tuple[int, ...] = (64, 256, 256),
        dropout: float,
        batchnorm: bool,
        norm: Callable[[int], nn.Module] | None = None,
        ceil_mode: bool = True,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            _conv3x3(in_channels, stem_width, bias=not batchnorm),
            norm2d(stem_width, batchnorm),
            nn.GELU(),
        )
        groups: list[nn.Module] = []
        c_in = stem_width
        for c_out in widths:
            groups.append(ConvGroup(c_in, c_out, batchnorm, norm, ceil_mode))
            c_in = c_out
        self.groups = nn.Sequential(*groups)
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(c_in, num_classes, bias=False)
        self.logit_scale = LOGIT_SCALE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.groups(self.stem(x))).flatten(1)
        return self.head(self.dropout(x)) * self.logit_scale


@register_model("fastnet")
def fastnet(
    *,
    num_classes: int,
    in_channels: int = 3,
    image_size: tuple[int, int] = (32, 32),
    width: float = 1.0,
    dropout: float = 0.0,
    batchnorm: bool = True,
) -> FastNet:
    """airbench-style net; `width` scales the stem (32) and group widths (64/256/256)."""
    del image_size  # the global max pool makes the net independent of the image size
    return FastNet(
        num_classes=num_classes,
        in_channels=in_channels,
        stem_width=scale_channels(32, width),
        widths=tuple(scale_channels(c, width) for c in (64, 256, 256)),
        dropout=dropout,
        batchnorm=batchnorm,
    )


# The speed records' head: logits = W x / width with W of unit standard deviation at the start,
# and an SGD rate for W 12.6x the one for the norm shifts (0.67 vs 0.053 there). SpeedNet writes
# the same function as W' x * s, W' = W / (width * s): an SGD step at rate r moves the logits by
# r * s^2 * (...), so with s = sqrt(12.6) / width one rate, the norm shifts', moves the head as
# the records' two did, step for step. One optimizer group instead of two, the same training.
HEAD_RATE_RATIO = 0.67 / 0.053
MIN_SPEEDNET_SIZE = 9  # pixels: 9 -> 8 after the stem -> 4 -> 2 -> 1


def speed_batchnorm(channels: int) -> nn.BatchNorm2d:
    """BatchNorm as the speed records set it: running statistics that follow the last few batches
    (momentum 0.4), eps 1e-12, and the scale frozen at 1 (only the shift trains: the next
    conv's filters set the scale, and Muon keeps their norm fixed)."""
    norm = nn.BatchNorm2d(channels, momentum=0.4, eps=1e-12)
    norm.weight.requires_grad_(False)
    return norm


class SpeedNet(FastNet):
    """FastNet's body behind a patch-whitening stem: the speedrun preset's net.

    The stem is a 2x2 convolution (no padding) with 2 x C x 4 output channels: each
    principal direction of the training set's 2x2 patches, scaled to unit variance, and
    its negative (so the GELU after it passes both signs). Its weights are set from the
    data by `ddplab.engine.data_init` (models hold no training code) and never trained (frozen
    here, so every count of trainable parameters agrees); at construction they are a random
    init, so the model also runs without it. Each group's
    convolutions start as partial identities (the first min(in, out) channels pass through
    unchanged), which lets a few-epoch run start from a net that forwards the whitened input.
    Norms are `speed_batchnorm`; pooling rounds down (31 -> 15 -> 7 -> 3 on CIFAR: a fifth
    fewer FLOPs than rounding up); the head is scaled as HEAD_RATE_RATIO says.
    """

    def __init__(self, *, num_classes: int, in_channels: int, widths: tuple[int, ...], dropout: float, batchnorm: bool):
        patch = 2
        super().__init__(
            num_classes=num_classes,
            in_channels=in_channels,
            stem_width=2 * in_channels * patch * patch,
            widths=widths,
            dropout=dropout,
            batchnorm=batchnorm,
            norm=speed_batchnorm if batchnorm else None,
            ceil_mode=False,
        )
        self.whitening = nn.Conv2d(
            in_channels, 2 * in_channels * patch * patch, kernel_size=patch, padding=0, bias=True
        )
        self.whitening.weight.requires_grad_(False)  # set from the training data (engine/data_init.py), never trained
        self.stem = nn.Sequential(self.whitening, nn.GELU())
        width = self.head.in_features
        self.logit_scale = math.sqrt(HEAD_RATE_RATIO) / width
        with torch.no_grad():
            for group in self.groups:
                assert isinstance(group, ConvGroup)
                for conv in (group.conv1, group.conv2):
                    n = min(conv.in_channels, conv.out_channels)
                    nn.init.dirac_(conv.weight[:n, :n])
            w = self.head.weight
            w.mul_(1 / (width * self.logit_scale) / w.std())  # W' = W / (width * s), W of unit std


@register_model("speednet")
def speednet(
    *,
    num_classes: int,
    in_channels: int = 3,
    image_size: tuple[int, int] = (32, 32),
    width: float = 1.0,
    dropout: float = 0.0,
    batchnorm: bool = True,
) -> SpeedNet:
    """FastNet with a data-whitened 2x2 stem and identity-initialized convs; `width` scales 64/256/256."""
    if min(image_size) < MIN_SPEEDNET_SIZE:
        raise ConfigError(
            f"speednet needs images of at least {MIN_SPEEDNET_SIZE}x{MIN_SPEEDNET_SIZE} pixels (a 2x2 stem "
            f"and three poolings that round down), got {image_size[0]}x{image_size[1]}"
        )
    return SpeedNet(
        num_classes=num_classes,
        in_channels=in_channels,
        widths=tuple(scale_channels(c, width) for c in (64, 256, 256)),
        dropout=dropout,
        batchnorm=batchnorm,
    )
