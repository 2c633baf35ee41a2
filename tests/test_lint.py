"""The code passes the linter CI holds it to (ruff; rules and exceptions in pyproject.toml's [tool.ruff])."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_src_and_tests_pass_ruff():
    pytest.importorskip("ruff", reason="ruff comes with the test extra (pip install -e '.[test]')")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests", "benchmarks", "scripts"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
