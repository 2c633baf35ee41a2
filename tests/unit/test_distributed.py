"""Pieces of the distributed plumbing that run in one process."""

import inspect
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from ddplab.distributed import ddp_module, no_sync, route_address, unwrap


@pytest.mark.slow(why="torch.compile compiles a DDP model")
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


def test_cpu_workers_of_one_node_split_the_cores_they_may_use(monkeypatch):
    import os

    from ddplab.distributed import set_cpu_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the machine's cores: not the ones this process may use
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        set_cpu_threads(torch.device("cpu"), local_world=4)
        assert torch.get_num_threads() == 4
        set_cpu_threads(torch.device("cpu"), threads=3, local_world=4)  # --train.threads wins
        assert torch.get_num_threads() == 3
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's environment wins over the split
        torch.set_num_threads(7)
        set_cpu_threads(torch.device("cpu"), local_world=4)
        assert torch.get_num_threads() == 7
        set_cpu_threads(torch.device("cuda"), threads=2)  # nothing to do for a GPU process
        assert torch.get_num_threads() == 7
    finally:
        torch.set_num_threads(before)


def test_compile_mode_reaches_torch_compile(monkeypatch):
    from ddplab.distributed import DistContext, wrap_model

    from support.settings import tiny_config

    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: seen.append(kwargs) or model)
    for mode, expected in (("default", None), ("reduce-overhead", "reduce-overhead"), ("max-autotune", "max-autotune")):
        wrap_model(nn.Linear(2, 2), tiny_config(model={"compile": True, "compile_mode": mode}), DistContext())
        assert seen.pop() == {"mode": expected}


def test_the_rank_that_raised_is_the_root_cause_not_a_peer_that_died_with_it(tmp_path):
    """Rank 1 raises; rank 0 dies (SIGABRT) in the collective it waited in, in the same second or
    noticed a moment later: the one line names rank 1. A death well before any exception stays the cause."""
    import json

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from ddplab.launch.elastic import root_failure

    def raised(local_rank, timestamp):
        error_file = tmp_path / f"error-{local_rank}.json"
        error_file.write_text(json.dumps({"message": "TrainingError: injected fault", "timestamp": str(timestamp)}))
        return ProcessFailure(local_rank=local_rank, pid=100 + local_rank, exitcode=1, error_file=str(error_file))

    died = ProcessFailure(local_rank=0, pid=100, exitcode=-6, error_file=str(tmp_path / "none.json"))
    now = died.timestamp
    for later in (0, 1):  # same second, or a second later
        rank, failure = root_failure({0: died, 1: raised(1, now + later)})
        assert rank == 1 and "injected fault" in str(failure.message)
    rank, _ = root_failure({0: died, 1: raised(1, now + 30)})
    assert rank == 0


def test_a_restarted_worker_group_resumes_only_where_a_checkpoint_exists(tmp_path, monkeypatch):
    from ddplab.config import build_config
    from ddplab.rundir import checkpoint
    from ddplab.rundir.runplan import resumed_after_restart
    from ddplab.topology import RESTART_COUNT

    config = build_config({"output": {"out": str(tmp_path)}})
    monkeypatch.setenv(RESTART_COUNT, "1")
    assert resumed_after_restart(config) is config  # restarted before the first checkpoint: start over
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / checkpoint.LAST).write_bytes(b"")
    resumed = resumed_after_restart(config)
    assert resumed.output.resume is True and config.output.resume is False
    monkeypatch.setenv(RESTART_COUNT, "0")
    assert resumed_after_restart(config) is config  # a first start never resumes on its own


def test_a_restarted_torchrun_group_without_out_resumes_in_the_folder_named_after_its_job(tmp_path, monkeypatch):
    """torchrun --max-restarts without --out: the first start named runs/DATASET-MODEL-JOB; a restart must find it
    (it reached Path(None) once, and then would have been refused as "holds an unfinished run")."""
    from ddplab.config import build_config
    from ddplab.rundir import checkpoint
    from ddplab.rundir.runplan import resumed_after_restart
    from ddplab.topology import RESTART_COUNT

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv(RESTART_COUNT, "1")
    config = build_config({"data": {"dataset": "synthetic"}, "model": {"name": "simple_cnn"}})
    folder = tmp_path / "runs" / "synthetic-simple_cnn-job7"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / checkpoint.LAST).write_bytes(b"")
    resumed = resumed_after_restart(config)
    assert resumed.output.resume is True and resumed.output.out == "runs/synthetic-simple_cnn-job7"


def test_the_groups_attempt_is_the_rendezvous_round_where_ddplabs_launcher_counts_it(monkeypatch):
    """torch's restart count differs between nodes after a membership change (test_ddp.py has the two nodes);
    the round ddplab's launcher counts does not. Under torchrun or srun the restart count is all there is."""
    from ddplab.topology import RESTART_COUNT, ROUND, group_attempt

    assert group_attempt({}) == 0
    assert group_attempt({RESTART_COUNT: "2"}) == 2
    assert group_attempt({RESTART_COUNT: "0", ROUND: "1"}) == 1  # restarted for another node's failure
    assert group_attempt({RESTART_COUNT: "1", ROUND: "1"}) == 1


def test_the_launcher_counts_the_rounds_its_agent_joins_and_leaves_nothing_behind(monkeypatch):
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.rendezvous import registry

    from ddplab.launch.elastic import CountedRendezvous, rounds_counted
    from ddplab.topology import ROUND

    # The launcher builds its handler through the registry's module function, at call time: what is wrapped.
    assert "rdzv_registry.get_rendezvous_handler(" in inspect.getsource(launcher_api.launch_agent)

    class Handler:
        use_agent_store = True

        def next_rendezvous(self):
            return "info"

        def get_run_id(self):
            return "job"

    monkeypatch.setattr(registry, "get_rendezvous_handler", lambda params: Handler())
    monkeypatch.setenv(ROUND, "7")  # a launch before this one, in the same process, or around it
    with rounds_counted():
        assert ROUND not in os.environ  # no round formed yet (elastic's `formed`)
        handler = registry.get_rendezvous_handler(None)
        assert isinstance(handler, CountedRendezvous) and handler.use_agent_store and handler.get_run_id() == "job"
        assert handler.next_rendezvous() == "info" and os.environ[ROUND] == "0"
        assert handler.next_rendezvous() == "info" and os.environ[ROUND] == "1"
    assert not isinstance(registry.get_rendezvous_handler(None), CountedRendezvous) and os.environ[ROUND] == "7"


def test_a_node_that_joins_late_takes_the_rendezvous_own_round_where_it_says_it(monkeypatch):
    """Where nodes come and go (--nnodes MIN:MAX), a node started again after a loss joins round 2 as its first:
    counting its own rounds it would name the group 0 and meet no one; the store's round is the one they share."""
    from types import SimpleNamespace

    from ddplab.launch.elastic import CountedRendezvous
    from ddplab.topology import ROUND

    inner = SimpleNamespace(next_rendezvous=lambda: "info", _state_holder=SimpleNamespace(state=SimpleNamespace()))
    inner._state_holder.state.round = 2
    handler = CountedRendezvous(inner)
    monkeypatch.setenv(ROUND, "x")
    assert handler.next_rendezvous() == "info" and os.environ[ROUND] == "2"
    inner._state_holder.state.round = 3
    assert handler.next_rendezvous() == "info" and os.environ[ROUND] == "3"
    del inner._state_holder  # a handler with no such state: its own count (this is its third round)
    assert handler.next_rendezvous() == "info" and os.environ[ROUND] == "2"


def test_a_membership_that_may_change_scales_the_rounds_waits_to_the_timeout_and_says_too_few():
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError

    from ddplab.launch.elastic import elastic_waits, rendezvous_failure

    # a lost node dropped within half the timeout, a last call of up to half (30 s at most), then the timeout itself
    assert elastic_waits(6) == {"last_call_timeout": 3, "keep_alive_interval": 1, "keep_alive_max_attempt": 3,
                                "join_timeout": 12}  # fmt: skip
    assert elastic_waits(600) == {"last_call_timeout": 30, "keep_alive_interval": 5, "keep_alive_max_attempt": 3,
                                  "join_timeout": 645}  # fmt: skip
    line = str(rendezvous_failure(RendezvousTimeoutError(), "10.0.0.1:29500", 3, "dist.timeout_s=6", 2))
    assert line.startswith("fewer than 2 of 3 nodes (dist.min_nodes) joined the rendezvous at 10.0.0.1:29500")
    assert line.endswith("start the same command with --resume on at least 2 nodes")
    fixed = str(rendezvous_failure(RendezvousTimeoutError(), "10.0.0.1:29500", 3, "dist.timeout_s=6"))
    assert fixed.startswith("not all 3 nodes joined")


def test_a_node_a_round_formed_without_says_so_not_that_too_few_nodes_joined():
    """A real c10d rendezvous over a TCPStore here: node A forms a round alone (--nnodes 1:3), node B joins after it
    and times out in the wait list for the next round, which no agent here calls. B's line says a round of 1 formed
    without it (seen in a starved elastic run: "fewer than 2 of 3 nodes joined" while two trained)."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    from ddplab.launch.elastic import FORMED_WITHOUT, CountedRendezvous, rendezvous_failure

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    endpoint = f"127.0.0.1:{store.port}"

    def handler():
        params = RendezvousParameters(
            "c10d", endpoint, "left-out", 1, 3, join_timeout=2, last_call_timeout=1, keep_alive_interval=1
        )
        return create_handler(store, C10dRendezvousBackend(store, "left-out"), params)

    a, b = handler(), CountedRendezvous(handler())
    try:
        a.next_rendezvous()  # a round of A alone, after the last call
        with pytest.raises(RendezvousTimeoutError) as caught:
            b.next_rendezvous()
    finally:
        a.shutdown()
    assert getattr(caught.value, FORMED_WITHOUT) == 1
    line = str(rendezvous_failure(caught.value, endpoint, 3, "dist.timeout_s=2", 1))
    assert line.startswith(f"a round of 1 of 3 nodes formed at {endpoint} without this node, and no next round")
    assert "start the same command on it again to join" in line
    alone = RendezvousTimeoutError()  # no round formed: too few joined, as before
    assert str(rendezvous_failure(alone, endpoint, 3, "dist.timeout_s=2", 2)).startswith("fewer than 2 of 3 nodes")


def test_a_store_gone_before_the_rendezvous_formed_is_unreached_and_after_it_is_the_run_ended_there():
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    from ddplab.launch.elastic import rendezvous_failure

    before = str(rendezvous_failure(RendezvousConnectionError(), "10.0.0.1:29500", 2, "dist.timeout_s=6"))
    assert before.startswith("cannot reach the rendezvous endpoint 10.0.0.1:29500 within dist.timeout_s=6 s")
    after = str(rendezvous_failure(RendezvousConnectionError(), "10.0.0.1:29500", 2, "dist.timeout_s=6", formed=True))
    assert after.startswith("the run's store at the rendezvous host 10.0.0.1:29500 (node 0) closed while the run was")


def test_a_stop_signal_during_the_workers_spawn_is_raised_once_the_agent_holds_them_all():
    """SIGTERM between two workers' spawns made the agent's handler raise before it held the group: the worker
    already started was never stopped, and printed a FileNotFoundError traceback under ddplab's one line (seen
    once in CI). Held over each spawn and over the group's start, it is raised once both are done."""
    import signal
    from multiprocessing import popen_spawn_posix

    from torch.distributed.elastic.multiprocessing import api

    from ddplab.launch.elastic import held_stop_signals, whole_spawns

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        done = []
        with pytest.raises(Stop):
            with held_stop_signals():
                os.kill(os.getpid(), signal.SIGTERM)  # held: nothing raised here
                done.append("first spawn")
                os.kill(os.getpid(), signal.SIGTERM)  # held once, however often it came
                done.append("second spawn")
        assert done == ["first spawn", "second spawn"] and signal.getsignal(signal.SIGTERM) is stop
        # What whole_spawns wraps is there in this torch, and is put back after.
        originals = (popen_spawn_posix.Popen._launch, api.MultiprocessContext._start)
        with whole_spawns():
            assert api.MultiprocessContext._start is not originals[1]
            assert popen_spawn_posix.Popen._launch is not originals[0]
        assert (popen_spawn_posix.Popen._launch, api.MultiprocessContext._start) == originals
        assert "self._pc = mp.start_processes(" in inspect.getsource(originals[1])  # the group is held from here
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.slow(why="a real Gloo group, in processes of its own")
def test_a_failed_run_frees_its_ddp_model_before_the_group_is_destroyed(monkeypatch):
    """The traceback of a failure held the DDP model past destroy_process_group; its reducer then ended the
    group itself, freed with the exception, joining Gloo's thread while holding the GIL, and a rank that
    raised mid-step hung there (a CI run waited 300 s on it). The model must be gone when the group is
    destroyed, and the traceback must still say where the failure was."""
    import socket
    import traceback
    import weakref

    from ddplab.config import build_config
    from ddplab.distributed import distributed_context
    from ddplab.topology import ProcessPlace

    with socket.socket() as s:  # a free port for the one rank's store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    config = build_config({"dist": {"strategy": "ddp"}, "train": {"device": "cpu"}})
    place = ProcessPlace(rank=0, world_size=1, local_rank=0, local_world_size=1, launcher="torchrun")
    models: list = []  # a weak reference to the failed run's DDP model
    alive_at_destroy = []
    destroy = dist.destroy_process_group
    monkeypatch.setattr(
        dist, "destroy_process_group", lambda *a: alive_at_destroy.append(models[0]() is not None) or destroy(*a)
    )

    def train_and_fail():
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
        ddp(torch.ones(1, 2)).sum().backward()
        models.append(weakref.ref(ddp))
        raise RuntimeError("failed mid-step")

    with pytest.raises(RuntimeError, match="failed mid-step") as failed, distributed_context(config, place):
        train_and_fail()
    assert alive_at_destroy == [False]
    assert "train_and_fail" in "".join(traceback.format_tb(failed.value.__traceback__))


def test_a_stop_signal_started_ignored_stays_ignored_while_workers_spawn():
    """Under `nohup` SIGHUP is ignored: the workers spawned while stop signals are held must inherit it ignored,
    or a closed terminal kills them (the launcher itself keeps it ignored)."""
    import signal

    from ddplab.launch.elastic import held_stop_signals

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with held_stop_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert callable(signal.getsignal(signal.SIGTERM))  # held, to be raised once the spawn is whole
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_worker_of_another_launcher_asked_for_nodes_that_come_and_go_is_refused(monkeypatch):
    """dist.min_nodes is what ddplab's launcher does with a round; torchrun's worker has its launcher's own."""
    from ddplab.config import build_config
    from ddplab.errors import ConfigError
    from ddplab.rundir.runplan import prepared

    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)
    config = build_config(
        {
            "dist": {"strategy": "ddp", "nnodes": 3, "min_nodes": 2, "max_restarts": 1,
                     "on_resize": "keep_global_batch", "rdzv_endpoint": "10.0.0.1:29500"},
            "output": {"out": "runs/x"},
        }
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"^dist.min_nodes=2 is ddplab's launcher's .*started by another launcher"):
        with prepared(config):
            pass
