"""What a run folder may be used for: created once, never silently overwritten, reopened only to resume.

A folder holding a finished run (summary.json) or an unfinished one (a checkpoint) is
refused unless `--resume` asks to continue it; on resume the saved config must match the
requested one except for what `RESUMABLE_DIFFERENCES` names. Below runplan.py and the sweep
(which check a folder before anything runs); the engine writes the folder (engine/makedir.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ddplab.config import SECTIONS, RunConfig, build_config, load_toml
from ddplab.errors import ConfigError, DataError
from ddplab.rundir import runfiles

# What a resume may change: the length, an observer, and where and how patiently the nodes meet (a run cut
# short by a network fault resumes on other hosts, or with a longer timeout): none changes a number.
# Settings that change no number of the run (a sweep's re-run may change them)
OBSERVERS = {"train.profile_steps", "train.checkpoint_every"}
# Where a run's nodes meet: an executor that starts each node's part (Ray) picks them for each attempt.
MEETING = {"dist.rdzv_endpoint", "dist.rdzv_id", "dist.node_rank"}
RESUMABLE_DIFFERENCES = {"train.epochs", *OBSERVERS, "dist.timeout_s", "dist.max_restarts", *MEETING, "dist.on_resize"}
# What a resume at another world size changes, where dist.on_resize allows it: how many workers carry the run's shards
RESIZE = {"dist.nproc", "dist.nnodes", "dist.node_rank"}


@dataclass
class Resume:
    """What a run folder that `--resume` continues holds: read once, when the run is prepared."""

    epoch: int  # epochs trained so far
    stopped_early: bool
    planned_epochs: int  # train.epochs of the saved config.toml, before this resume rewrites it
    layout_world: int | None = None  # the data shards the run is laid out in (None: the saved config's world size)
    planned_world: int | None = None  # the shards its configured learning rate was set for (None: layout_world)
    # last.pt as read for the checks, kept for the one restore in this process (None: not read here).
    checkpoint: dict | None = field(default=None, repr=False, compare=False)

    def nothing_left(self, run_dir: Path, epochs: int) -> str | None:
        """Why resuming to `epochs` has no epoch to train, or None when it has work to do."""
        if self.stopped_early:
            return f"{run_dir} stopped early at epoch {self.epoch} (no improvement); there is nothing to resume"
        if self.epoch >= epochs:
            return f"{run_dir} has already trained {self.epoch} of {epochs} epochs; pass a larger --epochs to extend it"
        return None

    def take_checkpoint(self, path: Path) -> dict:
        """last.pt for the restore: the copy read for the checks, handed over once, else read from `path`."""
        state, self.checkpoint = self.checkpoint, None
        return state if state is not None else load_checkpoint(path)

    def without_checkpoint(self) -> Resume:
        """The facts alone, for processes that read the checkpoint themselves (a launcher's workers)."""
        return dataclasses.replace(self, checkpoint=None)


def refuse_by_state(config: RunConfig) -> str:
    """The refusals that need no file read (a finished, unfinished or foreign folder; nothing to resume):
    checked before the folder's lock is taken, so a refused run leaves no trace in it. Returns the state."""
    assert config.output.out is not None  # named by RunConfig.with_out_folder
    run_dir = Path(config.output.out)
    state = runfiles.run_state(run_dir)
    if config.output.resume:
        if state not in ("finished", "unfinished"):
            raise ConfigError(f"output.resume: {run_dir} holds no checkpoint to resume from")
    elif state == "finished":
        raise ConfigError(
            f"output.out={str(run_dir)!r} already holds a finished run; choose another --out, "
            "or --resume it with more --epochs"
        )
    elif state == "unfinished":
        raise ConfigError(
            f"output.out={str(run_dir)!r} holds an unfinished run; continue it with --resume, or choose another --out"
        )
    elif state == "foreign":
        raise ConfigError(f"output.out={str(run_dir)!r} exists and is not a ddplab run folder; choose another --out")
    return state


def check_run_dir(config: RunConfig, saved: RunConfig | None = None) -> Resume | None:
    """Decide whether this run may use its folder, and read what a resumed one holds (config.toml and
    last.pt, once each; `saved`: its config.toml, already read by the caller). None for a new run."""
    refuse_by_state(config)
    if not config.output.resume:
        return None
    assert config.output.out is not None
    run_dir = Path(config.output.out)
    if saved is None:
        saved = saved_config(run_dir)
    differing = config_differences(saved, config) - RESUMABLE_DIFFERENCES
    if config.dist.on_resize != "refuse":
        differing -= RESIZE
    elif differing and differing <= RESIZE and saved.world_size() != config.world_size():
        raise ConfigError(
            f"output.resume: {run_dir} was trained on {saved.world_size()} workers and this resume asks for "
            f"{config.world_size()}, which would change its data order and global batch; resume on "
            f"{saved.world_size()}, or keep both with --dist.on_resize keep_global_batch (fewer workers only), "
            "or let the batch follow the workers with keep_local_batch"
        )
    if differing:
        raise ConfigError(
            f"output.resume: the config differs from the run's saved config.toml in "
            f"{', '.join(sorted(differing))}; resume with the same settings (only "
            f"{', '.join(sorted(RESUMABLE_DIFFERENCES))} may change){changed_defaults(differing)}"
        )
    state = load_checkpoint(runfiles.checkpoint_path(run_dir))
    refuse_edited_since(
        state,
        saved,
        run_dir,
        "resuming would train on with settings the checkpoint was not trained with; put the file back, or start "
        "a new run from it with --config",
    )
    done = state["train_state"]["epoch"]
    layout_world = int(state["train_state"].get("layout_world") or saved.world_size())
    if config.dist.on_resize == "keep_global_batch" and config.world_size() > layout_world:
        raise ConfigError(
            f"dist.on_resize={config.dist.on_resize}: {run_dir} is laid out in {layout_world} data shards, which "
            f"{config.world_size()} workers cannot share out; resume on at most {layout_world}"
        )
    if config.train.epochs < done:
        raise ConfigError(
            f"train.epochs={config.train.epochs} is not valid: {run_dir} has already trained {done} epochs"
        )
    return Resume(
        epoch=done,
        stopped_early=bool(state["train_state"].get("stopped_early")),
        planned_epochs=saved.train.epochs,
        layout_world=layout_world,
        planned_world=int(state["train_state"].get("planned_world") or layout_world),
        checkpoint=state,
    )


def refuse_edited_since(
    state: dict, saved: RunConfig | None, run_dir: Path, consequence: str, checkpoint: Path | None = None
) -> None:
    """One line naming each setting of config.toml (`saved`, read here where None) edited since the checkpoint
    `state` was written (checkpoints hold the config they were trained with since 2026-11-25; older ones are not
    checked), and what using it now would do (`consequence`): a resume, or an eval that would build another
    model than the weights. `checkpoint`: where `state` was read (last.pt by default)."""
    if not isinstance(state.get("config"), dict):
        return
    saved = saved if saved is not None else saved_config(run_dir)
    trained = checkpoint_config(state, checkpoint or runfiles.checkpoint_path(run_dir))
    edited = config_differences(trained, saved) - RESUMABLE_DIFFERENCES
    if edited:
        then, now = trained.to_dict(), saved.to_dict()
        changes = "; ".join(
            f"{k}: {then[k.split('.')[0]][k.split('.')[1]]!r} in the checkpoint, "
            f"{now[k.split('.')[0]][k.split('.')[1]]!r} in the file"
            for k in sorted(edited)
        )
        raise ConfigError(
            f"{run_dir / runfiles.CONFIG} was edited after the run's last checkpoint ({changes}): {consequence}"
        )


def checkpoint_config(state: dict, path: Path) -> RunConfig:
    """The config a checkpoint recorded: data from a file like any other, so a bad value in it is a DataError
    (exit 3) naming the checkpoint, never a setting's error (exit 2) that points at the user's own input."""
    try:
        return build_config(state["config"])
    except ConfigError as exc:
        raise DataError(
            f"{path}: the config it recorded is not one ddplab writes ({exc}); was it edited or written by another "
            "program? Resume from a checkpoint ddplab wrote, or start a new run"
        ) from None


def saved_config(run_dir: Path) -> RunConfig:
    """A run folder's config.toml, the one reader of it for a resume: ddplab writes every section and field, so
    an empty, truncated or other-shaped file is refused naming it, never filled in with defaults."""
    path = Path(run_dir) / runfiles.CONFIG
    values = load_toml(path)
    missing = [s for s in SECTIONS if not isinstance(values.get(s), dict)]
    if missing:
        found = "it is empty" if not values else "no [" + "], [".join(missing) + "]"
        raise ConfigError(
            f"{path} is not the config.toml ddplab wrote for this run ({found}): "
            "edited or truncated? put it back as it was, or start a new run in another folder"
        )
    try:
        return build_config(values)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc} (edited since the run wrote it?)") from None


# Defaults that changed, and what a folder written before the change asks for to be continued
CHANGED_DEFAULTS = {
    "model.channels_last": 'its default became "auto" on 2026-11-29 (channels_last on a CPU): a folder trained '
    "before it ran NCHW, which model.channels_last=false asks for",
}


def changed_defaults(differing: set[str]) -> str:
    """What a refusal adds where a setting differs because its default changed ("" where none does)."""
    return "".join(f"; {key}: {why}" for key, why in CHANGED_DEFAULTS.items() if key in differing)


def config_differences(saved: RunConfig, config: RunConfig) -> set[str]:
    """Settings (section.field) in which `config` asks for another run than a saved config.toml's.

    Data roots compare as the absolute folders they name: a folder written before config.toml
    recorded its root, or a config that leaves it to $DDPLAB_DATA, differs only if the folders do.
    """
    ours = config.with_data_root().to_dict()
    theirs = saved.with_data_root().to_dict()
    ours["model"]["channels_last"] = config.channels_last_as_run()  # a setting's meaning, where "auto" decides it
    theirs["model"]["channels_last"] = saved.channels_last_as_run()
    keys = set()
    for section in ours.keys() | theirs.keys():
        if section == "output":
            continue
        a, b = ours.get(section, {}), theirs.get(section, {})
        keys |= {f"{section}.{k}" for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    return keys


def load_checkpoint(path: Path) -> dict:
    from ddplab.rundir import checkpoint  # torch: only a resumed run reads one

    return checkpoint.load(path)
