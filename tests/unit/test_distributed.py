"""Pieces of the distributed plumbing that run in one process."""

import torch
import torch.distributed as dist
import torch.nn as nn

from ddplab.distributed import ddp_module, no_sync, route_address, unwrap


def test_no_sync_reaches_ddp_through_torch_compile(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
        compiled = torch.compile(ddp)  # compiles lazily: nothing is compiled here
        assert ddp_module(compiled) is ddp and unwrap(compiled) is ddp.module
        ddp.require_backward_grad_sync = True
        with no_sync(compiled, skip_sync=True):
            assert ddp.require_backward_grad_sync is False  # accumulation skips the all-reduce
        assert ddp.require_backward_grad_sync is True
        assert ddp_module(nn.Linear(2, 2)) is None
    finally:
        dist.destroy_process_group()


def test_route_address_of_loopback():
    assert route_address("127.0.0.1:29500") == "127.0.0.1"
    assert route_address(None) is None


def test_cpu_workers_of_one_node_split_its_cores(monkeypatch):
    import os

    from ddplab.distributed import maybe_share_cores

    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(os, "cpu_count", lambda: 16)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
        maybe_share_cores(torch.device("cpu"))
        assert torch.get_num_threads() == 4
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice wins
        torch.set_num_threads(7)
        maybe_share_cores(torch.device("cpu"))
        assert torch.get_num_threads() == 7
    finally:
        torch.set_num_threads(before)


def test_compile_mode_reaches_torch_compile(monkeypatch):
    from conftest import tiny_config
    from ddplab.distributed import DistContext, wrap_model

    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: seen.append(kwargs) or model)
    for mode, expected in (("default", None), ("reduce-overhead", "reduce-overhead"), ("max-autotune", "max-autotune")):
        wrap_model(nn.Linear(2, 2), tiny_config(model={"compile": True, "compile_mode": mode}), DistContext())
        assert seen.pop() == {"mode": expected}
