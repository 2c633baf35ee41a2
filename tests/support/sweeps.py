"""Sweep files that train in seconds, for the tests that run sweeps (here and on a test Slurm cluster)."""

from pathlib import Path

TINY_BASE = """
[sweep]
name = "tiny"

[base.data]
dataset = "synthetic"
synthetic_size = 256
image_size = 16
num_classes = 4
crop_padding = 0
flip = false

[base.model]
width = 0.5
dropout = 0.0

[base.train]
epochs = 2
batch_size = 16
device = "cpu"

[base.output]
tensorboard = false
"""

# Two single-process points, and with them a 2-worker DDP one.
TWO_POINTS = """
[[variants]]
label = "a"
"optim.lr" = 0.01

[[variants]]
label = "b"
"train.batch_size" = 32
"""
THREE_POINTS = (
    TWO_POINTS
    + """
[[variants]]
label = "ddp"
"dist.strategy" = "ddp"
"dist.nproc" = 2
"""
)


def tiny_sweep(path: Path, variants: str = THREE_POINTS, epochs: int = 2) -> Path:
    path.write_text(TINY_BASE.replace("epochs = 2", f"epochs = {epochs}") + variants)
    return path
