"""Predict a run's training speed on more workers and nodes from one measured run.

A step of the measured run (its epochs after the first, as the report times them) splits into
data, compute (forward+backward less the all-reduce wait that ddplab's probe saw), optimizer,
and the rest of the step (host work between phases). For a target of P workers per node on M
nodes (N = P x M), local batch b, the same accumulation a and link L, a step takes

    data(b) + compute(b) + exposed all-reduce + optimizer + rest

and an epoch ceil(images / (b a N)) steps. Speedup is the target's training throughput over
one worker's at the same local batch; the ideal is the devices added (GPUs on CUDA; on a CPU
the nodes, as a node's processes share its cores); efficiency is speedup over ideal.

Assumptions, each with the name it goes by in the code:
  PER_IMAGE    data and compute per image are the same at any local batch: the device is as
               busy at b as at the measured batch (on CUDA BATCH_BOUND bounds it: at a small b a
               GPU is less busy); optimizer and rest are per step.
  BATCH_BOUND  on CUDA a step at a smaller local batch than the measured one takes the measured step's data and
               compute time; at a larger one, the GPU's own share of it (its busy time, from the run's profile)
               grows with the batch until it passes the measured time, or without a profile the whole of it
               (PER_IMAGE). A step never gets shorter for fewer images, an image never costs the GPU more in a
               larger batch, and the host's launches take as long at any batch, so each bounds the step from
               above. One H100 shows why (BENCHMARKS.md, "The planner's GPU side"): below a model's knee (batch
               128-256) the host's launches bound a step, which then costs about the same at any batch, and
               PER_IMAGE alone was up to 9x optimistic there. The price: where the device bounds the measured
               step, a much smaller batch is predicted too slow (1024 -> 32: up to -81%); with a profile a larger
               batch came within -8% to +10% (without: up to -96%). On a CPU PER_IMAGE holds.
  SHARED_CORES on a CPU the processes of one node share its cores: each computes at 1/P of the
               rate one process has alone (the measured run's own per-node processes are
               divided out first). On CUDA every worker has its own GPU.
  TIMED_STEPS  on CUDA ddplab times 1 step in 20, the device synchronized at each phase's end, and scales those
               steps' phases to the epoch; there the host's launches no longer overlap the device's work, so the
               phases can add up to more than the epoch took (on one H100: up to 40% more, simple_cnn at batch
               1024). They are scaled down to the measured step, so the measured run is predicted back as it ran.
  BACKWARD_SHARE of forward+backward is backward (a backward pass costs about two forwards).
  BUCKETS      DDP all-reduces the gradients in buckets: FIRST_BUCKET_MIB, then
               dist.bucket_cap_mb each, in the order backward makes them ready.
  READY_EVENLY backward produces gradient bytes at an even rate: bucket i is ready when
               backward has run the share of its time that buckets 1..i hold of the bytes.
  LINK_QUEUE   the all-reduces queue on one link: each starts when its bucket is ready and
               the one before it is done; the exposed part is what the queue runs past the end
               of backward (at least the last bucket, ready only when backward ends; on a slow
               link most of the traffic).
  CPU_SERIAL   on a CPU (Gloo) the whole all-reduce is exposed; LINK_QUEUE is the CUDA rule. Within a node its
               ranks copy and sum on the cores backward computes on. Across nodes the wire's wait does run under
               backward and costs no core (a comm hook's timing of each bucket on two hosts of this VM: resnet18's,
               vgg_small's and simple_cnn's first buckets all-reduced while backward ran on; Gloo's thread used 2%
               of a core waiting on a 100 Mbit/s wire), yet splitting each bucket into its cores' share (its time
               over a host's loopback) and the wire's (queued under backward) predicted this test cluster's 8
               two-host runs worse: median |error| 10.8% against 7.4%, 7 of 8 optimistic (BENCHMARKS.md, 2026-11-28).
               Its two hosts share one VM's two cores, and a step computes about a third slower beside a second
               busy process than alone (simple_cnn's forward+backward at batch 64: 0.11 s alone, 0.15 s beside a
               twin), which the exposed all-reduce happens to make up for. The overlap stays out until it can be
               checked where hosts do not share cores.
  DDP_HOST     on CUDA, DDP's own host work every step (the reducer's autograd hooks and bucket bookkeeping, each
               bucket's all-reduce launched), which a one-process run never did: DDP_HOST_PER_LAYER_S for each
               layer with parameters (the run's summary lists its layers). benchmarks/ddp_step.py stepped one
               rank's DDP against the plain step (one H100, torch 2.11, 2026-11-26): where the host bounds the
               step (batches 32 and 64) DDP added 73-102 us a layer over simple_cnn, vgg_small and resnet18 (the
               median taken), 18-50% of those steps; where the device bounds it, the work hides behind the
               device's (0.06-0.6 ms showed at batch 1024). Counted in full, so a prediction is not optimistic
               for it, and at most DDP_HOST / step pessimistic. A measured DDP run has it in its step already,
               and so has a published base row that ran under DDP at one GPU (base_ran_ddp in planner/figures:
               a script that wraps the model at any world size; the reducer hooks, fills and launches as at N).
               With it, PyTorch's published DDP benchmark (planned from its figures without DDP) came out
               within -0.6% to +2.2% on 2-16 V100s, errors on both sides (planner/published.py).
               On a CPU it was not measurable above the noise (batch 128: DDP 6-16% faster, the wrong sign), so
               no term there.
  STRAGGLER    N workers step together, so each step waits for the slowest of them: it costs the most of N step
               times, not their mean. The measured run's own clock gives its step's spread (steps.jsonl: the time
               between progress refreshes over the timed epochs; a window of k steps has sqrt(k) times less
               spread than one step, the steps taken as independent): its coefficient of variation cv. The
               target's step grows by E[the most of N standard normals] x cv x its step before the all-reduce
               (0.56 at N=2, 1.03 at 4, 1.42 at 8). On this VM's two-host runs cv was 6-9%: +3-5% a step at
               N=2 (benchmarks/network.py's one-host runs, 2026-11-26). A run with fewer than MIN_WINDOWS
               windows has no cv: no term. On a CPU N is the nodes: the processes of one node share its
               cores, so one's wait in the all-reduce is another's core, not lost time (on one node of this
               VM the term made benchmarks/plan_validation.py's checks, already pessimistic, 5-25 points more
               so). On CUDA a run's own clock cannot say it (each window ends in a device sync, and one H100's
               runs gave cv 0.01-0.44, the most where the host bounds the step): there two spreads apply, a
               GPU's (GPU_STEP_CV, over the N workers) and, across M nodes, a node's besides (NODE_STEP_CV, over
               the M nodes: what a node's workers share, its host and its network port, makes them late
               together), each the spread at which the model best predicts the published all-reduce figures of
               planner/figures (487 points of 8 sources, `ddplab plan --corpus`): the GPU's on the points of one
               node, then the node's on those across nodes, sources weighing alike (a source's median |error|,
               averaged over sources: one benchmark's 220 rows on one cluster would otherwise set them for every
               machine). Fitted without each source in turn: a GPU's 2.25-3.75%, a node's 3.0-4.75% (a
               measurement is owed), and those out-of-sample predictions are the GPU bands' errors
               (planner/band.py). With one spread for both, fitted on points, the model was above 62% of the
               published figures held out (median |error| 6.1%); with the two, 62% (5.2%; across nodes 11.4% ->
               8.5%); once the bases that ran DDP were known as such (29 series of 5 sources), 63% (4.37%); once
               Lambda's Transformer-XL rows were known to train N unsynchronised copies (not predicted), 66% (4.21%);
               with Lambda's H100 SXM5 rows of five partner hosts (60 points), refitted to 2.5% and 4.25%: 60%
               (3.9%). Every plan names them as fitted overheads with their size (planner/command.py).
  HOST_FLOOR   on CUDA no step is shorter than its host's own work (the launches, at any batch): host_s, 1.28 ms +
               141 us a layer with parameters, the host-bound steps of one H100 (benchmarks/ddp_step.py at batch
               32: simple_cnn, vgg_small, resnet18 within 0.06 ms). PER_IMAGE alone would shrink a step with its
               batch without end (the corpus's strong scaling, a global batch of 64 over 8 GPUs: its band's
               low end -54% -> -40%). Under DDP the host does DDP_HOST's work besides, every step at any batch: a
               run measured under DDP (or a published base that ran it) has it in its floor, where a device-bound
               measured step had hidden it (the corpus's strong scaling, Paik's bases under DDP: median 29.1% ->
               25.5%).
  GRAD_BYTES   4 bytes a parameter (fp32 gradients), 2 with an fp16 or bf16 comm hook; with
               accumulation, one all-reduce per optimizer step, which only the last
               micro-batch's backward can hide (the others run under no_sync).
  LINK         one all-reduce costs links.Link.allreduce_s: across nodes the inter-node link's
               figures (the ring runs at its slowest link), within a node the given link; a
               measured one as measured with N ranks (links.MeasuredLinks.for_ranks).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from ddplab.errors import DataError
from ddplab.planner.links import Link, MeasuredLinks
from ddplab.planner.planfile import BandPart, MeasuredStep, Overlapped, PaysFromRow, PlanFile, PlanRow
from ddplab.rundir.epochs import EpochRecord, optimizer_steps, refresh_windows, timed_epochs
from ddplab.topology import devices_brought

if TYPE_CHECKING:
    from pathlib import Path

    from ddplab.rundir.summary import Summary

BACKWARD_SHARE = 2 / 3  # of forward+backward compute
FIRST_BUCKET_MIB = 1.0  # DDP's first bucket (torch.distributed's default first_bucket_bytes_cap)
MIB = 2**20
AnyLink = Link | MeasuredLinks  # a published link, or this machine's measured per number of ranks
EFFICIENCY_BARS = (0.5, 0.8)
MIN_WINDOWS = 5  # STRAGGLER: fewer refresh windows than this give no spread
DDP_HOST_PER_LAYER_S = 75e-6  # DDP_HOST: the median of 6 host-bound steps (73-102 us a layer), one H100
# HOST_FLOOR: a plain step's own host work on CUDA (launches), one H100: 1.28 ms + 141 us a layer with parameters
HOST_FIXED_S, HOST_PER_LAYER_S = 1.28e-3, 141e-6
# STRAGGLER on CUDA, fitted on planner/figures (corpus.fit_spread; a test recomputes them): a GPU's step spread,
# and a node's (what the workers of one node share: its host, its network), which only a run across nodes waits on
GPU_STEP_CV, NODE_STEP_CV = 0.025, 0.0425
# the layers that hold parameters, as models.registry.describe_layers names them
PARAMETER_LAYERS = ("Conv", "Linear", "BatchNorm", "GroupNorm", "LayerNorm", "FusedConv")


@dataclass(frozen=True)
class Spread:
    """STRAGGLER's coefficients of variation on CUDA: a GPU's step, and a node's (what its workers share)."""

    gpu: float = 0.0
    node: float = 0.0


@dataclass(frozen=True)
class StepCosts:
    """One measured step, per worker, normalized to one worker alone on its device."""

    data_per_image_s: float
    compute_per_image_s: float
    optimizer_s: float
    rest_s: float
    accumulate: int
    train_images: int
    grad_bytes: float
    bucket_cap_mb: float
    on_cuda: bool
    measured: MeasuredStep | None  # the run it was derived from, for plan.json (None: a published figure's)
    params: float = 0.0  # the model's parameters (0: unknown; `for_config` then keeps grad_bytes)
    ddp_host_s: float = 0.0  # DDP_HOST: what DDP adds to a step of this run on 2+ workers (0: in its step already)
    host_s: float = 0.0  # HOST_FLOOR: the step's own host work on CUDA, which no batch makes shorter (0: not known)
    ddp_floor_s: float = 0.0  # HOST_FLOOR: DDP's host work a host-bound step of 2+ workers pays, for a run that ran
    # DDP (its device-bound step hid it; DDP_HOST adds it in full to a run that did not)
    measured_batch: int = 0  # BATCH_BOUND: the local batch the step was measured at (0: PER_IMAGE alone)
    device_share: float = 1.0  # BATCH_BOUND: of the measured step, the GPU's busy time (a profiled run's; 1: unknown)
    step_cv: float = 0.0  # STRAGGLER: the measured step's coefficient of variation (0: not known)
    node_cv: float = 0.0  # STRAGGLER: a node's spread, across nodes (on CUDA; on a CPU step_cv is the nodes')

    def for_config(self, config: dict[str, Any]) -> StepCosts:
        """These costs for a target run whose flattened config may all-reduce differently (GRAD_BYTES: its comm
        hook; BUCKETS: its bucket_cap_mb), as a DDP point planned from a 1-process run does."""
        return replace(
            self,
            grad_bytes=self.params * grad_bytes_per_param(config) if self.params else self.grad_bytes,
            bucket_cap_mb=float(config.get("dist.bucket_cap_mb", self.bucket_cap_mb)),
        )

    def last_backward_s(self, local_batch: int, per_node: int) -> float:
        """The backward that can hide the all-reduce: the last micro-batch's (GRAD_BYTES)."""
        return BACKWARD_SHARE * self.compute_s(local_batch, per_node) / self.accumulate

    def slowdown(self, per_node: int) -> int:
        return 1 if self.on_cuda else per_node  # SHARED_CORES

    def images_paid(self, local_batch: int) -> float:
        """The images a micro-batch of `local_batch` costs as (BATCH_BOUND on CUDA: never fewer than measured, and
        more only once the GPU's own share of the measured step, grown with the batch, passes the whole step)."""
        if not (self.on_cuda and self.measured_batch):
            return local_batch
        return self.measured_batch * max(1.0, self.device_share * local_batch / self.measured_batch)

    def compute_s(self, local_batch: int, per_node: int) -> float:
        return self.compute_per_image_s * self.images_paid(local_batch) * self.accumulate * self.slowdown(per_node)

    def data_s(self, local_batch: int, per_node: int) -> float:
        return self.data_per_image_s * self.images_paid(local_batch) * self.accumulate * self.slowdown(per_node)


@dataclass(frozen=True)
class Prediction:
    per_node: int
    nodes: int
    local_batch: int
    link: str
    step_s: float
    compute_s: float
    exposed_comm_s: float
    comm_s: float
    epoch_train_s: float
    images_per_s: float
    speedup: float
    ideal: float
    efficiency: float

    @property
    def workers(self) -> int:
        return self.per_node * self.nodes


def step_costs(
    summary: Summary, epochs: list[EpochRecord], config: dict[str, Any], clock: list[dict[str, Any]] | None = None
) -> StepCosts:
    """A run's measured step, from its summary.json, metrics.jsonl, config.toml (flattened) and steps.jsonl (its
    clock between progress refreshes: the step's spread; none given, no STRAGGLER term)."""
    run, batch = summary["run"], summary["batch"]
    if run["strategy"] == "dp":
        raise DataError("a DataParallel run's step mixes its GPUs' work: plan from a single-process or DDP run")
    timed = timed_epochs(epochs)
    if not timed or any(r.forward_backward_s is None for r in timed):
        raise DataError(
            "the run has no time breakdown (train.time_breakdown was off): its step cannot be split "
            "into compute and communication; train it again with the breakdown on"
        )
    steps = optimizer_steps(timed, batch["global"])
    images = sum(r.train_samples for r in timed) / run["world_size"]  # per worker
    per_node = run["world_size"] // max(1, int(config.get("dist.nnodes", 1)))
    on_cuda = str(run["device"]).startswith("cuda")
    if on_cuda and summary.get("gpu_peak_alloc_mib") is None:  # every CUDA run records its GPU memory
        raise DataError(
            f"its summary.json says the run trained on {run['device']} but holds no GPU memory (gpu_peak_alloc_mib), "
            "which every CUDA run records: edited, or written by another program? plan from the run as it was written"
        )
    layers = parameter_layers(str(summary["model"].get("layers", "")))  # DDP_HOST, HOST_FLOOR
    share = 1 if on_cuda else per_node  # SHARED_CORES: one worker alone is this much faster
    data = sum(r.data_s or 0.0 for r in timed)
    comm = sum(r.comm_wait_s or 0.0 for r in timed)
    compute = sum(r.forward_backward_s or 0.0 for r in timed) - comm  # never None here: checked above
    optimizer = sum(r.optimizer_s or 0.0 for r in timed)
    train = sum(r.train_s for r in timed)
    phases = data + compute + comm + optimizer
    if phases > train:  # TIMED_STEPS: the synchronized steps' phases overstate the step they were scaled to
        data, compute, comm, optimizer = (x * train / phases for x in (data, compute, comm, optimizer))
    rest = max(train - data - compute - comm - optimizer, 0.0)
    spreads, spread_from = measured_spread(summary, on_cuda, run["world_size"] // per_node, clock, len(epochs))
    return StepCosts(
        data_per_image_s=data / images / share,
        compute_per_image_s=compute / images / share,
        optimizer_s=optimizer / steps / share,
        rest_s=rest / steps,
        accumulate=int(batch.get("accumulate", 1)),
        train_images=int(summary["data"]["train_images"]),
        grad_bytes=summary["model"]["params"] * grad_bytes_per_param(config),
        params=summary["model"]["params"],
        ddp_host_s=ddp_host_s(summary, on_cuda, layers),
        host_s=host_s(layers) if on_cuda else 0.0,
        ddp_floor_s=ddp_work_s(layers) if on_cuda and run["world_size"] > 1 else 0.0,
        measured_batch=int(batch["local"]),
        device_share=device_share(summary, train / steps) if on_cuda else 1.0,
        step_cv=spreads.gpu,
        node_cv=spreads.node,
        bucket_cap_mb=float(config.get("dist.bucket_cap_mb", 25.0)),
        on_cuda=on_cuda,
        measured={
            "world_size": run["world_size"],
            "per_node": per_node,  # a node of several (on CUDA): its rows across nodes of as many are planned from it
            "nodes": run["world_size"] // per_node,
            "local_batch": batch["local"],
            "device": run["device"],
            "epochs_timed": len(timed),
            "steps": steps,
            "step_s": statistics.fmean(r.train_s for r in timed) * len(timed) / steps,
            "comm_wait_s_per_step": comm / steps,
            "spread_from": spread_from,
        },
    )


def device_share(summary: Summary, step_s: float) -> float:
    """BATCH_BOUND: the GPU's busy time over the measured step, from the run's profile (--train.profile_steps: its
    busy share of the profiled steps' wall time, which the profiler slows); 1 (PER_IMAGE) without one."""
    profile = summary.get("profile") or {}
    busy, profiled_ms = profile.get("device_busy_share"), profile.get("step_ms")
    if not isinstance(busy, (int, float)) or not isinstance(profiled_ms, (int, float)) or step_s <= 0:
        return 1.0
    return min(1.0, busy * profiled_ms / 1e3 / step_s)


def measured_spread(
    summary: Summary, on_cuda: bool, nodes: int, clock: list[dict[str, Any]] | None, epochs: int
) -> tuple[Spread, dict[str, str]]:
    """STRAGGLER's spreads for a run, and where each came from. A run of two or more ranks measured the spreads
    between them (its step clocks: summary.json's stragglers): a GPU's between the ranks of a node, a node's
    between its nodes where it ran across nodes, each read apart. What it did not measure: on CUDA the constants
    fitted to published figures (GPU_STEP_CV, NODE_STEP_CV), on a CPU its own clock's refresh windows (a step's
    spread, for the nodes: one node's processes share its cores)."""
    found = cast(dict[str, Any], summary.get("stragglers") or {})
    ranks = summary["run"]["world_size"]

    def read(name: str) -> float | None:
        value = found.get(name)
        return float(value) if isinstance(value, (int, float)) and ranks > 1 else None

    mine = f"measured: this run's {ranks} ranks' step clocks"
    fitted = "fitted to the published figures (planner/figures)"
    if on_cuda:
        gpu, node = (GPU_STEP_CV, fitted), (NODE_STEP_CV, fitted)
    else:
        gpu, node = (step_spread(clock or [], epochs), "this run's clock between progress refreshes"), (0.0, "none")
    together = read("spread_cv")  # a run from before the spreads were read apart: all its ranks' together
    in_node, across = read("spread_cv_in_node"), read("spread_cv_across_nodes")
    if "spread_cv_in_node" not in found and together is not None:
        in_node, across = (together, None) if nodes == 1 else (None, together)
    if on_cuda:
        if in_node is not None:
            gpu = (in_node, mine + (", between a node's ranks" if nodes > 1 else ""))
        elif across is not None and nodes > 1 and "spread_cv_in_node" in found:  # one rank a node: all in the node's
            gpu = (0.0, f"none besides the node's ({mine}: one rank a node, measured with its node)")
        if across is not None and nodes > 1:
            node = (across, f"{mine}, between its {nodes} nodes")
    elif across is not None and nodes > 1:
        gpu = (across, f"{mine}, between its {nodes} nodes")
    return Spread(gpu[0], node[0]), {"gpu": gpu[1], "node": node[1]}


def step_spread(steps: list[dict[str, Any]], epochs: int) -> float:
    """STRAGGLER: a step's coefficient of variation from the refresh windows of a run's clock (0: too few)."""
    windows = refresh_windows(steps, epochs)
    if len(windows) < MIN_WINDOWS:
        return 0.0
    per_step = [dt / ds for dt, ds in windows]
    mean = statistics.fmean(per_step)
    k = statistics.fmean(ds for _, ds in windows)
    return statistics.stdev(per_step) * math.sqrt(k) / mean if mean > 0 else 0.0


@functools.cache  # a few ms each, and the planner's searches ask for the same few counts hundreds of times
def slowest_of(n: int) -> float:
    """E[the most of n independent standard normals] (STRAGGLER): 0 for one, 0.564 for two, 1.029 for four."""
    if n <= 1:
        return 0.0
    # the integral of x n phi(x) Phi(x)^(n-1) over [-8, 8], by the midpoint rule: exact to 4 digits
    h, total = 0.004, 0.0
    for i in range(4000):
        x = -8.0 + (i + 0.5) * h
        total += (
            x * n * math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * (0.5 * (1 + math.erf(x / math.sqrt(2)))) ** (n - 1)
        )
    return total * h


def straggler_wait_s(own_s: float, waiting_for: int, cv: float) -> float:
    """STRAGGLER: what a step of `own_s` waits for the slowest of `waiting_for` steppers at spread `cv`."""
    return slowest_of(waiting_for) * cv * own_s if cv else 0.0


def straggler_waits_s(own_s: float, waiting_for: int, nodes: int, spread: Spread) -> float:
    """STRAGGLER: what a step of `own_s` waits for the slowest of `waiting_for` steppers at `spread.gpu`, and then
    for the slowest of `nodes` at `spread.node`."""
    return straggler_wait_s(own_s, waiting_for, spread.gpu) + straggler_wait_s(own_s, nodes, spread.node)


def parameter_layers(layers: str) -> int:
    """Layers with parameters in a summary's layer list ("Conv3x3(3->32) > ReLU > ... > Linear(256->10)")."""
    return sum(1 for layer in layers.split(" > ") if layer.startswith(PARAMETER_LAYERS))


def ddp_work_s(layers: int) -> float:
    """DDP_HOST: DDP's own host work a step on CUDA for a model of `layers` layers with parameters."""
    return DDP_HOST_PER_LAYER_S * layers


def ddp_host_s(summary: Summary, on_cuda: bool, layers: int) -> float:
    """DDP_HOST for a run of `layers` layers with parameters planned onto 2+ workers: 0 on a CPU, or for a run
    that ran DDP (it is in its step)."""
    if not on_cuda or summary["run"]["world_size"] > 1:
        return 0.0
    return ddp_work_s(layers)


def host_s(layers: int, under_ddp: bool = False) -> float:
    """HOST_FLOOR: a CUDA step's own host work for a model of `layers` layers with parameters: its launches, and
    under DDP the reducer's work besides (DDP_HOST), which a step bound by its device hid but a host-bound one pays
    (StepCosts.ddp_floor_s holds that part for a measured run, as one worker runs no DDP)."""
    return HOST_FIXED_S + HOST_PER_LAYER_S * layers + (ddp_work_s(layers) if under_ddp else 0.0)


def grad_bytes_per_param(config: dict[str, Any]) -> int:
    """GRAD_BYTES: what DDP all-reduces per parameter under a flattened config's comm hook."""
    return 2 if config.get("dist.comm_hook", "none") in ("fp16", "bf16") else 4


def buckets(grad_bytes: float, cap_mb: float) -> list[float]:
    """BUCKETS: the sizes DDP reduces, in the order backward makes them ready."""
    first = min(grad_bytes, FIRST_BUCKET_MIB * MIB)
    rest = grad_bytes - first
    cap = cap_mb * MIB
    sizes = [first] + [cap] * int(rest // cap)
    if rest % cap:
        sizes.append(rest % cap)
    return [s for s in sizes if s > 0]


def exposed_comm(costs: StepCosts, link: Link, workers: int, local_batch: int, per_node: int) -> tuple[float, float]:
    """(all of the step's all-reduce time, the part backward does not hide)."""
    if workers <= 1:
        return 0.0, 0.0
    sizes, times = bucket_times(costs, link, workers)
    if not costs.on_cuda:  # CPU_SERIAL
        return sum(times), sum(times)
    return sum(times), queued_past(sizes, times, costs.last_backward_s(local_batch, per_node))


def bucket_times(costs: StepCosts, link: Link, workers: int) -> tuple[list[float], list[float]]:
    """BUCKETS and LINK: each bucket's size and its all-reduce's time over `link` among `workers`."""
    sizes = buckets(costs.grad_bytes, costs.bucket_cap_mb)
    return sizes, [link.allreduce_s(size, workers) for size in sizes]


def queued_past(sizes: list[float], times: list[float], backward_s: float) -> float:
    """LINK_QUEUE over READY_EVENLY buckets: how far the queue of all-reduces runs past the end of backward."""
    done, produced, total = 0.0, 0.0, sum(sizes)
    for size, t in zip(sizes, times, strict=True):
        produced += size
        done = max(done, backward_s * produced / total) + t
    return max(0.0, done - backward_s)


def epoch_steps(costs: StepCosts, local_batch: int, workers: int) -> int:
    """An epoch's optimizer steps at `local_batch` on `workers`: whole steps, the last filled as far as it goes."""
    return math.ceil(costs.train_images / (local_batch * costs.accumulate * workers))


def predict_one(
    costs: StepCosts, per_node: int, nodes: int, local_batch: int, link: AnyLink, inter_node: AnyLink | None = None
) -> Prediction:
    workers = per_node * nodes
    used = (inter_node if nodes > 1 and inter_node is not None else link).for_ranks(workers)  # LINK
    compute = costs.compute_s(local_batch, per_node)
    data = costs.data_s(local_batch, per_node)
    comm, exposed = exposed_comm(costs, used, workers, local_batch, per_node)
    floor = costs.host_s + (costs.ddp_floor_s if workers > 1 else 0.0)  # HOST_FLOOR (one worker runs no DDP)
    plain = max(data + compute + costs.optimizer_s * costs.slowdown(per_node) + costs.rest_s, floor)
    own = plain + (costs.ddp_host_s if workers > 1 else 0.0)  # DDP_HOST
    # STRAGGLER: on a CPU across nodes (a node's processes share its cores: one's wait is another's core); on
    # CUDA each GPU's spread, and across nodes each node's besides
    waiting = straggler_waits_s(own, workers if costs.on_cuda else nodes, nodes, Spread(costs.step_cv, costs.node_cv))
    step = own + exposed + waiting
    steps = epoch_steps(costs, local_batch, workers)
    rate = costs.train_images / (steps * step)
    alone = predict_alone(costs, local_batch)
    ideal = float(devices_brought(workers, nodes, on_cuda=costs.on_cuda))
    return Prediction(
        per_node,
        nodes,
        local_batch,
        used.name,
        step,
        compute,
        exposed,
        comm,
        steps * step,
        rate,
        rate / alone,
        ideal,
        rate / alone / ideal,
    )


def overlapped_rate(costs: StepCosts, p: Prediction, inter_node: AnyLink | None) -> float | None:
    """On a CPU across nodes, `p`'s training images/s had the wire's wait been queued under backward (LINK_QUEUE)
    rather than exposed (CPU_SERIAL): the faster side a prediction leaves out (None elsewhere)."""
    if costs.on_cuda or p.nodes <= 1 or inter_node is None:
        return None
    sizes, times = bucket_times(costs, inter_node.for_ranks(p.workers), p.workers)
    queued = queued_past(sizes, times, costs.last_backward_s(p.local_batch, p.per_node))
    return p.images_per_s * p.step_s / (p.step_s - p.exposed_comm_s + queued)


def predict_alone(costs: StepCosts, local_batch: int) -> float:
    """One worker's training images per second at `local_batch` (no all-reduce)."""
    step = costs.data_s(local_batch, 1) + costs.compute_s(local_batch, 1) + costs.optimizer_s + costs.rest_s
    return costs.train_images / (epoch_steps(costs, local_batch, 1) * step)


def above_ideal(costs: StepCosts, p: Prediction) -> str | None:
    """Why a prediction beats its ideal, where it does (None elsewhere): a figure over 100% is never printed
    without its cause.

    On a CPU the ideal counts nodes (SHARED_CORES: a node's processes share its cores), but a step's per-step
    work (optimizer, the host's share) runs on one core however many a process has: at a small local batch it
    is most of the step, and N processes do theirs at once on the cores one process left idle, so N processes
    can beat one node's ideal. On CUDA no term gives more than the GPUs added: a figure over it is a defect."""
    if p.efficiency < 1.005:  # printed as 100% or less
        return None
    if costs.on_cuda:
        return f"{p.efficiency:.0%} of the ideal on CUDA, which no assumption allows: report it as a bug"
    alone = costs.data_s(p.local_batch, 1) + costs.compute_s(p.local_batch, 1) + costs.optimizer_s + costs.rest_s
    fixed = (costs.optimizer_s + costs.rest_s) / alone if alone > 0 else 0.0
    return (
        f"{p.efficiency:.0%} of the ideal at local batch {p.local_batch}: on a CPU the ideal counts nodes (a node's "
        f"processes share its cores), but {fixed:.0%} of one process's step there is per-step work (optimizer, "
        f"host) that runs on one core; {p.per_node} processes a node do theirs at once on cores one process left "
        "idle. A larger local batch, or fewer threads for the one process, is the fairer baseline"
    )


EMPTY_SHARE = 0.10  # an epoch's whole steps this much emptier than its images are said under the table (empty_steps)


def empty_steps(costs: StepCosts, p: Prediction) -> str | None:
    """Where an epoch pays for whole steps it cannot fill (None elsewhere): its steps are ceil(images / global
    batch), so a global batch near or past the dataset's size trains fewer images than its steps hold, and the row's
    efficiency falls for the dataset's size, not the link or the GPUs: said with the row, at 10% empty or more."""
    per_step = p.local_batch * costs.accumulate * p.workers
    steps = epoch_steps(costs, p.local_batch, p.workers)
    empty = 1 - costs.train_images / (steps * per_step)
    if empty < EMPTY_SHARE:
        return None
    plural = "s" if steps > 1 else ""
    return f"{p.per_node} x {p.nodes} at {p.local_batch}: {steps} step{plural} of {per_step:,}, {empty:.0%} empty"


def smallest_batch(
    costs: StepCosts,
    per_node: int,
    nodes: int,
    link: AnyLink,
    inter_node: AnyLink | None,
    bar: float,
    batches: list[int],
) -> int | None:
    """The smallest of `batches` at which this many workers reach `bar` efficiency (None: none does)."""
    return next(
        (b for b in sorted(batches) if predict_one(costs, per_node, nodes, b, link, inter_node).efficiency >= bar), None
    )


@dataclass(frozen=True)
class PlannedRow:
    """A row of a plan: its prediction, why it beats its ideal where it does, and the band of its cell around its
    rate (None: the run itself, or a cell no case covers) with the band's name in the plan (None: the run itself)."""

    prediction: Prediction
    above_ideal: str | None
    band: tuple[float, float] | None = None
    band_name: str | None = None

    def to_json(self) -> PlanRow:
        p = self.prediction
        band = list(self.band) if self.band else None
        return cast(
            PlanRow,
            {
                **asdict(p),
                "workers": p.workers,
                "above_ideal": self.above_ideal,
                "images_per_s_band": band,
                "band": self.band_name,
            },
        )  # the prediction's fields are PlanRow's first ones (tests/unit/planner/test_planfile.py)


@dataclass(frozen=True)
class PaysFrom:
    """For one shape (workers a node x nodes): the smallest local batch at which each efficiency bar is reached
    (None: never, up to 8192)."""

    per_node: int
    nodes: int
    batch_for: dict[int, int | None]  # bar in percent -> local batch

    def to_json(self) -> PaysFromRow:
        bars = {f"batch_for_{k}pct": b for k, b in self.batch_for.items()}
        return cast(PaysFromRow, {"per_node": self.per_node, "nodes": self.nodes, **bars})


@dataclass(frozen=True)
class Grid:
    """Every shape and batch a plan asks for, predicted, and where DDP starts paying (plan.json's body)."""

    costs: StepCosts
    link: AnyLink
    inter_node: AnyLink | None
    rows: list[PlannedRow]
    pays_from: list[PaysFrom]

    def to_json(self, run: Path, bands: dict[str, BandPart], overlapped: list[Overlapped]) -> PlanFile:
        """plan.json: this grid, planned from `run`, with the bands its rows were given (by name) and, where
        there are any, its rows' rates if the wire overlapped backward."""
        if self.costs.measured is None:
            raise ValueError("a plan.json is made from a run's costs, not a published figure's")
        plan: PlanFile = {
            "run": str(run),
            "measured": self.costs.measured,
            "costs": {k: v for k, v in asdict(self.costs).items() if k != "measured"},
            "link": asdict(self.link),
            "inter_node": asdict(self.inter_node) if self.inter_node else None,
            "rows": [r.to_json() for r in self.rows],
            "pays_from": [p.to_json() for p in self.pays_from],
            "bands": bands,
        }
        if overlapped:
            plan["images_per_s_if_the_wire_overlaps"] = overlapped
        return plan


def predict_grid(
    costs: StepCosts,
    per_node: list[int],
    nodes: list[int],
    batches: list[int],
    link: AnyLink,
    inter_node: AnyLink | None = None,
) -> Grid:
    """Every (workers per node, nodes, local batch) predicted, and where DDP starts paying."""
    rows = [predict_one(costs, p, m, b, link, inter_node) for m in nodes for p in per_node for b in batches]
    # BATCH_BOUND: below a GPU's measured batch the model cannot tell a step's time, so it searches from there up
    floor = costs.measured_batch if costs.on_cuda else 1
    search = sorted(b for b in {*batches, floor, *(2**k for k in range(0, 14))} if b >= floor)
    pays = [
        PaysFrom(
            p,
            m,
            {round(bar * 100): smallest_batch(costs, p, m, link, inter_node, bar, search) for bar in EFFICIENCY_BARS},
        )
        for m in nodes
        for p in per_node
        if p * m > 1
    ]
    return Grid(costs, link, inter_node, [PlannedRow(r, above_ideal(costs, r)) for r in rows], pays)
