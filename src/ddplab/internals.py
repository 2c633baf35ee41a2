"""Every private API of CPython, torch and numpy that ddplab patches or calls: reached only through here.

A release may change any of them without notice. Each is listed in PRIVATE with what relies on it, the versions it
was checked on and a check of what ddplab assumes of it; tests/unit/test_internals.py runs every check, so an
upgrade that breaks one fails that test by the API's name rather than a sweep half-way through. Where ddplab
patches one, the patch is made here, for a block, and undone after it. Torch-free at import (torch's are looked
up when used).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

CPYTHON = "CPython 3.10, 3.11, 3.12, 3.13"
TORCH = "torch 2.4 to 2.13"


@dataclass(frozen=True)
class Private:
    """One private API: where it lives, what ddplab does with it, what it was checked on, and the check."""

    name: str  # module.attribute, as imported
    used_for: str
    checked_on: str
    check: Callable[[], None]  # raises where the API is not what ddplab relies on


def _attribute(dotted: str) -> Any:
    """`module.attr.attr`: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def _callable(dotted: str, *params: str) -> Callable[[], None]:
    """A check that `dotted` is a function taking at least `params` by name."""

    def check() -> None:
        import inspect

        found = _attribute(dotted)
        assert callable(found), f"{dotted} is no longer callable"
        if params:
            names = set(inspect.signature(found).parameters)
            assert set(params) <= names, f"{dotted} takes {sorted(names)}, not {list(params)}"

    return check


# --- CPython: what makes a fork look like a fresh interpreter (warm starts) ---------------------------------------


def interpreter_flags() -> list[str]:
    """The command-line flags this interpreter runs with, as a child started the same way repeats them."""
    import subprocess

    return subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]


def run_module_as_main(module: str) -> None:
    """`python -m MODULE`'s own runner (argv[0] set to the module's file)."""
    import runpy

    runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]


def run_exit_functions() -> None:
    """What the interpreter runs at exit (atexit's functions), for a process that ends by os._exit."""
    import atexit

    atexit._run_exitfuncs()


def join_threads() -> None:
    """The interpreter's end: non-daemon threads joined."""
    import threading

    threading._shutdown()  # type: ignore[attr-defined]


# --- multiprocessing: the DDP workers' start method, spawns held whole -------------------------------------------


def spawn_popen() -> type:
    """spawn's Popen on POSIX: ddplab's warm start method subclasses it and overrides its `_launch`."""
    from multiprocessing import popen_spawn_posix

    return popen_spawn_posix.Popen


def register_start_method(name: str, context: Any) -> bool:
    """multiprocessing's table of start methods, with `name` in it (get_context(name) finds `context`); False where
    the table is not there."""
    from multiprocessing import context as mp_context

    table = getattr(mp_context, "_concrete_contexts", None)
    if not isinstance(table, dict):
        return False
    table.setdefault(name, context)
    return True


def process_name(process: Any) -> str:
    """A multiprocessing Process's name, as spawn's preparation data reads it."""
    return process._name


@contextlib.contextmanager
def wrapped(owner: Any, name: str, wrap: Callable[[Callable], Callable]) -> Iterator[bool]:
    """`owner.name` replaced by `wrap(owner.name)` for the block (False, and nothing done, where it is missing)."""
    original = getattr(owner, name, None)
    if original is None:
        yield False
        return
    setattr(owner, name, wrap(original))
    try:
        yield True
    finally:
        setattr(owner, name, original)


def spawn_launch() -> tuple[Any, str]:
    """Where spawn starts one process (held whole against a stop signal: launch.elastic.whole_spawns)."""
    return spawn_popen(), "_launch"


def agent_start() -> tuple[Any, str]:
    """Where torch's elastic agent starts its group of workers."""
    from torch.distributed.elastic.multiprocessing import api

    return api.MultiprocessContext, "_start"


def rendezvous_handlers() -> tuple[Any, str]:
    """The elastic agent's factory of rendezvous handlers (the launcher builds its handler through it)."""
    from torch.distributed.elastic.rendezvous import registry

    return registry, "get_rendezvous_handler"


def rendezvous_round(handler: Any) -> int | None:
    """The round a c10d rendezvous handler has joined, as its store counts it (the same on every node, whenever
    each joined); None where the handler keeps no such state (a static rendezvous, another torch)."""
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    value = getattr(state, "round", None)
    return value if isinstance(value, int) else None


def rendezvous_formed_without(handler: Any) -> int | None:
    """How many nodes the round a c10d rendezvous handler last saw holds, where that round had formed without this
    node (it waited for the next one); None where it had not, or where the handler keeps no such state."""
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    node = getattr(handler, "_this_node", None)
    participants = getattr(state, "participants", None)
    if node is None or not isinstance(participants, dict) or getattr(state, "complete", None) is not True:
        return None
    return None if node in participants else len(participants)


# --- torch and numpy, read elsewhere -------------------------------------------------------------------------------


def compiled_original(model: Any) -> Any:
    """The module torch.compile wrapped (OptimizedModule's `_orig_mod`), or `model` itself."""
    return getattr(model, "_orig_mod", model)


FLIGHT_RECORDER = ("_dump_fr_trace", "_dump_nccl_trace")  # torch's dump of its record: any backend's, then NCCL's


def flight_recorder_dump() -> bytes | None:
    """torch's Flight Recorder of this process's collectives, pickled (op, sequence number, sizes, state, Python
    frames of each); None where this torch keeps none. It records where TORCH_FR_BUFFER_SIZE (or, for NCCL,
    TORCH_NCCL_TRACE_BUFFER_SIZE) was set before the process group was made (distributed.init_group sets it)."""
    import torch

    c10d = torch._C._distributed_c10d
    dump = next((found for name in FLIGHT_RECORDER if (found := getattr(c10d, name, None)) is not None), None)
    return dump() if dump is not None else None


def flight_recorder_variable() -> str:
    """The environment variable that sizes torch's Flight Recorder in this torch: TORCH_FR_BUFFER_SIZE where it
    records any backend (the older NCCL-only name is deprecated there, and warns), else NCCL's own."""
    import torch

    new = hasattr(torch._C._distributed_c10d, FLIGHT_RECORDER[0])
    return "TORCH_FR_BUFFER_SIZE" if new else "TORCH_NCCL_TRACE_BUFFER_SIZE"


def ddp_logging_data(ddp: Any) -> Any:
    """DDP's own running timings of the steps it samples; None where this torch has none."""
    read = getattr(ddp, "_get_ddp_logging_data", None)
    return read() if read is not None else None


def parser_actions(parser: Any) -> list:
    """An argparse parser's actions (every option it takes)."""
    return list(parser._actions)


NUMPY_RECONSTRUCT = ("numpy._core.multiarray", "_reconstruct")  # numpy >= 1.26 (numpy.core before): CIFAR's pickles


def _numpy_reconstruct() -> None:
    module, name = NUMPY_RECONSTRUCT
    try:
        _attribute(f"{module}.{name}")
    except ImportError:
        _attribute(f"numpy.core.multiarray.{name}")  # numpy < 1.26


def _check_ddp_logging() -> None:
    from torch.nn.parallel import DistributedDataParallel

    assert callable(getattr(DistributedDataParallel, "_get_ddp_logging_data", None)), "no _get_ddp_logging_data"


def _check_flight_recorder() -> None:
    """Where this torch has the dump, one Gloo all-reduce is in it."""
    import os
    import pickle
    import socket
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if not hasattr(torch._C._distributed_c10d, FLIGHT_RECORDER[0]):
        return  # an older torch: ddplab's own record of the collectives is the one a hang report holds
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    before = os.environ.get("TORCH_FR_BUFFER_SIZE")
    os.environ["TORCH_FR_BUFFER_SIZE"] = "8"
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True)
    try:
        group: Any = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=30))  # typed stubs lack allreduce
        group.allreduce([torch.ones(3)]).wait()
        entries = pickle.loads(flight_recorder_dump() or b"\x80\x04}\x94.")["entries"]
        assert any("all_reduce" in e["profiling_name"] for e in entries), "the Flight Recorder kept no all-reduce"
    finally:
        if before is None:
            os.environ.pop("TORCH_FR_BUFFER_SIZE")
        else:
            os.environ["TORCH_FR_BUFFER_SIZE"] = before


def _check_orig_mod() -> None:
    import torch

    compiled = torch.compile(torch.nn.Linear(1, 1))  # wraps only: nothing is compiled until it is called
    assert isinstance(getattr(compiled, "_orig_mod", None), torch.nn.Linear), "OptimizedModule has no _orig_mod"


def _check_actions() -> None:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--x")
    assert [a.dest for a in p._actions] == ["help", "x"], "argparse keeps its options elsewhere"


def _check_start_methods() -> None:
    from multiprocessing import context as mp_context

    assert isinstance(mp_context._concrete_contexts, dict) and "spawn" in mp_context._concrete_contexts  # type: ignore[attr-defined]


def _check_process_name() -> None:
    import multiprocessing

    assert getattr(multiprocessing.Process(name="x"), "_name", None) == "x", "Process keeps its name elsewhere"


def _check_rendezvous_round() -> None:
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    assert isinstance(getattr(dr._RendezvousState(), "round", None), int), "the rendezvous state keeps no round"
    assert "self._state_holder" in inspect.getsource(dr.DynamicRendezvousHandler.__init__), "no _state_holder"


def _check_owner(where: Callable[[], tuple[Any, str]]) -> Callable[[], None]:
    def check() -> None:
        owner, name = where()
        assert callable(getattr(owner, name, None)), f"{owner.__name__}.{name} is gone"

    return check


PRIVATE = [
    Private("subprocess._args_from_interpreter_flags", "the flags a warm server and a fork's `argv` repeat",
            CPYTHON, _callable("subprocess._args_from_interpreter_flags")),
    Private("runpy._run_module_as_main", "a warm child runs `-m MODULE` as the interpreter does", CPYTHON,
            _callable("runpy._run_module_as_main", "mod_name", "alter_argv")),
    Private("atexit._run_exitfuncs", "a warm child ends as the interpreter ends (atexit run)", CPYTHON,
            _callable("atexit._run_exitfuncs")),
    Private("threading._shutdown", "a warm child joins its non-daemon threads at its end", CPYTHON,
            _callable("threading._shutdown")),
    Private("multiprocessing.context._concrete_contexts", "the warm start method registered for the elastic agent",
            CPYTHON, _check_start_methods),
    Private("multiprocessing.popen_spawn_posix.Popen._launch",
            "overridden by the warm start method; held whole against a stop signal (whole_spawns)", CPYTHON,
            _check_owner(spawn_launch)),
    Private("multiprocessing.process.BaseProcess._name", "spawn's preparation data for a warm worker", CPYTHON,
            _check_process_name),
    Private("torch.distributed.elastic.multiprocessing.api.MultiprocessContext._start",
            "the agent's start of its workers, held whole against a stop signal (whole_spawns)", TORCH,
            _check_owner(agent_start)),
    Private("torch.distributed.elastic.rendezvous.registry.get_rendezvous_handler",
            "wrapped to count the rendezvous rounds a node joins (launch.elastic.rounds_counted)", TORCH,
            _check_owner(rendezvous_handlers)),
    Private("torch.distributed.elastic.rendezvous.dynamic_rendezvous.DynamicRendezvousHandler._state_holder",
            "the round a node joined, as the store counts it (launch.elastic.CountedRendezvous; else counted)",
            TORCH, _check_rendezvous_round),
    Private("torch.nn.parallel.DistributedDataParallel._get_ddp_logging_data",
            "DDP's own timings, read each epoch (compat.ddp_timings; without it none are recorded)", TORCH,
            _check_ddp_logging),
    Private("torch._C._distributed_c10d._dump_fr_trace", "torch's own record of the collectives, in a hang report",
            "torch 2.13, Gloo and NCCL (where absent: ddplab's own record alone)", _check_flight_recorder),
    Private("torch._dynamo.eval_frame.OptimizedModule._orig_mod", "the compiled model's own module, to save and place",
            TORCH, _check_orig_mod),
    Private("argparse.ArgumentParser._actions", "the options a command was given (cli/common.given_options)",
            CPYTHON, _check_actions),
    Private("numpy._core.multiarray._reconstruct", "allowed by the restricted unpickler of CIFAR's python files",
            "numpy 1.26 to 2.x (numpy.core before)", _numpy_reconstruct),
]  # fmt: skip
