"""Kernel tests run on CPU through Triton's interpreter, or compiled on a CUDA machine.

TRITON_INTERPRET must be set before the Triton kernels are first imported (triton.jit
decides compiled vs interpreted at decoration time), so it is set here, at conftest import,
before any test module of this directory is collected. On a CUDA machine it is left alone
and the tests run the compiled kernels on the GPU.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def full_fp32():
    """Turn off TF32 for the test (the Triton kernel follows cudnn.allow_tf32, as convs do)."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old
