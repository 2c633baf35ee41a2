"""The run folder: created once, never silently overwritten, reopened only to resume.

A folder holding a finished run (summary.json) or an unfinished one (a checkpoint) is
refused unless `--resume` asks to continue it; on resume the saved config must match the
requested one except for the number of epochs and output settings.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from ddplab import files, runfiles
from ddplab.config import RunConfig, build_config, load_toml, save_config
from ddplab.distributed import DistContext
from ddplab.engine import checkpoint
from ddplab.errors import ConfigError

RESUMABLE_DIFFERENCES = {"train.epochs", "train.profile_steps"}  # the length, and an observer that changes no number


def check_run_dir(config: RunConfig) -> Path:
    """Decide, before any worker starts, whether this run may use its folder."""
    run_dir = Path(config.output.out)
    state = runfiles.run_state(run_dir)
    if config.output.resume:
        if state not in ("finished", "unfinished"):
            raise ConfigError(f"output.resume: {run_dir} holds no checkpoint to resume from")
        differing = config_differences(load_toml(run_dir / runfiles.CONFIG), config) - RESUMABLE_DIFFERENCES
        if differing:
            raise ConfigError(f"output.resume: the config differs from the run's saved config.toml in "
                              f"{', '.join(sorted(differing))}; resume with the same settings (only train.epochs and train.profile_steps may change)")
        done = checkpoint.load(run_dir / runfiles.CHECKPOINTS / checkpoint.LAST)["train_state"]["epoch"]
        if config.train.epochs < done:
            raise ConfigError(f"train.epochs={config.train.epochs} is not valid: {run_dir} has already trained {done} epochs")
        return run_dir
    if state == "finished":
        raise ConfigError(f"output.out={str(run_dir)!r} already holds a finished run; choose another --out, "
                          "or --resume it with more --epochs")
    if state == "unfinished":
        raise ConfigError(f"output.out={str(run_dir)!r} holds an unfinished run; continue it with --resume, or choose another --out")
    if state == "foreign":
        raise ConfigError(f"output.out={str(run_dir)!r} exists and is not a ddplab run folder; choose another --out")
    return run_dir


def nothing_to_resume(config: RunConfig) -> str | None:
    """Why a resumed run has no epoch left to train, or None when it has work to do."""
    if not config.output.resume:
        return None
    run_dir = Path(config.output.out)
    state = checkpoint.load(run_dir / runfiles.CHECKPOINTS / checkpoint.LAST)["train_state"]
    if state.get("stopped_early"):
        return f"{run_dir} stopped early at epoch {state['epoch']} (no improvement); there is nothing to resume"
    if state["epoch"] >= config.train.epochs:
        return (f"{run_dir} has already trained {state['epoch']} of {config.train.epochs} epochs; "
                "pass a larger --epochs to extend it")
    return None


def extended_from(config: RunConfig) -> int | None:
    """The epoch count a resumed run was planned with, when this resume changes it (an extension)."""
    saved = Path(config.output.out) / runfiles.CONFIG
    if not config.output.resume or not saved.is_file():
        return None
    planned = build_config(load_toml(saved)).train.epochs
    return planned if planned != config.train.epochs else None


def config_differences(saved: dict, config: RunConfig) -> set[str]:
    """Settings (section.field) in which `config` asks for another run than a saved config.toml.

    Data roots compare as the absolute folders they name: a folder written before config.toml
    recorded its root, or a config that leaves it to $DDPLAB_DATA, differs only if the folders do.
    """
    ours = config.with_data_root().to_dict()
    theirs = build_config(saved).with_data_root().to_dict()
    keys = set()
    for section in ours.keys() | theirs.keys():
        if section == "output":
            continue
        a, b = ours.get(section, {}), theirs.get(section, {})
        keys |= {f"{section}.{k}" for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    return keys


def prepare_run_dir(config: RunConfig, ctx: DistContext) -> Path:
    """Rank 0 checks and creates the folder; the others wait for it."""
    run_dir = Path(config.output.out)
    if ctx.is_main:
        check_run_dir(config)
        files.make_dir(run_dir)
        # First: it marks the folder as a run. On resume it records a changed epoch count.
        save_config(reproducible(config), run_dir / runfiles.CONFIG)
        files.make_dir(run_dir / runfiles.CHECKPOINTS)
        files.write_json(run_dir / runfiles.ENV, environment(ctx))
    ctx.barrier()
    return run_dir


def reproducible(config: RunConfig) -> RunConfig:
    """The config as saved: without the folder and resume flag, so `--config` starts a fresh run;
    with the data root absolute, so the folder finds its data from any working directory."""
    values = config.with_data_root().to_dict()
    values["output"].pop("out", None)
    values["output"]["resume"] = False
    return build_config(values)


def environment(ctx: DistContext) -> dict:
    from ddplab import __version__
    from ddplab.metrics.system import device_name

    return {
        "ddplab": __version__,
        "git_sha": git_sha(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "device": str(ctx.device),
        "device_name": device_name(ctx.device),
        "world_size": ctx.world_size,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "argv": sys.argv,
    }


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
