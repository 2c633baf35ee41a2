"""Where a parallel sweep's points run: cores split, GPUs never shared, nothing held with one slot (no GPU needed)."""

import argparse

import pytest

from ddplab.config import build_config
from ddplab.errors import ConfigError
from ddplab.io.arguments import AUTO, parallel_points
from ddplab.sweep.slots import Slot, SlotPool, gpus_needed, split_cores


def config(device="cuda", strategy="single", nproc=1, share=False, dp_gpus=0):
    dist = {"strategy": strategy, "nproc": nproc, "share_device": share, "dp_gpus": dp_gpus}
    return build_config({"train": {"device": device}, "dist": dist})


def test_cores_are_split_into_groups_that_differ_by_one_at_most():
    assert split_cores([0, 1, 2, 3, 4], 2) == [(0, 1, 2), (3, 4)]
    assert split_cores([4, 5], 2) == [(4,), (5,)]
    assert split_cores(list(range(8)), 3) == [(0, 1, 2), (3, 4, 5), (6, 7)]


def test_the_gpus_a_point_takes():
    assert gpus_needed(config(), 4) == 1
    assert gpus_needed(config(strategy="ddp", nproc=2), 4) == 2
    assert gpus_needed(config(strategy="ddp", nproc=2, share=True), 4) == 1  # workers share one GPU on purpose
    assert gpus_needed(config(strategy="dp"), 4) == 4
    assert gpus_needed(config(strategy="dp", dp_gpus=2), 4) == 2
    assert gpus_needed(config(device="cpu", strategy="ddp", nproc=2), 4) == 0
    assert gpus_needed(config(), 0) == 0


def test_one_slot_holds_nothing_and_renames_nothing():
    pool = SlotPool(1, cores=[0, 1], gpus=["0", "1"])
    slot = pool.take(config(strategy="ddp", nproc=2))
    assert slot == Slot() and slot.describe() == "the whole machine"
    assert slot.env({"OMP_NUM_THREADS": "2", "CUDA_VISIBLE_DEVICES": "0,1"}) == {
        "OMP_NUM_THREADS": "2",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    assert pool.take(config()) is None  # one point at a time
    pool.give_back(slot)
    assert pool.take(config()) == Slot()


def test_cpu_points_each_get_their_own_cores_and_wait_for_a_free_group():
    pool = SlotPool(2, cores=[0, 1, 2, 3], gpus=[])
    a, b = pool.take(config(device="cpu")), pool.take(config(device="cpu", strategy="ddp", nproc=2))
    assert (a.cores, b.cores) == ((0, 1), (2, 3)) and a.gpus == b.gpus == ()
    assert a.env({"OMP_NUM_THREADS": "4", "PATH": "x"}) == {"PATH": "x"}  # threads follow the cores held
    assert pool.take(config(device="cpu")) is None
    pool.give_back(a)
    assert pool.take(config(device="cpu")).cores == (0, 1)
    assert "up to 2 points at once, 2 CPU cores each" in SlotPool(2, cores=[0, 1, 2, 3], gpus=[]).describe()


def test_gpus_are_never_shared_and_keep_the_names_this_process_was_given():
    pool = SlotPool(4, cores=list(range(8)), gpus=["2", "5", "7"])
    ddp = pool.take(config(strategy="ddp", nproc=2))
    assert ddp.gpus == ("2", "5") and ddp.env({})["CUDA_VISIBLE_DEVICES"] == "2,5"
    assert ddp.cores == (0, 1, 2, 3)  # a group of cores per GPU: its two workers need their cores
    one = pool.take(config())
    assert one.gpus == ("7",) and one.describe() == "cores 4,5, GPU 7"
    assert pool.take(config()) is None  # a group of cores is free, no GPU is
    cpu = pool.take(config(device="cpu"))
    assert cpu.gpus == () and cpu.cores == (6, 7)  # a CPU point needs none
    pool.give_back(ddp)
    assert pool.take(config(strategy="dp")) is None  # DataParallel takes every GPU: it waits for GPU 7 too
    pool.give_back(one)
    pool.give_back(cpu)
    assert pool.free_gpus == ["2", "5", "7"] and pool.free_cores == [(0, 1), (2, 3), (4, 5), (6, 7)]
    everything = pool.take(config(strategy="dp"))
    assert everything.gpus == ("2", "5", "7") and everything.cores == tuple(range(6))


def test_a_point_that_names_its_gpu_is_refused_with_several_slots():
    SlotPool(1, cores=[0, 1], gpus=["0", "1"]).refuse_fixed_devices([("r", config(device="cuda:1"))])  # one slot: fine
    with pytest.raises(ConfigError, match="sweep run r asks for train.device=cuda:1: with --parallel"):
        SlotPool(2, cores=[0, 1], gpus=["0", "1"]).refuse_fixed_devices([("r", config(device="cuda:1"))])


def test_a_one_gpu_machine_runs_its_cuda_points_one_at_a_time_and_says_so():
    pool = SlotPool(2, cores=[0, 1], gpus=["0"])
    assert pool.take(config()).gpus == ("0",) and pool.take(config()) is None
    assert "(at most 1 one-GPU point(s) at a time)" in pool.describe()
    assert not SlotPool(2, cores=[0, 1], gpus=["0"]).fits(config(strategy="ddp", nproc=2))


def test_auto_is_one_point_per_gpu_and_one_at_a_time_on_a_cpu():
    assert SlotPool(AUTO, cores=list(range(16)), gpus=[str(i) for i in range(8)]).parallel == 8
    assert SlotPool(AUTO, cores=[0, 1], gpus=[str(i) for i in range(8)]).parallel == 2  # a core each at least
    assert SlotPool(AUTO, cores=[0, 1], gpus=[]).parallel == 1
    one_gpu = SlotPool(AUTO, cores=list(range(16)), gpus=["0"])
    assert one_gpu.parallel == 1 and one_gpu.describe() == (
        "one point at a time, each with the whole machine (--parallel auto: 1 GPU(s), 16 core(s))"
    )


def test_parallel_is_checked_before_anything_runs():
    assert parallel_points("3") == 3 and parallel_points("auto") == AUTO
    for bad in ("0", "-1", "x", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a number of points to run at once"):
            parallel_points(bad)
    with pytest.raises(ConfigError, match="--parallel 3: this process may use 2 CPU core"):
        SlotPool(3, cores=[0, 1], gpus=[])
