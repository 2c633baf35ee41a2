"""Sharded, normalized, augmented batches cut from a dataset that lives whole on the device.

The uint8 dataset is copied to the device once; each batch is an `index_select` there,
converted to float, augmented and normalized in a few batched ops. No worker processes,
no pinned-memory copies, no per-sample Python: for small images this is far faster than
torch's DataLoader (the idea of airbench's CifarLoader), and on CPU it is the same code.

Which samples a rank sees follows `DistributedSampler` exactly (see `shard_indices`), so
ddplab's sharding can be compared with, and reasoned about like, PyTorch's.

The data position is global: an epoch is one order of the whole set (its seed), and the
ranks' micro-batch m together take the next batch_size x world_size places of it, so after
any number of steps the job has consumed a prefix of that order. A run resumed from the
middle of an epoch, at this world size or another, continues the same order from there
(`set_epoch(epoch, start=...)`): no sample twice, none skipped. Its layout (`layout_world`
shards, the world size the run started with) can outlive its workers: a worker may carry
several shards ("virtual ranks"), each with its own augmentation stream, which is how a run
resumed on fewer workers trains the very micro-batches the undisturbed run would have.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from ddplab import faults
from ddplab.data.augment import Augmenter, AugmentSpec
from ddplab.data.dataset import ImageDataset
from ddplab.data.options import images_per_rank
from ddplab.seeding import derive_seed


def shard_indices(
    num_samples: int,
    *,
    epoch: int,
    seed: int,
    rank: int,
    world_size: int,
    shuffle: bool,
    pad: bool,
    start: int = 0,
) -> torch.Tensor:
    """The dataset indices rank `rank` reads in epoch `epoch` (int64, CPU).

    Same as `DistributedSampler(drop_last=False)` after `set_epoch(epoch)`: a permutation from
    a generator seeded with `seed + epoch`, identical on every rank, padded by wrapping around
    to a multiple of world_size when `pad` (training: equal step counts on all ranks), then
    every world_size-th index from `rank`. Without `pad` (evaluation) nothing is repeated, so
    the shards partition the dataset and may differ in length by one.

    `start`: the places of the epoch's order already consumed (a resume from the middle of
    an epoch); the rest is padded from the order's beginning, as the whole epoch is, so at
    the same world size the shards continue exactly where the undisturbed ones were.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if not 0 <= start < max(num_samples, 1) or (start and not pad):
        raise ValueError(f"need 0 <= start < {num_samples} (training only), got start={start}")
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(num_samples, generator=g)
    else:
        indices = torch.arange(num_samples)
    if pad and num_samples > 0:
        rest = num_samples - start
        padding = math.ceil(rest / world_size) * world_size - rest
        indices = torch.cat([indices[start:], indices.repeat(math.ceil(padding / num_samples))[:padding]])
    return indices[rank::world_size].clone()


def shards_of(rank: int, world_size: int, layout_world: int) -> tuple[int, ...]:
    """The data shards worker `rank` of `world_size` carries in a run laid out in `layout_world` of them: every
    world_size-th from its own rank (all of them on one worker; its own alone where the sizes agree)."""
    if not 1 <= world_size <= layout_world:
        raise ValueError(f"{world_size} workers cannot carry a run laid out in {layout_world} shards")
    return tuple(range(rank, layout_world, world_size))


def augment_seed(seed: int, epoch: int, rank: int) -> int:
    """The augmentation generator's seed: a hash of (seed, epoch, rank), never their sum."""
    return derive_seed(seed, epoch, rank)


class DeviceLoader:
    """Iterates (x, y) batches for one rank: x float32 [B, C, H, W] normalized, y int64 [B].

    Training (`train=True`) shuffles with the epoch's shared permutation and pads shards to
    equal length; evaluation keeps dataset order and covers every sample exactly once over
    the ranks. Call `set_epoch` before each epoch; an epoch's batches, augmentation included,
    depend only on (seed, epoch, shard), and a resume from its middle hands back the place and
    the augmentation streams it had reached (`position`, `stream_states`).
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
        # The run's shards (its first world size) and those this worker carries: (rank,) until a resize.
        self.layout_world = world_size
        self.shards: tuple[int, ...] = (rank,)
        self.drop_last = drop_last
        self.channels_last = channels_last
        use_aug = train and augment is not None and not augment.is_identity()
        self.augmenter = Augmenter(augment) if use_aug and augment is not None else None
        self.epoch = 0
        self.start = 0  # places of the epoch's order consumed before this session's part of it
        self.rounds = 0  # micro-batch rounds (one from each carried shard) handed out this epoch
        self.restored: dict[int, torch.Tensor] = {}  # augmentation streams to continue, by shard
        self.streams: dict[int, torch.Generator] = {}  # the epoch's live streams, by shard
        self.handed: list[torch.Tensor] | None = None  # a list: the indices handed out are kept (a test's record)
        self.flip_parity: torch.Tensor | None = None  # alternating flip: each image's epoch-1 choice
        if self.augmenter is not None and self.augmenter.spec.flip and self.augmenter.spec.flip_mode == "alternate":
            g = torch.Generator()
            g.manual_seed(derive_seed(seed, 0, 0, "flip"))  # the same on every rank: an image's flips agree
            self.flip_parity = torch.randint(0, 2, (len(self.labels),), generator=g, dtype=torch.uint8).to(self.device)

    def relayout(self, layout_world: int, shards: tuple[int, ...]) -> None:
        """Carry `shards` of a run laid out in `layout_world` (a run resumed at another world size)."""
        if not self.train or not shards or any(not 0 <= v < layout_world for v in shards):
            raise ValueError(f"need training shards in [0, {layout_world}), got {shards}")
        self.layout_world, self.shards = layout_world, tuple(shards)

    def set_epoch(self, epoch: int, start: int = 0, streams: dict[int, torch.Tensor] | None = None) -> None:
        """The epoch to iterate next; `start` places of its order already trained and the augmentation
        streams' states they had reached (a resume from the middle of it; a shard without one draws afresh)."""
        if not 0 <= start < max(len(self.labels), 1):
            raise ValueError(f"a data position is in [0, {len(self.labels)}), got {start}")
        self.epoch, self.start, self.restored = epoch, start, dict(streams or {})

    def position(self) -> int:
        """Places of the epoch's order the whole job has been handed (every rank, padding included)."""
        return self.start + self.rounds * self.batch_size * self.layout_world

    def stream_states(self) -> dict[int, torch.Tensor]:
        """Each carried shard's augmentation stream as it stands (host-side state: no device sync)."""
        return {v: g.get_state() for v, g in self.streams.items()}

    def shard_length(self) -> int:
        """Samples each shard reads this epoch (padding duplicates included when training)."""
        n = len(self.labels)
        if self.train:
            return images_per_rank(n - self.start, self.layout_world)
        return len(range(self.rank, n, self.world_size))

    @property
    def num_samples(self) -> int:
        """Samples this rank reads this epoch, over the shards it carries."""
        return self.shard_length() * len(self.shards)

    def rounds_per_epoch(self) -> int:
        if self.drop_last:
            return self.shard_length() // self.batch_size
        return math.ceil(self.shard_length() / self.batch_size)

    def __len__(self) -> int:
        """Micro-batches this rank reads this epoch: a round of one from each carried shard."""
        return self.rounds_per_epoch() * len(self.shards)

    def indices(self, shard: int | None = None) -> torch.Tensor:
        """A shard's dataset indices (this rank's own by default) for the current epoch, on CPU."""
        return shard_indices(
            len(self.labels),
            epoch=self.epoch,
            seed=self.seed,
            rank=self.shards[0] if shard is None else shard,
            world_size=self.layout_world if self.train else self.world_size,
            shuffle=self.train,
            pad=self.train,
            start=self.start,
        )

    def generator(self, shard: int | None = None) -> torch.Generator:
        """A shard's augmentation generator (this rank's by default): fresh for (seed, epoch, shard), or
        where the epoch resumes, as the stream had reached."""
        shard = self.shards[0] if shard is None else shard
        g = torch.Generator(device=self.device)
        if shard in self.restored:
            g.set_state(self.restored[shard])
        elif self.start:  # the epoch's rest in another layout: draws of their own, not a replay of its start
            g.manual_seed(derive_seed(self.seed, self.epoch, shard, self.start))
        else:
            g.manual_seed(augment_seed(self.seed, self.epoch, shard))
        return g

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        index = {v: self.indices(v).to(self.device) for v in self.shards}  # one host-to-device copy per epoch
        self.streams = {v: self.generator(v) for v in self.shards} if self.augmenter is not None else {}
        self.rounds = 0
        b = self.batch_size
        made = 0
        for m in range(self.rounds_per_epoch()):
            for i, v in enumerate(self.shards):
                made += 1
                if self.train:
                    faults.maybe_stall(self.rank, self.epoch, made)  # a test's stuck data path (ddplab/faults.py)
                batch = index[v][m * b : (m + 1) * b]
                x = self._make_batch(self.images.index_select(0, batch), self.streams.get(v), batch)
                if self.handed is not None:
                    self.handed.append(batch)
                if i == len(self.shards) - 1:
                    self.rounds = m + 1  # the round is handed out: position() counts it
                yield x, self.labels.index_select(0, batch)

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
