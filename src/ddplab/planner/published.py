"""Published scaling figures the model is checked against, predicted from the hardware they state.

Each case gives what its source states (model size, images per GPU, one GPU's time, the GPUs,
nodes and links of each measured row) and nothing measured here. The prediction treats the
one-GPU time as compute (the model's PER_IMAGE assumption holds the per-image cost fixed),
and adds the all-reduce that backward does not hide over the stated links. `ddplab plan
--published` prints the table; BENCHMARKS.md keeps it with the errors.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from ddplab.planner.links import GB, Link
from ddplab.planner.model import (
    DDP_HOST_PER_LAYER_S,
    GPU_STEP_CV,
    NODE_STEP_CV,
    StepCosts,
    host_s,
    predict_one,
)

# V100 SXM2: NVLink 2, 300 GB/s per GPU both directions (NVIDIA V100 datasheet); alpha assumed.
NVLINK2 = Link(
    "nvlink2",
    150.0,
    10e-6,
    "NVLink 2 on V100 SXM2: 300 GB/s per GPU, both directions (NVIDIA V100 datasheet); alpha assumed",
)
# Four 100 Gb/s EDR InfiniBand ports per node, as the DDP benchmark states: 50 GB/s a node; NCCL runs a ring
# per NIC, so the node's NICs together bound the bus bandwidth between nodes.
EDR_X4 = Link(
    "4x EDR", 50.0, 5e-6, "4 x 100 Gb/s EDR InfiniBand per node (the benchmark's statement; line rate); alpha assumed"
)


DDP_BENCHMARK = (
    "pytorch/pytorch benchmarks/distributed/ddp/README.md (PyTorch 1.4, NCCL, DGX machines with 8 V100 "
    "on NVLink and 4 x 100 Gb/s InfiniBand each), p50: "
)


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    params: float  # parameters: 4 bytes of gradient each
    local_batch: int  # images a GPU on one GPU
    one_gpu_s: float  # what the source states for one GPU: a step's time, or (epoch_images set) a whole run's
    rows: tuple[tuple[int, int, float], ...]  # (GPUs per node, nodes, the source's figure)
    intra: Link
    inter: Link | None = None
    epoch_images: int = 0  # 0: the figures are a step's time; else runs of `epochs` epochs of this many images
    epochs: int = 1
    keep: str = "local"  # what the runs on more GPUs keep: each GPU's batch ("local") or the global one ("global")
    note: str = ""
    not_comparable: str = ""  # why the case does not measure DDP's scaling (planner/band.py leaves it out)
    layers: int = 0  # layers with parameters, counted from the architecture (DDP_HOST); 0: not known


PCIE4_ASSUMED = Link("pcie4", 31.5, 10e-6, "PCIe 4.0 x16 (assumed: the report does not say how its GPUs connect)")
# Seed report D's VGG-like net, its parameters counted from the layers it states (biases included):
# convolutions 3-32-64-128-256-256-256 (3x3) and Linear 4096-256-32-10.
REPORT_D_PARAMS = (
    (3 * 32 + 32 * 64 + 64 * 128 + 128 * 256 + 256 * 256 * 2) * 9
    + 32
    + 64
    + 128
    + 256 * 3
    + 4096 * 256
    + 256
    + 256 * 32
    + 32
    + 32 * 10
    + 10
)
# Seed report A's SimpleCNN at 128 px: convolutions 3-32-64-128 (3x3), three 2x2 pools, Linear 128x16x16-256-10.
# Layers with parameters (DDP_HOST): ResNet-50 has 53 convolutions (1 + 16 bottlenecks x 3 + 4 downsampling), a
# BatchNorm after each and one Linear; ResNet-101 1 + 33 x 3 + 4 = 104 convolutions, 104 BatchNorms, one Linear.
RESNET50_LAYERS = 53 + 53 + 1
RESNET101_LAYERS = 104 + 104 + 1
REPORT_A_PARAMS = (3 * 32 + 32 * 64 + 64 * 128) * 9 + 32 + 64 + 128 + 128 * 16 * 16 * 256 + 256 + 256 * 10 + 10
SEEDS = "a course report ddplab started from (its own figures): "
SEED_FLAWS = (
    "a course report's own figures, its 1- and 2-GPU runs not timed alike (SEEDS.md: start-up in one and not the "
    "other, a data-bound pipeline): they do not measure DDP"
)

CASES = (
    Case(
        "PyTorch DDP benchmark, ResNet-50",
        DDP_BENCHMARK + "ResNet-50 at 32 images a GPU: 0.097 s an iteration on "
        "1 GPU without DDP, 0.100 with it, 0.103 on 2 and 4, 0.104 on 8 and on 16 GPUs (2 machines)",
        params=25.56e6,
        local_batch=32,
        one_gpu_s=0.097,
        rows=((2, 1, 0.103), (4, 1, 0.103), (8, 1, 0.104), (8, 2, 0.104)),
        intra=NVLINK2,
        inter=EDR_X4,
        layers=RESNET50_LAYERS,
    ),
    Case(
        "PyTorch DDP benchmark, ResNet-101",
        DDP_BENCHMARK + "ResNet-101 at 32 images a GPU: 0.162 s without DDP, "
        "0.171 with it, 0.176 on 2 and 4, 0.179 on 8 and on 16 GPUs (2 machines)",
        params=44.55e6,
        local_batch=32,
        one_gpu_s=0.162,
        rows=((2, 1, 0.176), (4, 1, 0.176), (8, 1, 0.179), (8, 2, 0.179)),
        intra=NVLINK2,
        inter=EDR_X4,
        layers=RESNET101_LAYERS,
    ),
    Case(
        "DAWNBench CIFAR-10, 1 vs 4 V100",
        "DAWNBench CIFAR-10 training-time entries: 68 s to 94% on one V100, 38 s on four",
        params=6.57e6,
        local_batch=512,
        one_gpu_s=68.0,
        rows=((4, 1, 38.0),),
        intra=NVLINK2,
        epoch_images=98 * 512,
        epochs=24,
        keep="global",
        note="assumed: a ResNet-9 of 6.57 M parameters, the same "
        "recipe on both (24 epochs of 98 steps at a global batch of 512, so 128 a GPU on four); the entries' "
        "recipes are not stated alike",
        not_comparable="two leaderboard entries, not one recipe run on 1 and 4 GPUs",
    ),
    Case(
        "Seed report D, batch 32 a GPU",
        SEEDS + "VGG-like net on CIFAR-10, 20 epochs on RTX 3090s: 160.7 s on one GPU, 634.1 s with DDP on two",
        params=REPORT_D_PARAMS,
        local_batch=32,
        one_gpu_s=160.7,
        rows=((2, 1, 634.1),),
        intra=PCIE4_ASSUMED,
        epoch_images=50_000,
        epochs=20,
        note="the runs' times include evaluation and start-up, taken as compute",
        not_comparable=SEED_FLAWS,
    ),
    Case(
        "Seed report D, batch 256 a GPU",
        SEEDS + "the same net: 153.1 s on one GPU, 214.4 s with DDP on two",
        params=REPORT_D_PARAMS,
        local_batch=256,
        one_gpu_s=153.1,
        rows=((2, 1, 214.4),),
        intra=PCIE4_ASSUMED,
        epoch_images=50_000,
        epochs=20,
        not_comparable=SEED_FLAWS,
    ),
    Case(
        "Seed report A, batch 16 a GPU",
        SEEDS + "SimpleCNN on STL-10 (5,000 training images), 10 epochs: 185.15 s on "
        "one GPU, 80.60 s with DDP (NCCL) on two",
        params=REPORT_A_PARAMS,
        local_batch=16,
        one_gpu_s=185.15,
        rows=((2, 1, 80.60),),
        intra=PCIE4_ASSUMED,
        epoch_images=5_000,
        epochs=10,
        note="assumed: 128 px images, as the report resized them for its kernel, and a hidden layer of 256 "
        "(ddplab's simple_cnn): 8.48 M parameters",
        not_comparable=SEED_FLAWS,
    ),
    Case(
        "Seed report A, batch 128 a GPU",
        SEEDS + "the same: 156.75 s on one GPU, 57.87 s on two",
        params=REPORT_A_PARAMS,
        local_batch=128,
        one_gpu_s=156.75,
        rows=((2, 1, 57.87),),
        intra=PCIE4_ASSUMED,
        epoch_images=5_000,
        epochs=10,
        not_comparable=SEED_FLAWS,
    ),
)


def predict(case: Case, ddp_host_per_layer_s: float | None = None) -> list[dict]:
    """Each row of `case`: the source's figure, the model's, the relative error (model - source) / source, and
    what the model leaves unexplained a step where the source is slower (with the bus bandwidth an
    all-reduce would need to explain it alone: a link that slow, or something else in the step). The terms are a
    CUDA plan's: DDP_HOST (the one-GPU figures ran without DDP; `ddp_host_per_layer_s` in place of the model's, to
    check it), HOST_FLOOR, and STRAGGLER at the spreads fitted to the corpus (GPU_STEP_CV, NODE_STEP_CV)."""
    run = case.epoch_images > 0
    images = case.epoch_images if run else case.local_batch
    per_image = case.one_gpu_s / (case.epochs * images)
    per_layer = DDP_HOST_PER_LAYER_S if ddp_host_per_layer_s is None else ddp_host_per_layer_s
    out = []
    for per_node, nodes, stated in case.rows:
        workers = per_node * nodes
        local = case.local_batch // workers if case.keep == "global" else case.local_batch
        costs = StepCosts(
            data_per_image_s=0.0,
            compute_per_image_s=per_image,
            optimizer_s=0.0,
            rest_s=0.0,
            accumulate=1,
            train_images=images if run else local * workers,
            grad_bytes=case.params * 4,
            bucket_cap_mb=25.0,
            on_cuda=True,
            measured=None,
            ddp_host_s=per_layer * case.layers,  # the one-GPU figures ran without DDP
            host_s=host_s(case.layers),
            step_cv=GPU_STEP_CV,
            node_cv=NODE_STEP_CV,
        )
        p = predict_one(costs, per_node, nodes, local, case.intra, case.inter)
        steps = math.ceil(images / (local * workers)) * case.epochs if run else 1
        model = p.step_s * steps
        unexplained = max(0.0, stated - model) / steps
        link = case.inter if nodes > 1 and case.inter is not None else case.intra
        needed = p.comm_s + unexplained - link.alpha_s  # the all-reduce's transfer, were it the whole gap
        out.append(
            {
                "case": case.name,
                "gpus": workers,
                "nodes": nodes,
                "stated": stated,
                "predicted": model,
                "error": model / stated - 1,
                "exposed_comm_s": p.exposed_comm_s,
                "link": p.link,
                "unexplained_s": unexplained,
                "implied_busbw_gbps": case.params * 4 * 2 * (workers - 1) / workers / needed / GB
                if unexplained > 0 and needed > 0
                else None,
            }
        )
    return out


def implied_ddp_host(case: Case, most_s: float = 1e-3) -> float | None:
    """DDP_HOST a layer that makes the model's steps for `case` match its stated ones, every other term a plan's:
    the median over the rows whose match lies in 0 to `most_s` a layer (each found by bisection; a row already
    long at 0, or still short at `most_s`, bounds nothing and is left out); None without layers or such a row."""
    if not case.layers:
        return None
    found = []
    for row in case.rows:
        one = replace(case, rows=(row,))
        if predict(one, 0.0)[0]["error"] > 0 or predict(one, most_s)[0]["error"] < 0:
            continue
        lo, hi = 0.0, most_s
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if predict(one, mid)[0]["error"] < 0 else (lo, mid)
        found.append((lo + hi) / 2)
    return statistics.median(found) if found else None
