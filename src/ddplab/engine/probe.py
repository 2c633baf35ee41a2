"""The sweep's probe, in its own process: what a run's start and each point's step cost on this machine.

sweep/estimate.py starts it (`python -m ddplab.engine.probe`, warm where points start warm), hands it the
points' configs as JSON on stdin and reads one JSON line back: when torch and then all a run imports were
loaded, how long the first point's data took, and each point's training step and evaluation cost per image
at its own per-worker shape (local batch, threads, precision) on images of the data's shape. The torch side
of the estimate lives here, in the engine it times; the sweep stays torch-free.
"""

from __future__ import annotations

import json
import sys
import time

from ddplab.config import RunConfig, build_config

WARMUP_STEPS = 2  # steps that warm caches and the allocator up, untimed
PROBE_S, MIN_STEPS, MAX_STEPS = 0.2, 3, 40  # then steps are timed as one block of about PROBE_S
PROBE_EVAL_IMAGES = 64  # at most, per evaluation batch timed


def probe_point(config: RunConfig, data) -> dict[str, float]:
    """A point's training step and evaluation cost per image, at its per-worker shape, on images of the data's shape."""
    import torch
    import torch.nn.functional as F

    from ddplab.distributed import place_model, resolve_device, set_cpu_threads
    from ddplab.engine.optim import build_optimizer
    from ddplab.engine.precision import Precision
    from ddplab.engine.worker import build_model

    device = resolve_device(config.train.device)
    workers = config.dist.nproc if config.dist.strategy == "ddp" else 1
    threads = torch.get_num_threads()
    set_cpu_threads(device, config.train.threads, local_world=workers)
    try:
        torch.manual_seed(0)
        model = place_model(build_model(config, data), config, device)  # and its batches in the run's format:
        fmt = torch.channels_last if config.channels_last_on(device.type) else torch.contiguous_format
        optimizer = build_optimizer(model.parameters(), config.optim, device)
        precision = Precision(config.train.precision, device)
        shape = tuple(data.image_shape)
        x = torch.randn(config.train.batch_size, *shape, device=device).contiguous(memory_format=fmt)
        y = torch.randint(0, data.num_classes, (config.train.batch_size,), device=device)

        def step() -> None:
            with precision.autocast():
                loss = F.cross_entropy(model(x).float(), y)
            precision.backward(loss)
            precision.step(optimizer)
            optimizer.zero_grad(set_to_none=True)

        step_s = timed(step, device)
        batch = min(config.train.eval_batch_size, PROBE_EVAL_IMAGES)
        xe = torch.randn(batch, *shape, device=device).contiguous(memory_format=fmt)
        model.eval()

        def evaluate() -> None:
            with torch.no_grad(), precision.autocast():
                model(xe)

        eval_s = timed(evaluate, device, warmup=1, budget_s=PROBE_S / 2, min_steps=1)
        grad_bytes = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    finally:
        torch.set_num_threads(threads)
    return {"step_s": step_s, "eval_image_s": eval_s / batch, "grad_bytes": grad_bytes}


def timed(fn, device, warmup: int = WARMUP_STEPS, budget_s: float = PROBE_S, min_steps: int = MIN_STEPS) -> float:
    """Seconds per call of `fn`: after `warmup` calls, one timed block of as many calls as fit in about
    `budget_s` (at least `min_steps`), as a run's epoch times them (one clock, not one per call)."""
    from ddplab.metrics.system import synchronize

    started = time.perf_counter()
    for _ in range(warmup):
        fn()
    synchronize(device)
    each = (time.perf_counter() - started) / max(1, warmup)
    steps = max(min_steps, min(MAX_STEPS, int(budget_s / max(each, 1e-6))))
    started = time.perf_counter()
    for _ in range(steps):
        fn()
    synchronize(device)
    return (time.perf_counter() - started) / steps


def main() -> None:
    """The probe: configs (as dicts, JSON) on stdin, its measurements as one JSON line on stdout."""
    import torch

    torch_at = time.time()  # a launcher's start
    import torch._dynamo  # noqa: F401 (torch's optimizers and DDP import it on first use: 3 s of every run's start)

    from ddplab.distributed import DistContext, resolve_device
    from ddplab.engine.worker import build_datasets  # what a run imports: ddplab's engine

    ready_at = time.time()
    configs = []
    for values in json.loads(sys.stdin.read()):
        values.setdefault("data", {})["download"] = False  # data not there yet is the first run's to download, said
        configs.append(build_config(values))
    loaded = time.perf_counter()
    first = configs[0]
    train, test, _ = build_datasets(first, DistContext(device=resolve_device(first.train.device)))
    data_s = time.perf_counter() - loaded
    points, data = [], first.data
    for config in configs:
        if config.data != data:  # other images (size, split, folder): the point is timed on its own
            train, test, _ = build_datasets(config, DistContext(device=resolve_device(config.train.device)))
            data = config.data
        cost = probe_point(config, train)
        cost["train_images"] = len(train)
        cost["eval_images"] = len(test) + min(config.train.eval_train_images, len(train))
        points.append(cost)
    print(
        json.dumps(
            {"torch_at": torch_at, "ready_at": ready_at, "data_s": data_s, "points": points, "done_at": time.time()}
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
