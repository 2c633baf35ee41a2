import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_CIFAR = REPO.parent / "shared" / "data" / "cifar10-jpeg"


def cifar10_root() -> Path | None:
    """The data root holding cifar-10-batches-bin, from DDPLAB_DATA or ../shared."""
    for cand in (os.environ.get("DDPLAB_DATA"), SHARED_CIFAR):
        if cand and (Path(cand) / "cifar-10-batches-bin" / "test_batch.bin").is_file():
            return Path(cand)
    return None


@pytest.fixture
def cifar_root() -> Path:
    root = cifar10_root()
    if root is None:
        pytest.skip("CIFAR-10 not found: set DDPLAB_DATA to a root holding cifar-10-batches-bin")
    return root
