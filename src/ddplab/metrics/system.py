"""Clocks and memory, measured honestly (contract 7).

Times are read after the device has finished its queued work. Memory is peak allocated and
peak reserved on CUDA (reset each epoch) and the process's peak resident set size on CPU
(a lifetime peak: the OS offers no reset), each labelled as what it is.
"""

from __future__ import annotations

import resource
import sys
import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Wall time between `start()` and `stop()`, with the device synchronized at both ends."""

    def __init__(self, device: torch.device):
        self.device = device
        self._t0 = 0.0

    def start(self) -> "Stopwatch":
        synchronize(self.device)
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> float:
        synchronize(self.device)
        return time.perf_counter() - self._t0


def reset_peak_memory(device: torch.device, gpus: list[int] | None = None) -> None:
    """On `device`, or on each of `gpus` (DataParallel's)."""
    if device.type == "cuda":
        for index in [device.index] if gpus is None else gpus:
            torch.cuda.reset_peak_memory_stats(index)


def peak_alloc_per_gpu_mib(gpus: list[int]) -> list[float]:
    """Peak allocated MiB on each of DataParallel's GPUs: its load on GPU 0 shows up here."""
    return [round(torch.cuda.max_memory_allocated(i) / 2**20, 1) for i in gpus]


def peak_memory_mib(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {
            "peak_alloc_mib": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
            "peak_reserved_mib": round(torch.cuda.max_memory_reserved(device) / 2**20, 1),
        }
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024
    return {"peak_rss_mib": round(rss_bytes / 2**20, 1)}


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model with the thread count torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {cpu_model()} ({torch.get_num_threads()} threads)"


def cpu_model() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        model = None
    return model or platform.processor() or platform.machine()


# CPU flags (/proc/cpuinfo) of instructions that compute bf16 products natively: x86's AVX512-BF16 and AMX,
# Arm's BF16 extension. Without one, oneDNN converts bf16 to fp32 and back around every operation.
BF16_FLAGS = {"avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX", "bf16": "Arm BF16"}


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 "flags", Arm "Features"); empty where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.split(":", 1)[0].strip() in ("flags", "Features")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def cpu_bf16() -> dict[str, object]:
    """Whether this CPU computes bf16 natively, and how that was found: torch's own CPU checks where this
    torch has them (private, so looked up by name), else the CPU's flags. On a CPU without it bf16 autocast
    only adds conversions (about 6x slower than fp32 on a 2-core AVX2 EPYC), so a sweep sizes its bf16
    points by it and the report says so."""
    checks = {"AVX512-BF16": "_is_avx512_bf16_supported", "AMX": "_is_amx_tile_supported"}
    found = [name for name, fn in checks.items() if callable(check := getattr(torch.cpu, fn, None)) and check()]
    flags = cpu_flags()
    found += [name for flag, name in BF16_FLAGS.items() if flag in flags and name not in found]
    capability = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "unknown"
    if found:
        return {"native": True, "text": f"computes bf16 natively ({', '.join(found)})"}
    return {
        "native": False,
        "text": f"does not compute bf16 natively (its best: {capability}; no AVX512-BF16, AMX or Arm BF16)",
    }


def machine(device: torch.device | str) -> dict:
    """What a figure was measured on: the one description that run folders (env.json), the
    benchmarks and the GPU check all record, so their figures can be set side by side."""
    import os
    import platform

    from ddplab.topology import usable_cores

    device = torch.device(device)
    return {
        "device": str(device),
        "device_name": device_name(device),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "cpu_cores": len(usable_cores()),
        "torch_threads": torch.get_num_threads(),
        "cpu_bf16": cpu_bf16()["native"],
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": platform.node(),
    }


def network_link(address: str | None) -> dict | None:
    """The interface this node reaches the others through (the one holding `address`), its line rate as
    the kernel states it, and the rate a root qdisc holds it to (tc tbf or htb: a shaped link, as on
    ddplab's test hosts); None where no interface holds the address. Each figure None where unknown."""
    import re
    import subprocess
    from pathlib import Path

    from ddplab.distributed import interface_for_address
    from ddplab.io.arguments import link_rate

    name = interface_for_address(address) if address else None
    if name is None:
        return None
    try:
        speed = int(Path(f"/sys/class/net/{name}/speed").read_text())
    except (OSError, ValueError):
        speed = -1
    shaped = None
    try:
        qdisc = subprocess.run(
            ["tc", "qdisc", "show", "dev", name], capture_output=True, text=True, errors="replace", timeout=5
        ).stdout
        found = re.search(r"\brate (\S+)", qdisc)
        rate = link_rate(found.group(1)) if found else None  # tc's spelling, as `ddplab hosts` reads it
        shaped = rate / 1e6 if rate is not None else None
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return {"interface": name, "address": address, "speed_mbit": speed if speed > 0 else None, "shaped_mbit": shaped}
