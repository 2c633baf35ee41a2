"""The tiny run every quick test trains: small synthetic images, a narrow net, about a second on a CPU core."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The tiny run as `ddplab train` flags; a test adds what it is about (its batch size, its augmentation, epochs).
TINY = [
    *("--dataset", "synthetic", "--data.synthetic_size", "256", "--data.image_size", "16"),
    *("--data.num_classes", "4", "--model.width", "0.5", "--device", "cpu"),
    *("--output.progress", "false", "--output.tensorboard", "false"),
]
UNAUGMENTED = ["--data.crop_padding", "0", "--data.flip", "false", "--model.dropout", "0"]


def tiny_config(out: Path | None = None, **sections):
    """The tiny run as a config; `sections` override per section, e.g. tiny_config(tmp, train={"epochs": 3})."""
    from ddplab.config import build_config

    values = {
        "data": {"dataset": "synthetic", "synthetic_size": 256, "image_size": 16, "num_classes": 4},
        "model": {"name": "simple_cnn", "width": 0.5},
        "train": {"epochs": 2, "batch_size": 32, "device": "cpu", "eval_batch_size": 64},
        "output": {"progress": False, "tensorboard": False},
    }
    if out is not None:
        values["output"]["out"] = str(out)
    for section, content in sections.items():
        values.setdefault(section, {}).update(content)
    return build_config(values)
