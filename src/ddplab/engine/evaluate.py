"""`ddplab eval`: the loss and accuracy of a finished run's saved weights, in one process.

It rebuilds the run's evaluation set and model from the saved config.toml, so the figure
can be compared, sample for sample, with the one the run itself reported.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ddplab.config import build_config, load_toml
from ddplab.data.loader import DeviceLoader
from ddplab.distributed import DistContext, place_model, resolve_device
from ddplab.engine.precision import Precision
from ddplab.engine.tta import evaluate
from ddplab.errors import ConfigError
from ddplab.machine import check_environment
from ddplab.rundir import checkpoint, runfiles
from ddplab.rundir.runfolder import refuse_edited_since


def evaluate_run(
    run_dir: str | Path,
    *,
    weights: str = "final",
    device: str = "auto",
    data_dir: str | None = None,
    tta: str | None = None,
) -> dict:
    """`tta` overrides the run's own test-time augmentation (to see what it adds, or to add it afterwards)."""
    from ddplab.engine.worker import build_datasets, build_model

    run_dir = Path(run_dir)
    if not (run_dir / runfiles.CONFIG).is_file():
        raise ConfigError(f"{run_dir} is not a ddplab run folder (no config.toml)")
    values = load_toml(run_dir / runfiles.CONFIG)
    values.setdefault("data", {})["download"] = False
    if data_dir is not None:
        values["data"]["data_dir"] = data_dir
    values.setdefault("train", {})["device"] = device
    if tta is not None:
        values["train"]["tta"] = tta  # checked by build_config like any setting
    values.setdefault("dist", {}).update(strategy="single", nproc=1, nnodes=1)
    config = build_config(values)
    check_environment(config)  # e.g. --device cuda on a machine without CUDA: one line, not a traceback
    ctx = DistContext(device=resolve_device(device))
    path = runfiles.checkpoint_path(run_dir, checkpoint.LAST if weights == "final" else checkpoint.BEST)
    state = checkpoint.load(path, ctx.device)
    refuse_edited_since(
        state,
        None,
        run_dir,
        "eval would build another model or data than the weights were trained with; put the file back",
        checkpoint=path,
    )
    epoch = state["train_state"]["epoch"] if "train_state" in state else state.get("epoch")
    _, eval_set, split = build_datasets(config, ctx)
    model = build_model(config, eval_set)
    checkpoint.restore(path, model.load_state_dict, state["model"])
    model = place_model(model, config, ctx.device)  # as the run evaluated: the same sums, in its time
    loader = DeviceLoader(
        eval_set,
        batch_size=config.train.eval_batch_size,
        device=ctx.device,
        train=False,
        channels_last=config.channels_last_on(ctx.device.type),
    )
    with torch.inference_mode(False):
        result = evaluate(model, loader, Precision(config.train.precision, ctx.device), ctx, tta=config.train.tta)
    return {
        **result,
        "run_dir": str(run_dir),
        "weights": weights,
        "epoch": epoch,
        "split": split,
        "tta": config.train.tta,
    }
