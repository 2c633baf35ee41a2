"""Start a run: in this process, or as N workers through PyTorch's elastic launcher.

The elastic launcher is the engine behind torchrun: c10d rendezvous on `localhost:0` picks
its own free port (no find-free-port race, two runs on one machine never collide), a
failed worker brings the whole group down and, with `--max-restarts K`, back up from the
last checkpoint. A process already started by torchrun or srun runs as one worker.

Everything is validated here, before any worker exists: the config, the machine, the run
folder.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import uuid
from pathlib import Path

from ddplab import compat, errors
from ddplab.config import RunConfig, build_config, check_environment
from ddplab.distributed import place_from_env, route_address
from ddplab.engine import checkpoint
from ddplab.engine.rundir import check_run_dir

RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
SHUTDOWN_TIMEOUT_S = 5


class Interrupted(errors.DdplabError):
    exit_code = 130


def launch(config: RunConfig):
    """Run `config` the way it asks to be run; returns the RunResult (rank 0's, when it has one)."""
    from ddplab.engine.run import train

    check_environment(config)
    if place_from_env() is not None:  # inside torchrun / srun: this process is one worker
        maybe_resume_after_restart(config)
        check_run_dir(config)  # on every rank, before the group forms: a refusal stops all ranks at once
        return train(config)
    check_run_dir(config)
    if config.dist.strategy == "ddp" and config.world_size() > 1:
        return launch_workers(config)
    return train(config)


def launch_workers(config: RunConfig):
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    d = config.dist
    static = d.rdzv_backend == "static"
    launch_config = compat.launch_config(
        min_nodes=d.nnodes, max_nodes=d.nnodes, nproc_per_node=d.nproc,
        # Every node of one run must present the same id: derive it from the shared endpoint.
        run_id=d.rdzv_id or (f"ddplab-{d.rdzv_endpoint}" if d.nnodes > 1 else str(uuid.uuid4())),
        rdzv_backend=d.rdzv_backend,
        rdzv_endpoint=d.rdzv_endpoint or "localhost:0",  # port 0: the store picks a free port itself
        rdzv_configs={"rank": d.node_rank} if static else c10d_configs(d.rdzv_endpoint),
        local_addr=route_address(d.rdzv_endpoint) if d.nnodes > 1 else None,
        max_restarts=d.max_restarts, monitor_interval=0.1, start_method="spawn",
        # After Ctrl-C / SIGTERM, wait this long for the workers before the agent's SIGKILL
        # (torch 2.12+; older releases wait their fixed 30 s).
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    if not config.output.debug:
        # The agent logs every worker's traceback; the one-line root cause below is enough.
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        results = elastic_launch(launch_config, run_worker)(config.to_dict())
    except ChildFailedError as exc:
        raise worker_failure(exc, d.max_restarts) from None
    except SignalException as exc:  # Ctrl-C / SIGTERM: the agent has already stopped every worker
        raise Interrupted(f"interrupted by {exc.sigval.name}; every worker was stopped, checkpoints are kept") from None
    return next((r for r in results.values() if r is not None), None)


def c10d_configs(endpoint: str | None) -> dict:
    """The node that owns the endpoint's address hosts the rendezvous store.

    PyTorch recognizes the host by its hostname only, so a node reached through another
    interface (a second NIC, a network namespace) would wait for a store nobody starts.
    Being able to bind the address is the test that it is ours.
    """
    if endpoint is None:
        return {}
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    try:  # where PyTorch already recognizes the host, keep its fallback for shared machines
        from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

        if _matches_machine_hostname(host):
            return {}
    except ImportError:
        pass
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, 0))
    except OSError:
        return {}
    return {"is_host": True}


def run_worker(config_values: dict):
    """The body of each spawned worker (module-level, so spawn can import it)."""
    from ddplab.engine.run import train

    # A worker stopped by its agent is usually blocked in a collective, where a Python-level
    # handler never runs; the default action ends it at once (checkpoints are atomic).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    config = build_config(config_values)
    maybe_resume_after_restart(config)
    result = train(config)
    return result if result is not None and int(os.environ.get("RANK", "0")) == 0 else None


def maybe_resume_after_restart(config: RunConfig) -> None:
    """A restarted worker group (elastic agent or torchrun) continues from the last checkpoint."""
    restarts = int(os.environ.get(RESTART_COUNT, "0"))
    if restarts > 0 and (Path(config.output.out) / "checkpoints" / checkpoint.LAST).exists():
        config.output.resume = True


_ERROR_TYPES = {cls.__name__: cls for cls in (errors.ConfigError, errors.DataError, errors.TrainingError)}


def worker_failure(exc, max_restarts: int) -> errors.DdplabError:
    """One line naming the first failed rank and its cause, keeping the error's exit code."""
    rank, failure = exc.get_first_failure()
    raw = failure.message
    message = raw.get("message", "") if isinstance(raw, dict) else str(raw)
    match = re.match(r"^(\w+): (.*)$", message, re.S)
    cls, text = errors.TrainingError, message
    if match and match.group(1) in _ERROR_TYPES:
        cls, text = _ERROR_TYPES[match.group(1)], match.group(2)
    elif failure.exitcode < 0:
        text = f"killed by signal {failure.signal_name()} (exit code {failure.exitcode})"
    restarts = f" after {max_restarts} restart(s)" if max_restarts else ""
    return cls(f"worker rank {rank} failed{restarts}: {text.strip().splitlines()[0] if text.strip() else 'no message'}")
