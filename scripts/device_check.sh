#!/usr/bin/env bash
# Everything only a GPU can check, in one call on a lent CUDA machine (the `device` tool's
# `run`), in under 10 minutes. Results land in $OUT (at most 8 files come back): the GPU check
# table, the plain-loop comparison, and one 1-GPU sweep's run folders (checkpoints left out)
# as a tarball, to report on here with `ddplab report` (the report needs no GPU and no torch).
#
# Carry (git-ignored paths named in `carry`):
#   .device/cifar10-jpeg.pack and .device/unpack_cifar10_jpeg.py   (copies of ../shared/data/)
#   .whl/*.whl   pure-Python wheels the device lacks (tomli-w; nvidia-ml-py for GPU sampling)
# Run:  bash scripts/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
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

# 1. CUDA-relevant tests, the training matrix, kernels check and bench: one table.
timeout 270 python3 scripts/gpu_check.py --out /tmp/gpu-check --timeout 120 2>&1 | tail -40 | tee "$OUT/gpu_check.txt"
cp /tmp/gpu-check/gpu_check.json "$OUT/" 2>/dev/null
# 2. Seed report D's recipe: a plain PyTorch loop vs ddplab, seconds per epoch; then ddplab with CUDA graphs.
timeout 100 python3 scripts/bench_loop.py --device cuda --epochs 3 --out "$OUT/bench_loop.json" 2>&1 | tail -6 \
  | tee "$OUT/bench_loop.txt"
timeout 100 python3 scripts/bench_loop.py --device cuda --epochs 3 --out "$OUT/bench_graphs.json" \
  --ddplab-args "--model.compile true --model.compile_mode reduce-overhead" 2>&1 | tail -6 | tee -a "$OUT/bench_loop.txt"
# 3. A sweep that fits one GPU, then its run folders (without checkpoints) for the report.
timeout 80 python3 -m ddplab sweep sweeps/accumulation.toml --profile gpu --out /tmp/sweep-accumulation --no-report \
  2>&1 | tail -8 | tee "$OUT/sweep.txt"
tar czf "$OUT/sweep-accumulation.tgz" --exclude=checkpoints -C /tmp sweep-accumulation 2>/dev/null
ls -la "$OUT"
