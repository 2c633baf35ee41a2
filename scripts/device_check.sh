#!/usr/bin/env bash
# Everything only a GPU can check, in ONE call of the device tool per part: a lent session has 15 minutes of
# device time in all, the machine's start (1-2 minutes) included.
#   bash scripts/device_check.sh [checks]     on the CUDA machine: 397 s on an H200 (2026-11-26); call it with
#                                           timeout_s 600
#   bash scripts/device_check.sh owed         what the checks left owed: the assignment's GPU profile, the
#                                           speedrun step's profile, data path, time to accuracy and the
#                                           memory formats on CUDA,
#                                           reduce-overhead under DDP, a --parallel 2 sweep on one GPU
#   bash scripts/device_check.sh planner      the scaling planner's GPU side (issue 30): what DDP adds to a step
#                                           (benchmarks/ddp_step.py), and ddplab runs at local batches 32 to
#                                           1024 whose folders come back to be planned from each other (their
#                                           first epoch profiled: the GPU's busy share; SKIP_BENCH=1: runs only)
#   bash scripts/device_check.sh airbench     issue 45: the speedrun preset against airbench94_muon on this card,
#                                           interleaved, $SEEDS runs each (default 20): benchmarks/speedrun.py
#                                           --against airbench (its own compile and warm-up once, then ~2 s a run;
#                                           the preset's each a process: start-up and compile apart from its time).
#                                           ddplab carries none of airbench: fetch airbench94_muon.py at the commit
#                                           benchmarks/_airbench.py names into .device/ before the call (it is carried
#                                           with .device; a file of another hash is refused)
#   bash scripts/device_check.sh --cpu [PART] the same steps on a CPU at toy sizes: a rehearsal, no device minute lost
#                                           (airbench: a stand-in of its interface written here, its figures
#                                           labelled a stand-in's, since a CPU cannot run airbench)
# Every step's limit is cut to what is left of the call ($DEADLINE s from the start, default 570), so a slow
# step costs the steps after it, never the results before it.
#
# Part `checks`. Phase 1 checks correctness in five lanes side by side (16 cores, one GPU; their times are not
# figures):
#   matrix-a, matrix-b  scripts/gpu_check.py's rows on one GPU (share-device DDP, CUDA graphs, AMP, compile, ...)
#   tests               the CUDA-relevant tests under pytest -n 6
#   share               2 workers sharing the GPU: a clean run, then the same run with rank 1 killed in epoch 2
#                       and the group restarted from the checkpoint
#   exact               1 worker, eager and with the whole step in a CUDA graph
# (the last two with deterministic kernels: each pair's epochs compared, and 2 x 64 against 1 x 128)
# Phase 2 takes the figures, one at a time on an otherwise idle GPU: the loop against a plain loop (eager and with
# the whole step in a CUDA graph), the speedrun preset over 5 seeds, the kernels' bench, seed D's step profiled.
#
# Part `owed`, in order of worth: the assignment alone on the GPU (its run folders come back; the report is
# built where they land), then one at a time the speedrun step's profile, the data path and time to accuracy,
# then side by side (correctness only) reduce-overhead under share-device DDP against the eager DDP run, a
# --parallel 2 sweep on the one GPU, and `kernels check`.
#
# Everything lands in /tmp/device-check and is bundled into $OUT/device-check.tgz every 15 s and at the end, so a
# timeout still brings back what ran; $OUT/summary.txt holds each step's last lines.
#
# Carry (git-ignored paths named in `carry`): .device (copies of ../shared/data/cifar10-jpeg.pack and
# unpack_cifar10_jpeg.py; for `airbench`, airbench94_muon.py as fetched) and .whl (tomli-w's wheel; the image has
# nvidia-ml-py).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=cuda
[ "${1:-}" = --cpu ] && MODE=cpu && shift
PART=${1:-checks}
case $PART in checks | owed | planner | airbench) ;;
*) echo "device_check.sh: no part '$PART' (checks, owed, planner, airbench)" >&2; exit 2 ;; esac
DEADLINE=${DEADLINE:-570}
OUT=${OUT:-runs/device-check}
W=/tmp/device-check
rm -rf "$W"
mkdir -p "$OUT" "$W"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
T0=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1 && [ "$MODE" = cuda ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
if [ -f .device/cifar10-jpeg.pack ] && [ ! -d /tmp/ddplab-data/cifar-10-batches-bin ]; then
  $PY .device/unpack_cifar10_jpeg.py .device/cifar10-jpeg.pack /tmp/ddplab-data >/dev/null
fi
[ -d /tmp/ddplab-data/cifar-10-batches-bin ] && export DDPLAB_DATA=/tmp/ddplab-data

# tar exits 1 when a log grows while it reads it (phase 1 always does): that bundle is still good.
bundle() {
  tar czf "$OUT/.$1.tgz" --warning=no-file-changed --exclude=checkpoints --exclude='*.pt' --exclude='trace_*.json' -C /tmp device-check \
    2>/dev/null
  [ $? -le 1 ] && mv "$OUT/.$1.tgz" "$OUT/device-check.tgz"
}
(while sleep 15; do bundle partial; done) &
BUNDLER=$!
say() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$OUT/summary.txt"; }
# step NAME SECONDS CMD...: runs CMD with a limit (cut to what is left before $DEADLINE), its output to
# $W/NAME.log, its last lines to the summary.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - 12 - ($(date +%s) - T0)))
  if [ "$left" -lt 20 ]; then
    say "skip $name: $left s left of the call"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  say "start $name (limit $limit s)"
  timeout -k 10 "$limit" "$@" >"$W/$name.log" 2>&1
  local rc=$?
  say "end $name: exit $rc$([ $rc = 124 ] || [ $rc = 137 ] && echo ' (timed out)')"
  tail -n "${TAIL:-8}" "$W/$name.log" | tee -a "$OUT/summary.txt"
}
# Stragglers of a timed-out step (supervised children run in their own sessions) must not share phase 2's GPU.
# Only this call's processes: each one it starts carries DDPLAB_DEVICE_CHECK (exported after the bundler starts, so
# neither the bundler nor this shell does); a `ddplab train` of anything else on the machine is left alone.
export DDPLAB_DEVICE_CHECK="$$-$T0"
reap() {
  local p
  for p in $(grep -lsz "^DDPLAB_DEVICE_CHECK=$DDPLAB_DEVICE_CHECK\$" /proc/[0-9]*/environ | cut -d/ -f3); do
    kill -9 "$p" 2>/dev/null
  done
  true
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv 2>/dev/null
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" 2>&1
} | tee "$W/device.txt" | tee -a "$OUT/summary.txt"

if [ "$MODE" = cuda ]; then
  DEV=(--device cuda)
  XDIST=(-n 6)
  QUICK=()
  DATA=(--dataset cifar10 --subset 20000 --batch-size 128)
  SHARE=(--strategy ddp --nproc 2 --dist.share_device true)
  TESTS=(tests/unit/engine/test_graphed.py tests/kernels tests/unit/data/test_loader.py tests/unit/engine/test_trainer.py
    tests/unit/test_compat.py tests/unit/test_speedrun.py tests/unit/test_tta.py tests/unit/test_phases.py)
else
  DEV=(--device cpu)
  XDIST=()
  QUICK=(--quick)
  DATA=(--dataset synthetic --data.synthetic_size 512 --data.image_size 16 --model.width 0.5 --batch-size 64)
  SHARE=(--strategy ddp --nproc 2)
  TESTS=(tests/unit/test_compat.py)
fi
TESTS=($(for t in "${TESTS[@]}"; do [ -e "$t" ] && echo "$t"; done))
[ ${#TESTS[@]} -gt 0 ] || TESTS=(--co -q tests/unit/test_compat.py) # never the whole suite by accident

checks() {
  say "phase 1: correctness, five lanes side by side"
  (TAIL=24 step matrix-a 170 $PY scripts/gpu_check.py "${DEV[@]}" "${QUICK[@]}" --tests none --timeout 100 \
    --out "$W/matrix-a" --rows "fp32,ddp x2 one gpu,ddp x2 one gpu sync_bn,cuda graphs,cuda graphs bf16 + accumulate 2,bf16,dp,ddp nccl x1") &
  LANES=($!)
  (TAIL=24 step matrix-b 170 $PY scripts/gpu_check.py "${DEV[@]}" "${QUICK[@]}" --tests none --timeout 120 \
    --out "$W/matrix-b" \
    --rows "kernels check,fp16,bf16 channels_last,fused conv+relu,compile,compile reduce-overhead") &
  LANES+=($!)
  (TAIL=15 step tests 170 $PY -m pytest -q -p no:cacheprovider "${XDIST[@]}" \
    "${TESTS[@]}" --junitxml="$W/tests.xml") &
  LANES+=($!)
  # Exactness with deterministic kernels (the CUDA default is the fast ones): a killed and restarted run against
  # the clean one, the whole step in a CUDA graph against the eager step, 2 workers x 64 against 1 x 128.
  EXACT=(-m ddplab train "${DEV[@]}" "${DATA[@]}" --seed 1 --epochs 3 --train.deterministic true
    --output.progress false --output.tensorboard false)
  (
    step share-clean 80 $PY "${EXACT[@]}" --batch-size 64 "${SHARE[@]}" --out "$W/share-clean"
    DDPLAB_FAULT=kill:rank=1:epoch=2:step=3 step share-kill 85 $PY "${EXACT[@]}" --batch-size 64 "${SHARE[@]}" \
      --dist.max_restarts 1 --out "$W/share-kill"
  ) &
  LANES+=($!)
  (
    step single 60 $PY "${EXACT[@]}" --batch-size 128 --out "$W/single"
    step graphs 60 $PY "${EXACT[@]}" --batch-size 128 --train.cuda_graphs "$([ "$MODE" = cuda ] && echo true || echo false)" \
      --out "$W/graphs"
  ) &
  LANES+=($!)
  wait "${LANES[@]}"
  reap
  $PY - "$W" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import collections, json, sys
from pathlib import Path
w = Path(sys.argv[1])
KEYS = ("train_loss", "test_loss", "test_acc")
def epochs(name):
    try:
        return [json.loads(l) for l in (w / name / "metrics.jsonl").read_text().splitlines() if '"test_acc"' in l]
    except OSError as exc:
        return f"no metrics ({exc})"
runs = {n: epochs(n) for n in ("single", "graphs", "share-clean", "share-kill")}
for name, rows in runs.items():
    print(name, rows if isinstance(rows, str) else [tuple(r.get(k) for k in ("epoch", *KEYS)) for r in rows])
for name in ("share-clean", "share-kill"):
    run, ranks = w / name, collections.Counter()
    if (run / "gpu.jsonl").exists():
        for line in (run / "gpu.jsonl").read_text().splitlines():
            ranks[json.loads(line).get("rank")] += 1
    log = (run / "train.log").read_text() if (run / "train.log").exists() else ""
    print(f"{name}: {'resumed' if 'resumed from' in log else 'not resumed'}; gpu.jsonl rows per rank {dict(ranks)}")
for a, b in (("share-kill", "share-clean"), ("graphs", "single"), ("share-clean", "single")):
    A, B = runs[a], runs[b]
    if isinstance(A, str) or isinstance(B, str) or len(A) != len(B):
        print(f"{a} vs {b}: missing epochs"); continue
    same = all(x[k] == y[k] for x, y in zip(A, B) for k in KEYS)
    worst = [max(abs(x[k] - y[k]) for k in KEYS) for x, y in zip(A, B)]
    print(f"{a} vs {b}: bit-identical {same}; largest difference per epoch {worst}")
EOF

  say "phase 2: figures, one at a time"
  if [ "$MODE" = cuda ]; then
    LOOP=(--subset 20000 --epochs 3)
  else
    LOOP=(--quick)
  fi
  TAIL=14 step loop-eager 80 $PY benchmarks/loop_overhead.py "${DEV[@]}" "${LOOP[@]}" --repeats 2 --out "$W/bench_loop.json"
  reap
  TAIL=14 step loop-graphs 50 $PY benchmarks/loop_overhead.py "${DEV[@]}" "${LOOP[@]}" --repeats 1 \
    --out "$W/bench_graphs.json" --ddplab-args "--train.cuda_graphs $([ "$MODE" = cuda ] && echo true || echo false)"
  reap
  TAIL=16 step speedrun 150 $PY benchmarks/speedrun.py "${DEV[@]}" "${QUICK[@]}" --seeds "$([ "$MODE" = cuda ] && echo 5 || echo 2)" \
    --out "$W/speedrun.json" --runs-dir "$W/speedrun-runs"
  reap
  TAIL=40 step kernels-bench 70 $PY -m ddplab kernels bench "${DEV[@]}" "${QUICK[@]}"
  reap
  if [ "$MODE" = cuda ]; then
    PROFILE=(--config configs/seed_report_d.toml --subset 8192)
  else
    PROFILE=("${DATA[@]}")
  fi
  TAIL=14 step profile 35 $PY -m ddplab train "${PROFILE[@]}" "${DEV[@]}" --epochs 1 --train.profile_steps 20 \
    --output.progress false --out "$W/profile-seed-d"
  head -45 "$W"/profile-seed-d/profile/ops_rank0_*.txt 2>/dev/null | tee -a "$OUT/summary.txt"
  reap
}

owed() {
  local asg speed ro ro_compile par2 ttacc
  if [ "$MODE" = cuda ]; then
    asg=(--profile gpu)
    speed=(--preset speedrun --epochs 2 --train.profile_steps 15)
    ro=(--dataset cifar10 --subset 8192 --batch-size 128 --epochs 2 --seed 1 "${SHARE[@]}")
    ro_compile=(--model.compile true --model.compile_mode reduce-overhead)
    par2=("dataset = \"cifar10\"" "subset = 8192" "epochs = 2")
    ttacc=(--repeats 2)
  else
    asg=(--profile cpu --set data.subset=128 --set data.test_subset=128 --set train.eval_train_images=64)
    speed=(--preset speedrun --model.compile false --train.precision fp32 --epochs 1 --subset 320 --data.test_subset 100
      --batch-size 32 --train.profile_steps 3)
    ro=("${DATA[@]}" --epochs 2 --seed 1 "${SHARE[@]}")
    ro_compile=() # the CPU rehearses the flags around it: torch.compile on 2 cores would take the minute alone
    par2=("dataset = \"synthetic\"" "synthetic_size = 256" "epochs = 1")
    ttacc=(--quick)
  fi
  say "the assignment alone on the device"
  TAIL=30 step assignment 420 $PY -m ddplab assignment "${asg[@]}" --out "$W/assignment" --no-estimate --no-report
  reap
  say "figures, one at a time"
  TAIL=14 step speedrun-profile 70 $PY -m ddplab train "${speed[@]}" "${DEV[@]}" --output.progress false \
    --out "$W/speedrun-profile"
  head -45 "$W"/speedrun-profile/profile/ops_rank0_*.txt 2>/dev/null | tee -a "$OUT/summary.txt"
  reap
  say "correctness side by side: reduce-overhead under DDP, a --parallel 2 sweep on one device, kernels check"
  printf '%s\n' '[sweep]' 'name = "par2"' '[base.data]' "${par2[0]}" "${par2[1]}" '[base.train]' "${par2[2]}" \
    'batch_size = 64' '[[variants.config]]' 'label = "lr 1e-3"' '"optim.lr" = 0.001' '[[variants.config]]' \
    'label = "lr 2e-3"' '"optim.lr" = 0.002' >"$W/par2.toml"
  local lanes=()
  (
    step ddp-eager 80 $PY -m ddplab train "${ro[@]}" "${DEV[@]}" --output.progress false --out "$W/ddp-eager"
    step ddp-reduce-overhead 100 $PY -m ddplab train "${ro[@]}" "${DEV[@]}" "${ro_compile[@]}" \
      --output.progress false --out "$W/ddp-reduce-overhead"
  ) &
  lanes+=($!)
  (TAIL=20 step parallel-2 120 $PY -m ddplab sweep "$W/par2.toml" --parallel 2 --no-estimate --no-report \
    --out "$W/par2") &
  lanes+=($!)
  (TAIL=14 step kernels-check 120 $PY -m ddplab kernels check "${DEV[@]}") &
  lanes+=($!)
  wait "${lanes[@]}"
  reap
  $PY - "$W" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
for name in ("ddp-eager", "ddp-reduce-overhead"):
    try:
        rows = [json.loads(l) for l in (w / name / "metrics.jsonl").read_text().splitlines() if '"test_acc"' in l]
        print(name, [(r["epoch"], r["train_loss"], r["test_loss"], r["test_acc"]) for r in rows])
    except (OSError, KeyError) as exc:
        print(name, "no metrics:", exc)
EOF
  say "figures, one at a time (if the call has time left)"
  TAIL=14 step data-path 60 $PY benchmarks/data_path.py "${DEV[@]}" "${QUICK[@]}" --workers 8 --repeats 2 \
    --out "$W/bench_data_path.json"
  reap
  TAIL=14 step time-to-accuracy 90 $PY benchmarks/time_to_accuracy.py "${DEV[@]}" "${ttacc[@]}" \
    --out "$W/bench_tta.json"
  reap
  # model.channels_last=auto keeps CUDA in NCHW: what channels_last is worth there, fp32 and bf16 (BENCHMARKS.md)
  TAIL=12 step memory-format 60 $PY benchmarks/memory_format.py "${DEV[@]}" "${QUICK[@]}" --out "$W/bench_memory_format.json"
  reap
  TAIL=12 step memory-format-bf16 60 $PY benchmarks/memory_format.py "${DEV[@]}" "${QUICK[@]}" --precision bf16 \
    --out "$W/bench_memory_format_bf16.json"
  reap
}

planner() {
  local bench=() batches=(32 128 512 1024) models=(vgg_small resnet18 simple_cnn) data
  data=(--dataset synthetic --data.synthetic_size 16384 --data.image_size 32 --epochs 3)
  if [ "$MODE" = cpu ]; then
    bench=(--quick)
    batches=(32 64)
    models=(simple_cnn)
    data=(--dataset synthetic --data.synthetic_size 512 --data.image_size 16 --model.width 0.5 --epochs 2)
  fi
  if [ "${SKIP_BENCH:-0}" != 1 ]; then
    say "what DDP adds to a step, and a step's time against its batch"
    TAIL=40 step ddp-step 200 $PY benchmarks/ddp_step.py "${DEV[@]}" "${bench[@]}" --out "$W/bench_ddp_step.json"
    reap
  fi
  say "ddplab runs to plan from each other (the time breakdown the planner reads)"
  local m b
  for m in "${models[@]}"; do
    for b in "${batches[@]}"; do
      TAIL=3 step "plan-$m-$b" 60 $PY -m ddplab train "${data[@]}" --model "$m" --batch-size "$b" "${DEV[@]}" \
        --output.progress false --output.tensorboard false --output.save_best false --train.profile_steps 10 \
        --out "$W/plan/$m-$b"
    done
  done
  reap
}

airbench() {
  local file=(--airbench-file .device/airbench94_muon.py)
  if [ "$MODE" = cpu ]; then  # airbench's interface on a CPU, written here: checks the plumbing, measures nothing
    cat >"$W/airbench_stand_in.py" <<'EOF'
import torch
import torchvision.transforms as T
class CifarNet(torch.nn.Module):
    def cuda(self): return self
    def compile(self, mode=None): pass
def print_training_details(variables, is_final_entry): pass
def main(run, model):
    time_seconds = 1.0
    tta_val_acc = 0.5
    print_training_details(locals(), is_final_entry=True)
    return tta_val_acc
EOF
    file=(--airbench-file "$W/airbench_stand_in.py" --airbench-unverified)
  elif [ ! -f .device/airbench94_muon.py ]; then
    say "airbench: .device/airbench94_muon.py is missing: fetch it at the commit benchmarks/_airbench.py names"
    return
  fi
  say "the speedrun preset against airbench94_muon, interleaved (issue 45)"
  TAIL=20 step airbench 540 $PY benchmarks/speedrun.py "${DEV[@]}" "${QUICK[@]}" \
    --seeds "$([ "$MODE" = cuda ] && echo "${SEEDS:-20}" || echo 2)" --against airbench "${file[@]}" \
    --out "$W/speedrun_airbench.json" --runs-dir "$W/airbench-runs"
  reap
}

$PART
kill "$BUNDLER" 2>/dev/null
wait "$BUNDLER" 2>/dev/null # a bundle under way ends first
bundle final
say "done"
ls -la "$OUT"
