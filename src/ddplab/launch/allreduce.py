"""All-reduce timed on this machine: a real backend (Gloo or NCCL) in N processes of PyTorch's elastic launcher,
as training's workers are, over message sizes from 4 KiB up (`ddplab plan --measure`, and a sweep's links.json).

Each size's time is the slowest rank's, repeated for about TARGET_S_PER_SIZE. What the times are fitted to
(alpha and bus bandwidth) and how a links file holds them is the planner's (planner/links.py: arithmetic and a
file format); starting the ranks is the launcher's (elastic.py), which this harness uses as a run does.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from ddplab.errors import ConfigError
from ddplab.io import files
from ddplab.planner import links
from ddplab.planner.links import MAX_BYTES, MIB, SIZES
from ddplab.topology import resolve_backend

TARGET_S_PER_SIZE = 0.2  # each size is repeated for about this long (at least MIN_REPEATS times)
MIN_REPEATS, MAX_REPEATS, WARMUP = 3, 200, 2


def measure_links(
    backend: str,
    nproc: list[int],
    *,
    nnodes: int,
    max_mib: int,
    rdzv_endpoint: str | None,
    timeout_s: int,
    out: Path | None,
) -> int:
    """All-reduce timed from 4 KiB to `max_mib` with each count of ranks in `nproc` (per node), fitted, printed
    and written to `out` (links.json)."""
    import torch

    on_cuda = torch.cuda.is_available()
    backend = resolve_backend(backend, on_cuda=on_cuda)
    device = "cuda" if backend == "nccl" else "cpu"
    if device == "cuda" and max(nproc) > torch.cuda.device_count():
        raise ConfigError(
            f"--nproc {max(nproc)}: NCCL needs a GPU per rank and this machine has {torch.cuda.device_count()}"
        )
    out = out or Path(links.LINKS_FILE)
    files.ready_to_write(out)  # before the measurement, which a read-only --out would throw away
    results = []
    for per_node in nproc:
        ranks = per_node * nnodes
        where = f" across {nnodes} nodes" if nnodes > 1 else ""
        print(f"measuring all-reduce: {backend} x{ranks} on {device}{where}, 4 KiB to {max_mib} MiB ...", flush=True)
        result = measure(
            backend,
            per_node,
            device=device,
            max_bytes=max_mib * links.MIB,
            nnodes=nnodes,
            rdzv_endpoint=rdzv_endpoint,
            timeout_s=timeout_s,
        )
        link = links.measured_link(result)
        print(f"{'size':>10} {'time us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11} {'model us':>10}")
        factor = 2 * (ranks - 1) / ranks
        for size, t in zip(result["sizes"], result["times_s"], strict=False):
            print(
                f"{size / links.KIB:>8,.0f} K {t * 1e6:>10,.1f} {size / t / links.GB:>11,.3f} "
                f"{size * factor / t / links.GB:>11,.3f} {link.allreduce_s(size, ranks) * 1e6:>10,.1f}"
            )
        print(
            f"fit ({ranks} ranks): alpha {link.alpha_s * 1e6:,.1f} us, bus bandwidth {link.busbw_gbps:,.3f} GB/s; "
            f"model error median {link.fit_error['median']:.1%}, worst {link.fit_error['max']:.1%} "
            f"({result['wall_s']} s)"
        )
        results.append(result)
    from ddplab.metrics.system import machine

    links.save_links(out, results, machine=machine(device))
    print(f"links: {out}")
    return 0


def measure(
    backend: str = "gloo",
    ranks: int = 2,
    *,
    device: str = "cpu",
    max_bytes: int = MAX_BYTES,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    timeout_s: int = 600,
) -> dict[str, Any]:
    """Time all-reduce over SIZES up to `max_bytes` with `ranks` processes of the elastic launcher on each of
    `nnodes` nodes (each runs this, with the same `rdzv_endpoint`: node 0's address)."""
    from ddplab import compat
    from ddplab.distributed import route_address
    from ddplab.launch.elastic import c10d_configs, run_agent, whole_spawns

    if ranks * nnodes < 2:
        raise ConfigError(f"--nproc {ranks}: an all-reduce needs 2 or more ranks to measure a link")
    if backend == "nccl" and device != "cuda":
        raise ConfigError("--backend nccl needs CUDA devices; use --backend gloo on a CPU")
    if nnodes > 1 and rdzv_endpoint is None:
        raise ConfigError(
            f"--nnodes {nnodes}: every node needs --rdzv-endpoint host:port, the same on each (node 0's address)"
        )
    sizes = [s for s in SIZES if s <= max_bytes]
    if len(sizes) < 3:
        raise ConfigError(
            f"--max-mib {max_bytes / MIB:g} leaves {len(sizes)} message size(s) from 4 KiB; the fit needs 3"
        )
    config = compat.launch_config(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=ranks,
        run_id=f"ddplab-links-{rdzv_endpoint}" if nnodes > 1 else str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint or "localhost:0",
        rdzv_configs=c10d_configs(rdzv_endpoint, timeout_s),
        max_restarts=0,
        local_addr=route_address(rdzv_endpoint) if nnodes > 1 else None,
        monitor_interval=0.1,
        start_method="spawn",
    )
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    start = time.perf_counter()
    try:
        with whole_spawns():
            results = run_agent(config, time_allreduce, backend, sizes, device, nnodes > 1)
    except RendezvousError as exc:
        from ddplab.launch.elastic import rendezvous_failure

        raise rendezvous_failure(exc, rdzv_endpoint, nnodes, f"--timeout-s {timeout_s}") from None
    except SignalException as exc:  # Ctrl-C or SIGTERM: the agent has stopped the ranks; nothing was written
        from ddplab.errors import Interrupted

        raise Interrupted(
            f"interrupted by {exc.sigval.name} while timing the all-reduce: nothing was written; "
            "run the command again to measure"
        ) from None
    return {
        "backend": backend,
        "ranks": ranks * nnodes,
        "nodes": nnodes,
        "device": device,
        "sizes": sizes,
        "times_s": next(iter(results.values())),
        "wall_s": round(time.perf_counter() - start, 1),
    }  # keyed by global rank


def time_allreduce(backend: str, sizes: list[int], device: str, across_nodes: bool = False) -> list[float]:
    """In each worker: seconds per all-reduce of each size, the slowest rank's."""
    import torch
    import torch.distributed as dist

    if across_nodes and backend == "gloo":
        from ddplab.distributed import maybe_set_gloo_interface

        maybe_set_gloo_interface()
    dist.init_process_group(backend)
    try:
        on = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if device == "cuda" else torch.device("cpu")
        if on.type == "cuda":
            torch.cuda.set_device(on)

        def sync() -> None:
            if on.type == "cuda":
                torch.cuda.synchronize(on)

        times = []
        for size in sizes:
            buffer = torch.ones(size // 4, dtype=torch.float32, device=on)
            for _ in range(WARMUP):
                dist.all_reduce(buffer)
            sync()
            first = time.perf_counter()
            dist.all_reduce(buffer)
            sync()
            once = torch.tensor([time.perf_counter() - first])
            dist.all_reduce(once, op=dist.ReduceOp.MAX)  # every rank repeats the same number of times
            repeats = max(MIN_REPEATS, min(MAX_REPEATS, int(TARGET_S_PER_SIZE / max(once.item(), 1e-6))))
            dist.barrier()
            start = time.perf_counter()
            for _ in range(repeats):
                dist.all_reduce(buffer)
            sync()
            times.append((time.perf_counter() - start) / repeats)
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return slowest.tolist()
    finally:
        dist.destroy_process_group()
