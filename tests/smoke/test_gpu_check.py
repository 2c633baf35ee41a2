"""scripts/gpu_check.py: the one-command machine check, run here on its CPU-safe part."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def gpu_check(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={"OMP_NUM_THREADS": "1", **__import__("os").environ},
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU answer (on CUDA the script runs for real)")
def test_cpu_safe_part_runs_and_tabulates(tmp_path):
    proc = gpu_check(
        "--device",
        "cpu",
        "--quick",
        "--tests",
        "none",
        "--rows",
        "fp32,ddp gloo xN,dp,kernels check",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["row"]: r for r in json.loads((tmp_path / "gpu_check.json").read_text())["results"]}
    assert list(rows) == ["fp32", "dp", "ddp gloo xN", "kernels check"]  # the script's order
    assert rows["fp32"]["status"] == "ok" and rows["fp32"]["world_size"] == 1 and 0 < rows["fp32"]["test_acc"] <= 1
    assert rows["ddp gloo xN"]["status"] == "ok" and rows["ddp gloo xN"]["world_size"] == 2
    assert rows["dp"]["status"] == "skipped: needs CUDA"
    assert rows["kernels check"]["status"].startswith("ok: ") and "0 failed" in rows["kernels check"]["status"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert (
        "| fp32 | ok | 1 |" in table and "| dp | skipped: needs CUDA |" in table and table in proc.stdout + "\n" + table
    )


def test_unknown_row_is_refused(tmp_path):
    proc = gpu_check("--device", "cpu", "--rows", "fp8", "--out", str(tmp_path))
    assert proc.returncode == 2 and "unknown rows ['fp8']" in proc.stderr


def test_a_failed_row_fails_the_check(tmp_path):
    """A broken row must not pass silently (here: a run that refuses its settings)."""
    proc = gpu_check(
        "--device",
        "cpu",
        "--quick",
        "--tests",
        "none",
        "--rows",
        "fp32",
        "--epochs",
        "0",
        "--out",
        str(tmp_path / "bad"),
    )
    assert proc.returncode == 1
    row = json.loads((tmp_path / "bad" / "gpu_check.json").read_text())["results"][0]
    assert row["status"].startswith("FAILED (exit 2): train.epochs=0")  # the error line, as the sweep records it
