"""The torch releases ddplab supports, and the newer torch APIs it uses only where they exist.

ddplab supports torch >= MIN_TORCH (the floor is set by `torch.library.custom_op`, which
the kernels register their ops with). Every API newer than the floor is looked up here,
by feature, not by version number, and each entry of `NEWER_APIS` says what a user of an
older torch loses. A torch below the floor gets one line naming the version needed
(`check_torch`), before anything imports an API it may lack.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ddplab import internals
from ddplab.errors import ConfigError

MIN_TORCH = (2, 4)

# What each newer API buys, and what a torch without it does instead (docs/setup.md: "Supported torch").
NEWER_APIS: dict[str, str] = {
    "LaunchConfig.shutdown_timeout": (
        "torch 2.12+: after Ctrl-C or SIGTERM the launcher waits at most 5 s for its workers before SIGKILL; older "
        "torch waits up to 30 s (ddplab's workers exit at once on SIGTERM, so in practice nothing is lost)"
    ),
    "DistributedDataParallel(forward_sync_buffers=)": (
        "torch 2.13+ renames broadcast_buffers; older torch gets broadcast_buffers=True, the same behaviour"
    ),
    "LaunchConfig.signals_to_handle": (
        "torch 2.10+: Ctrl-C reaches the launcher alone, which stops its workers with SIGTERM at once; older torch "
        "forwards SIGINT to workers, and one still starting up may print a KeyboardInterrupt traceback"
    ),
    "torch.library.custom_op schema inference": (
        "torch 2.7+ infers an op's schema from list[int] and string annotations; older torch could not, so the "
        "kernels write their schemas out and nothing is lost"
    ),
    "DistributedDataParallel._get_ddp_logging_data": (
        "private, in every torch 2.x so far (with _set_ddp_runtime_logging_sample_rate): DDP's own timings of the "
        "steps it samples, which the report sets against ddplab's communication probe and reads stragglers from; "
        "a torch without it (or with other field names) records none, and the report says the stragglers were not "
        "measured"
    ),
}


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as '2.11.0+cu130' or '2.13.0.dev20260101'."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"unrecognized torch version {text!r}")
    return int(match.group(1)), int(match.group(2))


def check_torch() -> None:
    """Refuse a torch below the floor with one line (contract 8), before any command needs it.

    The version comes from the installed distribution's metadata, not from importing torch
    (seconds): a usage or config error is answered at once. An imported torch's own version wins.
    """
    import importlib.metadata
    import sys

    need = ".".join(map(str, MIN_TORCH))
    torch: Any = sys.modules.get("torch", False)
    try:
        version = torch.__version__ if torch else None if torch is None else importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is None:
        raise ConfigError(f"ddplab needs torch >= {need}, and this Python has none: pip install 'torch>={need}'")
    if parse_version(version) < MIN_TORCH:
        raise ConfigError(
            f"ddplab needs torch >= {need}, this Python has torch {version}: "
            f"pip install 'torch>={need}' (the build that matches your CUDA)"
        )


def accepted_kwargs(cls: type, kwargs: dict[str, Any], optional: set[str]) -> dict[str, Any]:
    """`kwargs` less the `optional` ones that dataclass `cls` does not take in this torch.

    Anything else `cls` lacks is a bug in ddplab (it would be a TypeError on every torch),
    so only the names listed as optional are ever dropped.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in kwargs.items() if k in names or k not in optional}


def ddp_buffer_sync() -> dict[str, Any]:
    """DDP keyword that broadcasts rank 0's buffers (BatchNorm statistics) every forward (PITFALLS row 12)."""
    import inspect

    import torch.nn as nn

    params = inspect.signature(nn.parallel.DistributedDataParallel).parameters
    return {"forward_sync_buffers": True} if "forward_sync_buffers" in params else {"broadcast_buffers": True}


def elastic_signals_configurable() -> bool:
    """Whether the elastic agent can be told which signals to handle (`LaunchConfig.signals_to_handle`, torch 2.10+).

    The agent exports the field to its process tree (TORCHELASTIC_SIGNALS_TO_HANDLE), replacing
    whatever that variable held: the field is the one way to set it.
    """
    from torch.distributed.launcher.api import LaunchConfig

    return "signals_to_handle" in {f.name for f in dataclasses.fields(LaunchConfig)}


ELASTIC_SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"  # where the agent exports signals_to_handle


def agent_signals_without_sigint() -> str:
    """The elastic agent's own signals (LaunchConfig.signals_to_handle's default) less SIGINT, which the
    launcher keeps, and less any this process was started ignoring: under `nohup` SIGHUP is ignored, and a
    closed terminal must not stop the run the agent would otherwise stop on it (ddplab.stops keeps the same
    promise for every other command)."""
    import signal

    from torch.distributed.launcher.api import LaunchConfig

    from ddplab.stops import started_ignored

    default: Any = next(f.default for f in dataclasses.fields(LaunchConfig) if f.name == "signals_to_handle")

    def ignored(name: str) -> bool:
        return hasattr(signal, name) and started_ignored(getattr(signal, name))

    return ",".join(s for s in default.split(",") if s.strip() != "SIGINT" and not ignored(s.strip()))


def launch_config(**kwargs: Any):
    """torch's elastic LaunchConfig, built with only the fields this torch release has."""
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(**accepted_kwargs(LaunchConfig, kwargs, optional={"shutdown_timeout", "signals_to_handle"}))


# DDP's running averages over the steps it samples (nanoseconds), as `_get_ddp_logging_data` names them.
DDP_TIMINGS = {
    "ddp_forward_s": "avg_forward_compute_time",
    "ddp_backward_s": "avg_backward_compute_time",
    "ddp_comm_s": "avg_backward_comm_time",
    "ddp_overlap_s": "avg_backward_compute_comm_overlap_time",
}
DDP_FIRST_SAMPLED, DDP_DEFAULT_SAMPLE_EVERY = 10, 100  # DDP times its first 10 steps, then one in 100 (torch's default)


def sample_ddp_every(ddp: Any, every: int) -> int:
    """Ask DDP to time one step in `every` after its first ten (`_set_ddp_runtime_logging_sample_rate`, private);
    the rate in effect: torch's default where this torch cannot be asked."""
    setter = getattr(ddp, "_set_ddp_runtime_logging_sample_rate", None)
    if setter is None:
        return DDP_DEFAULT_SAMPLE_EVERY
    try:
        setter(every)
    except Exception:  # noqa: BLE001 (a private API: any failure leaves torch's default)
        return DDP_DEFAULT_SAMPLE_EVERY
    return every


def ddp_samples(iteration: int, every: int) -> int:
    """Steps DDP has timed up to and including step `iteration`: its first ten, then each multiple of `every`."""
    first = min(iteration, DDP_FIRST_SAMPLED)
    return first + max(0, iteration // every - DDP_FIRST_SAMPLED // every)


def ddp_timing_totals(ddp: Any, every: int) -> dict[str, float] | None:
    """DDP's own timings summed over the steps it has timed so far, in seconds, with their count ("samples"):
    forward, backward compute, backward communication (first bucket's launch to the last one's end) and
    their overlap. DDP keeps running averages; the difference of two of these totals over their samples is
    the mean of the steps in between (`every`: the sample rate in effect). None without the method; no
    samples before DDP has timed a step or where it names its fields otherwise. DDP times a sampled step
    with CUDA events on a GPU; reading them costs no device sync."""
    try:
        data = internals.ddp_logging_data(ddp)
    except Exception:  # noqa: BLE001 (a private API: no logger, another torch: nothing recorded)
        return None
    if data is None:
        return None
    values = {ours: data.get(theirs) for ours, theirs in DDP_TIMINGS.items()}
    iteration = data.get("iteration")
    if (
        not isinstance(iteration, int)
        or not all(isinstance(v, int) for v in values.values())
        or not values["ddp_backward_s"]
    ):
        return dict.fromkeys(("samples", *DDP_TIMINGS), 0)  # nothing timed yet (or fields this code does not know)
    samples = ddp_samples(iteration, every)
    return {"samples": samples, **{k: v / 1e9 * samples for k, v in values.items()}}


def ddp_epoch_means(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """The mean of each DDP timing over the steps timed between two `ddp_timing_totals`; None without any."""
    if before is None or after is None or after["samples"] <= before["samples"]:
        return None
    n = after["samples"] - before["samples"]
    return {k: (after[k] - before[k]) / n for k in DDP_TIMINGS}


CPP_LOG_LEVELS = {"INFO": 0, "WARNING": 1, "ERROR": 2, "FATAL": 3, "0": 0, "1": 1, "2": 2, "3": 3}
CPP_LOG_DEFAULT = 1  # c10's FLAGS_caffe2_log_level where TORCH_CPP_LOG_LEVEL is unset, empty or not a level


def set_cpp_log_level(level: str) -> bool:
    """What TORCH_CPP_LOG_LEVEL=level would have done, for a process whose torch is already loaded (a warm
    child: torch reads the variable once, when it loads): c10's FLAGS_caffe2_log_level, which c10d's logs
    consult; a name or a digit as c10 takes them, anything else its default. False where this torch does not
    export the flag (then its native logs stay as they were)."""
    import ctypes
    import os

    import torch

    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    if not os.path.exists(lib):
        return False
    try:
        flag = ctypes.c_int.in_dll(ctypes.CDLL(lib), "FLAGS_caffe2_log_level")
    except (OSError, ValueError):
        return False
    flag.value = CPP_LOG_LEVELS.get(level.strip().upper(), CPP_LOG_DEFAULT)
    return True
