"""One worker's run, from a validated config to a finished run folder.

`run(plan)` is the body of every process that trains (runplan.py prepared the run once): it
joins the process's group, builds the components (data, model, optimizer, loaders,
sinks), hands them to the `Trainer`, and writes the summary. The building happens before
the trainer exists, so a failure half-way leaves no half-built trainer behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from ddplab import log as logsetup
from ddplab.config import SCHEDULES_OVER_THE_RUN, RunConfig
from ddplab.data.augment import AugmentSpec
from ddplab.data.datasets import load_dataset, make_splits
from ddplab.data.loader import DeviceLoader, shards_of
from ddplab.distributed import DistContext, distributed_context, dp_device_ids, wrap_model
from ddplab.engine import hang
from ddplab.engine.clocks import StepClocks
from ddplab.engine.makedir import prepare_run_dir
from ddplab.engine.optim import build_optimizer, build_scheduler
from ddplab.engine.precision import Precision
from ddplab.engine.state import TrainerConfig
from ddplab.engine.trainer import PROGRESS_UPDATES_PER_EPOCH, Trainer, steps_per_epoch
from ddplab.errors import ConfigError, DataError, TrainingError
from ddplab.io import files
from ddplab.io.borders import WHOLE
from ddplab.metrics import stragglers
from ddplab.metrics.early_stop import EarlyStopping
from ddplab.metrics.gpu import GpuSampler
from ddplab.metrics.profiler import build_profiler
from ddplab.metrics.sinks import MetricSink, NullSink, run_sinks
from ddplab.metrics.system import Stopwatch, synchronize
from ddplab.models import count_flops, count_params, create_model, describe_layers
from ddplab.rundir import checkpoint, runfiles
from ddplab.rundir.epochs import EpochRecord, read_epochs
from ddplab.rundir.runplan import RunPlan
from ddplab.rundir.summary import RunInfo, Summary, build_summary, format_summary, read_summary
from ddplab.topology import group_attempt

log = logging.getLogger("ddplab")


@dataclass
class RunResult:
    run_dir: Path
    summary: Summary
    history: list[EpochRecord] = field(default_factory=list)

    @property
    def test_acc(self) -> float:
        return self.summary["final"]["test_acc"]


def run(plan: RunPlan) -> RunResult:
    """This process's part of a prepared run: join its group, build, train, summarize."""
    start = time.perf_counter()
    with (
        torch_settings_restored(),
        logsetup.restored(),
        distributed_context(plan.config, plan.place) as ctx,
        hang.responding(ctx, plan.run_dir),  # where this rank is, should a collective hang
        memory_errors(plan.config, ctx),
    ):
        return train_in_group(plan, ctx, start)


@contextlib.contextmanager
def torch_settings_restored():
    """A run sets process-wide torch state (determinism, cuDNN autotuning, CPU threads); a caller
    of the Python API gets its own back when the run returns or fails."""
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
        torch.get_num_threads(),
    )
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark = saved[2]
        torch.set_num_threads(saved[3])


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the RuntimeError / MemoryError a failed CPU allocation raises."""
    return isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)
    )


@contextlib.contextmanager
def memory_errors(config: RunConfig, ctx: DistContext):
    """Out of memory anywhere in a worker (building the model, training) is one line, exit 4."""
    try:
        yield
    except (RuntimeError, MemoryError) as exc:
        if not is_out_of_memory(exc):
            raise
        where = "GPU" if ctx.device.type == "cuda" else "CPU"
        raise TrainingError(
            f"rank {ctx.rank} ran out of {where} memory (batch size {config.train.batch_size}, "
            f"model.width {config.model.width:g}); lower --batch-size or --model.width, "
            "or use --train.accumulate"
        ) from None


def finished_result(run_dir: Path) -> RunResult:
    summary = read_summary(run_dir) if (run_dir / runfiles.SUMMARY).is_file() else cast(Summary, {})
    return RunResult(run_dir=run_dir, summary=summary, history=read_epochs(run_dir / runfiles.METRICS, run_dir))


def train_in_group(plan: RunPlan, ctx: DistContext, start: float) -> RunResult:
    config = plan.config
    run_dir = prepare_run_dir(config, ctx)
    logsetup.init_logging(ctx.rank, run_dir / runfiles.LOG if ctx.is_main else None, debug=config.output.debug)
    # The data shards: a resumed run's own; a run whose nodes may come and go lays out as many as it may have
    # workers, whatever number of nodes its first round found (each worker then carries its share).
    layout_world = plan.resume.layout_world if plan.resume else None
    layout_world = layout_world or (config.world_size() if config.dist.elastic() else None)
    planned_world = plan.resume.planned_world if plan.resume else None
    trainer, info = build_trainer(
        config, ctx, run_dir, session_start=start, layout_world=layout_world, planned_world=planned_world
    )
    if config.output.resume:
        assert plan.resume is not None  # check_run_dir read the folder of every resumed run
        path = runfiles.checkpoint_path(run_dir)
        checkpoint.restore(path, trainer.load_state_dict, plan.resume.take_checkpoint(path))
        at = trainer.resume_at
        inside = f" and {at.steps_done} steps of epoch {at.epoch}" if at is not None else ""
        log.info("resumed from epoch %d%s (step %d)", trainer.state.epoch, inside, trainer.state.step)
        if ctx.is_main and trainer.replanned is not None:
            log.info("dist.on_resize=keep_local_batch: %s", trainer.replanned)
        if trainer.state.layout_world != ctx.world_size and ctx.is_main:
            log.info(
                "dist.on_resize=keep_global_batch: %d workers carry the run's %d data shards (rank 0: %s): "
                "the global batch, steps and learning rate as laid out",
                ctx.world_size,
                trainer.state.layout_world,
                ", ".join(map(str, trainer.train_loader.shards)),
            )
        planned_epochs = plan.resume.planned_epochs
        if ctx.is_main and planned_epochs != config.train.epochs and config.optim.schedule in SCHEDULES_OVER_THE_RUN:
            log.warning(
                "changing from %d to %d epochs re-plans the %s schedule over %d: the learning rate goes "
                "from %.3g (the last step's) to %.3g; config.toml now says %d epochs, and --config with it "
                "trains them all under the new plan",
                planned_epochs,
                config.train.epochs,
                config.optim.schedule,
                config.train.epochs,
                trainer.state.history[-1].lr,
                trainer.optimizer.param_groups[0]["lr"],
                config.train.epochs,
            )
    if ctx.is_main and ctx.is_distributed:
        say_membership_change(config, ctx, run_dir, trainer)
        record_round(ctx, run_dir)
    sinks = build_sinks(config, ctx, run_dir, trainer.state.history)
    warmup = maybe_warm_up(trainer)
    profiler = build_profiler(
        config.train.profile_steps,
        ctx.device,
        ctx.rank,
        run_dir,
        first_step=trainer.state.step,
        steps_per_epoch=trainer.steps_per_epoch(),
    )
    startup_s = time.perf_counter() - start
    try:
        with profiler or contextlib.nullcontext():
            state = trainer.fit(sinks, profiler)
    except BaseException as exc:
        sinks.close(exc)  # a tracker ends its run as failed or stopped
        # Gloo/NCCL report a timed-out or broken collective as RuntimeError
        if isinstance(exc, RuntimeError) and ctx.is_distributed and not is_out_of_memory(exc):
            failure = collective_failure(exc, config, ctx, run_dir)
            if ctx.is_main:
                record_round(ctx, run_dir, stopped={"epoch": trainer.state.epoch + 1, "step": trainer.state.step})
            if ctx.is_main and group_attempt() < config.dist.max_restarts:  # the launcher's restart follows
                log.warning(
                    "%s; the group restarts from it (restart %d of %d; this one stopped at step %d, in epoch %d)",
                    failure,
                    group_attempt() + 1,
                    config.dist.max_restarts,
                    trainer.state.step,
                    trainer.state.epoch + 1,
                )
            raise failure from exc
        raise
    summary = build_summary(
        config,
        info,
        state,
        startup_s=startup_s,
        total_s=trainer.elapsed_s(),
        warmup=warmup,
        profile=profiler.result() if profiler is not None else None,
        tracking=sinks.tracking(),
        stragglers_found=stragglers.run_verdict(  # type: ignore[arg-type]
            [r.per_rank for r in state.history],
            ctx.rank_hosts(),
            {
                "all": [r.join_spread_share for r in state.history],
                "in_node": [r.join_spread_in_node_share for r in state.history],
                "across_nodes": [r.join_spread_across_nodes_share for r in state.history],
            },
            steps=state.step,
        ),
    )
    try:
        if ctx.is_main:
            if trainer.run_folder is not None:
                trainer.run_folder.check()
            files.write_json(run_dir / runfiles.SUMMARY, summary)
            print(format_summary(summary, run_dir), flush=True)
        sinks.run_end(summary)
        ended = sinks.tracking()
        if ctx.is_main and ended != summary.get("tracking"):  # a tracker failed at the end
            summary["tracking"] = ended
            files.write_json(run_dir / runfiles.SUMMARY, summary)
    finally:
        sinks.close()
    return RunResult(run_dir=run_dir, summary=summary, history=list(state.history))


def maybe_warm_up(trainer: Trainer) -> dict[str, Any] | None:
    """Compilation and autotuning, timed as start-up: None when the run has nothing to warm up."""
    if not trainer.should_warm_up() or not trainer.should_continue():
        return None
    clock = time.perf_counter()
    done = trainer.warm_up()
    synchronize(trainer.ctx.device)
    warmup_s = time.perf_counter() - clock
    log.info("warm-up (compilation, autotuning, capture: %s) took %.1f s, counted in start-up", done, warmup_s)
    return {"s": round(warmup_s, 3), **done, "counted_in": "startup_s"}


def membership_change(
    before: list[str] | None, ctx: DistContext, config: RunConfig, where: tuple[int, int] | None = None
) -> str | None:
    """What changed in the nodes since the checkpoint was written, in words (None: the same, or not known), with
    where the last round was when it lost one (`where`: epoch, step): `host 10.211.0.3 lost in epoch 2 after step
    11: 2 of 3 nodes (2 workers)`."""
    now = [h for h in ctx.rank_hosts() if h]
    if not before or not now or sorted(set(before)) == sorted(set(now)):
        return None
    lost, joined = sorted(set(before) - set(now)), sorted(set(now) - set(before))
    at = f" in epoch {where[0]} after step {where[1]}" if where else ""
    said = [f"host {', '.join(lost)} lost{at}"] if lost else []
    said += [f"host {', '.join(joined)} joined"] if joined else []
    nodes = len(set(now))
    return f"{'; '.join(said)}: {nodes} of {config.dist.nnodes} nodes ({ctx.world_size} workers)"


def say_membership_change(config: RunConfig, ctx: DistContext, run_dir: Path, trainer: Trainer) -> None:
    """The one line a change of hosts since the round before gets (against the resumed checkpoint's writers where
    no round was recorded), with where that round stopped and where this one goes on from."""
    last = last_round(run_dir)
    before = last["hosts"] if last else trainer.written_by
    if change := membership_change(before, ctx, config, last["stopped"] if last else None):
        going_on = f"going on from the checkpoint at step {trainer.state.step}" if config.output.resume else None
        log.warning("%s: %s", change, going_on or "starting over (no checkpoint yet)")


def record_round(ctx: DistContext, run_dir: Path, stopped: dict[str, int] | None = None) -> None:
    """RUN/round.json: this round's hosts and, when a collective failed under it, where rank 0 had got to (epoch,
    step). Only for a run across hosts (on one node there is no membership to change); it only adds words to the
    next round's line, so it is never in the way of the run, or of its failure."""
    hosts = [h for h in ctx.rank_hosts() if h]
    if hosts:
        with contextlib.suppress(Exception):
            files.write_json(run_dir / runfiles.ROUND, {"hosts": hosts, "stopped": stopped})


def last_round(run_dir: Path) -> dict[str, Any] | None:
    """The round of workers before this one (RUN/round.json): its hosts, and `stopped` (epoch, step) where its
    rank 0 was when a collective failed (None: it ended otherwise, or its rank 0 was lost too). It only adds words
    to a line: a file that is not such a record is left unread (None)."""
    try:
        found = runfiles.read_json(run_dir / runfiles.ROUND, run_dir)
    except (ConfigError, DataError):
        return None
    hosts = found.get("hosts") if isinstance(found, dict) else None
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        return None
    stopped, where = found.get("stopped"), None
    if isinstance(stopped, dict) and all(WHOLE.holds(stopped.get(k)) for k in ("epoch", "step")):
        where = (stopped["epoch"], stopped["step"])
    return {"hosts": found["hosts"], "stopped": where}


MISSING_RANKS_WAIT_S = 10
# A rank whose collective broke because a peer failed waits this long before it fails too: the launcher (which
# polls its workers every 0.1 s and names the first failure it sees) then sees the peer's failure first. A warm
# worker ends in milliseconds (no interpreter tear-down), so without it both could land in one poll, and the
# lower rank, the collateral one, was named.
COLLATERAL_WAIT_S = 0.5


def collective_failure(exc: Exception, config: RunConfig, ctx: DistContext, run_dir: Path) -> Exception:
    """A collective failed or timed out: find out, and say, which ranks never arrived."""
    # The ranks still alive timed out in the same collective, within moments of each other.
    missing = ctx.missing_ranks(
        timeout_s=min(MISSING_RANKS_WAIT_S, config.dist.timeout_s), quiet=not config.output.debug
    )
    answers = hang.ask(ctx) if missing else {}  # every rank that can still answer: where it is (engine/hang.py)
    time.sleep(COLLATERAL_WAIT_S)
    if missing:
        who = ", ".join(f"{rank}{ctx.on_host(rank)}" for rank in missing)
        said = hang.clause(answers, missing, ctx, run_dir)
        return TrainingError(
            f"rank {who} did not reach the collective within dist.timeout_s={config.dist.timeout_s} s"
            + (said or " (stuck or far slower than the others)")
            + "; the last checkpoint is kept"
        )
    return exc


def trainer_config(config: RunConfig, device_type: str) -> TrainerConfig:
    """What of a run's config the loop reads, on `device_type` (train.cuda_graphs=auto decided there)."""
    t, o, m = config.train, config.optim, config.model
    return TrainerConfig(
        epochs=t.epochs,
        seed=t.seed,
        accumulate=t.accumulate,
        time_breakdown=t.time_breakdown,
        cuda_graphs=config.cuda_graphs_on(device_type)[0],
        tta=t.tta,
        grad_clip=o.grad_clip,
        label_smoothing=o.label_smoothing,
        lookahead_steps=o.lookahead_steps,
        lookahead_alpha=o.lookahead_alpha,
        save_best=config.output.save_best,
        compile=m.compile,
        fuse_conv_relu=m.fuse_conv_relu,
        checkpoint_every=t.checkpoint_interval(),
        recorded=config.with_data_root().to_dict(),
    )


def build_trainer(
    config: RunConfig,
    ctx: DistContext,
    run_dir: Path | None,
    session_start: float | None = None,
    layout_world: int | None = None,
    planned_world: int | None = None,
) -> tuple[Trainer, RunInfo]:
    """Every component of a run, built in order and handed to a Trainer (its observers come with `fit`).
    `layout_world`: the data shards of the run a resume continues, where its checkpoint records them;
    `planned_world`: the shards its configured learning rate was set for."""
    configure_determinism(config, ctx.device)
    train_set, eval_set, eval_split = build_datasets(config, ctx)
    torch.manual_seed(config.train.seed)  # identical initial weights on every rank (contract 3)
    model = build_model(config, train_set)
    data_init_s = maybe_init_from_data(model, train_set, ctx.device)
    params, flops = count_params(model), count_flops(model, train_set.image_shape)
    maybe_fuse_conv_relu(model, config, ctx.device)
    graphs, graphs_said = config.cuda_graphs_on(ctx.device.type)
    clocks = StepClocks(ctx.device)  # a captured step runs no comm hook: its ranks' join times go unmeasured
    wrapped = wrap_model(model, config, ctx, on_joined=clocks.joined)
    train_loader, eval_loader, train_eval_loader = build_loaders(config, ctx, train_set, eval_set)
    planned_world = planned_world or layout_world or ctx.world_size
    # On other workers, keep_global_batch has them carry the run's shards; keep_local_batch lays the rest of the run
    # out in the workers as they are (the loader's own layout), its rate scaled below.
    if layout_world and layout_world != ctx.world_size and config.dist.on_resize != "keep_local_batch":
        train_loader.relayout(layout_world, shards_of(ctx.rank, ctx.world_size, layout_world))
    if len(train_loader) == 0:
        raise ConfigError(
            f"train.batch_size={config.train.batch_size} with train.drop_last leaves no training batch: "
            f"this rank has {train_loader.num_samples} training images"
        )
    num_steps = steps_per_epoch(len(train_loader), config.train.accumulate * len(train_loader.shards))
    optimizer = build_optimizer(wrapped.parameters(), config.optim, ctx.device, capturable=graphs)
    for group in optimizer.param_groups:  # linear in the global batch, where it follows the workers (keep_local)
        group["lr"] *= train_loader.layout_world / planned_world
    trainer = Trainer(
        config=trainer_config(config, ctx.device.type),
        ctx=ctx,
        model=wrapped,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, config.optim, epochs=config.train.epochs, steps_per_epoch=num_steps),
        precision=Precision(config.train.precision, ctx.device, cache_casts=not graphs),
        train_loader=train_loader,
        eval_loader=eval_loader,
        early_stopping=EarlyStopping(config.train.early_stop_metric, config.train.patience, config.train.min_delta),
        checkpoint_dir=run_dir / runfiles.CHECKPOINTS if ctx.is_main and run_dir is not None else None,
        gpu_sampler=build_gpu_sampler(config, ctx),
        train_eval_loader=train_eval_loader,
        session_start=session_start,
        clocks=clocks,
        planned_world=planned_world,
    )
    sampler = trainer.gpu_sampler
    every = trainer.timed_step_every()
    info = RunInfo(
        engine={
            "deterministic": resolve_deterministic(config, ctx.device),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "time_breakdown": (
                "off"
                if not config.train.time_breakdown
                else "every step"
                if every == 1
                else f"1 step in {every}, the device synchronized around it"
            ),
            "progress_syncs_per_epoch": min(PROGRESS_UPDATES_PER_EPOCH, num_steps),
            "fused_optimizer": bool(optimizer.defaults.get("fused")),
            "cuda_graphs": graphs,
            "cuda_graphs_said": graphs_said,
            "channels_last": config.channels_last_on(ctx.device.type),
            "cpu_threads": torch.get_num_threads() if ctx.device.type == "cpu" else None,
        },
        gpu={
            "measured": bool(sampler and sampler.measured),
            "reason": sampler.reason if sampler is not None else "no GPU (training on the CPU)",
        },
        data_init_s=data_init_s,
        params=params,
        flops_per_image=flops,
        eval_split=eval_split,
        world_size=ctx.world_size,
        layout_world=train_loader.layout_world,
        lr_scale=train_loader.layout_world / planned_world,
        backend=ctx.backend,
        train_images=len(train_set),
        eval_images=len(eval_set),
        steps_per_epoch=num_steps,
        train_eval_images=len(train_eval_loader.labels) if train_eval_loader is not None else None,
        layers=describe_layers(model),
        device=str(ctx.device),
        num_classes=len(train_set.classes),
    )
    log.info(
        "%s on %s: %d train / %d %s images, %s params, batch %d local / %d global, %d steps/epoch%s",
        config.model.name,
        ctx.device,
        len(train_set),
        len(eval_set),
        eval_split,
        f"{params:,}",
        config.train.batch_size,
        config.global_batch_size(train_loader.layout_world),
        num_steps,
        f", the step in a CUDA graph: {graphs_said}" if config.train.cuda_graphs is not False else "",
    )
    return trainer, info


def maybe_init_from_data(model: torch.nn.Module, train_set, device: torch.device) -> float | None:
    """The whitening stem's weights from the training images, timed (None: the model has no such layer)."""
    from ddplab.engine.data_init import init_whitening, wants_data_init

    if not wants_data_init(model):
        return None
    clock = Stopwatch(device).start()
    whitening = model.whitening
    assert isinstance(whitening, torch.nn.Conv2d)  # what wants_data_init checked
    init_whitening(whitening, train_set, device)
    return round(clock.stop(), 4)


def build_gpu_sampler(config: RunConfig, ctx: DistContext) -> GpuSampler | None:
    """Each rank samples its GPU; DataParallel's one process samples all of them. None on a CPU."""
    if ctx.device.type != "cuda":
        return None
    gpus = dp_device_ids(config) if config.dist.strategy == "dp" else [ctx.device.index or 0]
    return GpuSampler(gpus, rank=ctx.rank)


def build_model(config: RunConfig, data) -> torch.nn.Module:
    m = config.model
    return create_model(
        m.name,
        num_classes=data.num_classes,
        in_channels=data.image_shape[0],
        image_size=data.image_shape[1:],
        width=m.width,
        dropout=m.dropout,
        batchnorm=m.batchnorm,
    )


def maybe_fuse_conv_relu(model: torch.nn.Module, config: RunConfig, device: torch.device) -> None:
    """Swap Conv2d->ReLU pairs for the fused kernel (same parameters, same state_dict keys).

    The Triton kernel runs on CUDA; on a CPU the fused modules compute through PyTorch
    (Triton's CPU interpreter is a correctness tool, far too slow to train with).
    """
    if not config.model.fuse_conv_relu:
        return
    from ddplab.kernels import fuse_conv_relu

    if fuse_conv_relu(model, backend="auto" if device.type == "cuda" else "reference") == 0:
        raise ConfigError(
            f"model.fuse_conv_relu: {config.model.name} has no Conv2d->ReLU pair to fuse "
            "(BatchNorm or another activation sits between them; try --model.batchnorm false)"
        )


def resolve_deterministic(config: RunConfig, device: torch.device) -> bool:
    """Unset means: bit-identical reruns on a CPU (free there), the fastest kernels on CUDA."""
    return config.train.deterministic if config.train.deterministic is not None else device.type != "cuda"


def configure_determinism(config: RunConfig, device: torch.device) -> None:
    deterministic = resolve_deterministic(config, device)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # warn_only: a few CUDA backward kernels (e.g. adaptive pooling) have no deterministic version.
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.benchmark = not deterministic


def build_datasets(config: RunConfig, ctx: DistContext):
    d = config.data
    common: dict[str, Any] = dict(
        image_size=d.image_size,
        download=d.download and ctx.is_main,
        fold=d.fold,
        cifar100_labels=d.cifar100_labels,
        synthetic_size=d.synthetic_size,
        num_classes=d.num_classes,
        seed=config.train.seed,
        progress=ctx.is_main and config.output.progress,
    )
    root = d.root()
    if d.download and ctx.is_distributed:
        # Rank 0 downloads; the others wait for it instead of racing on the same files.
        if ctx.is_main:
            load_dataset(d.dataset, root, "test", **common)
        ctx.barrier()
    train = load_dataset(d.dataset, root, "train", **common)
    test = None if d.val_fraction > 0 else load_dataset(d.dataset, root, "test", **common)
    return make_splits(
        train,
        test if test is not None else train,
        subset=d.subset,
        val_fraction=d.val_fraction,
        seed=config.train.seed,
        test_subset=d.test_subset,
    )


def build_loaders(
    config: RunConfig, ctx: DistContext, train_set, eval_set
) -> tuple[DeviceLoader, DeviceLoader, DeviceLoader | None]:
    """Training batches, evaluation batches, and the first `train.eval_train_images` training images
    cut like evaluation batches (None when that check is off)."""
    d, t = config.data, config.train
    spec = AugmentSpec(
        crop_padding=d.crop_padding,
        translate=d.translate,
        flip=d.flip,
        flip_mode=d.flip_mode,
        cutout=d.cutout,
        jitter=d.jitter,
        rotate=d.rotate,
    )
    common: dict[str, Any] = dict(
        device=ctx.device,
        seed=t.seed,
        rank=ctx.rank,
        world_size=ctx.world_size,
        channels_last=config.channels_last_on(ctx.device.type),
    )
    train_loader = DeviceLoader(
        train_set, batch_size=t.batch_size, train=True, augment=spec, drop_last=t.drop_last, **common
    )
    eval_loader = DeviceLoader(eval_set, batch_size=t.eval_batch_size, train=False, **common)
    seen = min(t.eval_train_images, len(train_set))
    train_eval_loader = (
        DeviceLoader(train_set.select(slice(0, seen)), batch_size=t.eval_batch_size, train=False, **common)
        if seen
        else None
    )
    return train_loader, eval_loader, train_eval_loader


def build_sinks(config: RunConfig, ctx: DistContext, run_dir: Path, history: list[EpochRecord]) -> MetricSink:
    return run_sinks(config, run_dir, history) if ctx.is_main else NullSink()
