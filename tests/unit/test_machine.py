"""A config against this machine: what it has (CUDA devices, MPI, the data folder) decides, one ConfigError each."""

import pytest
import torch

from ddplab.config import build_config
from ddplab.errors import ConfigError
from ddplab.machine import check_environment, too_many_processes


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
@pytest.mark.parametrize(
    "values, field",
    [
        ({"dist": {"backend": "nccl"}}, "dist.backend"),
        ({"train": {"device": "cuda"}}, "train.device"),
        ({"data": {"data_dir": "/no/such/folder"}}, "data.data_dir"),
        ({"data": {"dataset": "imagefolder"}}, "data.data_dir"),
        ({"dist": {"strategy": "dp"}}, "dist.strategy"),
        ({"dist": {"comm_hook": "bf16"}}, "dist.comm_hook"),
        ({"dist": {"sync_bn": True}}, "dist.sync_bn"),
        ({"dist": {"backend": "mpi"}}, "dist.backend"),
    ],
)
def test_machine_checks(values, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        check_environment(build_config(values))


def test_reduce_overhead_with_accumulation_is_refused_on_cuda_only(monkeypatch):
    """Under reduce-overhead the next micro-batch's backward replay overwrote the gradients it accumulated into
    (H200, torch 2.11); on a CPU there is no CUDA graph and accumulation works."""
    values = {"model": {"compile": True, "compile_mode": "reduce-overhead"}, "train": {"accumulate": 2}}
    check_environment(build_config({**values, "train": {"accumulate": 2, "device": "cpu"}}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"train\.accumulate=2 .*reduce-overhead on CUDA .*--train\.cuda_graphs"):
        check_environment(build_config(values))
    check_environment(build_config({**values, "train": {"accumulate": 1}}))
    check_environment(build_config({**values, "model": {"compile": True}}))


def test_dataparallel_takes_the_gpus_it_is_given_and_is_refused_more_than_the_node_has(monkeypatch):
    """The assignment's "dp x2" ran DataParallel over the one GPU of a 1-GPU machine (H100, 2026-11-26) and the
    report set it against one device as if it were two: --dist.dp_gpus 2 makes it a point that machine skips."""
    from ddplab.distributed import dp_device_ids

    with pytest.raises(ConfigError, match=r"dist\.dp_gpus=2 .*applies with --strategy dp"):
        build_config({"dist": {"dp_gpus": 2}})
    with pytest.raises(ConfigError, match=r"dist\.dp_gpus=-1"):
        build_config({"dist": {"strategy": "dp", "dp_gpus": -1}})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    two = build_config({"dist": {"strategy": "dp", "dp_gpus": 2}})
    with pytest.raises(ConfigError, match=r"dist\.dp_gpus=2 .*this node has 1 CUDA device"):
        check_environment(two)
    every = build_config({"dist": {"strategy": "dp"}})
    check_environment(every)  # nn.DataParallel's own default: every visible GPU, here one
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    check_environment(two)
    assert dp_device_ids(two) == [0, 1] and dp_device_ids(every) == [0, 1, 2, 3]


def test_a_node_holds_the_workers_its_memory_and_process_limit_allow(monkeypatch):
    """Any count a CPU can start is allowed (they share the cores); a typo's 10^11 is not, and says why."""
    import resource

    assert too_many_processes(2) == ""
    monkeypatch.setattr(resource, "getrlimit", lambda _: (64, 64))
    assert too_many_processes(65) == "this user may start at most 64 processes (ulimit -u)"
    monkeypatch.setattr(resource, "getrlimit", lambda _: (resource.RLIM_INFINITY,) * 2)
    assert too_many_processes(10**11).startswith("each worker process holds about 200 MiB")
