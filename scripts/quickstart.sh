#!/usr/bin/env bash
# The main job: a short real training run on CIFAR-10, ending in its summary.
# CIFAR-10 comes from --data-dir / $DDPLAB_DATA, and is downloaded there when missing.
# Extra arguments go to `ddplab train` (e.g. --epochs 5 for the full recipe).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/ddplab train --dataset cifar10 --model simple_cnn --epochs 2 --subset 20000 "$@"
