"""The end-of-run summary: what was trained, how well, how fast, and whether it overfit.

Built from the per-epoch records only, so the same function serves a finished run, a
resumed one and (later) the report. Times split start-up from training (contract 7);
batch sizes are given local and global (contract 2). `read_summary` is the one reader of
summary.json, checked against its declaration (`Summary`: each field's type and kind, once).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict, cast

from ddplab.config import ON_RESIZE, RunConfig
from ddplab.errors import DataError
from ddplab.io.borders import (
    ANY,
    COUNT,
    FLAG,
    LIST,
    SECONDS,
    SHARE,
    TABLE,
    TEXT,
    WHOLE,
    Each,
    declared,
    list_of,
    number,
    one_of,
)
from ddplab.rundir import runfiles
from ddplab.rundir.epochs import (
    ACROSS_EPOCHS,
    MEMORY,
    PHASES,
    SCHEMA_VERSION,
    EpochRecord,
    check_schema,
    gap_train_acc,
    worst_reading,
)

# summary.json, declared once: its shape for the type checker (a typo in a reader's key is an error, not a silent None)
# and, in each field's Annotated kind, what `read_summary` checks a file against (borders.declared). Each part's fields
# that every ddplab has written are required (its _Written base); the rest an older summary may lack. A field added
# to `build_summary` gets its line here, with its kind.
LOSS, ACC, GAP = number(0) | None, SHARE | None, number(-1, 1) | None


class _RunPartWritten(TypedDict):
    dataset: Annotated[str, TEXT]
    model: Annotated[str, TEXT]
    strategy: Annotated[str, TEXT]
    world_size: Annotated[int, COUNT]
    device: Annotated[str, TEXT]
    precision: Annotated[str, TEXT]


class RunPart(_RunPartWritten, total=False):
    backend: Annotated[str, TEXT]
    shared_device: Annotated[bool, FLAG]
    optimizer: Annotated[str, TEXT]
    lr: Annotated[float, number(0)]
    schedule: Annotated[str, TEXT]
    seed: Annotated[int, WHOLE]
    epochs_planned: Annotated[int, COUNT]
    epochs_done: Annotated[int, WHOLE]


# "global" is a keyword: the functional syntax declares it.
_BatchWritten = TypedDict("_BatchWritten", {"local": Annotated[int, COUNT], "global": Annotated[int, COUNT]})


class BatchPart(_BatchWritten, total=False):
    accumulate: Annotated[int, COUNT]
    steps_per_epoch: Annotated[int, WHOLE]
    optimizer_steps: Annotated[int, WHOLE]
    # The data shards the run is laid out in (its first world size), where workers now carry more than one each
    # (a resume on fewer workers with dist.on_resize=keep_global_batch): the global batch counts them, not workers.
    shards: Annotated[int, COUNT]
    # A run that may train on another number of workers (dist.on_resize, where not "refuse"): its policy, and the
    # factor on the configured learning rate it trained with (keep_local_batch: linear in the global batch).
    on_resize: Annotated[str, one_of(*ON_RESIZE)]
    lr_scale: Annotated[float, number(above=0)]


class _ModelPartWritten(TypedDict):
    params: Annotated[int, COUNT]
    flops_per_image: Annotated[float, number(above=0)]


class ModelPart(_ModelPartWritten, total=False):
    layers: Annotated[str | None, TEXT | None]


class _DataPartWritten(TypedDict):
    train_images: Annotated[int, COUNT]
    eval_images: Annotated[int, COUNT]


class DataPart(_DataPartWritten, total=False):
    eval_split: Annotated[str, TEXT]
    num_classes: Annotated[int, COUNT]
    train_eval_images: Annotated[int | None, WHOLE | None]


class _FinalPartWritten(TypedDict):
    train_acc: Annotated[float, ACC]
    test_loss: Annotated[float, LOSS]
    test_acc: Annotated[float, ACC]


class FinalPart(_FinalPartWritten, total=False):
    epoch: Annotated[int | None, WHOLE | None]
    train_loss: Annotated[float | None, LOSS]
    train_eval_loss: Annotated[float | None, LOSS]
    train_eval_acc: Annotated[float | None, ACC]


class _BestPartWritten(TypedDict):
    test_acc: Annotated[float, ACC]


class BestPart(_BestPartWritten, total=False):
    epoch: Annotated[int | None, WHOLE | None]


class OverfittingPart(TypedDict, total=False):
    train_test_acc_gap: Annotated[float | None, GAP]
    gap_from: Annotated[str, TEXT]
    min_test_loss: Annotated[float | None, LOSS]
    min_test_loss_epoch: Annotated[int | None, WHOLE | None]
    test_loss_rise: Annotated[float | None, number() | None]
    best_minus_final_acc: Annotated[float | None, GAP]


class _TimePartWritten(TypedDict):
    train_s: Annotated[float, SECONDS]
    total_s: Annotated[float, SECONDS]


class TimePart(_TimePartWritten, total=False):
    startup_s: Annotated[float | None, SECONDS | None]
    warmup: Annotated[dict[str, Any] | None, ANY]
    data_init_s: Annotated[float | None, SECONDS | None]
    eval_s: Annotated[float, SECONDS]
    mean_epoch_s: Annotated[float | None, SECONDS | None]
    mean_epoch_s_after_first: Annotated[float | None, SECONDS | None]
    images_per_s: Annotated[float | None, number(0) | None]
    record_s: Annotated[float | None, SECONDS | None]


class GpuPart(TypedDict, total=False):
    measured: Annotated[bool, FLAG]
    reason: Annotated[str | None, TEXT | None]
    per_rank: Annotated[list[Any], LIST]


class RankFigures(TypedDict, total=False):
    per_rank: Annotated[list[float | None], list_of(number() | None)]
    max: Annotated[float, number()]
    mean: Annotated[float, number()]


class _StragglersWritten(TypedDict):
    verdict: Annotated[str, one_of("chronic", "noise", "unmeasured")]
    # the spread between ranks' join times (metrics/stragglers.spreads): all ranks', a host's ranks' and the
    # hosts'; `ddplab plan` takes a GPU's and a node's for STRAGGLER (None: not shown by this run)
    spread_cv: Annotated[float | None, number(0) | None]
    # the chronic straggler: {"ranks": [R, ...], "host": H | None, "last_share": S, "slower": F} (metrics/stragglers)
    straggler: Annotated[dict[str, Any] | None, TABLE | None]
    last_share: Annotated[list[float | None], list_of(number() | None)]
    said: Annotated[str, TEXT]


class StragglersPart(_StragglersWritten, total=False):  # a run from before the spreads were read apart lacks them
    spread_cv_in_node: Annotated[float | None, number(0) | None]
    spread_cv_across_nodes: Annotated[float | None, number(0) | None]


UNMEASURED: StragglersPart = {
    "verdict": "unmeasured",
    "spread_cv": None,
    "spread_cv_in_node": None,
    "spread_cv_across_nodes": None,
    "straggler": None,
    "last_share": [],
    "said": "not measured",
}


class Segment(TypedDict):
    """A stretch of the run's steps on one set of workers (engine/state.py's TrainState.segments)."""

    from_step: Annotated[int, WHOLE]
    to_step: Annotated[int, WHOLE]
    workers: Annotated[int, COUNT]
    nodes: Annotated[int, COUNT]
    images_per_s: Annotated[float | None, number(0) | None]


class TrackerPart(TypedDict, total=False):
    uri: Annotated[str, TEXT]
    run_id: Annotated[str | None, TEXT | None]
    logged: Annotated[bool, FLAG]
    error: Annotated[str | None, TEXT | None]


class _SummaryWritten(TypedDict):
    status: Annotated[str, one_of("finished", "stopped_early")]
    run: RunPart
    batch: BatchPart
    model: ModelPart
    data: DataPart
    final: FinalPart
    best: BestPart
    time: TimePart


class Summary(_SummaryWritten, total=False):
    schema: Annotated[int, WHOLE]
    overfitting: OverfittingPart
    memory: Annotated[dict[str, float], TABLE, Each(number(0))]
    gpu_peak_alloc_mib: Annotated[list[float] | None, list_of(number(0)) | None]
    phases_s: Annotated[dict[str, float], TABLE, Each(SECONDS)]
    contention: Annotated[dict[str, Any], TABLE, Each(number(0) | None)]
    ranks: Annotated[dict[str, Any], TABLE, Each(RankFigures)]
    stragglers: StragglersPart
    gpu: GpuPart
    engine: Annotated[dict[str, Any] | None, TABLE | None]
    profile: Annotated[dict[str, Any] | None, TABLE | None]
    tracking: Annotated[dict[str, Any], TABLE, Each(TrackerPart)]
    # Where the workers changed during the run (a resume on fewer, a lost or joined host): each stretch of steps
    membership: Annotated[list[Segment], list_of(TABLE)]


@dataclass(frozen=True)
class RunInfo:
    """What building a run found out (engine/worker.build_trainer), for its summary."""

    world_size: int
    device: str
    steps_per_epoch: int
    params: int
    flops_per_image: float
    train_images: int
    eval_images: int
    eval_split: str  # test | val
    num_classes: int
    backend: str | None = None  # the process group's (None: one process)
    layers: str | None = None
    train_eval_images: int | None = None  # training images evaluated like the test set (None: off)
    data_init_s: float | None = None  # the whitening stem's init from the data (None: none)
    gpu: dict[str, Any] = field(default_factory=dict)  # whether GPU utilization is sampled, and why not
    engine: dict[str, Any] | None = None  # how the numbers are taken: determinism, syncs, fused optimizer, ...
    layout_world: int | None = None  # the data shards the run is laid out in (None: as many as its workers)
    lr_scale: float = 1.0  # on the configured learning rate: the shards it trains over those it was planned for


def batch_part(config: RunConfig, info: RunInfo, steps: int) -> BatchPart:
    """The batch as trained: the global one counts the data shards, which outnumber the workers after a resume
    on fewer of them (dist.on_resize=keep_global_batch)."""
    shards = info.layout_world or info.world_size
    part: BatchPart = {
        "local": config.train.batch_size,
        "accumulate": config.train.accumulate,
        "global": config.global_batch_size(shards),
        "steps_per_epoch": info.steps_per_epoch,
        "optimizer_steps": steps,
    }
    if shards != info.world_size:
        part["shards"] = shards
    if config.dist.on_resize != "refuse":
        part["on_resize"], part["lr_scale"] = config.dist.on_resize, info.lr_scale
    return part


def build_summary(
    config: RunConfig,
    info: RunInfo,
    state,
    *,
    startup_s: float,
    total_s: float,
    warmup: dict[str, Any] | None = None,
    profile: dict[str, Any] | None = None,
    tracking: dict[str, Any] | None = None,
    stragglers_found: StragglersPart | None = None,
) -> Summary:
    """summary.json: `info` as build_trainer gathered it, the state fit left, the clocks, the warm-up and the
    profile (each None when the run had none)."""
    history: list[EpochRecord] = state.history
    last = history[-1] if history else None
    epoch_s = [r.epoch_s for r in history]
    min_loss = min(history, key=lambda r: r.test_loss) if history else None
    gap_train, gap_from = gap_train_acc(last)
    summary: Summary = {
        "schema": SCHEMA_VERSION,
        "status": "stopped_early" if state.stopped_early else "finished",
        "run": {
            "dataset": config.data.dataset,
            "model": config.model.name,
            "strategy": config.dist.strategy,
            "world_size": info.world_size,
            "backend": info.backend or "none",
            # Workers on one GPU (--dist.share_device): a check that a multi-worker run works, never a speed figure.
            "shared_device": bool(config.dist.share_device and info.world_size > 1),
            "device": info.device,
            "precision": config.train.precision,
            "optimizer": config.optim.name,
            "lr": config.optim.lr,
            "schedule": config.optim.schedule,
            "seed": config.train.seed,
            "epochs_planned": config.train.epochs,
            "epochs_done": state.epoch,
        },
        "batch": batch_part(config, info, state.step),
        "model": {"params": info.params, "flops_per_image": info.flops_per_image, "layers": info.layers},
        "data": {
            "train_images": info.train_images,
            "eval_images": info.eval_images,
            "eval_split": info.eval_split,
            "num_classes": info.num_classes,
            "train_eval_images": info.train_eval_images,
        },
        "final": final_part(last),
        "best": {"epoch": state.best_epoch, "test_acc": state.best_test_acc},
        "overfitting": {
            "train_test_acc_gap": _diff(gap_train, getattr(last, "test_acc", None)),
            "gap_from": gap_from,
            "min_test_loss": getattr(min_loss, "test_loss", None),
            "min_test_loss_epoch": getattr(min_loss, "epoch", None),
            "test_loss_rise": _diff(getattr(last, "test_loss", None), getattr(min_loss, "test_loss", None)),
            "best_minus_final_acc": _diff(state.best_test_acc, getattr(last, "test_acc", None)),
        },
        "time": {
            "startup_s": round(startup_s, 3),
            # Compilation and autotuning run on every batch shape before the clocks (None: nothing to warm up).
            "warmup": warmup,
            "data_init_s": info.data_init_s,  # the whitening stem's init from the data (None: none)
            "train_s": round(sum(r.train_s for r in history), 3),
            "eval_s": round(sum(r.eval_s for r in history), 3),
            "total_s": round(total_s, 3),  # a resumed run's: every session's, each to its last checkpoint
            "mean_epoch_s": round(statistics.fmean(epoch_s), 3) if epoch_s else None,
            # The first epoch still warms caches (cuDNN, the allocator): show the steady state apart.
            "mean_epoch_s_after_first": round(statistics.fmean(epoch_s[1:]), 3) if len(epoch_s) > 1 else None,
            "images_per_s": round(statistics.fmean(r.images_per_s for r in history), 1) if history else None,
            # As the CIFAR-10 speed records time a run: data init + every epoch's training + the last evaluation;
            # start-up, compilation and the earlier epochs' evaluations are left out (each is reported above).
            "record_s": round((info.data_init_s or 0.0) + sum(r.train_s for r in history) + last.eval_s, 3)
            if last
            else None,
        },
        "memory": {
            k: max(getattr(r, k) or 0.0 for r in history)
            for k in MEMORY
            if any(getattr(r, k) is not None for r in history)
        },
        # DataParallel: per-GPU peaks, where GPU 0's extra load shows (PITFALLS row 14).
        "gpu_peak_alloc_mib": [max(col) for col in zip(*(r.gpu_peak_alloc_mib for r in history), strict=False)]
        if last and last.gpu_peak_alloc_mib is not None
        else None,
        "phases_s": {
            k: round(sum(getattr(r, k) or 0.0 for r in history), 3)
            for k in PHASES
            if last and getattr(last, k) is not None
        },
        # What else ran on the machine while this run trained (metrics/contention.py), worst epoch.
        "contention": contention_summary(history),
        "ranks": per_rank_summary(history),
        # Who was slow: the rank (or host) that joined the all-reduce last in most steps, or noise (metrics/stragglers)
        "stragglers": stragglers_found or UNMEASURED,
        "gpu": gpu_summary(info.gpu, history),
        # How the numbers were taken: determinism, cuDNN autotuning, how often the device is synchronized.
        "engine": info.engine,
        # --train.profile_steps: the window, its files under RUN/profile/, the ops with the most self time.
        "profile": profile,
        # Trackers the run logged to (MLflow): where, which run, and whether everything reached them.
        "tracking": tracking or {},
    }
    if segments := membership(state):
        summary["membership"] = segments
    return summary


def membership(state) -> list[Segment]:
    """Each stretch of steps on one set of workers, where the run trained on more than one (else none)."""
    segments = getattr(state, "segments", None) or []
    if len(segments) < 2:
        return []
    ends = [s["from_step"] for s in segments[1:]] + [state.step]
    return [
        {
            "from_step": s["from_step"],
            "to_step": end,
            "workers": s["workers"],
            "nodes": s["nodes"],
            "images_per_s": round(s["images"] / s["train_s"], 3) if s["train_s"] > 0 else None,
        }
        for s, end in zip(segments, ends, strict=True)
    ]


SUMMARY = declared(Summary)  # what read_summary checks a file against, from the declaration above


def read_summary(run_dir: Path) -> Summary:
    """summary.json, checked: its schema version (1: written before the version was, same sections) and each
    field against `SUMMARY`; a bad one is a DataError naming the file and the field."""
    path = run_dir / runfiles.SUMMARY
    summary = runfiles.read_json(path, run_dir)
    if not isinstance(summary, dict):
        raise DataError(f"{path} does not hold a ddplab summary (not a JSON object)")
    check_schema(summary, str(path))
    SUMMARY.check(summary, str(path))
    return cast(Summary, summary)  # checked against its declaration above


CONTENTION_KEYS = ("other_cpu_share", "steal_share", "cpu_pressure_share", "load_avg_1m", "gpu_other_processes")


def contention_summary(history: list[EpochRecord]) -> dict[str, Any]:
    """The highest reading of each contention figure over the epochs (None: never measured)."""
    return {f"max_{key}": worst_reading(history, key) for key in CONTENTION_KEYS}


def final_part(last: EpochRecord | None) -> FinalPart:
    """The last epoch's figures (each None before the first epoch)."""
    keys = ("epoch", "train_loss", "train_acc", "train_eval_loss", "train_eval_acc", "test_loss", "test_acc")
    return cast(FinalPart, {k: getattr(last, k, None) for k in keys})


def gpu_summary(gpu: dict[str, Any], history: list[EpochRecord]) -> GpuPart:
    """Mean utilization and peak memory used per rank's GPU over the run, or why they were not measured."""
    if not gpu.get("measured"):
        return {"measured": False, "reason": gpu.get("reason") or "not measured"}
    util = [r.per_rank["gpu_util_pct"] for r in history if r.per_rank.get("gpu_util_pct")]
    mem = [r.per_rank["gpu_mem_used_mib"] for r in history if r.per_rank.get("gpu_mem_used_mib")]
    per_rank = []
    for rank, (rank_util, rank_mem) in enumerate(zip(zip(*util, strict=False), zip(*mem, strict=False), strict=False)):
        u = [v for v in rank_util if v is not None and math.isfinite(v)]
        m = [v for v in rank_mem if v is not None and math.isfinite(v)]
        per_rank.append(
            {
                "rank": rank,
                "mean_util_pct": round(statistics.fmean(u), 1) if u else None,
                "peak_mem_used_mib": round(max(m), 1) if m else None,
            }
        )
    return {"measured": True, "reason": None, "per_rank": per_rank}


def per_rank_summary(history: list[EpochRecord]) -> dict[str, dict[str, Any]]:
    """Per-rank totals (time, samples) and peaks (memory) over the run, with max and mean across ranks; DDP's
    own timings (ddp_*) are means a step: the last epoch's, in milliseconds (ddp_*_ms)."""
    out = {}
    for key in history[-1].per_rank if history else ():
        if key.endswith("_pct"):  # a rate: averaged over epochs, not summed
            continue
        if key.startswith("ddp_"):  # DDP's own timings: the last epoch's means, where it timed steps
            last: list[Any] = history[-1].per_rank[key]
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in last):
                continue
            per_rank, key = [1000 * v for v in last], key.removesuffix("_s") + "_ms"
        else:  # epochs from before a resume may lack a figure added since: the epochs that hold it
            columns = list(
                zip(*(r.per_rank[key] for r in history if key in r.per_rank), strict=False)
            )  # one tuple per rank
            if key in ACROSS_EPOCHS:  # an epoch's median, p95, max or share: across epochs, not a total
                kept = [[v for v in c if v is not None] for c in columns]
                if not all(kept):
                    continue  # not measured (one rank: no all-reduce to join)
                per_rank = [ACROSS_EPOCHS[key](c) for c in kept]
            else:
                per_rank = [max(c) if key.endswith("_mib") else sum(c) for c in columns]
        out[key] = {
            "per_rank": [round(v, 6 if key in ACROSS_EPOCHS else 3) for v in per_rank],
            "max": round(max(per_rank), 6 if key in ACROSS_EPOCHS else 3),
            "mean": round(statistics.fmean(per_rank), 6 if key in ACROSS_EPOCHS else 3),
        }
    return out


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def resize_said(batch: BatchPart) -> str:
    """A resizable run's batch policy as the summary says it."""
    if batch.get("on_resize") == "keep_global_batch":
        return "keep_global_batch (the global batch kept: a worker carries a lost one's share)"
    return (
        f"keep_local_batch (the global batch follows the workers, the learning rate with it: x{batch['lr_scale']:g} "
        "of the configured, linear in the global batch)"
    )


def format_summary(s: Summary, run_dir: Any = None) -> str:
    """One screen of plain text, the way a person reads a finished run; `run_dir` ends it."""
    run, batch, final, best, over, t = s["run"], s["batch"], s["final"], s["best"], s["overfitting"], s["time"]
    split = s["data"]["eval_split"]
    lines = [
        f"ddplab run {s['status']}: {run['model']} on {run['dataset']}, {run['strategy']} x{run['world_size']} "
        f"on {run['device']}, {run['precision']}, {run['optimizer']} lr {run['lr']:g} ({run['schedule']})",
        f"  epochs        {run['epochs_done']}/{run['epochs_planned']}   batch {batch['local']} local x "
        + (f"{batch['shards']} data shards on {run['world_size']} ranks" if batch.get("shards") else "")
        + ("" if batch.get("shards") else f"{run['world_size']} ranks")
        + f" x {batch['accumulate']} accumulate = {batch['global']} global, "
        f"{batch['optimizer_steps']} optimizer steps"
        + (f"; on other workers: {resize_said(batch)}" if batch.get("on_resize") else ""),
        f"  model         {s['model']['params']:,} params, "
        f"{s['model']['flops_per_image'] / 1e6:,.1f} MFLOP/image forward",
    ]
    if final["epoch"] is not None:
        lines += [
            f"  final         {split} acc {final['test_acc']:.2%}  {split} loss {final['test_loss']:.4f}   "
            + (
                f"train acc {final['train_eval_acc']:.2%}  train loss {final['train_eval_loss']:.4f} "
                f"({s['data']['train_eval_images']:,} training images, eval mode)"
                if final.get("train_eval_acc") is not None
                else f"train acc {final['train_acc']:.2%}  train loss {final['train_loss']:.4f} (running, augmented)"
            ),
            f"  best          {split} acc {best['test_acc']:.2%} at epoch {best['epoch']}",
            f"  overfitting   train-{split} acc gap {over['train_test_acc_gap']:+.2%}; {split} loss min "
            f"{over['min_test_loss']:.4f} at epoch {over['min_test_loss_epoch']}, "
            f"now {over['test_loss_rise']:+.4f} from it",
            f"  time          start-up {t['startup_s']:.1f} s, train {t['train_s']:.1f} s, eval {t['eval_s']:.1f} s, "
            f"total {t['total_s']:.1f} s; {t['images_per_s']:,.0f} images/s",
        ]
    if s["memory"]:
        lines.append(
            "  memory        " + ", ".join(f"{k.replace('_mib', '')} {v:,.0f} MiB" for k, v in s["memory"].items())
        )
    if s["phases_s"]:
        lines.append("  train time    " + phases_text(s["phases_s"]))
    profile = s.get("profile")
    if profile and profile["steps"]:
        ops = ", ".join(f"{o['op']} {o['share']:.0%}" for o in profile["top_ops"])
        busy = f", GPU busy {profile['device_busy_share']:.0%}" if profile.get("device_busy_share") is not None else ""
        lines.append(
            f"  profile       steps {profile['first_step']}-{profile['last_step']}, {profile['step_ms']:.1f} ms a "
            f"step{busy}; {profile['time']} self time: {ops} (profile/{profile['ops']}, profile/{profile['trace']})"
        )
    elif profile:
        lines.append(f"  profile       none written: {profile['reason']}")
    load = s.get("contention") or {}
    if load.get("max_other_cpu_share") is not None:
        gpu = load.get("max_gpu_other_processes")
        lines.append(
            f"  other load    other processes used up to {load['max_other_cpu_share']:.0%} of the CPUs while "
            f"it trained (load average up to {load['max_load_avg_1m']})"
            + (f", up to {gpu} other process(es) on its GPU" if gpu else "")
        )
    if s.get("membership"):
        lines.append(
            "  workers       "
            + " then ".join(str(m["workers"]) for m in s["membership"])
            + ": "
            + ", ".join(
                f"steps {m['from_step']}-{m['to_step']} on {m['workers']} ({m['nodes']} node(s)"
                + (f", {m['images_per_s']:,.0f} images/s)" if m["images_per_s"] is not None else ")")
                for m in s["membership"]
            )
        )
    if run["world_size"] > 1 and s.get("stragglers"):
        lines.append(f"  stragglers    {s['stragglers']['said']}")
    if run["world_size"] > 1:
        for key, stats in s["ranks"].items():
            scale, unit = (
                (1000, " ms")
                if key in ACROSS_EPOCHS and key.endswith("_s")
                else (100, "%")
                if key in ACROSS_EPOCHS
                else (1, "")
            )
            name = key.removesuffix("_s") if unit == " ms" else key
            lines.append(
                f"  per rank      {name}: "
                + " / ".join(f"{scale * v:,.1f}" for v in stats["per_rank"])
                + f"{unit}  (max {scale * stats['max']:,.1f}, mean {scale * stats['mean']:,.1f})"
            )
    if run_dir is not None:
        lines.append(f"  run folder    {run_dir}")
    return "\n".join(lines)


def phases_text(phases: dict[str, float]) -> str:
    """Where training time went, the parts adding up: communication wait is inside forward+backward
    (its probe waits for the all-reduce there), so it is shown as "of which", never beside it."""
    comm = phases.get("comm_wait_s")
    names = {"data_s": "data", "forward_backward_s": "forward+backward", "optimizer_s": "optimizer"}
    parts = []
    for key, name in names.items():
        if key in phases:
            parts.append(
                f"{name} {phases[key]:.1f} s"
                + (f" (of which comm wait {comm:.1f} s)" if key == "forward_backward_s" and comm else "")
            )
    return ", ".join(parts)
