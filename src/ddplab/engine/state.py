"""What the loop is given and what it keeps: its settings (TrainerConfig, the part of a run's config it reads)
and its state (TrainState: where the run is, its best epoch, its records so far, as each checkpoint holds it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ddplab.rundir.epochs import EpochRecord


@dataclass(frozen=True)
class TrainerConfig:
    """The settings the loop reads, and nothing else (engine/worker.py's `trainer_config` takes them from a run's
    config): what a Trainer can be built with, and tested with, without the whole of a run's config."""

    epochs: int
    seed: int
    accumulate: int
    time_breakdown: bool
    cuda_graphs: bool
    tta: str
    grad_clip: float | None
    label_smoothing: float
    lookahead_steps: int
    lookahead_alpha: float
    save_best: bool
    compile: bool  # model.compile: every batch shape compiled before the clocks start
    fuse_conv_relu: bool  # model.fuse_conv_relu: on CUDA, Triton's autotuning per shape likewise
    checkpoint_every: tuple[str, float] = ("epoch", 0)  # train.checkpoint_every, as checkpoint_interval() reads it
    # What the weights were trained with, as config.toml records it (the data root absolute): each checkpoint
    # holds it, and a resume refuses a config.toml edited since.
    recorded: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainState:
    epoch: int = 0  # epochs completed
    step: int = 0  # optimizer steps taken
    best_test_acc: float = -1.0
    best_epoch: int = 0
    stopped_early: bool = False
    history: list[EpochRecord] = field(default_factory=list)
    # Wall time of the sessions a resumed run continues, each to its last checkpoint (work lost
    # after it is not part of the run): the summary's total_s adds this session's to it.
    earlier_sessions_s: float = 0.0
    # The data shards the run is laid out in (its first world size; 0: a checkpoint older than the record):
    # a run resumed on other workers keeps them (data/loader.py).
    layout_world: int = 0
    # The data shards the configured learning rate was set for (the run's first world size; 0: layout_world): a
    # resume with dist.on_resize=keep_local_batch scales the rate by the shards now over these.
    planned_world: int = 0
    # The schedule's own step (-1: a checkpoint older than the record, whose schedule is at `step`): the optimizer's
    # steps until a keep_local_batch resize re-plans it over the new steps an epoch from the progress reached.
    schedule_step: int = -1
    # Each stretch of steps trained on one set of workers, as the run's membership changed (a resize, a lost or a
    # joined host): {from_step, workers, nodes, train_s, images}; the summary's `membership` where there are two+.
    segments: list[dict[str, Any]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        """Plain data (the records as they are written to metrics.jsonl), which a weights-only load reads."""
        return {**asdict(self), "history": [r.to_json() for r in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
        self.history = [EpochRecord.from_json(r, f"the checkpoint's epoch {i}") for i, r in enumerate(self.history, 1)]


@dataclass
class MidEpoch:
    """Where a checkpoint written inside an epoch stands: what the epoch's end needs of its first part, and what
    the rest needs to continue exactly. Plain values and tensors (a weights-only load reads them)."""

    epoch: int  # the epoch in progress
    position: int  # places of the epoch's data order the job has been handed (data/loader.py)
    steps_done: int  # the epoch's optimizer steps taken
    streams: list[Any]  # each shard's augmentation stream state (empty: no augmentation)
    meters: list[list[float]]  # each rank's [loss_sum, correct, count] so far
    rng: list[dict[str, Any]]  # each rank's torch RNG states (dropout): continued at the same world size
    steps: list[dict[str, Any]]  # the training loss at the epoch's progress refreshes so far
    slow_weights: list[Any] | None = None  # Lookahead's, where it is on

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)
