"""ResNet-18, CIFAR variant (He et al. 2016, as commonly adapted to 32x32 images).

The ImageNet stem (7x7 stride-2 conv + max pool) would shrink a 32x32 image to 8x8 before
the first block, so the stem is one 3x3 stride-1 conv without pooling. Then 4 stages of 2
BasicBlocks (64/128/256/512 channels, stride 2 from the second stage on), global average
pooling, dropout and a linear classifier. Any image size works: stride-2 convs with padding
1 never go below 1x1, and the pooling is adaptive.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ddplab.models.registry import norm2d, register_model, scale_channels


def _conv3x3(c_in: int, c_out: int, stride: int, bias: bool) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=bias)


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus a shortcut (1x1 conv + BN when the shape changes), ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int, batchnorm: bool) -> None:
        super().__init__()
        # Without BatchNorm (Identity) the convs get their bias back.
        self.conv1 = _conv3x3(c_in, c_out, stride, bias=not batchnorm)
        self.bn1 = norm2d(c_out, batchnorm)
        self.conv2 = _conv3x3(c_out, c_out, 1, bias=not batchnorm)
        self.bn2 = norm2d(c_out, batchnorm)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, kernel_size=1, stride=stride, bias=not batchnorm),
                norm2d(c_out, batchnorm),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet of BasicBlocks; `widths[i]` channels and `depths[i]` blocks in stage i."""

    def __init__(
        self,
        *,
        num_classes: int,
        in_channels: int,
        widths: tuple[int, ...] = (64, 128, 256, 512),
        depths: tuple[int, ...] = (2, 2, 2, 2),
        dropout: float,
        batchnorm: bool,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            _conv3x3(in_channels, widths[0], 1, bias=not batchnorm),
            norm2d(widths[0], batchnorm),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        c_in = widths[0]
        for i, (c_out, depth) in enumerate(zip(widths, depths, strict=True)):
            blocks = [BasicBlock(c_in, c_out, 1 if i == 0 else 2, batchnorm)]
            blocks += [BasicBlock(c_out, c_out, 1, batchnorm) for _ in range(depth - 1)]
            stages.append(nn.Sequential(*blocks))
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.stages(self.stem(x))).flatten(1)
        return self.fc(self.dropout(x))


@register_model("resnet18")
def resnet18(
    *,
    num_classes: int,
    in_channels: int = 3,
    image_size: tuple[int, int] = (32, 32),
    width: float = 1.0,
    dropout: float = 0.0,
    batchnorm: bool = True,
) -> ResNet:
    """ResNet-18 for small images; `width` scales the four stage widths (64/128/256/512)."""
    del image_size  # global average pooling makes the net independent of the image size
    return ResNet(
        num_classes=num_classes,
        in_channels=in_channels,
        widths=tuple(scale_channels(c, width) for c in (64, 128, 256, 512)),
        dropout=dropout,
        batchnorm=batchnorm,
    )
