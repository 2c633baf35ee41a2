"""Sharded, normalized, augmented batches cut from a dataset that lives whole on the device.

The uint8 dataset is copied to the device once; each batch is an `index_select` there,
converted to float, augmented and normalized in a few batched ops. No worker processes,
no pinned-memory copies, no per-sample Python: for small images this is far faster than
torch's DataLoader (the idea of airbench's CifarLoader), and on CPU it is the same code.

Which samples a rank sees follows `DistributedSampler` exactly (see `shard_indices`), so
ddplab's sharding can be compared with, and reasoned about like, PyTorch's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from ddplab.data.augment import Augmenter, AugmentSpec
from ddplab.data.dataset import ImageDataset
from ddplab.data.options import images_per_rank
from ddplab.seeding import derive_seed


def shard_indices(
    num_samples: int, *, epoch: int, seed: int, rank: int, world_size: int, shuffle: bool, pad: bool
) -> torch.Tensor:
    """The dataset indices rank `rank` reads in epoch `epoch` (int64, CPU).

    Same as `DistributedSampler(drop_last=False)` after `set_epoch(epoch)`: a permutation from
    a generator seeded with `seed + epoch`, identical on every rank, padded by wrapping around
    to a multiple of world_size when `pad` (training: equal step counts on all ranks), then
    every world_size-th index from `rank`. Without `pad` (evaluation) nothing is repeated, so
    the shards partition the dataset and may differ in length by one.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(num_samples, generator=g)
    else:
        indices = torch.arange(num_samples)
    if pad and num_samples > 0:
        total = math.ceil(num_samples / world_size) * world_size
        indices = indices.repeat(math.ceil(total / num_samples))[:total]
    return indices[rank::world_size].clone()


def augment_seed(seed: int, epoch: int, rank: int) -> int:
    """The augmentation generator's seed: a hash of (seed, epoch, rank), never their sum."""
    return derive_seed(seed, epoch, rank)


class DeviceLoader:
    """Iterates (x, y) batches for one rank: x float32 [B, C, H, W] normalized, y int64 [B].

    Training (`train=True`) shuffles with the epoch's shared permutation and pads shards to
    equal length; evaluation keeps dataset order and covers every sample exactly once over
    the ranks. Call `set_epoch` before each epoch; an epoch's batches, augmentation included,
    depend only on (seed, epoch, rank), which is what makes resuming at an epoch boundary exact.
    """

    def __init__(
        self,
        data: ImageDataset,
        *,
        batch_size: int,
        device: torch.device | str,
        train: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        augment: AugmentSpec | None = None,
        drop_last: bool = False,
        channels_last: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.device = torch.device(device)
        # uint8 on the device: 4x smaller than float, converted one batch at a time.
        self.images = data.images.to(self.device)
        self.labels = data.labels.to(self.device)
        c = data.images.shape[1]
        self.mean = torch.tensor(data.mean, dtype=torch.float32, device=self.device).view(1, c, 1, 1)
        self.std = torch.tensor(data.std, dtype=torch.float32, device=self.device).view(1, c, 1, 1)
        self.batch_size = batch_size
        self.train = train
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.channels_last = channels_last
        use_aug = train and augment is not None and not augment.is_identity()
        self.augmenter = Augmenter(augment) if use_aug and augment is not None else None
        self.epoch = 0
        self.flip_parity: torch.Tensor | None = None  # alternating flip: each image's epoch-1 choice
        if self.augmenter is not None and self.augmenter.spec.flip and self.augmenter.spec.flip_mode == "alternate":
            g = torch.Generator()
            g.manual_seed(derive_seed(seed, 0, 0, "flip"))  # the same on every rank: an image's flips agree
            self.flip_parity = torch.randint(0, 2, (len(self.labels),), generator=g, dtype=torch.uint8).to(self.device)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def num_samples(self) -> int:
        """Samples this rank reads this epoch (padding duplicates included when training)."""
        n, w = len(self.labels), self.world_size
        if self.train:
            return images_per_rank(n, w)
        return len(range(self.rank, n, w))

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)

    def indices(self) -> torch.Tensor:
        """This rank's dataset indices for the current epoch, on CPU."""
        return shard_indices(
            len(self.labels),
            epoch=self.epoch,
            seed=self.seed,
            rank=self.rank,
            world_size=self.world_size,
            shuffle=self.train,
            pad=self.train,
        )

    def generator(self) -> torch.Generator:
        """A fresh augmentation generator for this (seed, epoch, rank), on the device."""
        g = torch.Generator(device=self.device)
        g.manual_seed(augment_seed(self.seed, self.epoch, self.rank))
        return g

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        index = self.indices().to(self.device)  # one host-to-device copy per epoch
        gen = self.generator() if self.augmenter is not None else None
        for i in range(len(self)):
            batch = index[i * self.batch_size : (i + 1) * self.batch_size]
            yield self._make_batch(self.images.index_select(0, batch), gen, batch), self.labels.index_select(0, batch)

    def mirror_mask(self, batch: torch.Tensor) -> torch.Tensor | None:
        """Alternating flip: image i is mirrored in epochs where (its parity + epoch) is even."""
        if self.flip_parity is None:
            return None
        return (self.flip_parity.index_select(0, batch) + self.epoch) % 2 == 0

    def _make_batch(
        self, raw: torch.Tensor, gen: torch.Generator | None, batch: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = raw.float().div_(255)
        if self.augmenter is not None:
            assert gen is not None  # __iter__ makes one whenever there is an augmenter
            x = self.augmenter(x, gen, self.mirror_mask(batch) if batch is not None else None)
        x = x.sub_(self.mean).div_(self.std)
        if self.augmenter is not None:
            assert gen is not None
            x = self.augmenter.apply_cutout(x, gen)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x
