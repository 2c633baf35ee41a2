#!/usr/bin/env bash
# The main job: the distributed-ML assignment's six questions in one sweep, then one report
# (runs/assignment/report/index.html). Re-running skips finished runs and resumes interrupted ones.
# CIFAR-10 comes from $DDPLAB_DATA (or --set data.data_dir=PATH), and is downloaded there when missing.
# Extra arguments go to `ddplab assignment` (e.g. --profile gpu, --dry-run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/ddplab assignment "$@"
