"""Sharding like DistributedSampler, exact normalization, and reproducible batches per (seed, epoch, rank)."""

import itertools
import math

import pytest
import torch
from torch.utils.data import DistributedSampler

from ddplab.data.augment import AugmentSpec
from ddplab.data.dataset import ImageDataset
from ddplab.data.loader import DeviceLoader, augment_seed, shard_indices, shards_of

CPU = torch.device("cpu")
AUG = AugmentSpec(crop_padding=2, flip=True, jitter=0.2, cutout=4)


def make_data(n: int = 50, c: int = 3, hw: int = 8) -> ImageDataset:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, c, hw, hw), dtype=torch.uint8, generator=g)
    # Label = index, so a batch's y says exactly which samples it holds.
    return ImageDataset(images, torch.arange(n), classes=[str(i) for i in range(n)])


def loader(data, **kw) -> DeviceLoader:
    kw.setdefault("batch_size", 8)
    kw.setdefault("train", True)
    return DeviceLoader(data, device=CPU, **kw)


def labels_seen(ld: DeviceLoader) -> list[int]:
    return torch.cat([y for _, y in ld]).tolist() if len(ld) else []


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 2, 5, 10, 17, 64])
@pytest.mark.parametrize("epoch", [0, 3])
def test_shard_indices_match_distributed_sampler(world_size, n, epoch):
    for rank in range(world_size):
        ref = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=7, drop_last=False)
        ref.set_epoch(epoch)
        ours = shard_indices(n, epoch=epoch, seed=7, rank=rank, world_size=world_size, shuffle=True, pad=True)
        assert ours.dtype == torch.int64 and ours.device.type == "cpu"
        assert ours.tolist() == list(ref)
        ref_plain = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False, drop_last=False)
        plain = shard_indices(n, epoch=epoch, seed=7, rank=rank, world_size=world_size, shuffle=False, pad=True)
        assert plain.tolist() == list(ref_plain)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [0, 1, 5, 17, 50])
def test_eval_shards_partition_the_dataset(world_size, n):
    shards = [
        shard_indices(n, epoch=0, seed=0, rank=r, world_size=world_size, shuffle=False, pad=False).tolist()
        for r in range(world_size)
    ]
    union = sum(shards, [])
    assert sorted(union) == list(range(n)), "every sample exactly once, no padded duplicates"
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_bad_rank_is_refused():
    with pytest.raises(ValueError):
        shard_indices(10, epoch=0, seed=0, rank=2, world_size=2, shuffle=True, pad=True)
    with pytest.raises(ValueError):
        loader(make_data(), rank=0, world_size=0)


def test_eval_loader_covers_each_sample_once_over_ranks():
    data = make_data(50)
    seen = []
    for rank in range(3):
        ld = loader(data, train=False, rank=rank, world_size=3, batch_size=5)
        got = labels_seen(ld)
        assert len(got) == ld.num_samples == len(range(rank, 50, 3))
        assert got == sorted(got), "evaluation keeps dataset order"
        seen += got
    assert sorted(seen) == list(range(50))


def test_train_shards_equal_length_and_same_permutation_on_every_rank():
    data, w = make_data(50), 4
    lds = [loader(data, rank=r, world_size=w) for r in range(w)]
    lens = {len(ld) for ld in lds}
    counts = {ld.num_samples for ld in lds}
    assert lens == {math.ceil(13 / 8)} and counts == {13}, "every rank takes the same number of steps"
    shards = [labels_seen(ld) for ld in lds]
    # Interleaving the ranks' shards rebuilds one shared permutation (plus wrap-around padding).
    interleaved = [shards[r][i] for i in range(13) for r in range(w)]
    assert sorted(set(interleaved)) == list(range(50))
    assert interleaved[50:] == interleaved[:2], "padding repeats the start, like DistributedSampler"
    for ld in lds:
        ld.set_epoch(1)
    again = [labels_seen(ld) for ld in lds]
    assert again != shards, "a new epoch gives a new order"
    assert [
        shard_indices(50, epoch=1, seed=0, rank=r, world_size=w, shuffle=True, pad=True).tolist() for r in range(w)
    ] == again


def test_permutation_differs_across_epochs():
    ld = loader(make_data(50), world_size=1)
    orders = []
    for epoch in range(3):
        ld.set_epoch(epoch)
        order = labels_seen(ld)
        assert sorted(order) == list(range(50))
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]


@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_cover_num_samples(drop_last):
    ld = loader(make_data(50), batch_size=8, drop_last=drop_last, train=False)
    sizes = [len(y) for _, y in ld]
    assert len(sizes) == len(ld)
    if drop_last:
        assert sizes == [8] * 6
    else:
        assert sizes == [8] * 6 + [2] and sum(sizes) == ld.num_samples == 50


def test_normalization_is_exact():
    data = make_data(20)
    ld = loader(data, train=False, batch_size=7)
    mean = torch.tensor(data.mean).view(1, 3, 1, 1)
    std = torch.tensor(data.std).view(1, 3, 1, 1)
    for x, y in ld:
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert x.shape == (len(y), 3, 8, 8)
        assert torch.allclose(x * std + mean, data.images[y].float() / 255, atol=1e-6, rtol=0)


def test_eval_and_identity_augment_are_not_augmented():
    data = make_data(20)
    plain = [x for x, _ in loader(data, train=False)]
    assert all(
        torch.equal(a, b) for a, b in zip(plain, (x for x, _ in loader(data, train=False, augment=AUG)), strict=True)
    )
    ld = loader(data, augment=AugmentSpec())
    assert ld.augmenter is None
    for x, y in ld:
        assert torch.equal(x, next(iter(loader(data.select(y), train=False, batch_size=len(y))))[0])


def test_same_seed_same_batches_and_resume_at_epoch_boundary():
    data = make_data(40)
    a = loader(data, augment=AUG, seed=3)
    b = loader(data, augment=AUG, seed=3)
    for _ in a:  # a has been through epoch 0; b starts cold, as a resumed run's loader does
        pass
    a.set_epoch(2)
    b.set_epoch(2)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    first = [x for x, _ in a]
    assert all(torch.equal(p, q) for p, q in zip(first, (x for x, _ in a), strict=True)), (
        "iterating an epoch twice repeats it"
    )


def test_different_seed_or_epoch_changes_augmentation():
    data = make_data(40)
    ref = [x for x, _ in loader(data, augment=AUG, seed=3)]
    other_seed = [x for x, _ in loader(data, augment=AUG, seed=4)]
    assert not all(torch.equal(p, q) for p, q in zip(ref, other_seed, strict=True))


def test_different_rank_gets_different_augmentation_draws():
    """Ranks hold different samples, so compare their draws on one shared input batch."""
    data = make_data(16)
    seeds = {augment_seed(0, e, r) for e in range(4) for r in range(4)}
    assert len(seeds) == 16 and all(0 <= s < 2**63 for s in seeds), "no (epoch, rank) collisions"
    assert augment_seed(0, 1, 0) != augment_seed(0, 0, 1)
    r0 = loader(data, augment=AUG, rank=0, world_size=2, batch_size=16)
    r1 = loader(data, augment=AUG, rank=1, world_size=2, batch_size=16)
    x = torch.rand(16, 3, 8, 8)
    assert not torch.equal(r0.augmenter(x, r0.generator()), r1.augmenter(x, r1.generator()))
    assert torch.equal(r0.augmenter(x, r0.generator()), r0.augmenter(x, r0.generator()))


def constant_data(n: int = 16) -> ImageDataset:
    """Identical images: any difference between batches comes from augmentation alone."""
    g = torch.Generator().manual_seed(1)
    image = torch.randint(0, 256, (1, 3, 8, 8), dtype=torch.uint8, generator=g)
    return ImageDataset(image.repeat(n, 1, 1, 1), torch.arange(n), classes=[str(i) for i in range(n)])


def test_loader_draws_depend_on_epoch_and_rank():
    data = constant_data()

    def first_batch(epoch: int, rank: int) -> torch.Tensor:
        ld = loader(data, augment=AUG, rank=rank, world_size=2, batch_size=8)
        ld.set_epoch(epoch)
        return next(iter(ld))[0]

    ref = first_batch(0, 0)
    assert torch.equal(ref, first_batch(0, 0))
    assert not torch.equal(ref, first_batch(0, 1)), "ranks must not share augmentation draws"
    assert not torch.equal(ref, first_batch(1, 0)), "epochs must not share augmentation draws"
    assert not torch.equal(first_batch(1, 0), first_batch(0, 1)), "seed+epoch+rank style collision"


def test_flip_in_the_loader_mirrors_some_images():
    data = make_data(32)
    plain = loader(data, seed=1, batch_size=32)
    flip = loader(data, seed=1, batch_size=32, augment=AugmentSpec(flip=True))
    (xp, _), (xf, _) = next(iter(plain)), next(iter(flip))
    same = (xf == xp).flatten(1).all(1)
    mirrored = (xf == xp.flip(3)).flatten(1).all(1)
    assert (same | mirrored).all() and same.any() and mirrored.any()


def test_augmented_train_batches_differ_from_plain_but_keep_labels():
    data = make_data(32)
    plain = loader(data, seed=1)
    aug = loader(data, seed=1, augment=AUG)
    for (xp, yp), (xa, ya) in zip(plain, aug, strict=True):
        assert torch.equal(yp, ya), "augmentation does not change which samples a batch holds"
        assert xa.shape == xp.shape and not torch.equal(xa, xp)


def test_cutout_comes_after_normalization_in_the_loader():
    """Squares are exact zeros of the normalized batch (the mean colour); the rest is untouched."""
    data = make_data(16, hw=12)
    plain = loader(data, seed=2, batch_size=16)
    cut = loader(data, seed=2, batch_size=16, augment=AugmentSpec(cutout=4))
    (xp, _), (xc, _) = next(iter(plain)), next(iter(cut))
    hole = (xc == 0).all(1)  # [B, H, W]
    assert (hole.flatten(1).sum(1) > 0).all(), "every image gets a square"
    assert torch.equal(xc.permute(1, 0, 2, 3)[:, ~hole], xp.permute(1, 0, 2, 3)[:, ~hole])


def test_keeps_uint8_on_device_and_channels_last():
    data = make_data(20)
    ld = loader(data, channels_last=True, augment=AUG)
    assert ld.images.dtype == torch.uint8
    x, _ = next(iter(ld))
    assert x.is_contiguous(memory_format=torch.channels_last)


def test_empty_eval_shard_yields_nothing():
    ld = loader(make_data(3), train=False, rank=3, world_size=4)
    assert ld.num_samples == 0 and len(ld) == 0 and labels_seen(ld) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.cuda
def test_cuda_batches_and_generator_live_on_the_device():
    dev = torch.device("cuda")
    ld = DeviceLoader(make_data(40), batch_size=8, device=dev, train=True, augment=AUG)
    x, y = next(iter(ld))
    assert x.device.type == "cuda" and y.device.type == "cuda" and ld.images.dtype == torch.uint8
    again, _ = next(iter(ld))
    assert torch.equal(x, again)


# ---- the data position: a prefix of the epoch's order, continued at any world size ----------------------------------


def handed_out(loaders, rounds: int) -> list[list[int]]:
    """The sample ids each loader hands out in its first `rounds` rounds (one micro-batch per shard it carries)."""
    return [[y.tolist() for _, y in itertools.islice(ld, rounds * len(ld.shards))] for ld in loaders]


def test_the_ranks_consume_a_prefix_of_the_epochs_order_and_a_resume_continues_it_at_any_world_size():
    """Labels are sample ids: the ranks' first rounds together are the order's first places, in any layout, and
    a loader started at that position (same world size, one worker carrying both shards, or three shards) hands
    out the rest: every sample once, the only repeats the padding a world size needs."""
    n, b = 23, 3
    data = ImageDataset(torch.zeros(n, 1, 2, 2, dtype=torch.uint8), torch.arange(n), classes=[str(i) for i in range(n)])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(5 + 1)).tolist()  # seed 5, epoch 1

    def at(world, rank, start=0, layout=None):
        ld = DeviceLoader(data, batch_size=b, device="cpu", train=True, seed=5, rank=rank, world_size=world)
        if layout is not None:
            ld.relayout(layout, shards_of(rank, world, layout))
        ld.set_epoch(1, start=start)
        return ld

    whole = [[y for batch in shard for y in batch] for shard in handed_out([at(2, 0), at(2, 1)], 99)]
    first = [at(2, 0), at(2, 1)]
    got = handed_out(first, 2)
    assert first[0].position() == first[1].position() == 12
    assert sorted(y for shard in got for batch in shard for y in batch) == sorted(order[:12])
    p = first[0].position()
    same = [[y for batch in shard for y in batch] for shard in handed_out([at(2, 0, p), at(2, 1, p)], 99)]
    assert [got[r][0] + got[r][1] + same[r] for r in range(2)] == whole  # the undisturbed shards, exactly
    carried = handed_out([at(1, 0, p, layout=2)], 99)[0]
    assert carried[0::2] == [whole[0][i : i + b] for i in range(6, len(whole[0]), b)]  # shard 0's micro-batches...
    assert carried[1::2] == [whole[1][i : i + b] for i in range(6, len(whole[1]), b)]  # ... and shard 1's, in turn
    three = [y for shard in handed_out([at(3, r, p) for r in range(3)], 99) for batch in shard for y in batch]
    assert sorted(three) == sorted(order[12:] + order[:1])  # 11 left, padded to 12 from the order's start
    odd = [y for shard in handed_out([at(2, r, 13) for r in range(2)], 99) for batch in shard for y in batch]
    assert sorted(odd) == sorted(order[13:] + order[:0])  # from any place (a layout that changed): 10 left, even
    with pytest.raises(ValueError, match=r"a data position is in \[0, 23\)"):
        at(2, 0).set_epoch(1, start=23)
    with pytest.raises(ValueError, match="cannot carry"):
        shards_of(0, 3, 2)


def test_a_resume_hands_the_augmentation_streams_back_so_the_rest_of_the_epoch_is_the_same():
    data = make_data(40)
    ref = loader(data, augment=AUG, batch_size=8)
    ref.set_epoch(1)
    whole = [x for x, _ in ref]
    first = loader(data, augment=AUG, batch_size=8)
    first.set_epoch(1)
    batches = iter(first)
    head = [next(batches)[0] for _ in range(2)]
    states, position = first.stream_states(), first.position()
    rest = loader(data, augment=AUG, batch_size=8)
    rest.set_epoch(1, start=position, streams=states)
    tail = [x for x, _ in rest]
    assert position == 16 and len(head) + len(tail) == len(whole)
    assert all(torch.equal(p, q) for p, q in zip(head + tail, whole, strict=True))
    fresh = loader(data, augment=AUG, batch_size=8)
    fresh.set_epoch(1, start=position)  # without the streams: other draws
    assert not torch.equal(next(iter(fresh))[0], whole[2])
