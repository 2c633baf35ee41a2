#!/usr/bin/env bash
# The test suite, from scratch: installs what it needs, then runs pytest. Extra arguments go to pytest.
# As root on Debian it also installs headless Chromium for the browser test (skipped, with the reason, without it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "test: installing chromium for the browser test" >&2
  { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } >/dev/null 2>&1 \
    || echo "test: could not install chromium; the browser test will be skipped" >&2
fi
exec .venv/bin/python -m pytest -q "$@"
