"""The whole optimizer step as one CUDA graph, for steps bound by kernel launches.

With a small model and batch, a GPU finishes each kernel faster than Python launches the
next, so the step's time is the host's. Capturing records one full step (forward and
backward of every micro-batch, DDP's all-reduce, clipping, the optimizer's update, zeroing
the gradients) once; every later step copies its batch into the graph's input buffers and
replays it: one launch instead of hundreds.

What capture demands, and how each demand is met here:

- Static shapes: full steps replay the graph; the epoch's last step, when it is ragged
  (fewer micro-batches, or a short last batch), runs the very same function eagerly.
- Static memory: gradients exist before capture and are zeroed in place, never set to None
  (`Trainer.zero_grad`); the optimizer's state exists before capture too.
- No host reads inside the step: the learning rate is a device tensor the captured update
  reads (`param_group["lr"]` holds it during capture only). The schedule still runs on the
  host with plain floats; before each replay its value is copied in with `fill_`, a kernel
  argument, not a sync. fp16 is refused at configuration: its gradient scaler decides on
  the host whether to skip a step.
- Warm-up: capture needs a few eager steps first (cuDNN/cuBLAS workspaces, lazily built
  optimizer state; PyTorch's notes ask for 11 under DDP so the reducer has rebuilt its
  buckets), run on a side stream. They are undone afterwards: weights, buffers, optimizer
  state and RNG are restored in place, so capturing changes nothing of the run (tested).

On a CPU there is nothing to capture; `capture=False` runs the same buffers and function
eagerly, which is how the tests check the logic against the plain step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from ddplab.distributed import ddp_module
from ddplab.engine.warmup import batch_sizes
from ddplab.metrics.meters import ClassificationMeter

WARMUP_STEPS = 3
WARMUP_STEPS_DDP = 11  # "at least 11 DDP-enabled eager iterations before capture" (PyTorch CUDA semantics notes)

Batch = tuple[torch.Tensor, torch.Tensor]


class GraphedStep:
    """Static input buffers for `accumulate` micro-batches of `batch_size`, and the step over them.

    `step_fn(micro_batches, meter)` is the trainer's device work for one optimizer step
    (forward/backward, update, zeroing) and returns the step's mean loss; it must not
    touch the host-side schedule. `replay` runs it for a batch group that fits the
    buffers; `fits` says which groups do.
    """

    def __init__(
        self,
        step_fn: Callable[[list[Batch], ClassificationMeter], torch.Tensor],
        *,
        optimizer: torch.optim.Optimizer,
        accumulate: int,
        batch_size: int,
        image_shape: tuple[int, ...],
        device: torch.device,
        channels_last: bool = False,
        capture: bool | None = None,
    ):
        self.step_fn, self.optimizer = step_fn, optimizer
        self.accumulate, self.batch_size, self.device = accumulate, batch_size, torch.device(device)
        self.capture = self.device.type == "cuda" if capture is None else capture
        format = torch.channels_last if channels_last else torch.contiguous_format
        self.inputs = [
            (
                torch.zeros(batch_size, *image_shape, device=self.device).contiguous(memory_format=format),
                torch.zeros(batch_size, dtype=torch.long, device=self.device),
            )
            for _ in range(accumulate)
        ]
        self.lrs = [
            torch.tensor(float(g["lr"]), dtype=torch.float32, device=self.device) for g in optimizer.param_groups
        ]
        self.meter = ClassificationMeter(self.device)  # the step's own sums, zeroed inside the step
        self.loss: torch.Tensor | None = None  # the graph's output: the step's mean loss
        self.graph: Any = None
        self.replays = 0

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def fits(self, micro_batches: list[Batch]) -> bool:
        return len(micro_batches) == self.accumulate and all(len(y) == self.batch_size for _, y in micro_batches)

    def prepare(self, model: torch.nn.Module, *, warmup_steps: int = WARMUP_STEPS) -> None:
        """Warm up and capture (on CUDA), then put every piece of state back as it was."""
        saved = snapshot(model, self.optimizer)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            stream = torch.cuda.Stream(self.device) if self.capture else None
            if stream is not None:
                stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                for _ in range(warmup_steps):
                    self.run_step()
            if stream is not None:
                torch.cuda.current_stream(self.device).wait_stream(stream)
                self.graph = torch.cuda.CUDAGraph()
                with self.lr_tensors_in_groups(), torch.cuda.graph(self.graph):
                    self.loss = self.run_step()
        restore(saved, model, self.optimizer)

    def run_step(self) -> torch.Tensor:
        self.meter.sums.zero_()
        return self.step_fn(self.inputs, self.meter)

    @contextlib.contextmanager
    def lr_tensors_in_groups(self):
        """The optimizer reads `lr` from the device tensors while the update is being recorded."""
        floats = [g["lr"] for g in self.optimizer.param_groups]
        for group, lr in zip(self.optimizer.param_groups, self.lrs, strict=True):
            group["lr"] = lr
        try:
            yield
        finally:
            for group, value in zip(self.optimizer.param_groups, floats, strict=True):
                group["lr"] = value

    def replay(self, micro_batches: list[Batch], meter: ClassificationMeter) -> torch.Tensor:
        """One step over `micro_batches` (which must fit); adds its sums to `meter`."""
        for (x, y), (static_x, static_y) in zip(micro_batches, self.inputs, strict=True):
            static_x.copy_(x, non_blocking=True)
            static_y.copy_(y, non_blocking=True)
        for group, lr in zip(self.optimizer.param_groups, self.lrs, strict=True):
            lr.fill_(group["lr"])  # the host's schedule value, passed as a kernel argument
        if self.graph is not None:
            self.graph.replay()
            loss = self.loss
        else:
            with self.lr_tensors_in_groups():
                loss = self.run_step()
        self.replays += 1
        meter.add(self.meter.sums, self.accumulate * self.batch_size)
        assert loss is not None  # set by the capture whenever there is a graph
        return loss.clone()  # the next replay overwrites the graph's output


NO_FULL_STEP = "not captured: the epoch has no full step (every step runs eagerly)"


def static_step(
    step_fn: Callable[[list[Batch], ClassificationMeter], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    loader,
    *,
    accumulate: int,
    device: torch.device,
    capture: bool | None = None,
) -> GraphedStep | None:
    """The step over `loader`'s full batch groups (`capture=False`: its buffers run eagerly), not yet prepared;
    None where the epoch has no full step."""
    if batch_sizes(loader)[:1] != [loader.batch_size] or len(loader) < accumulate:
        return None
    return GraphedStep(
        step_fn,
        optimizer=optimizer,
        accumulate=accumulate,
        batch_size=loader.batch_size,
        image_shape=tuple(loader.images.shape[1:]),
        device=device,
        channels_last=loader.channels_last,
        capture=capture,
    )


def prepare_step(graphed: GraphedStep, model: torch.nn.Module, *, ragged: bool) -> str:
    """Warm up and capture (PyTorch's count of warm-up steps under DDP); what was done, for the setup line."""
    warmup = WARMUP_STEPS_DDP if ddp_module(model) is not None else WARMUP_STEPS
    model.train()
    graphed.prepare(model, warmup_steps=warmup)
    what = "the whole step captured" if graphed.captured else "static step prepared (not captured)"
    return f"{what} after {warmup} warm-up steps (undone)" + (
        "; the ragged last step of each epoch runs eagerly" if ragged else ""
    )


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Copies of everything a training step changes: weights, buffers, gradients, optimizer state."""

    def copy(value):
        return value.detach().clone() if isinstance(value, torch.Tensor) else value

    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
        "buffers": [b.detach().clone() for b in model.buffers()],
        "state": {p: {k: copy(v) for k, v in s.items()} for p, s in optimizer.state.items()},
    }


@torch.no_grad()
def restore(saved: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Put `saved` back in place: the tensors a captured graph points at keep their storage.

    Optimizer state created after the snapshot (a fresh run's lazily built moments) is
    zeroed, which is what the optimizers' lazy initialization fills in: Adam's moments and
    step count, RMSprop's averages, and a momentum buffer whose first update then equals
    the gradient, as SGD's first step (zero dampening) sets it.
    """
    p: torch.Tensor
    for p, value in zip(model.parameters(), saved["params"], strict=True):
        p.copy_(value)
    for p, grad in zip(model.parameters(), saved["grads"], strict=True):
        if p.grad is not None:
            p.grad.copy_(grad) if grad is not None else p.grad.zero_()
    for b, value in zip(model.buffers(), saved["buffers"], strict=True):
        b.copy_(value)
    for p, state in optimizer.state.items():
        before = saved["state"].get(p, {})
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                value.copy_(before[key]) if key in before else value.zero_()
            else:
                state[key] = before.get(key, 0)
