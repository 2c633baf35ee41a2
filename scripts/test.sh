#!/usr/bin/env bash
# The test suite, from scratch: installs what it needs, then runs pytest. Extra arguments go to pytest.
# It installs MLflow (the mlflow extra) for the tracking tests, Ray (the ray extra) for --executor ray, and, as
# root on Debian, headless Chromium for the
# browser test and Slurm for the Slurm tests (each skipped, with the reason, without them). `--fast`: the fast tier
# (-m "not slow"), which needs none of them: it installs nothing (bootstrap only makes .venv when there is none).
#
# Three passes: the in-process tests on every core at once (pytest-xdist); the tests that spawn processes
# (`slow`) two at a time, each file's on one worker in turn (--dist loadfile: a module's fixture is built once,
# and the Slurm file's one cluster is never made twice at once); then the tests that measure this machine's
# speed or load, or bound a cold start (`alone`), one at a time. Then tests/support/tiers.py checks the skips against what
# this machine should run (root with ip and tc: no test-cluster test skips; the extras installed: no MLflow or Ray
# test skips), says which tiers ran and closes on the totals of all three passes. An install that fails fails the
# run (after the tests, so they still say what they can); `--fast` keeps its skips.
set -euo pipefail
cd "$(dirname "$0")/.."
# Byte-code written once and read by every later process: pytest's rewritten test modules (each pass and each
# xdist worker collected them from source: 12.5 s a collection, 6.8 s cached) and what no install compiled.
unset PYTHONDONTWRITEBYTECODE
in_parallel() {  # -n N --dist MODE where pytest-xdist is installed (an older .venv may lack it)
  if .venv/bin/python -c "import xdist" 2>/dev/null; then echo "-n $1 --dist $2"; fi
}
if [ "${1:-}" = "--fast" ]; then
  shift
  [ -x .venv/bin/python ] || bash scripts/bootstrap.sh
  # shellcheck disable=SC2046
  exec .venv/bin/python -m pytest -q -m "not slow and not alone" $(in_parallel auto load) "$@"
fi
# Chromium and Slurm come from apt while pip installs the Python side (a minute saved of a fresh machine's start).
APT_LOG=$(mktemp)
FAILED_INSTALLS=$(mktemp -u)  # made by an install that failed (the apt side runs in the background)
apt_installs() {
  if ! command -v chromium >/dev/null; then
    echo "test: installing chromium for the browser test" >&2
    { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } >>"$APT_LOG" 2>&1 \
      || { echo "test: could not install chromium (the browser test will skip, and the run fail)" >&2; touch "$FAILED_INSTALLS"; }
  fi
  if ! command -v slurmctld >/dev/null; then
    echo "test: installing slurm-wlm and munge for the Slurm tests (a one-node cluster they start themselves)" >&2
    { apt-get install -y -q slurm-wlm munge || { apt-get update -q && apt-get install -y -q slurm-wlm munge; }; } \
      >>"$APT_LOG" 2>&1 || { echo "test: could not install slurm-wlm and munge (the Slurm tests will skip, and the run \
fail)" >&2; touch "$FAILED_INSTALLS"; }
  fi
}
APT_PID=
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt_installs &
  APT_PID=$!
fi
bash scripts/bootstrap.sh
# MLflow (the mlflow extra) for the tracking tests, Ray (the ray extra) for --executor ray: pinned to the versions
# the tests were written on, installed together (one resolution, in parallel where uv installs them).
# shellcheck source=scripts/install.sh
source scripts/install.sh
extras=()
.venv/bin/python -c "import mlflow" 2>/dev/null || extras+=("mlflow==3.17.2")
.venv/bin/python -c "import ray" 2>/dev/null || extras+=("ray==2.60.0")
if [ ${#extras[@]} -gt 0 ]; then
  echo "test: installing ${extras[*]} for the tracking and --executor ray tests" >&2
  install "${extras[@]}" || { echo "test: could not install ${extras[*]} (their tests will skip, and the run fail)" >&2
    touch "$FAILED_INSTALLS"; }
fi
# What MLflow's client and server import, compiled once (PYTHONDONTWRITEBYTECODE would have every process do it).
if .venv/bin/python -c "import mlflow" 2>/dev/null && [ ! -f .venv/.compiled-mlflow ]; then
  .venv/bin/python scripts/compile_imports.py mlflow mlflow.tracking mlflow.entities \
    mlflow.store.tracking.sqlalchemy_store mlflow.server mlflow.server.handlers mlflow.server.fastapi_app \
    mlflow.cli 2>/dev/null && touch .venv/.compiled-mlflow || true
fi
[ -z "$APT_PID" ] || wait "$APT_PID"
rm -f "$APT_LOG"
status=0
keep() { [ "$status" != 0 ] && [ "$status" != 5 ] || status=$1; }  # the first failure's; 5: no test selected
DDPLAB_TEST_RECORD=$(mktemp)  # each pass's outcomes (tests/conftest.py), for tests/support/tiers.py
export DDPLAB_TEST_RECORD
# shellcheck disable=SC2046
.venv/bin/python -m pytest -q -m "not slow and not alone" $(in_parallel auto load) "$@" || keep $?
# Two at a time: mostly waiting on processes (start-up, rendezvous, timeouts), not on this one's cores. Three cut
# this pass from 10 min 29 s to 9 min 19 s with both cores 96-98% busy, and in its third run a starved node of an
# elastic run never joined the other two and ended "too few to go on" (CI, 2026-12-03; BENCHMARKS.md): two it stays.
# shellcheck disable=SC2046
.venv/bin/python -m pytest -q -m "slow and not alone" $(in_parallel 2 loadfile) "$@" || keep $?
.venv/bin/python -m pytest -q -m "alone" "$@" || keep $?
[ "$status" = 5 ] && status=0  # 5: a pass that selected no test (a path given of one tier only)
if [ -e "$FAILED_INSTALLS" ]; then
  echo "test: an install failed (above): the tests that need it were skipped, so this run fails" >&2
  keep 1
  rm -f "$FAILED_INSTALLS"
fi
.venv/bin/python tests/support/tiers.py "$DDPLAB_TEST_RECORD" || keep $?
rm -f "$DDPLAB_TEST_RECORD"
exit "$status"
