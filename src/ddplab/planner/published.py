"""Published scaling figures the model is checked against, predicted from the hardware they state.

Each case gives what its source states (model size, images per GPU, one GPU's time, the GPUs,
nodes and links of each measured row) and nothing measured here. The prediction treats the
one-GPU time as compute (the model's PER_IMAGE assumption holds the per-image cost fixed),
and adds the all-reduce that backward does not hide over the stated links. `ddplab plan
--published` prints the table; BENCHMARKS.md keeps it with the errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddplab.planner.links import Link
from ddplab.planner.model import StepCosts, predict_one

# V100 SXM2: NVLink 2, 300 GB/s per GPU both directions (NVIDIA V100 datasheet); alpha assumed.
NVLINK2 = Link("nvlink2", 150.0, 10e-6, "NVLink 2 on V100 SXM2: 300 GB/s per GPU, both directions (NVIDIA V100 "
                                        "datasheet); alpha assumed")
# Four 100 Gb/s EDR InfiniBand ports per node, as the DDP benchmark states: 50 GB/s a node; NCCL runs a ring
# per NIC, so the node's NICs together bound the bus bandwidth between nodes.
EDR_X4 = Link("4x EDR", 50.0, 5e-6, "4 x 100 Gb/s EDR InfiniBand per node (the benchmark's statement; line rate); "
                                    "alpha assumed")


DDP_BENCHMARK = ("pytorch/pytorch benchmarks/distributed/ddp/README.md (PyTorch 1.4, NCCL, DGX machines with 8 V100 "
                 "on NVLink and 4 x 100 Gb/s InfiniBand each), p50: ")


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    params: float  # parameters: 4 bytes of gradient each
    local_batch: int
    one_gpu_s: float  # what the source states for one GPU: a step, or a whole run (then per_run)
    rows: tuple[tuple[int, int, float], ...]  # (GPUs per node, nodes, the source's figure)
    intra: Link
    inter: Link | None = None
    steps: int = 1  # steps the figure covers (1: a step's time; else a run's total over this many steps)
    note: str = ""


CASES = (
    Case("PyTorch DDP benchmark, ResNet-50", DDP_BENCHMARK + "ResNet-50 at 32 images a GPU: 0.097 s an iteration on "
         "1 GPU without DDP, 0.100 with it, 0.103 on 2 and 4, 0.104 on 8 and on 16 GPUs (2 machines)",
         params=25.56e6, local_batch=32, one_gpu_s=0.097,
         rows=((2, 1, 0.103), (4, 1, 0.103), (8, 1, 0.104), (8, 2, 0.104)), intra=NVLINK2, inter=EDR_X4),
    Case("PyTorch DDP benchmark, ResNet-101", DDP_BENCHMARK + "ResNet-101 at 32 images a GPU: 0.162 s without DDP, "
         "0.171 with it, 0.176 on 2 and 4, 0.179 on 8 and on 16 GPUs (2 machines)",
         params=44.55e6, local_batch=32, one_gpu_s=0.162,
         rows=((2, 1, 0.176), (4, 1, 0.176), (8, 1, 0.179), (8, 2, 0.179)), intra=NVLINK2, inter=EDR_X4),
    Case("DAWNBench CIFAR-10, 1 vs 4 V100", "DAWNBench CIFAR-10 training-time entries: 68 s to 94% on one V100, "
         "38 s on four", params=6.57e6, local_batch=512, one_gpu_s=68.0, rows=((4, 1, 38.0),), intra=NVLINK2,
         steps=24 * 98, note="assumed: a ResNet-9 of 6.57 M parameters, the same recipe on both (24 epochs of "
         "98 steps at a global batch of 512, so 128 a GPU on four); the entries' recipes are not stated alike"),
)


def predict(case: Case) -> list[dict]:
    """Each row of `case`: the source's figure, the model's, and the relative error (model - source) / source."""
    per_image = case.one_gpu_s / case.steps / case.local_batch
    out = []
    for per_node, nodes, stated in case.rows:
        workers = per_node * nodes
        local = case.local_batch if case.steps == 1 else case.local_batch // workers  # a run: the global batch is kept
        images = local * workers * case.steps
        costs = StepCosts(data_per_image_s=0.0, compute_per_image_s=per_image, optimizer_s=0.0, rest_s=0.0,
                          accumulate=1, train_images=images, grad_bytes=case.params * 4, bucket_cap_mb=25.0,
                          on_cuda=True, measured={})
        p = predict_one(costs, per_node, nodes, local, case.intra, case.inter)
        model = p.step_s if case.steps == 1 else p.step_s * case.steps
        out.append({"case": case.name, "gpus": workers, "nodes": nodes, "stated": stated, "predicted": model,
                    "error": model / stated - 1, "exposed_comm_s": p.exposed_comm_s, "link": p.link})
    return out

