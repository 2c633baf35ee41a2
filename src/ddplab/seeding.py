"""Seeds derived from (seed, epoch, rank, ...), so each stream of randomness is independent.

Adding the parts (seed + epoch + rank) makes different runs collide (seed 1, epoch 0 ==
seed 0, epoch 1); hashing them does not.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed that is a pure function of `parts`."""
    digest = hashlib.blake2b(":".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)
