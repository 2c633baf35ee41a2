#!/usr/bin/env bash
# Everything only a GPU can check, in three calls on a lent CUDA machine (the `device` tool's
# `run`), each under 10 minutes; make them back to back, so the machine stays warm. Results land
# in $OUT (files come back from there):
#   bash scripts/device_check.sh checks     the GPU check table (training matrix, kernels) and the
#                                           CUDA-relevant tests
#   bash scripts/device_check.sh perf       loop overhead vs a plain loop (eager, CUDA graphs,
#                                           reduce-overhead) and one 1-GPU sweep's run folders
#                                           (checkpoints left out), for `ddplab report` here
#   bash scripts/device_check.sh speedrun   the speedrun preset over 5 seeds, and 3 with CUDA graphs; a
#                                           torch.profiler table of seed report D's step (its ops by
#                                           device time), where the loop's time goes on a GPU
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

# Each part keeps under the device's 10-minute call: inner timeouts sum to < 540 s. Text tables come back
# as .txt; everything else (JSON, logs, run folders without checkpoints) in one tarball per part, since
# a call returns at most 8 files.
if [ "$PART" = checks ]; then
  # The training matrix (CUDA-graph rows first), kernels check and bench: one table, saved after every row.
  timeout 330 python3 scripts/gpu_check.py --tests none --out /tmp/gpu-check --timeout 100 2>&1 | tee "$OUT/gpu_check.txt"
  # The CUDA-relevant tests (the graph capture tests, the CUDA extension's bad input, kernels, loader).
  timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests/unit/test_graphed_step.py tests/kernels \
    tests/unit/test_loader.py tests/unit/test_trainer.py tests/unit/test_compat.py tests/unit/test_speedrun.py \
    --junitxml=/tmp/gpu-check/tests.xml 2>&1 | tail -30 | tee "$OUT/tests.txt"
  tar czf "$OUT/gpu-check.tgz" --exclude=checkpoints -C /tmp gpu-check 2>/dev/null
elif [ "$PART" = perf ]; then
  # Seed report D's recipe: a plain PyTorch loop vs ddplab, images/s side by side (interleaved repeats, medians,
  # ratio); then ddplab with the whole step in a CUDA graph, and with reduce-overhead (compilation is start-up).
  mkdir -p /tmp/perf
  timeout 100 python3 benchmarks/loop_overhead.py --device cuda --epochs 2 --repeats 2 --out /tmp/perf/bench_loop.json \
    2>&1 | tail -12 | tee "$OUT/bench_loop.txt"
  timeout 100 python3 benchmarks/loop_overhead.py --device cuda --epochs 2 --repeats 1 --out /tmp/perf/bench_graphs.json \
    --ddplab-args "--train.cuda_graphs true" 2>&1 | tail -12 | tee -a "$OUT/bench_loop.txt"
  timeout 160 python3 benchmarks/loop_overhead.py --device cuda --epochs 2 --repeats 1 --out /tmp/perf/bench_reduce.json \
    --ddplab-args "--model.compile true --model.compile_mode reduce-overhead" 2>&1 | tail -12 | tee -a "$OUT/bench_loop.txt"
  # A sweep that fits one GPU (2 epochs), its run folders for `ddplab report` here.
  timeout 150 python3 -m ddplab sweep sweeps/accumulation.toml --profile gpu --set train.epochs=2 \
    --out /tmp/perf/sweep-accumulation --no-report 2>&1 | tail -8 | tee "$OUT/sweep.txt"
  tar czf "$OUT/perf.tgz" --exclude=checkpoints -C /tmp perf 2>/dev/null
elif [ "$PART" = speedrun ]; then
  # The speedrun preset as the records time it, 5 seeds; then with its step in a CUDA graph.
  mkdir -p /tmp/speedrun
  timeout 260 python3 benchmarks/speedrun.py --device cuda --seeds 5 --out /tmp/speedrun/speedrun.json \
    --runs-dir /tmp/speedrun/runs 2>&1 | tail -16 | tee "$OUT/speedrun.txt"
  timeout 200 python3 benchmarks/speedrun.py --device cuda --seeds 3 --out /tmp/speedrun/speedrun_graphs.json \
    --runs-dir /tmp/speedrun/runs-graphs -- --train.cuda_graphs true 2>&1 | tail -16 | tee -a "$OUT/speedrun.txt"
  # Where seed report D's eager step spends its time on the GPU: 20 steps, ops by device time, and the host's share.
  timeout 60 python3 -m ddplab train --config configs/seed_report_d.toml --subset 8192 --epochs 1 --train.profile_steps 20 \
    --output.progress false --out /tmp/speedrun/profile-seed-d 2>&1 | tail -14 | tee "$OUT/profile.txt"
  cat /tmp/speedrun/profile-seed-d/profile/ops_rank0_*.txt 2>/dev/null | head -45 >>"$OUT/profile.txt"
  tar czf "$OUT/speedrun.tgz" --exclude=checkpoints -C /tmp speedrun 2>/dev/null
else
  echo "usage: bash scripts/device_check.sh checks|perf|speedrun" >&2
  exit 2
fi
ls -la "$OUT"
