"""The VGG-like ConvNet of seed report D.

[3->32, 32->64, pool], [64->128, 128->256, pool], [256->256, 256->256, pool], every conv
3x3 pad 1 followed by (optional BatchNorm and) ReLU; then Linear 256*(H/8)*(W/8) -> 256 ->
32 -> num_classes with ReLU between (4096 -> 256 at 32x32, as in the report).
"""

from __future__ import annotations

import torch
from torch import nn

from ddplab.models.registry import check_image_size, norm2d, pooled_size, register_model, scale_channels

_STAGES = ((32, 64), (128, 256), (256, 256))


class VGGSmall(nn.Module):
    """Three stages of two convs and a ceil-mode max pool, then a three-layer MLP head.

    The head is sized for `image_size` at construction (see `pooled_size` for odd sizes).
    Dropout, when set, follows the 256-unit hidden layer: the layer right after the
    flattened features, which holds most of the head's parameters.
    """

    def __init__(
        self,
        *,
        num_classes: int,
        in_channels: int,
        image_size: tuple[int, int],
        stages: tuple[tuple[int, int], ...] = _STAGES,
        hidden: tuple[int, int] = (256, 32),
        dropout: float,
        batchnorm: bool,
    ) -> None:
        super().__init__()
        self.image_size = tuple(image_size)
        layers: list[nn.Module] = []
        c_in = in_channels
        for stage in stages:
            for c_out in stage:
                layers += [
                    nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=not batchnorm),
                    norm2d(c_out, batchnorm),
                    nn.ReLU(inplace=True),
                ]
                c_in = c_out
            layers.append(nn.MaxPool2d(2, ceil_mode=True))
        self.features = nn.Sequential(*layers)
        h, w = (pooled_size(s, len(stages)) for s in self.image_size)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c_in * h * w, hidden[0]),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden[0], hidden[1]),
            nn.ReLU(inplace=True),
            nn.Linear(hidden[1], num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_image_size(self, x)
        return self.classifier(self.features(x))


@register_model("vgg_small")
def vgg_small(
    *,
    num_classes: int,
    in_channels: int = 3,
    image_size: tuple[int, int] = (32, 32),
    width: float = 1.0,
    # Report D's baseline had neither dropout nor BatchNorm (77.5% test in 20 epochs) and is
    # the baseline to reproduce; its regularized run added both: dropout=0.5, batchnorm=true.
    dropout: float = 0.0,
    batchnorm: bool = False,
) -> VGGSmall:
    """Seed report D's VGG-like net; `width` scales every conv and hidden FC width."""
    return VGGSmall(
        num_classes=num_classes,
        in_channels=in_channels,
        image_size=image_size,
        stages=tuple((scale_channels(a, width), scale_channels(b, width)) for a, b in _STAGES),
        hidden=(scale_channels(256, width), scale_channels(32, width)),
        dropout=dropout,
        batchnorm=batchnorm,
    )
