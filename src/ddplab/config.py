"""Typed run configuration: a TOML file plus command-line overrides, validated before any work.

A run is described by one `RunConfig` of six sections. Every field carries its help text
(shown by `ddplab train --help`) and is checked in `__post_init__`, so a bad value fails at
construction with a `ConfigError` naming `section.field`, the value and what is allowed.
Checks that depend on the machine (CUDA present, folder exists) live in machine.py's
`check_environment`, which a run's preparation calls before anything is spawned.

Values that mean "not set" are `None`; TOML has no null, so they are simply left out of the
saved `config.toml`, and loading that file gives back the same config.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

from ddplab.data.options import (
    CIFAR100_LABELS,
    DATASETS,
    FLIP_MODES,
    STL10_FOLDS,
    default_root,
    images_per_rank,
    training_images,
)
from ddplab.errors import ConfigError
from ddplab.io.arguments import endpoint_parts
from ddplab.io.borders import COUNT, WHOLE, Kind, number, one_of, shown, whole

MODELS = ("simple_cnn", "vgg_small", "resnet18", "fastnet", "speednet")
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "muon")
SCHEDULES = ("onecycle", "cosine", "linear", "step", "none")
# Planned over train.epochs: extending a run re-plans them, and a shorter run is not the first epochs of a
# longer one (with the others it is, seed for seed, which the report's equal-epoch comparisons use).
SCHEDULES_OVER_THE_RUN = ("onecycle", "cosine", "linear")
PRECISIONS = ("fp32", "bf16", "fp16")
STRATEGIES = ("single", "dp", "ddp")
BACKENDS = ("auto", "nccl", "gloo", "mpi")
ON_RESIZE = ("refuse", "keep_global_batch", "keep_local_batch")  # a --resume at another world size (dist.on_resize)
EARLY_STOP_METRICS = ("test_loss", "test_acc", "train_loss")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
TTA_MODES = ("none", "flip", "flip_translate")


def opt(default: Any, help: str) -> Any:
    """A dataclass field with its help text; lists get a default factory."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


LARGEST_INT = 2**62  # beyond any count ddplab has use for, and beyond what a float (or a C long) holds exactly


AUTO = "auto"  # a setting decided by the run where it runs (train.cuda_graphs, model.channels_last)


def invalid(name: str, value: Any, allowed: str) -> ConfigError:
    """The error a setting's bad value gets: its dotted name, the value (short, whatever it is) and what is allowed."""
    return ConfigError(f"{name}={shown(value)} is not valid: {allowed}")


# The kinds of value a setting may hold are declared on its field, `Annotated[type, KIND]`, with io/borders' kinds:
# the same declarations a file format's reader checks (borders.declared). A section's __post_init__ checks them
# all first (`check_kinds`), then the rules between its fields.
POSITIVE = number(above=0)
NONNEGATIVE = number(0)
FRACTION = number(0, below=1)
PART = number(above=0, most=1)


@functools.cache
def _kinds(section: str) -> tuple[tuple[str, Kind], ...]:
    hints = get_type_hints(SECTIONS[section], include_extras=True)
    return tuple(
        (name, k) for name, hint in hints.items() for k in getattr(hint, "__metadata__", ()) if isinstance(k, Kind)
    )


def check_kinds(settings: object, section: str) -> None:
    """Each of a section's settings against the kind its field declares: one line naming the first that is not."""
    for name, kind in _kinds(section):
        value = getattr(settings, name)
        if not kind.holds(value):
            raise invalid(f"{section}.{name}", value, "must be " + kind.what.removesuffix(" or null"))


@dataclass
class DataConfig:
    dataset: Annotated[str, one_of(*DATASETS)] = opt("cifar10", "dataset: " + " | ".join(DATASETS))
    data_dir: str | None = opt(
        None,
        "data root holding the canonical extracted folders (default: $DDPLAB_DATA, else ./data); "
        "for imagefolder the folder itself",
    )
    download: bool = opt(True, "download the official archive when the dataset is missing")
    image_size: Annotated[int | None, COUNT | None] = opt(
        None, "resize images to this square size in pixels (default: native size)"
    )
    subset: Annotated[int | None, COUNT | None] = opt(None, "train on the first N training images only")
    test_subset: Annotated[int | None, COUNT | None] = opt(
        None, "evaluate on the first N test images only (a quicker, noisier test figure)"
    )
    val_fraction: Annotated[float, FRACTION] = opt(
        0.0, "hold out this fraction of the training images and evaluate on it instead of the test set"
    )
    fold: int | None = opt(None, "STL-10 labelled fold 0-9 to train on (default: the whole train split)")
    cifar100_labels: Annotated[str, one_of(*CIFAR100_LABELS)] = opt("fine", "CIFAR-100 label set: fine | coarse")
    synthetic_size: Annotated[int | None, COUNT | None] = opt(
        None, "synthetic dataset: number of training images (test gets a quarter)"
    )
    num_classes: Annotated[int, whole(2)] = opt(10, "synthetic dataset: number of classes")
    crop_padding: Annotated[int, WHOLE] = opt(
        4, "augment: random crop after reflect-padding by this many pixels (0 = off)"
    )
    translate: Annotated[int, WHOLE] = opt(0, "augment: random shift by up to this many pixels, zero fill (0 = off)")
    flip: bool = opt(True, "augment: random horizontal flip")
    flip_mode: Annotated[str, one_of(*FLIP_MODES)] = opt(
        "random",
        "augment: random (each image, each epoch, p = 0.5) | alternate (a random half in epoch 1, "
        "then each image flips every other epoch)",
    )
    cutout: Annotated[int, WHOLE] = opt(0, "augment: cutout square side in pixels (0 = off)")
    jitter: Annotated[float, FRACTION] = opt(
        0.0, "augment: color jitter strength for brightness, contrast, saturation (0 = off)"
    )
    rotate: Annotated[float, number(0, 180)] = opt(0.0, "augment: random rotation up to this many degrees (0 = off)")

    def __post_init__(self) -> None:
        check_kinds(self, "data")
        if self.test_subset is not None and self.val_fraction > 0:
            raise invalid(
                "data.test_subset",
                self.test_subset,
                "with data.val_fraction the evaluation set is the held-out "
                "split, not the test set: leave test_subset unset",
            )
        if self.fold is not None and not 0 <= self.fold < STL10_FOLDS:
            raise invalid("data.fold", self.fold, f"STL-10 has folds 0-{STL10_FOLDS - 1}")
        if self.fold is not None and self.dataset != "stl10":
            raise invalid("data.fold", self.fold, "folds exist only for --dataset stl10")

    def root(self) -> Path:
        """The data root: --data-dir, else $DDPLAB_DATA, else ./data."""
        return Path(self.data_dir).expanduser() if self.data_dir else default_root()


@dataclass
class ModelConfig:
    name: Annotated[str, one_of(*MODELS)] = opt("simple_cnn", "model: " + " | ".join(MODELS))
    width: Annotated[float, POSITIVE] = opt(1.0, "channel width multiplier")
    dropout: Annotated[float | None, FRACTION | None] = opt(
        None, "dropout probability before the classifier (default: the model's own)"
    )
    batchnorm: bool | None = opt(None, "batch normalization after convolutions (default: the model's own)")
    channels_last: bool | Literal["auto"] = opt(
        "auto",
        "the channels_last memory format for the model and its batches. auto: on a CPU (oneDNN's convolutions "
        "trained 1.2-1.9x and evaluated 1.4-3.6x faster in it on a 2-core EPYC, BENCHMARKS.md), off on CUDA "
        "(it pays there under fp16/bf16 on tensor cores: set true)",
    )
    compile: bool = opt(
        False,
        "torch.compile the model (compiled for every batch shape before training starts: "
        "start-up time, not epoch time)",
    )
    compile_mode: Annotated[str, one_of(*COMPILE_MODES)] = opt(
        "default",
        "torch.compile mode: "
        + " | ".join(COMPILE_MODES)
        + " (reduce-overhead: CUDA graphs for forward and backward, for launch-bound steps)",
    )
    fuse_conv_relu: bool = opt(
        False,
        "replace Conv2d->ReLU pairs with the fused Triton kernel (on CUDA; on a CPU they compute through PyTorch)",
    )

    def __post_init__(self) -> None:
        check_kinds(self, "model")
        if self.compile_mode != "default" and not self.compile:
            raise invalid("model.compile_mode", self.compile_mode, "applies with --model.compile true")


@dataclass
class OptimConfig:
    name: Annotated[str, one_of(*OPTIMIZERS)] = opt("sgd", "optimizer: " + " | ".join(OPTIMIZERS))
    lr: Annotated[float, POSITIVE] = opt(
        0.05,
        "peak learning rate (per optimizer step, not scaled with batch size); "
        "muon: of the parameters that are not conv filters",
    )
    muon_lr: Annotated[float, POSITIVE] = opt(
        0.05, "muon: peak learning rate of the conv filters, whose momentum is orthogonalized"
    )
    muon_momentum: Annotated[float | None, FRACTION | None] = opt(
        None, "muon: momentum of the conv filters (default: optim.momentum, which the other parameters use)"
    )
    muon_ns_steps: Annotated[int, COUNT] = opt(
        5, "muon: Newton-Schulz iterations that orthogonalize the filters' momentum"
    )
    muon_normalize: bool = opt(
        False,
        "muon: rescale each filter bank to norm sqrt(out channels) before its step, so that the step "
        "stays the same fraction of the weights (they are followed by BatchNorm: the scale is free)",
    )
    muon_normalize_every: Annotated[int, COUNT] = opt(
        1, "muon: with muon_normalize, rescale on the first step and then every this many (1: every step)"
    )
    muon_momentum_precision: Annotated[str, one_of("fp32", "bf16")] = opt(
        "fp32",
        "muon: the filters' momentum buffer: fp32 | bf16 (half its memory traffic; the momentum is "
        "orthogonalized in bf16 either way)",
    )
    momentum: Annotated[float, FRACTION] = opt(0.9, "SGD / RMSprop / Muon momentum")
    nesterov: bool = opt(True, "SGD Nesterov momentum")
    betas: list[float] = opt([0.9, 0.999], "Adam / AdamW betas")
    eps: Annotated[float, POSITIVE] = opt(1e-8, "Adam / AdamW / RMSprop epsilon")
    alpha: float = opt(0.99, "RMSprop smoothing constant")
    weight_decay: Annotated[float, NONNEGATIVE] = opt(
        5e-4, "weight decay (decoupled for AdamW and for Muon's filters, L2 otherwise)"
    )
    schedule: Annotated[str, one_of(*SCHEDULES)] = opt("onecycle", "learning-rate schedule: " + " | ".join(SCHEDULES))
    warmup_epochs: Annotated[float, NONNEGATIVE] = opt(
        1.0,
        "cosine / linear: linear warm-up length in epochs (linear: then straight down); onecycle: rise phase in epochs",
    )
    step_epochs: Annotated[int, COUNT] = opt(10, "step: decay the learning rate every this many epochs")
    gamma: Annotated[float, PART] = opt(0.1, "step: decay factor")
    min_lr_ratio: Annotated[float, NONNEGATIVE] = opt(0.0, "cosine / linear: final learning rate as a fraction of lr")
    label_smoothing: Annotated[float, FRACTION] = opt(0.1, "label smoothing of the cross-entropy target")
    grad_clip: Annotated[float | None, POSITIVE | None] = opt(None, "clip the global gradient norm to this value")
    lookahead_steps: Annotated[int, WHOLE] = opt(
        0, "lookahead: every this many steps pull slow weights towards the fast ones and restart from them (0 = off)"
    )
    lookahead_alpha: Annotated[float, PART] = opt(0.5, "lookahead: fraction of the way the slow weights move")

    def __post_init__(self) -> None:
        check_kinds(self, "optim")
        if self.nesterov and self.name in ("sgd", "muon") and self.momentum == 0:
            raise invalid("optim.nesterov", True, "Nesterov needs optim.momentum > 0 (or set --optim.nesterov false)")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise invalid("optim.betas", self.betas, "two numbers in [0, 1)")


@dataclass
class TrainConfig:
    epochs: Annotated[int, COUNT] = opt(10, "number of epochs")
    batch_size: Annotated[int, COUNT] = opt(
        128, "images per process per micro-step (global = batch_size x world size x accumulate)"
    )
    accumulate: Annotated[int, COUNT] = opt(1, "micro-steps per optimizer step (gradient accumulation)")
    eval_batch_size: Annotated[int, COUNT] = opt(1000, "images per process per evaluation batch")
    eval_train_images: Annotated[int, WHOLE] = opt(
        2000,
        "after each epoch, evaluate the first N training images as the test set is (eval mode, "
        "no augmentation): the train side of the train-test gap (train_acc is a running mean over "
        "augmented batches); 0: off",
    )
    tta: Annotated[str, one_of(*TTA_MODES)] = opt(
        "none",
        "test-time augmentation at evaluation, logits averaged: none | flip (2 views) | flip_translate "
        "(6 views: also shifted 1 pixel both ways; the unshifted pair weighs as much as the four shifted)",
    )
    precision: Annotated[str, one_of(*PRECISIONS)] = opt(
        "fp32", "precision: fp32 | bf16 | fp16 (autocast; fp16 uses a gradient scaler on CUDA)"
    )
    device: str = opt("auto", "device: auto | cpu | cuda | cuda:N (auto = cuda when available)")
    seed: int = opt(0, "seed for weights, data order and augmentation")
    threads: Annotated[int | None, COUNT | None] = opt(
        None,
        "CPU: intra-op threads per process (default: $OMP_NUM_THREADS, else every core this process "
        "may use, split between the workers of a node)",
    )
    drop_last: bool = opt(False, "drop the last incomplete training batch of each epoch")
    early_stop_metric: Annotated[str | None, one_of(*EARLY_STOP_METRICS) | None] = opt(
        None, "stop when this metric stops improving: " + " | ".join(EARLY_STOP_METRICS)
    )
    patience: Annotated[int, COUNT] = opt(3, "early stopping: epochs without improvement before stopping")
    min_delta: Annotated[float, NONNEGATIVE] = opt(0.0, "early stopping: smallest change that counts as an improvement")
    deterministic: bool | None = opt(
        None,
        "deterministic algorithms; unset: on for CPU (bit-identical reruns), off on CUDA "
        "(cuDNN picks the fastest kernels; set true for bit-identical GPU reruns)",
    )
    cuda_graphs: bool | Literal["auto"] = opt(
        False,
        "capture the whole training step (forward, backward, all-reduce, optimizer) in a CUDA graph "
        "and replay it: for steps bound by kernel launches (small models and batches); the learning "
        "rate lives on the device; fp32/bf16, nccl. auto: on CUDA wherever true would not be refused "
        "(fp16, DataParallel, gloo, profile_steps, reduce-overhead), else off; the setup line says which and why",
    )
    time_breakdown: bool = opt(
        True,
        "time data / forward+backward / optimizer / communication wait per epoch "
        "(on CUDA measured on 1 step in 20, the device synchronized around it)",
    )
    profile_steps: Annotated[int, WHOLE] = opt(
        0,
        "record up to this many optimizer steps with torch.profiler, from the session's 7th on "
        "(the first 6 warm up) and inside its first epoch: a timeline and a table of ops per rank "
        "in RUN/profile/, the ops with the most self time in the summary; 0: off",
    )
    checkpoint_every: str = opt(
        "epoch",
        "when last.pt is written: epoch (each epoch's end), or also inside epochs every N optimizer steps "
        "(e.g. 200) or every N seconds or minutes (600s, 10m: decided at progress refreshes, 50 an epoch); "
        "a resume continues from the exact place in the epoch's data order",
    )

    def checkpoint_interval(self) -> tuple[str, float]:
        """("epoch", 0), ("steps", N) or ("seconds", S): what checkpoint_every asks for."""
        text = str(self.checkpoint_every).strip().lower()
        if text == "epoch":
            return "epoch", 0
        unit = {"s": 1, "m": 60}.get(text[-1:], 0)
        number = text[:-1] if unit else text
        if not number.isdigit() or int(number) < 1:
            raise invalid(
                "train.checkpoint_every", self.checkpoint_every, "epoch, a number of steps >= 1, or Ns / Nm (time)"
            )
        return ("seconds", int(number) * unit) if unit else ("steps", int(number))

    def __post_init__(self) -> None:
        check_kinds(self, "train")
        self.checkpoint_interval()
        if not (self.device in ("auto", "cpu", "cuda") or is_cuda_index(self.device)):
            raise invalid("train.device", self.device, "auto, cpu, cuda or cuda:N")
        if not 0 <= self.seed < 2**62:
            raise invalid("train.seed", self.seed, "must be in [0, 2**62)")


@dataclass
class DistConfig:
    strategy: Annotated[str, one_of(*STRATEGIES)] = opt(
        "single", "strategy: single | dp (nn.DataParallel) | ddp (DistributedDataParallel)"
    )
    nproc: Annotated[int, COUNT] = opt(1, "ddp: worker processes per node")
    dp_gpus: Annotated[int, WHOLE] = opt(
        0, "dp: the GPUs DataParallel splits each batch over (cuda:0..N-1); 0: every visible GPU"
    )
    backend: Annotated[str, one_of(*BACKENDS)] = opt(
        "auto", "ddp backend: auto | nccl | gloo | mpi (auto = nccl on CUDA, gloo on CPU)"
    )
    nnodes: Annotated[int, COUNT] = opt(1, "ddp: number of nodes (the most, where dist.min_nodes is less)")
    min_nodes: Annotated[int, WHOLE] = opt(
        0,
        "ddp: the fewest nodes the run goes on with (--nnodes MIN:MAX, torchrun's spelling): a lost node's peers "
        "re-form without it and resume from the last checkpoint, and a node started again joins at the next "
        "change; needs dist.on_resize (keep_global_batch or keep_local_batch) and dist.max_restarts >= 1. "
        "0: dist.nnodes (fixed)",
    )
    node_rank: int = opt(0, "ddp: rank of this node")
    rdzv_endpoint: str | None = opt(
        None, "ddp: rendezvous host:port, the same on every node (default: a free port on this machine)"
    )
    rdzv_backend: Annotated[str, one_of("c10d", "static")] = opt(
        "c10d", "ddp: rendezvous: c10d (elastic, ranks assigned on arrival) | static (ranks from --dist.node_rank)"
    )
    rdzv_id: str | None = opt(None, "ddp: rendezvous id shared by all nodes of one multi-node run (default: random)")
    max_restarts: Annotated[int, WHOLE] = opt(0, "ddp: restarts of the worker group after a failure")
    timeout_s: Annotated[int, COUNT] = opt(
        600,
        "ddp: seconds a collective, the nodes' rendezvous or a silent rendezvous host may hold up "
        "the run before it fails",
    )
    bucket_cap_mb: Annotated[float, POSITIVE] = opt(25.0, "ddp: gradient bucket size in MiB")
    static_graph: bool = opt(False, "ddp: static_graph=True")
    gradient_as_bucket_view: bool = opt(False, "ddp: gradients as views into the all-reduce buckets")
    comm_hook: Annotated[str, one_of("none", "fp16", "bf16")] = opt(
        "none", "ddp: gradient compression hook: none | fp16 | bf16"
    )
    sync_bn: bool = opt(False, "ddp: convert BatchNorm to SyncBatchNorm")
    on_resize: Annotated[str, one_of(*ON_RESIZE)] = opt(
        "refuse",
        "ddp: a --resume at another world size: refuse | keep_global_batch (each worker carries the data "
        "shards of the run's first world size that fall to it: the same micro-batches, global batch, steps and "
        "learning rate as the undisturbed run) | keep_local_batch (the global batch follows the workers, the "
        "learning rate with it, linearly, and the schedule is re-planned over the new steps an epoch from the "
        "progress reached)",
    )
    share_device: bool = opt(
        False,
        "ddp: every worker of a node on one GPU, over Gloo (NCCL refuses two ranks on one "
        "device): checks a multi-worker run on a 1-GPU machine; never a speed figure",
    )

    def elastic(self) -> bool:
        """Whether the run's nodes may come and go (MIN < MAX)."""
        return 0 < self.min_nodes < self.nnodes

    def __post_init__(self) -> None:
        check_kinds(self, "dist")
        if self.rdzv_endpoint is not None:
            try:
                endpoint_parts(self.rdzv_endpoint, nodes=self.nnodes)
            except ValueError as exc:
                raise invalid("dist.rdzv_endpoint", self.rdzv_endpoint, str(exc)) from None
        if self.timeout_s > 7 * 24 * 3600:
            raise invalid("dist.timeout_s", self.timeout_s, "at most a week (604800 s)")
        if self.dp_gpus and self.strategy != "dp":
            raise invalid("dist.dp_gpus", self.dp_gpus, "applies with --strategy dp")
        if self.min_nodes > self.nnodes:
            raise invalid("dist.min_nodes", self.min_nodes, f"at most dist.nnodes={self.nnodes} (--nnodes MIN:MAX)")
        if self.elastic():
            needs = [
                f"{flag} ({why})"
                for flag, why, missing in (
                    (
                        "--dist.on_resize keep_global_batch or keep_local_batch",
                        "what a smaller group trains",
                        self.on_resize == "refuse",
                    ),
                    ("--max-restarts 1 or more", "each change restarts the group", self.max_restarts < 1),
                    ("--dist.rdzv_backend c10d", "ranks by arrival", self.rdzv_backend != "c10d"),
                )
                if missing
            ]
            if needs:
                raise invalid(
                    "dist.min_nodes", self.min_nodes, f"a membership that may change needs {', '.join(needs)}"
                )
        if not 0 <= self.node_rank < self.nnodes:
            raise invalid("dist.node_rank", self.node_rank, f"must be in [0, {self.nnodes})")
        if self.strategy != "ddp" and (self.nproc > 1 or self.nnodes > 1):
            raise invalid("dist.nproc", self.nproc, "several processes need --strategy ddp")
        if self.share_device and self.strategy != "ddp":
            raise invalid("dist.share_device", True, "workers share a device only under --strategy ddp")
        if self.share_device and self.backend not in ("auto", "gloo"):
            raise invalid(
                "dist.backend",
                self.backend,
                "--dist.share_device needs gloo (NCCL refuses two ranks on one "
                "device); leave --backend auto, or pass gloo",
            )


@dataclass
class OutputConfig:
    out: str | None = opt(
        None,
        "run folder (default: runs/<dataset>-<model>-<time>-<random>); an existing finished run is never overwritten",
    )
    resume: bool = opt(False, "continue the run in --out from its last checkpoint")
    progress: bool = opt(True, "show a progress bar (only when the output is a terminal)")
    tensorboard: bool = opt(True, "write TensorBoard events when the tensorboard package is installed")
    mlflow: str | None = opt(
        None,
        "log the run to MLflow at this tracking URI (e.g. sqlite:///runs/mlflow.db, http://host:5000; needs "
        "ddplab[mlflow]); unset: $MLFLOW_TRACKING_URI when set; off: never",
    )
    save_best: bool = opt(True, "keep a copy of the weights with the best test accuracy")
    debug: bool = opt(False, "show tracebacks for errors")

    def run_dir(self, data: DataConfig, model: ModelConfig) -> Path:
        if self.out:
            return Path(self.out).expanduser()
        # Workers of one torchrun / srun job must agree on the folder: name it after the job.
        job = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID")
        if job and job != "none":  # torchrun without --standalone says "none"
            return Path("runs") / f"{data.dataset}-{model.name}-{job}"
        import secrets
        import time

        # The second alone collides (two runs started together): a random suffix makes it unique.
        return Path("runs") / f"{data.dataset}-{model.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@dataclass
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        if self.dist.strategy == "dp" and self.train.device == "cpu":
            raise invalid(
                "dist.strategy", "dp", "DataParallel needs CUDA devices; use --strategy ddp --backend gloo on CPU"
            )
        if self.model.compile and self.dist.strategy == "dp":
            raise invalid("model.compile", True, "torch.compile is not supported with DataParallel; use ddp")
        if self.train.cuda_graphs is True:
            self.check_cuda_graphs()
        if self.train.drop_last:
            self.check_a_batch_is_left()

    def check_a_batch_is_left(self) -> None:
        """With train.drop_last, every rank needs one full batch of training images. Checked here where
        the count is known without the data (the named datasets, synthetic data, a subset); a held-out
        split only makes it smaller, and an image folder is counted when it is read."""
        d = self.data
        images = training_images(d.dataset, subset=d.subset, fold=d.fold, synthetic_size=d.synthetic_size)
        if images is None:
            return
        world = self.world_size()
        per_rank = images_per_rank(images, world)
        if per_rank < self.train.batch_size:
            has = (
                f"each of the {world} processes reads {per_rank} of the {images}"
                if world > 1
                else f"the run has {images}"
            )
            raise invalid(
                "train.drop_last",
                True,
                f"it leaves no training batch: {has} training images, fewer than "
                f"train.batch_size={self.train.batch_size}; lower --batch-size or leave drop_last off",
            )

    def most_steps_per_epoch(self) -> int | None:
        """The optimizer steps an epoch takes at most, where the training images are counted without the data
        (a held-out split and drop_last only take steps away); None for an image folder."""
        d = self.data
        images = training_images(d.dataset, subset=d.subset, fold=d.fold, synthetic_size=d.synthetic_size)
        if images is None:
            return None
        batches = math.ceil(images_per_rank(images, self.world_size()) / self.train.batch_size)
        return math.ceil(batches / self.train.accumulate)

    def capture_refusals(self) -> list[tuple[str, Any, str]]:
        """What of this run a captured step cannot hold, (setting, value, why): host-side decisions inside the
        step, or a collective that is not CUDA's."""
        refuse = {
            "train.precision": (
                self.train.precision == "fp16",
                "fp16's gradient scaler decides on the host whether to "
                "skip each step; use bf16 (same speed, no scaler) or fp32",
            ),
            "dist.strategy": (
                self.dist.strategy == "dp",
                "DataParallel scatters batches from the host every step; use ddp",
            ),
            "dist.backend": (self.dist.backend in ("gloo", "mpi"), "only NCCL collectives can be captured; use nccl"),
            "train.profile_steps": (
                self.train.profile_steps > 0,
                "torch.profiler's CUPTI teardown can hang or crash "
                "while CUDA graphs it did not capture replay (pytorch#135003); profile the eager step",
            ),
            "model.compile_mode": (
                self.model.compile_mode == "reduce-overhead",
                "reduce-overhead already captures forward and backward in CUDA graphs; "
                "use --model.compile_mode default with --train.cuda_graphs",
            ),
        }
        out = []
        for name, (bad, why) in refuse.items():
            if bad:
                section, key = name.split(".")
                out.append((name, getattr(getattr(self, section), key), why))
        return out

    def check_cuda_graphs(self) -> None:
        """train.cuda_graphs=true asks for a capture: what cannot be captured is refused before anything runs."""
        for name, value, why in self.capture_refusals()[:1]:
            raise invalid(name, value, f"with train.cuda_graphs: {why}")

    def cuda_graphs_on(self, device_type: str) -> tuple[bool, str]:
        """Whether a run on `device_type` captures its step, and the words its setup line says it with (the one
        rule for train.cuda_graphs=auto: on CUDA, where nothing refuses the capture)."""
        setting = self.train.cuda_graphs
        if setting != AUTO:
            return bool(setting), "on" if setting else "off"
        if device_type != "cuda":
            return False, "auto: off (no CUDA device)"
        refused = self.capture_refusals()
        if refused:
            name, value, why = refused[0]
            return False, f"auto: off ({name}={value!r}: {why.split(';')[0]})"
        return True, "auto: on"

    def channels_last_on(self, device_type: str) -> bool:
        """Whether a run on `device_type` keeps its model and batches channels_last (the one rule for
        model.channels_last=auto: on a CPU, where oneDNN's convolutions prefer it)."""
        setting = self.model.channels_last
        return device_type == "cpu" if setting == AUTO else bool(setting)

    def channels_last_as_run(self) -> bool | str:
        """model.channels_last as the run decides it where train.device names its kind ("auto" on a device
        "auto" picks): what two configs are compared by, so that a config saved before auto was the default
        (false) is the same run on CUDA and another on a CPU."""
        kind = self.train.device.split(":")[0]
        return self.channels_last_on(kind) if kind in ("cpu", "cuda") else self.model.channels_last

    def with_out_folder(self) -> RunConfig:
        """This config with `output.out` set, naming a new folder when unset.

        Named once, by whoever starts the run, and then passed on: every process of the run,
        and the caller's own config, see one folder.
        """
        if self.output.out is None and (self.dist.nnodes > 1 or os.environ.get("TORCHELASTIC_RUN_ID") == "none"):
            raise invalid(
                "output.out",
                None,
                "the processes of a multi-node run (or of torchrun without --standalone or "
                "--rdzv-id) cannot agree on a new folder's name: pass --out, on a filesystem every node sees",
            )
        out = str(self.output.run_dir(self.data, self.model))  # a given one with ~ expanded
        if out == self.output.out:
            return self
        return dataclasses.replace(self, output=dataclasses.replace(self.output, out=out))

    def with_data_root(self) -> RunConfig:
        """This config with the data root it reads as an absolute path (--data-dir, else $DDPLAB_DATA,
        else ./data, from this working directory), so that the run folder's config.toml finds the
        same data from anywhere (`ddplab eval`, `--resume`, `--config`). Synthetic data has none."""
        if self.data.dataset == "synthetic" or (self.data.dataset == "imagefolder" and not self.data.data_dir):
            return self
        root = str(self.data.root().resolve())
        if root == self.data.data_dir:
            return self
        return dataclasses.replace(self, data=dataclasses.replace(self.data, data_dir=root))

    # Derived quantities live here, not in the loop (contract 2).
    def world_size(self) -> int:
        return self.dist.nproc * self.dist.nnodes if self.dist.strategy == "ddp" else 1

    def global_batch_size(self, world_size: int | None = None) -> int:
        return self.train.batch_size * (world_size or self.world_size()) * self.train.accumulate

    def to_dict(self) -> dict[str, Any]:
        return _drop_none(dataclasses.asdict(self))

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


SECTIONS: dict[str, type] = {f.name: get_type_hints(RunConfig)[f.name] for f in fields(RunConfig)}


def is_cuda_index(device: str) -> bool:
    return device.startswith("cuda:") and device[5:].isdigit()


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value


def field_types(section: str) -> dict[str, Any]:
    return get_type_hints(SECTIONS[section])


def coerce(key: str, raw: Any, hint: Any) -> Any:
    """Turn a TOML or command-line value into the field's type, or say why not."""
    text = raw if isinstance(raw, str) else None
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    optional = type(None) in args
    words = [v for a in args if typing.get_origin(a) is Literal for v in typing.get_args(a)]  # "auto", say
    base = next(a for a in args if a is not type(None) and typing.get_origin(a) is not Literal)
    if text is not None and text.strip().lower() in words:
        return text.strip().lower()
    if text is not None and not text.strip():  # `--out "$OUT"` with OUT unset: never read as "use the default"
        raise invalid(key, raw, "an empty value (an unset shell variable?): leave the option out for its default"
                   + (", or say none" if optional else ""))  # fmt: skip
    if optional and (raw is None or text is not None and text.lower() in ("none", "null")):
        return None
    origin = typing.get_origin(base)
    too_large = None
    try:
        if base is bool:
            if isinstance(raw, bool):
                return raw
            if text is not None and text.lower() in ("true", "1", "yes", "on"):
                return True
            if text is not None and text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if base is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            value = int(raw)
            if abs(value) < LARGEST_INT:
                return value
            too_large = value
        if base is float:
            if isinstance(raw, bool) or not math.isfinite(float(raw)):
                raise ValueError  # NaN and inf are never meant
            return float(raw)
        if base is str:
            if not isinstance(raw, str):
                raise ValueError
            return raw
        if origin is list:
            items = raw if isinstance(raw, list) else [s for s in str(raw).split(",") if s.strip()]
            (item_type,) = typing.get_args(base)
            return [coerce(key, item, item_type) for item in items]
    except (TypeError, ValueError):
        pass
    if too_large is not None:
        raise invalid(key, too_large, "must be below 2**62 in size")
    type_name = getattr(base, "__name__", str(base))
    expected = "a list" if origin is list else "a finite number" if base is float else type_name
    expected += "".join(f" or {w!r}" for w in words)
    raise invalid(key, raw, f"expected {expected}")


def build_config(values: dict[str, Any]) -> RunConfig:
    """A validated RunConfig from a nested {section: {field: value}} dict (TOML-shaped)."""
    sections: dict[str, Any] = {}
    for section, content in values.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown config section [{section}]: sections are " + ", ".join(SECTIONS))
        if not isinstance(content, dict):
            raise ConfigError(f"[{section}] must be a table of settings, got {content!r}")
        hints = field_types(section)
        kwargs = {}
        for key, raw in content.items():
            if key not in hints:
                raise ConfigError(f"unknown setting {section}.{key}: [{section}] has " + ", ".join(hints))
            kwargs[key] = coerce(f"{section}.{key}", raw, hints[key])
        try:
            sections[section] = SECTIONS[section](**kwargs)
        except TypeError as exc:  # pragma: no cover - guarded by the key check above
            raise ConfigError(f"[{section}]: {exc}") from None
    return RunConfig(**sections)


def load_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        with path.open("rb") as f:
            if f.read(3) != b"\xef\xbb\xbf":  # a byte-order mark, as Windows editors save UTF-8, is not TOML's
                f.seek(0)
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def merge(base: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in overrides.items():
        merged.setdefault(section, {})
        if isinstance(merged[section], dict):
            merged[section].update(values)
    return merged


def parse_dotted(assignments: list[str]) -> dict[str, dict[str, Any]]:
    """`["optim.lr=0.1", "train.epochs=3"]` -> {"optim": {"lr": "0.1"}, "train": {"epochs": "3"}}."""
    out: dict[str, dict[str, Any]] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().lstrip("-").partition(".")
        if not sep or not dot:
            raise ConfigError(f"override {item!r} is not valid: write section.field=value, e.g. optim.lr=0.1")
        out.setdefault(section, {})[name] = value
    return out


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted names ({"train": {"epochs": 3}} -> {"train.epochs": 3}; lists as tuples), as a
    run folder's config is compared and shown, and the inverse of `parse_dotted`."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def save_config(config: RunConfig, path: Path) -> None:
    from ddplab.io import files

    files.write_text(path, config.to_toml())


def reference_markdown() -> str:
    """The settings reference (docs/configuration.md), generated so the two cannot drift (tested)."""
    out = []
    for section, cls in SECTIONS.items():
        out += [f"`[{section}]`", "", "| setting | default | allowed | meaning |", "|---|---|---|---|"]
        kinds = dict(_kinds(section))
        for f in fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
            said = "unset" if default is None else repr(default).replace("'", '"')
            allowed = kinds[f.name].what.replace(" or null", " or unset") if f.name in kinds else ""
            out.append(f"| `{section}.{f.name}` | `{said}` | {allowed} | {f.metadata['help'].replace('|', '/')} |")
        out.append("")
    return "\n".join(out)
