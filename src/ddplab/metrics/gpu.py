"""GPU utilization, memory and power, sampled a few times a second while a rank trains.

The seed reports showed nvidia-smi charts; this records the same figures from NVML (the
library behind nvidia-smi, `pip install nvidia-ml-py`) in a background thread, so the
training step never waits for it. Each rank samples its own GPU from `start()` to
`stop()`; without NVML or without a GPU the sampler records nothing and says why, and the
run's files say "not measured".
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

SAMPLES_PER_S = 4


def load_nvml() -> tuple[Any | None, str | None]:
    """The initialized `pynvml` module, or None and the reason it cannot be used."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError: no driver, no GPU, ...
        return None, f"NVML cannot start ({exc})"
    return pynvml, None


def nvml_index(cuda_index: int) -> int:
    """NVML numbers every GPU of the machine; CUDA only the visible ones, in CUDA_VISIBLE_DEVICES order."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    try:
        return int(visible[cuda_index])
    except (IndexError, ValueError):  # unset, or UUIDs: assume the identity mapping
        return cuda_index


class GpuSampler:
    """Samples the GPUs `gpus` (CUDA indices) every `interval_s` seconds between `start()` and `stop()`.

    One rank samples its own GPU; a DataParallel process samples all of its GPUs. `nvml` is
    the pynvml module (or a stand-in with the same functions, for tests); None means "load
    it" when there are GPUs to sample. Each sample: t_s (seconds since `clock_zero`), rank,
    gpu (the CUDA index), util_pct (SM busy share over NVML's last period), mem_used_mib
    (the whole device, all processes), power_w.
    """

    def __init__(
        self,
        gpus: list[int],
        *,
        rank: int = 0,
        interval_s: float = 1 / SAMPLES_PER_S,
        nvml: Any | None = None,
        clock_zero: float | None = None,
    ):
        self.gpus, self.rank, self.interval_s = list(gpus), rank, interval_s
        self.clock_zero = time.perf_counter() if clock_zero is None else clock_zero
        self.samples: list[dict[str, Any]] = []
        self.reason: str | None = None
        self.handles: list[Any] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.nvml: Any = nvml  # the pynvml module (or a stand-in), or None
        if not self.gpus:
            self.nvml, self.reason = None, "no GPU (training on the CPU)"
            return
        if nvml is None:
            self.nvml, self.reason = load_nvml()
        if self.nvml is not None:
            try:
                self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(nvml_index(g)) for g in self.gpus]
            except Exception as exc:
                self.nvml, self.reason = None, f"NVML does not know GPU(s) {self.gpus} ({exc})"

    @property
    def measured(self) -> bool:
        return self.nvml is not None

    def sample(self) -> list[dict[str, Any]]:
        t_s = round(time.perf_counter() - self.clock_zero, 3)
        rows = []
        for gpu, handle in zip(self.gpus, self.handles, strict=True):
            util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                power_w = self.nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
            except Exception:  # not every GPU reports its power
                power_w = None
            rows.append(
                {
                    "t_s": t_s,
                    "rank": self.rank,
                    "gpu": gpu,
                    "util_pct": float(util.gpu),
                    "mem_used_mib": round(memory.used / 2**20, 1),
                    "power_w": power_w,
                }
            )
        return rows

    def other_processes(self) -> int | None:
        """The most processes on one of this rank's GPUs besides this one (None: not measured).

        A count, not a list of PIDs: in a container NVML reports the host's PIDs, which
        this process cannot match against its own.
        """
        if not self.measured:
            return None
        try:
            counts = [len(self.nvml.nvmlDeviceGetComputeRunningProcesses(h)) for h in self.handles]
        except Exception:  # an old driver without the call, or NVML gone: not measured
            return None
        return max((max(c - 1, 0) for c in counts), default=0)

    def start(self) -> GpuSampler:
        self.samples = []
        if self.measured:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"ddplab-gpu-sampler-{self.rank}", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.samples.extend(self.sample())
            except Exception as exc:  # the driver went away mid-run: stop sampling, keep training
                self.nvml, self.reason = None, f"NVML stopped answering ({exc})"
                return
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> list[dict[str, Any]]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return list(self.samples)


def summarize(samples: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean utilization and power, peak memory: the figures a summary shows per GPU."""
    if not samples:
        return {"mean_util_pct": None, "peak_mem_used_mib": None, "mean_power_w": None, "samples": 0}
    power = [s["power_w"] for s in samples if s.get("power_w") is not None]
    return {
        "mean_util_pct": round(sum(s["util_pct"] for s in samples) / len(samples), 1),
        "peak_mem_used_mib": round(max(s["mem_used_mib"] for s in samples), 1),
        "mean_power_w": round(sum(power) / len(power), 1) if power else None,
        "samples": len(samples),
    }
