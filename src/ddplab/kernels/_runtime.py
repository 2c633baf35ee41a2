"""Which fast paths can run here, and why not: the one place the dispatch rules live.

Triton (`ddplab.kernels._triton`) is imported lazily, on the first kernel call, because
`triton.jit` decides at decoration time whether a kernel is compiled for the GPU or run by
Triton's CPU interpreter (TRITON_INTERPRET=1). So the rule is:

- a CUDA (or ROCm) tensor runs the Triton kernel, compiled;
- a CPU tensor runs it only when TRITON_INTERPRET=1 was set before the first kernel call
  (the interpreter executes the kernel with NumPy: correct, and slow, for tests);
- anything else (no triton installed, another device, float64 for the conv) falls back to
  the pure-PyTorch reference when the caller asked for "auto", and raises when it asked for
  the fast path by name.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

INSTALL_HINT = "pip install 'ddplab[kernels]' (or 'triton>=3.0')"


def interpret_requested() -> bool:
    """True when TRITON_INTERPRET asks for Triton's CPU interpreter (same spellings as Triton)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


@functools.cache
def triton_installed() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["triton"] = None, as tests do to hide it
        return False


def triton_loaded_interpreted() -> bool | None:
    """How the Triton kernels were loaded: True interpreted, False compiled, None not yet."""
    import sys

    module = sys.modules.get("ddplab.kernels._triton")
    return None if module is None else module.INTERPRETED


def triton_unavailable_reason(device: torch.device | str) -> str | None:
    """None when the Triton kernels can run on tensors of `device`, else why not."""
    device = torch.device(device)
    if not triton_installed():
        return f"triton is not installed: {INSTALL_HINT}"
    interpreted = triton_loaded_interpreted()
    if interpreted is None:
        interpreted = interpret_requested()
    if device.type == "cuda":
        if interpreted or torch.cuda.is_available():
            return None
        return "no CUDA device"
    if device.type == "cpu":
        if interpreted:
            return None
        if interpret_requested():
            return "the Triton kernels were already loaded compiled; set TRITON_INTERPRET=1 before the first call"
        return "CPU tensors need TRITON_INTERPRET=1 (Triton's CPU interpreter) or a CUDA device"
    return f"Triton kernels run on CUDA or, interpreted, on CPU; not on {device.type}"


def cuda_unavailable_reason() -> str | None:
    """None when the CUDA C++ extension can be built and run here, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device (the CUDA C++ kernel is built with load_inline on a GPU machine)"
    if torch.version.cuda is None:
        return "this PyTorch build has no CUDA (ROCm or CPU build)"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return "nvcc/CUDA toolkit not found (set CUDA_HOME) to build the CUDA C++ kernel"
    return None
