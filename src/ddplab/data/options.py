"""The data layer's vocabulary, and what is known of a dataset before any image is read.

Torch-free, and importing nothing of ddplab: the config validates user input against these
names and sizes (before a process is spawned, before torch is imported), and the data layer
reads them from here, so neither imports the other to learn them.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

DATASETS = ("cifar10", "cifar100", "stl10", "imagefolder", "synthetic")
FLIP_MODES = ("random", "alternate")
CIFAR100_LABELS = ("fine", "coarse")
CIFAR10_FORMATS = ("auto", "binary", "python")

OFFICIAL_SPLIT_SIZES = {"cifar10": (50_000, 10_000), "cifar100": (50_000, 10_000), "stl10": (5_000, 8_000)}
STL10_FOLDS, STL10_FOLD_SIZE = 10, 1_000  # a fold: 1,000 of the 5,000 labelled training images
SYNTHETIC_TRAIN_SIZE = 2048  # the synthetic test split is a quarter of the train size


def default_root() -> Path:
    """$DDPLAB_DATA if set, else ./data."""
    return Path(os.environ.get("DDPLAB_DATA") or "data").expanduser()


def training_images(
    dataset: str, *, subset: int | None = None, fold: int | None = None, synthetic_size: int | None = None
) -> int | None:
    """How many training images a run reads before any validation split, where that is known
    without reading the data (None for an image folder)."""
    if dataset == "synthetic":
        n = synthetic_size or SYNTHETIC_TRAIN_SIZE
    elif dataset == "stl10" and fold is not None:
        n = STL10_FOLD_SIZE
    elif dataset in OFFICIAL_SPLIT_SIZES:
        n = OFFICIAL_SPLIT_SIZES[dataset][0]
    else:
        return None
    return min(n, subset) if subset is not None else n


def images_per_rank(images: int, world_size: int) -> int:
    """The training images each rank reads in an epoch: the sampler pads the set to a multiple of
    the world size (data/loader.py), so every rank takes as many steps."""
    return math.ceil(images / world_size)
