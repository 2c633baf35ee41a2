#!/usr/bin/env bash
# Everything only a GPU can check, in two calls on a lent CUDA machine (the `device` tool's
# `run`), each under 10 minutes. Results land in $OUT (files come back from there):
#   bash scripts/device_check.sh checks   the GPU check table (CUDA tests, training matrix,
#                                         kernels) and one 1-GPU sweep's run folders (checkpoints
#                                         left out) as a tarball, for `ddplab report` here
#   bash scripts/device_check.sh perf     loop overhead vs a plain loop (eager, CUDA graphs,
#                                         reduce-overhead) and the speedrun preset over 5 seeds
#
# Carry (git-ignored paths named in `carry`):
#   .device/cifar10-jpeg.pack and .device/unpack_cifar10_jpeg.py   (copies of ../shared/data/)
#   .whl/*.whl   pure-Python wheels the device lacks (tomli-w; nvidia-ml-py for GPU sampling)
set -uo pipefail
cd "$(dirname "$0")/.."
PART=${1:-checks}
OUT=${OUT:-runs/device-check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
if [ -f .device/cifar10-jpeg.pack ]; then
  python3 .device/unpack_cifar10_jpeg.py .device/cifar10-jpeg.pack /tmp/ddplab-data >/dev/null && export DDPLAB_DATA=/tmp/ddplab-data
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"

if [ "$PART" = checks ]; then
  # The CUDA-relevant tests, the training matrix, kernels check and bench: one table.
  timeout 330 python3 scripts/gpu_check.py --out /tmp/gpu-check --timeout 120 2>&1 | tail -44 | tee "$OUT/gpu_check.txt"
  cp /tmp/gpu-check/gpu_check.json "$OUT/" 2>/dev/null
  # A sweep that fits one GPU, then its run folders (without checkpoints) for the report.
  timeout 120 python3 -m ddplab sweep sweeps/accumulation.toml --profile gpu --out /tmp/sweep-accumulation --no-report \
    2>&1 | tail -8 | tee "$OUT/sweep.txt"
  tar czf "$OUT/sweep-accumulation.tgz" --exclude=checkpoints -C /tmp sweep-accumulation 2>/dev/null
elif [ "$PART" = perf ]; then
  # Seed report D's recipe: a plain PyTorch loop vs ddplab, images/s side by side (interleaved repeats, medians,
  # ratio); then ddplab with the whole step in a CUDA graph, and with reduce-overhead (compilation is start-up).
  timeout 100 python3 benchmarks/loop_overhead.py --device cuda --epochs 2 --repeats 2 --out "$OUT/bench_loop.json" 2>&1 \
    | tail -10 | tee "$OUT/bench_loop.txt"
  timeout 80 python3 benchmarks/loop_overhead.py --device cuda --epochs 2 --repeats 1 --out "$OUT/bench_graphs.json" \
    --ddplab-args "--train.cuda_graphs true" 2>&1 | tail -10 | tee -a "$OUT/bench_loop.txt"
  timeout 80 python3 benchmarks/loop_overhead.py --device cuda --epochs 2 --repeats 1 --out "$OUT/bench_reduce.json" \
    --ddplab-args "--model.compile true --model.compile_mode reduce-overhead" 2>&1 | tail -10 | tee -a "$OUT/bench_loop.txt"
  # The speedrun preset as the records time it, 5 seeds; then with its step in a CUDA graph.
  timeout 200 python3 benchmarks/speedrun.py --device cuda --seeds 5 --out "$OUT/speedrun.json" 2>&1 | tail -14 \
    | tee "$OUT/speedrun.txt"
  timeout 120 python3 benchmarks/speedrun.py --device cuda --seeds 3 --out "$OUT/speedrun_graphs.json" \
    --runs-dir runs/bench/speedrun-graphs -- --train.cuda_graphs true 2>&1 | tail -12 | tee -a "$OUT/speedrun.txt"
else
  echo "usage: bash scripts/device_check.sh checks|perf" >&2
  exit 2
fi
ls -la "$OUT"
