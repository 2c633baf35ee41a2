"""Every batch shape of a run compiled and tuned before the clocks start (contract 7).

Without this, the first epoch's training time carried the compilation and its evaluation time the autotuning
of the evaluation shapes (31 s against 0.03 s later on an H200). Train shapes go through forward and backward,
evaluation shapes through an eval-mode forward, the full and the ragged last batch each. Nothing of the run
changes: no all-reduce (no_sync), gradients dropped, BatchNorm buffers and every RNG restored, no optimizer step.
A CUDA graph's capture, the other thing done before the clocks, is graphed.py's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ddplab.distributed import ddp_module, no_sync, unwrap
from ddplab.engine.precision import Precision

Batch = tuple[torch.Tensor, torch.Tensor]


def batch_sizes(loader) -> list[int]:
    """The distinct batch sizes one epoch of `loader` yields on this rank: full, then the ragged last."""
    n, b = loader.num_samples, loader.batch_size
    sizes = [b] if n >= b else []
    if n % b and not loader.drop_last:
        sizes.append(n % b)
    return sizes


def blank_batch(loader, size: int, device: torch.device) -> Batch:
    """Zeros of the loader's image shape, layout and device, and class-0 labels."""
    x = torch.zeros(size, *loader.images.shape[1:], device=device)
    if loader.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, torch.zeros(size, dtype=torch.long, device=device)


def warm_up_shapes(
    model: torch.nn.Module,
    *,
    train_loader,
    eval_loader,
    precision: Precision,
    device: torch.device,
    forward_backward: Callable[[list[Batch]], object],
    zero_grad: Callable[[], None],
) -> dict[str, list[int]]:
    """Run each shape once through `model` (`forward_backward` for training's, an eval-mode forward for the
    evaluation's); the shapes run."""
    module, ddp = unwrap(model), ddp_module(model)
    buffers = {name: b.clone() for name, b in module.named_buffers()}
    forward_sync = ddp.require_forward_param_sync if ddp is not None else None
    shapes = {"train": batch_sizes(train_loader), "eval": batch_sizes(eval_loader)}
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        model.train()
        for size in shapes["train"]:
            with no_sync(model, skip_sync=True):
                forward_backward([blank_batch(train_loader, size, device)])
            # Each shape from no gradient: under reduce-overhead the gradients are outputs of the backward's
            # CUDA graph, which the next shape's replay overwrites before it accumulates into them.
            zero_grad()
        model.eval()
        with torch.no_grad():
            for size in shapes["eval"]:
                with precision.autocast():
                    model(blank_batch(train_loader, size, device)[0])
    with torch.no_grad():
        for name, b in module.named_buffers():
            b.copy_(buffers[name])
    if ddp is not None:
        assert forward_sync is not None
        ddp.require_forward_param_sync = forward_sync
    model.train()
    return shapes
