"""The code passes the linter and the type checker CI holds it to (ruff, mypy; their rules in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

import pytest

from support import tiers

ROOT = Path(__file__).resolve().parents[1]


def test_src_and_tests_pass_ruff():
    tiers.importorskip("lint", "ruff", "ruff comes with the test extra (pip install -e '.[test]')")
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests", "benchmarks", "scripts"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_code_is_laid_out_as_ruff_format_lays_it_out():
    """`ruff format` (line length in pyproject.toml): run it before a commit, and this passes."""
    tiers.importorskip("lint", "ruff", "ruff comes with the test extra (pip install -e '.[test]')")
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "src", "tests", "benchmarks", "scripts"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.slow(why="mypy over the whole source, about 30 s from cold")
def test_src_passes_the_type_checker():
    """mypy over src/ddplab (settings in pyproject.toml's [tool.mypy]): a None that flows where a value is expected,
    an argument of the wrong kind, a call to what a module does not have."""
    tiers.importorskip("lint", "mypy", "mypy comes with the test extra (pip install -e '.[test]')")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
