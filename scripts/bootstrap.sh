#!/usr/bin/env bash
# Make ./.venv with torch and ddplab (plus test and kernels extras) installed. Safe to re-run.
# torch: the one already importable by $PYTHON if there is one, else torch==2.13.0 (CPU build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m venv --system-site-packages .venv  # reuse the torch that is already there
  else
    "$PY" -m venv .venv
  fi
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "bootstrap: installing torch==2.13.0" >&2
  .venv/bin/python -m pip install -q --no-compile "torch==2.13.0"  # pip: its CPU build is on this machine's disk
fi
# shellcheck source=scripts/install.sh
source scripts/install.sh
install -e ".[test,kernels]"
# pip compiled nothing (most of an install's time): compile what ddplab's processes import, once a .venv.
[ -f .venv/.compiled ] || .venv/bin/python scripts/compile_imports.py torch torch._dynamo torch.distributed.run torch.nn.parallel \
  torch.utils.tensorboard torch.profiler PIL.Image matplotlib.pyplot tensorboard.backend.event_processing.event_accumulator \
  ddplab.cli ddplab.launch.elastic ddplab.engine.worker ddplab.report.build ddplab.sweep.local ddplab.planner.command 2>/dev/null \
  && touch .venv/.compiled || true
