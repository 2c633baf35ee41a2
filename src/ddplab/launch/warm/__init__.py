"""Warm starts: processes forked from a server that imported torch once, instead of each importing it.

A `python -m ddplab ...` pays 4-6 s before its first line of work (torch, then torch._dynamo, which
torch.optim and DDP import), often more than a small run trains. The processes ddplab starts many of
(sweep points, DDP workers, the estimate's probe, the tests' CLI runs) are instead forked from a
server that imported those modules and did nothing else: no tensor op (so no thread pool), no CUDA. The server
imports torch of its own accord; ddplab's modules are handed in by the callers that start the children
(`imports=`: the launcher names its workers', the sweep its points'), imported once, before the fork that needs
them, so this package, low in the layers, names none of the layers above it.

A warm child is still a process of its own, made to look like a fresh `exec` of the same command:
its own session (where asked), signal dispositions and mask as exec leaves them, exit code, file
descriptors, environment, working directory, resource limits, CPU set and thread count; Python's own
state as a fresh interpreter has it (argv, `__main__`, sys.path[0], stdio, RNGs). What a fresh
interpreter would read from the environment at start-up or import (PYTHON*, LD_*, TORCH*, locale,
thread libraries; not OMP_NUM_THREADS and TORCH_CPP_LOG_LEVEL, which a child applies) cannot be given
to a fork: a command whose environment differs there from the server's starts cold, as does every
command that is not `python -m MODULE` or `python -c CODE` with this interpreter. Such a command
after `ip netns exec NAME` (a host of ddplab.launch.hosts) starts warm too where this process is root: the
child enters the namespace as ip would.

The server serves the process that started it alone, over a socketpair (nothing on the file system,
nothing another user could reach), and ends with it. Children report their exit code over a channel
of their own, which is their sentinel: a client polls a warm child as multiprocessing's forkserver
polls its children. `DDPLAB_WARM=0` turns it all off: every process starts cold, as before.

Linux only (fork, SCM_RIGHTS, SOCK_SEQPACKET); elsewhere, or where the server cannot start,
everything starts cold.

The package, one module a job: `protocol` (what both sides agree on), `client` (a client's servers and its warm
children), `server` (the fork server), `fresh` (a fork made into what exec would have made) and `spawn` (the DDP
workers' start method). The private APIs of CPython and torch they rely on are reached through ddplab.internals.
"""

from ddplab.launch.warm.client import (
    MAX_SERVERS,
    Factory,
    WarmProcess,
    blocked_signals,
    emulated,
    factory,
    ignored_signals,
    popen,
    prestart,
    run,
    server_pids,
    using,
)
from ddplab.launch.warm.protocol import IMPORTS, SWITCH, can_adopt, enabled, read_at_start
from ddplab.launch.warm.server import fork_own_server, serve_cold
from ddplab.launch.warm.spawn import WARM_METHOD, WarmPopen, start_method

__all__ = [
    "IMPORTS", "MAX_SERVERS", "SWITCH", "WARM_METHOD", "Factory", "WarmPopen", "WarmProcess", "blocked_signals",
    "can_adopt", "emulated", "enabled", "factory", "fork_own_server", "ignored_signals", "popen", "prestart",
    "read_at_start", "run", "serve_cold", "server_pids", "start_method", "using",
]  # fmt: skip
