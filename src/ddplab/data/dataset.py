"""The one in-memory form every dataset takes: uint8 images plus labels.

Whatever the file format, a dataset ends up as a contiguous uint8 tensor [N, C, H, W] and an
int64 label tensor [N]. That form is small enough to live whole on the training device
(CIFAR-10 is 150 MB), which is what lets the loader cut and augment batches there.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch


@dataclass
class ImageDataset:
    images: torch.Tensor  # uint8 [N, C, H, W]
    labels: torch.Tensor  # int64 [N], values in [0, len(classes))
    classes: list[str]
    name: str = ""
    # Per-channel statistics in [0, 1] pixel units, used to normalize batches.
    mean: tuple[float, ...] = field(default=())
    std: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise ValueError(f"images must be uint8 [N, C, H, W], got {self.images.dtype} {tuple(self.images.shape)}")
        if self.labels.dim() != 1 or len(self.labels) != len(self.images):
            raise ValueError(f"labels must be [N] with N={len(self.images)}, got {tuple(self.labels.shape)}")
        self.labels = self.labels.to(torch.int64)
        if not self.mean:
            self.mean, self.std = channel_stats(self.images)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        c, h, w = self.images.shape[1:]
        return (c, h, w)

    def select(self, index: torch.Tensor | slice, name: str | None = None) -> "ImageDataset":
        """A subset that keeps classes and normalization statistics of the parent."""
        return ImageDataset(
            images=self.images[index].contiguous(),
            labels=self.labels[index].contiguous(),
            classes=list(self.classes),
            name=name or self.name,
            mean=self.mean,
            std=self.std,
        )


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Population mean/std per channel in [0, 1] units, from 256-bin histograms.

    Exact (integer counts) and ~20x faster than summing floats: 0.3 s for CIFAR-10's train set.
    """
    c = images.shape[1]
    n = images.shape[0] * images.shape[2] * images.shape[3]
    if n == 0:
        return tuple([0.5] * c), tuple([0.25] * c)
    values = torch.arange(256, dtype=torch.float64) / 255.0

    def histogram(channel: int) -> torch.Tensor:
        return torch.bincount(images[:, channel].reshape(-1).cpu(), minlength=256).to(torch.float64)

    # bincount is single-threaded and releases the GIL: one thread per channel.
    with ThreadPoolExecutor(max_workers=c) as pool:
        hists = list(pool.map(histogram, range(c)))
    means, stds = [], []
    for hist in hists:
        mean = float((hist * values).sum() / n)
        var = float((hist * (values - mean) ** 2).sum() / n)
        means.append(round(mean, 6))
        stds.append(round(max(var, 1e-12) ** 0.5, 6))
    return tuple(means), tuple(stds)
