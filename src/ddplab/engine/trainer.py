"""The training loop: one for every strategy.

`Trainer` receives built objects (model already wrapped for its strategy, loaders already
sharded, sinks already chosen for this rank) and only runs epochs. Nothing in here asks
whether it runs under DDP: reductions go through `DistContext`, gradient sync through
`no_sync`, and rank-0-only output through the sinks (STYLE rules 5-7).

An epoch is: reseed, train (optimizer steps of `accumulate` micro-batches), evaluate,
record, checkpoint, decide whether to stop. Checkpoints are taken at epoch boundaries,
where the data order and augmentation of the next epoch depend only on (seed, epoch), so
a resumed run continues bit-identically (contract 5); with `train.checkpoint_every` also
inside epochs, with the data position, augmentation streams, RNG and partial sums each rank
had reached (engine/state.py's MidEpoch), so a resume from there is as exact.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ddplab import faults
from ddplab.distributed import DistContext, no_sync, unwrap
from ddplab.engine.clocks import StepClocks
from ddplab.engine.comm import CommTimers
from ddplab.engine.graphed import NO_FULL_STEP, GraphedStep, prepare_step, static_step
from ddplab.engine.lookahead import Lookahead
from ddplab.engine.makedir import FolderIdentity
from ddplab.engine.phases import PhaseTimer
from ddplab.engine.precision import Precision
from ddplab.engine.readings import EpochReadings
from ddplab.engine.state import MidEpoch, TrainerConfig, TrainState
from ddplab.engine.tta import evaluate
from ddplab.engine.warmup import Batch, warm_up_shapes
from ddplab.errors import TrainingError
from ddplab.metrics import stragglers
from ddplab.metrics.early_stop import EarlyStopping
from ddplab.metrics.gpu import GpuSampler
from ddplab.metrics.meters import ClassificationMeter
from ddplab.metrics.profiler import StepProfiler
from ddplab.metrics.sinks import MetricSink, NullSink
from ddplab.metrics.system import Stopwatch
from ddplab.rundir import checkpoint
from ddplab.rundir.epochs import EpochRecord
from ddplab.seeding import derive_seed

log = logging.getLogger(__name__)

PROGRESS_UPDATES_PER_EPOCH = 50  # each one is a device-to-host sync
CUDA_TIMED_STEP_EVERY = 20  # the time breakdown synchronizes a GPU around 1 step in this many


def steps_per_epoch(num_batches: int, accumulate: int) -> int:
    """Optimizer steps in an epoch: the last one may gather fewer than `accumulate` micro-batches."""
    return math.ceil(num_batches / accumulate)


@dataclass
class EpochTraining:
    """What an epoch of training hands to `run_epoch`, which adds evaluation and clocks for the record."""

    loss: float  # global mean training loss (all ranks)
    acc: float
    count: int  # training images seen, all ranks
    steps: list[dict[str, Any]]  # the training loss at each progress refresh (steps.jsonl)
    phases: dict[str, float] | None  # seconds per phase of the step; None with time_breakdown off
    last_step: list[Batch]  # its micro-batches: what the communication probe replays
    ddp_start: dict[str, float] | None = None  # DDP's timing totals once its first step had run (engine/comm.py)
    session_count: int = 0  # training images this session trained of the epoch (its clock's), all ranks


class Trainer:
    def __init__(
        self,
        *,
        config: TrainerConfig,
        ctx: DistContext,
        model: torch.nn.Module,
        optimizer,
        scheduler,
        precision: Precision,
        train_loader,
        eval_loader,
        early_stopping: EarlyStopping,
        checkpoint_dir: Path | None,
        gpu_sampler: GpuSampler | None = None,
        train_eval_loader=None,
        session_start: float | None = None,
        clocks: StepClocks | None = None,
        planned_world: int | None = None,
    ):
        self.config, self.ctx = config, ctx
        self.model, self.optimizer, self.scheduler, self.precision = model, optimizer, scheduler, precision
        self.train_loader, self.eval_loader = train_loader, eval_loader
        self.train_eval_loader = train_eval_loader  # training images evaluated like the test set; None: off
        self.early_stopping = early_stopping
        self.sinks: MetricSink = NullSink()  # the observers of a fit: fit(sinks, profiler)
        self.checkpoint_dir = checkpoint_dir  # None on ranks that do not write
        # The folder it writes into, as found now: checked before each epoch's writes.
        self.run_folder = FolderIdentity.of(checkpoint_dir.parent) if checkpoint_dir is not None else None
        layout = getattr(train_loader, "layout_world", ctx.world_size)
        self.state = TrainState(layout_world=layout, planned_world=planned_world or layout, schedule_step=0)
        # Micro-batches a step: the configured ones from each data shard this worker carries (more than its own
        # after a resume on fewer workers), each rank's gradient weighed by its share of the global batch.
        shards = len(getattr(train_loader, "shards", (ctx.rank,)))
        self.accumulate = config.accumulate * shards
        self.batch_share = self.state.layout_world / (shards * ctx.world_size)
        self.resume_at: MidEpoch | None = None  # where a checkpoint written inside an epoch left it
        self.written_by: list[str] | None = None  # each rank's host as the resumed checkpoint was written
        self.replanned: str | None = None  # what a keep_local_batch resume changed, in words (None: nothing)
        self.last_checkpoint_t = time.perf_counter()
        self.last_lr = optimizer.param_groups[0]["lr"]
        self.gpu_sampler = gpu_sampler  # None: not sampled (no GPU); the same on every rank
        self.graphed: GraphedStep | None = None  # the captured step, with --train.cuda_graphs
        self.profiler: StepProfiler | None = None  # --train.profile_steps: told of every optimizer step
        self.comm = CommTimers(model, ctx, every=self.timed_step_every())
        self.readings = EpochReadings(ctx, model, gpu_sampler)  # the machine's side of each epoch
        self.clocks = clocks or StepClocks(ctx.device)  # each rank's step and join times (who is slow)
        # rank 0's view of the last steps: names a chronic straggler the first time one shows
        self.window = stragglers.Window(ctx.rank_hosts()) if ctx.is_main else None
        self.lookahead = (
            Lookahead(unwrap(model).parameters(), every=config.lookahead_steps, alpha=config.lookahead_alpha)
            if config.lookahead_steps
            else None
        )
        self.clock_zero = time.perf_counter()  # t_s of step and GPU samples counts from here
        self.session_start = self.clock_zero if session_start is None else session_start  # this session's wall clock

    # ---- the table of contents -------------------------------------------------------
    def fit(self, sinks: MetricSink | None = None, profiler: StepProfiler | None = None) -> TrainState:
        """Train to the end (the configured epochs, or early stopping); `sinks` hear of every step and epoch,
        `profiler` of every optimizer step, for this fit."""
        self.sinks, self.profiler = sinks or NullSink(), profiler
        self.open_segment()
        while self.should_continue():
            epoch = self.state.epoch + 1
            record, samples = self.run_epoch(epoch)
            if not math.isfinite(record.test_loss):  # the same on every rank: it is all-reduced
                raise self.nonfinite("the evaluation loss", epoch)
            self.state.epoch = epoch
            self.state.history.append(record)
            stop = self.early_stopping.update(
                epoch, record.metric(self.early_stopping.metric) if self.early_stopping.metric else None
            )
            if self.run_folder is not None:
                self.run_folder.check()  # moved or removed meanwhile: stop, never write a half folder at the old path
            if record.test_acc > self.state.best_test_acc:
                self.state.best_test_acc, self.state.best_epoch = record.test_acc, epoch
                self.maybe_save_best()
            self.state.stopped_early = stop and epoch < self.config.epochs
            self.maybe_save_checkpoint()
            self.sinks.epoch_end(record)
            for name, rows in samples.items():
                self.sinks.samples(name, rows)
        return self.state

    def open_segment(self) -> None:
        """This session's stretch of steps, where its workers are not the last one's (or it is the first)."""
        hosts = [h for h in self.ctx.rank_hosts() if h]
        here = {"workers": self.ctx.world_size, "nodes": len(set(hosts)) or 1}
        last = self.state.segments[-1] if self.state.segments else None
        if last is None or {k: last[k] for k in here} != here:
            self.state.segments.append({"from_step": self.state.step, **here, "train_s": 0.0, "images": 0})

    def timed_step_every(self) -> int:
        return CUDA_TIMED_STEP_EVERY if self.ctx.device.type == "cuda" else 1

    def should_continue(self) -> bool:
        return self.state.epoch < self.config.epochs and not self.state.stopped_early

    def steps_per_epoch(self) -> int:
        return steps_per_epoch(len(self.train_loader), self.accumulate)

    def run_epoch(self, epoch: int) -> tuple[EpochRecord, dict[str, list[dict[str, Any]]]]:
        """The epoch's record (metrics.jsonl) and its samples: training loss at each refresh, GPU readings."""
        torch.manual_seed(derive_seed(self.config.seed, epoch, self.ctx.rank, "dropout"))
        readings = self.readings.start()
        clock = Stopwatch(self.ctx.device).start()
        train = self.train_epoch(epoch)
        train_s = clock.stop()
        segment = self.state.segments[-1]
        segment["train_s"] = round(segment["train_s"] + train_s, 6)
        segment["images"] += train.session_count
        readings.training_ended()
        clocks, spreads = self.rank_clocks(epoch)
        phases: dict[str, Any] = {}
        ddp: dict[str, float] = {}
        if train.phases is not None:  # the communication probe runs outside the epoch's clock
            ddp = self.comm.epoch_means(train.ddp_start, captured=self.graphed is not None and self.graphed.captured)
            wait_s = self.comm.wait_per_step(train.last_step[-1], self.forward_backward, self.zero_grad)
            phases = {**train.phases, "comm_wait_s": wait_s * self.steps_per_epoch()}
        eval_clock = Stopwatch(self.ctx.device).start()
        test = self.evaluate()
        train_eval = self.evaluate_training_images()
        eval_s = eval_clock.stop()
        machine = readings.finish(epoch, train_s)
        steps = [{"epoch": epoch, **row} for row in train.steps]
        record = EpochRecord(
            epoch=epoch,
            step=self.state.step,
            lr=self.last_lr,
            train_loss=train.loss,
            train_acc=train.acc,
            test_loss=test["loss"],
            test_acc=test["acc"],
            train_eval_loss=train_eval["loss"] if train_eval else None,
            train_eval_acc=train_eval["acc"] if train_eval else None,
            train_samples=train.count,
            test_samples=test["count"],
            epoch_s=train_s + eval_s,
            train_s=train_s,
            eval_s=eval_s,
            images_per_s=train.session_count / train_s if train_s > 0 else 0.0,
            join_spread_share=spreads["all"],
            join_spread_in_node_share=spreads["in_node"],
            join_spread_across_nodes_share=spreads["across_nodes"],
            workers=self.ctx.world_size,
            **phases,
            **machine.load,
            **machine.memory,
            per_rank={
                "cpu_s": machine.cpu_s,
                **self.per_rank(
                    train_s=train_s,
                    samples=self.train_loader.num_samples,
                    **{k: v for k, v in machine.memory.items() if not isinstance(v, list)},
                    **machine.gpu,
                    **ddp,
                    # this rank's own data wait and exposed all-reduce wait, where the step is timed
                    **{k: phases[k] for k in ("data_s", "comm_wait_s") if k in phases},
                ),
                **clocks,
            },
        )
        return record, {"steps": steps, "gpu": machine.gpu_rows}

    def rank_clocks(self, epoch: int) -> tuple[dict[str, list[float | None]], dict[str, float | None]]:
        """Every rank's step clocks over the epoch (one gather of three floats a step), as per-rank figures, and the
        spreads between the ranks; rank 0 says a chronic straggler the first time its window of steps shows one."""
        step_s, joined_s, data_s = self.clocks.take()
        steps = len(step_s)
        table = self.ctx.all_gather_floats(step_s + joined_s + data_s)
        joined = [row[steps : 2 * steps] for row in table]
        last = stragglers.last_to_join(joined)
        waited = stragglers.waits(joined)
        figures = [
            stragglers.clock_figures(row[:steps], joined[r], last[r], row[2 * steps :], waited[r])
            for r, row in enumerate(table)
        ]
        if self.window is not None and (who := self.window.add(joined)) is not None:
            log.warning("straggler at epoch %d: %s", epoch, who.line(f"the last {who.steps} steps"))
        spreads = stragglers.spreads(joined, self.ctx.hosts)
        per_rank = {name: [f[name] if f[name] == f[name] else None for f in figures] for name in figures[0]}
        return per_rank, {k: v if v == v else None for k, v in spreads.items()}

    def per_rank(self, **values: float) -> dict[str, list[float | None]]:
        """Each rank's own figures, gathered (one collective per epoch), by name."""
        names = list(values)
        table = self.ctx.all_gather_floats([float(values[n]) for n in names])
        return {name: [row[i] for row in table] for i, name in enumerate(names)}

    # ---- start-up ----------------------------------------------------------------------
    def should_warm_up(self) -> bool:
        """Compilation (torch.compile) and Triton autotuning (fused Conv+ReLU on CUDA) happen per shape;
        a CUDA graph is captured once."""
        return self.should_warm_up_shapes() or self.config.cuda_graphs

    def should_warm_up_shapes(self) -> bool:
        return self.config.compile or (self.config.fuse_conv_relu and self.ctx.device.type == "cuda")

    def warm_up(self) -> dict[str, Any]:
        """Everything compiled, tuned or captured before the clocks start; what was done."""
        done: dict[str, Any] = {}
        if self.should_warm_up_shapes():
            done["batch_sizes"] = self.warm_up_shapes()
        if self.config.cuda_graphs:
            done["cuda_graph"] = self.capture_step()
        return done

    def capture_step(self, capture: bool | None = None) -> str:
        """Record the full optimizer step in a CUDA graph (`capture=False`: the same buffers, run eagerly)."""
        loader = self.train_loader
        device, accumulate = self.ctx.device, self.accumulate
        self.graphed = static_step(
            self.device_step, self.optimizer, loader, accumulate=accumulate, device=device, capture=capture
        )
        if self.graphed is None:
            return NO_FULL_STEP
        ragged = self.steps_per_epoch() * self.accumulate * loader.batch_size != loader.num_samples
        return prepare_step(self.graphed, self.model, ragged=ragged)  # zero_grad keeps the gradients from here

    def warm_up_shapes(self) -> dict[str, list[int]]:
        """Every batch shape of the run once, before the clocks start (engine/warmup.py)."""
        return warm_up_shapes(
            self.model,
            train_loader=self.train_loader,
            eval_loader=self.eval_loader,
            precision=self.precision,
            device=self.ctx.device,
            forward_backward=self.forward_backward,
            zero_grad=self.zero_grad,
        )

    # ---- training ----------------------------------------------------------------------
    def train_epoch(self, epoch: int) -> EpochTraining:
        self.model.train()
        resume, self.resume_at = (self.resume_at if self.resume_at and self.resume_at.epoch == epoch else None), None
        meter = ClassificationMeter(self.ctx.device)
        steps: list[dict[str, Any]] = []  # the training loss where it is read anyway (progress refreshes)
        done = 0  # the epoch's steps taken before this session
        if resume is None:
            self.train_loader.set_epoch(epoch)
        else:
            done = resume.steps_done
            self.continue_epoch(epoch, resume, meter, steps)
        nonfinite = torch.zeros((), dtype=torch.bool, device=self.ctx.device)
        num_steps = self.steps_per_epoch()
        refresh = max(1, (done + num_steps) // PROGRESS_UPDATES_PER_EPOCH)
        timer = PhaseTimer(self.ctx.device, enabled=self.config.time_breakdown, every=self.timed_step_every())
        self.sinks.epoch_start(epoch, num_steps)
        if self.lookahead is not None and resume is None:
            self.lookahead.reset()
        recording = faults.recording_samples()  # a test's record of the samples each step trains
        if recording:
            self.train_loader.handed = []
        batches = iter(self.train_loader)
        ddp_start = None
        kind, every = self.config.checkpoint_every
        for i in range(num_steps):
            step_in_epoch = done + i + 1  # steps count from 1, as epochs do
            faults.maybe_inject(self.ctx.rank, epoch, step_in_epoch)  # a test's fault: not the step's own data wait
            self.clocks.begin()
            timer.begin_step(i)
            group = [b for _, b in zip(range(self.accumulate), batches, strict=False)]
            self.clocks.fed()
            timer.lap("data_s")
            loss = self.train_step(group, meter, timer)
            self.clocks.end()
            if recording:
                ids = torch.cat(self.train_loader.handed).tolist()
                self.train_loader.handed = []
                faults.record_samples(self.ctx.rank, epoch, self.state.step, ids)
            if i == 0 and timer.enabled:
                ddp_start = self.comm.totals()
            nonfinite |= ~torch.isfinite(loss)
            value = None
            refreshed = step_in_epoch % refresh == 0 or i + 1 == num_steps
            if refreshed:  # a host sync: at progress refreshes only
                self.check_finite(nonfinite, epoch)
                value = loss.item()
                t_s = round(time.perf_counter() - self.clock_zero, 3)
                steps.append({"step": self.state.step, "train_loss": value, "lr": self.last_lr, "t_s": t_s})
            self.sinks.step(sum(len(y) for _, y in group), value)
            if self.profiler is not None:
                self.profiler.step()
            if i + 1 < num_steps and self.checkpoint_due(kind, every, refreshed):
                self.save_mid_epoch(epoch, step_in_epoch, meter, steps)
        if self.lookahead is not None:  # evaluation and the checkpoint see the slow weights
            self.lookahead.sync()
        totals = meter.reduced(self.ctx.all_reduce_sum)
        return EpochTraining(
            loss=totals["loss"],
            acc=totals["acc"],
            count=totals["count"],
            steps=steps,
            phases=timer.totals(num_steps) if timer.enabled else None,
            last_step=group,
            ddp_start=ddp_start,
            session_count=totals["count"] - (int(sum(m[2] for m in resume.meters)) if resume else 0),
        )

    # ---- checkpoints inside an epoch -----------------------------------------------------
    def checkpoint_due(self, kind: str, every: float, refreshed: bool) -> bool:
        """Whether to write last.pt after this step, the same answer on every rank: by the step count, or where
        the time has come, at a progress refresh (rank clocks differ: the ranks agree over one collective)."""
        if kind == "steps":
            return self.state.step % every == 0
        if kind == "seconds" and refreshed:
            return self.ctx.any_true(time.perf_counter() - self.last_checkpoint_t >= every)
        return False

    def save_mid_epoch(self, epoch: int, steps_done: int, meter: ClassificationMeter, steps: list) -> None:
        """last.pt with the place this epoch has reached: every rank hands in its part (one gather of objects)."""
        mine = {
            "meter": [*meter.sums.tolist(), float(meter.count)],
            "streams": self.train_loader.stream_states(),
            "rng": rng_states(self.ctx.device),
        }
        parts = self.ctx.gather_objects(mine)
        self.last_checkpoint_t = time.perf_counter()
        if self.checkpoint_dir is None:
            return
        streams: dict[int, Any] = {}
        for part in parts:
            streams.update(part["streams"])
        at = MidEpoch(
            epoch=epoch,
            position=self.train_loader.position(),
            steps_done=steps_done,
            streams=[streams[v] for v in sorted(streams)],
            meters=[part["meter"] for part in parts],
            rng=[part["rng"] for part in parts],
            steps=list(steps),
            slow_weights=[w.clone() for w in self.lookahead.slow] if self.lookahead is not None else None,
        )
        state = self.state_dict()
        state["mid_epoch"] = at.state_dict()
        checkpoint.save_atomic(state, self.checkpoint_dir / checkpoint.LAST)

    def continue_epoch(self, epoch: int, at: MidEpoch, meter: ClassificationMeter, steps: list) -> None:
        """Start this session's part of `epoch` where the checkpoint left it. At the world size it was written at,
        each rank takes back its own sums and RNG, so the epoch ends bit for bit as it would have; on other
        workers rank 0 carries the sums so far and dropout draws afresh."""
        loader = self.train_loader
        same_layout = len(at.streams) == loader.layout_world  # else the rest of the epoch draws afresh
        streams = {v: at.streams[v] for v in loader.shards} if at.streams and same_layout else None
        loader.set_epoch(epoch, start=at.position, streams=streams)
        same_world = len(at.meters) == self.ctx.world_size
        if same_world:
            sums = at.meters[self.ctx.rank]
            set_rng_states(at.rng[self.ctx.rank], self.ctx.device)
        else:
            sums = [sum(column) for column in zip(*at.meters, strict=True)] if self.ctx.is_main else [0.0, 0.0, 0.0]
        meter.add(torch.tensor(sums[:2], dtype=torch.float64, device=self.ctx.device), int(sums[2]))
        if self.ctx.is_main:
            steps.extend(at.steps)
        if self.lookahead is not None and at.slow_weights is not None:
            with torch.no_grad():
                for slow, saved in zip(self.lookahead.slow, at.slow_weights, strict=True):
                    slow.copy_(saved)

    def train_step(self, micro_batches: list[Batch], meter: ClassificationMeter, timer: PhaseTimer) -> torch.Tensor:
        """One optimizer step; its mean loss. A captured step has no separate optimizer phase:
        forward_backward_s holds its whole replay, optimizer_s the host's schedule update."""
        if self.graphed is not None and self.graphed.fits(micro_batches):
            loss = self.graphed.replay(micro_batches, meter)
            timer.lap("forward_backward_s")
        else:
            loss = self.forward_backward(micro_batches, meter)
            self.clocks.released()
            timer.lap("forward_backward_s")
            self.update_weights()
        self.advance_schedule()
        timer.lap("optimizer_s")
        return loss

    def device_step(self, micro_batches: list[Batch], meter: ClassificationMeter) -> torch.Tensor:
        """The step's device work, the part a CUDA graph records."""
        loss = self.forward_backward(micro_batches, meter)
        self.update_weights()
        return loss

    def forward_backward(self, micro_batches: list[Batch], meter: ClassificationMeter | None = None) -> torch.Tensor:
        """Gradients of one optimizer step, summed over `micro_batches`.

        Each micro-batch's summed loss is divided by the samples of the whole step, so k
        micro-batches of b give the gradient of one batch of k*b; DDP then averages over
        ranks, which hold equal sample counts (contract 4). Gradients are all-reduced once,
        on the last micro-batch.
        """
        step_samples = sum(len(y) for _, y in micro_batches)
        # this rank's share of the step's global samples, times the ranks DDP averages over
        divisor = step_samples if self.batch_share == 1 else step_samples * self.batch_share
        total = torch.zeros((), device=self.ctx.device)
        for j, (x, y) in enumerate(micro_batches):
            with no_sync(self.model, skip_sync=j < len(micro_batches) - 1):
                with self.precision.autocast():
                    logits = self.model(x)
                loss_sum = F.cross_entropy(
                    logits.float(), y, reduction="sum", label_smoothing=self.config.label_smoothing
                )
                self.precision.backward(loss_sum / divisor)
            if meter is not None:
                meter.update(loss_sum, logits, y)
            total += loss_sum.detach()
        return total / step_samples

    def update_weights(self) -> None:
        if self.config.grad_clip is not None:
            self.precision.unscale(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.precision.step(self.optimizer)
        self.zero_grad()

    def zero_grad(self) -> None:
        """Freed gradients are cheapest, except under a CUDA graph, which writes into the same ones every step."""
        self.optimizer.zero_grad(set_to_none=self.graphed is None)

    def advance_schedule(self) -> None:
        """The host's part of a step: the rate it used, the next one, the count."""
        self.last_lr = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        self.state.step += 1
        self.state.schedule_step += 1
        if self.lookahead is not None:
            self.lookahead.after_step(self.state.step)

    def check_finite(self, nonfinite: torch.Tensor, epoch: int) -> None:
        if self.ctx.any_true(bool(nonfinite.item())):
            raise self.nonfinite("loss", epoch)

    def nonfinite(self, what: str, epoch: int) -> TrainingError:
        last = f"epoch {self.state.epoch}" if self.state.epoch else "none (no epoch finished)"
        return TrainingError(
            f"{what} became NaN/inf in epoch {epoch} (optimizer step {self.state.step}); "
            f"last good checkpoint: {last}. Lower --lr, add --optim.grad_clip, or use fp32/bf16"
        )

    # ---- evaluation --------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        return evaluate(self.model, self.eval_loader, self.precision, self.ctx, tta=self.config.tta)

    def evaluate_training_images(self) -> dict[str, Any] | None:
        """Loss and accuracy on training images measured as the test set is (eval mode, no augmentation):
        the train side of the train-test gap. The running `train_acc` is over augmented batches
        with dropout on and weights that changed during the epoch, so it is not comparable."""
        if self.train_eval_loader is None:
            return None
        return evaluate(self.model, self.train_eval_loader, self.precision, self.ctx, tta=self.config.tta)

    # ---- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.state_dict(),
            "early_stopping": self.early_stopping.state_dict(),
            "train_state": {**self.state.state_dict(), "earlier_sessions_s": self.elapsed_s()},
            "hosts": list(self.ctx.rank_hosts()),  # who wrote it: a resume by other nodes says what changed
            # What these weights were trained with, as config.toml records it (the data root absolute): a resume
            # refuses a config.toml edited since.
            "config": self.config.recorded,
        }

    def elapsed_s(self) -> float:
        """The run's wall time so far, earlier sessions included."""
        return self.state.earlier_sessions_s + time.perf_counter() - self.session_start

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unwrap(self.model).load_state_dict(state["model"])
        # The schedule's constants as this run built them (the rate scaled where the batch followed the workers)
        built = [{k: g[k] for k in SCHEDULE_KEYS if k in g} for g in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, kept in zip(self.optimizer.param_groups, built, strict=True):
            group.update(kept)
            for key in ("fused", "capturable"):  # this machine's choices (a GPU run may resume on a CPU)
                if key in group:
                    group[key] = self.optimizer.defaults.get(key)
        self.precision.load_state_dict(state["scaler"])
        self.early_stopping.load_state_dict(state["early_stopping"])
        layout, planned = self.state.layout_world, self.state.planned_world
        self.state.load_state_dict(state["train_state"])
        written_in = self.state.layout_world or layout  # the shards the checkpoint was laid out in
        self.state.layout_world, self.state.planned_world = layout, planned  # as engine/worker.py laid them out
        self.resume_at = MidEpoch(**state["mid_epoch"]) if state.get("mid_epoch") else None
        if self.state.schedule_step < 0:
            self.state.schedule_step = self.state.step
        if written_in != layout:  # keep_local_batch: the schedule goes on from the progress reached
            self.state.schedule_step = self.replan(written_in)
        self.written_by = [h for h in state.get("hosts") or [] if isinstance(h, str) and h] or None
        if self.lookahead is not None:
            self.lookahead.reset()
        # Every schedule is a pure function of the step: replaying the steps restores it
        # exactly, and, unlike loading its state, also fits a run resumed with more epochs.
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*lr_scheduler.step.*before.*optimizer.step", category=UserWarning
            )
            for _ in range(self.state.schedule_step):
                self.scheduler.step()
        self.last_lr = self.optimizer.param_groups[0]["lr"]

    def replan(self, written_in: int) -> int:
        """The schedule's step on this run's new plan (keep_local_batch): the epochs done, and the part of the
        epoch in progress that its data position says, at the steps an epoch of the new global batch."""
        images = len(self.train_loader.labels)
        at = self.resume_at
        progress = self.state.epoch + (at.position / images if at is not None and images else 0.0)
        step = round(progress * self.steps_per_epoch())  # the loader is at no epoch yet: a whole one's steps
        self.replanned = (
            f"the global batch follows the workers ({written_in} -> {self.state.layout_world} shards), the learning "
            f"rate with it (x{self.state.layout_world / self.state.planned_world:g} of the configured, linear in "
            f"the global batch), the schedule re-planned over the new steps an epoch and taken up at its step "
            f"{step} ({progress:.3g} epochs done)"
        )
        return step

    def maybe_save_checkpoint(self) -> None:
        self.last_checkpoint_t = time.perf_counter()
        if self.checkpoint_dir is not None:
            checkpoint.save_atomic(self.state_dict(), self.checkpoint_dir / checkpoint.LAST, epoch=self.state.epoch)

    def maybe_save_best(self) -> None:
        if self.checkpoint_dir is not None and self.config.save_best:
            best = {
                "model": unwrap(self.model).state_dict(),
                "epoch": self.state.best_epoch,
                "test_acc": self.state.best_test_acc,
            }
            checkpoint.save_atomic(best, self.checkpoint_dir / checkpoint.BEST)


# What a schedule keeps in the optimizer's param groups: built from the run's config, never taken from a checkpoint
SCHEDULE_KEYS = ("initial_lr", "max_lr", "min_lr")


def rng_states(device: torch.device) -> dict[str, Any]:
    """This process's torch RNG states (what dropout draws from), as tensors a weights-only load reads."""
    states = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_states(states: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(states["cpu"])
    if device.type == "cuda" and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)
