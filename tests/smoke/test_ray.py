"""`ddplab sweep --executor ray` (sweep/ray_executor.py) on a local Ray that the sweep starts itself: its points are
the local executor's runs, a stopped sweep leaves nothing running and resumes exactly, and what cannot run is one
line before anything starts. A cluster of several hosts: tests/distributed/test_ray_cluster.py."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from ddplab.metrics.records import read_epochs, reproducible

from cli_process import ddplab_cli
from conftest import leftover_processes
from sweep_files import TWO_POINTS, tiny_sweep


def metrics(run_dir):
    return [reproducible(r, per_rank=False) for r in read_epochs(run_dir / "metrics.jsonl")]


def manifest(out):
    return json.loads((out / "manifest.json").read_text())


def test_a_stopped_sweep_on_ray_leaves_nothing_running_and_resumes_to_the_local_executors_runs(tmp_path):
    """SIGTERM at the sweep (started as a script's `cmd &`, SIGINT ignored: Ray's workers inherit that, and Ray
    cancels a task with SIGINT) cancels its tasks, each run stopped resumable (130), no Ray or run process left;
    run again it resumes both, and they end as the same sweep run by the local executor ends."""
    pytest.importorskip("ray", reason="Ray comes with the ray extra (pip install 'ddplab[ray]')")
    # One thread a run on both executors (a run's float sums follow its threads): Ray asks for, and gives, one CPU.
    one_thread = TWO_POINTS.replace('"optim.lr" = 0.01', '"optim.lr" = 0.01\n"train.threads" = 1').replace(
        '"train.batch_size" = 32', '"train.batch_size" = 32\n"train.threads" = 1'
    )
    path = tiny_sweep(tmp_path / "s.toml", one_thread, epochs=3)
    local = ddplab_cli("sweep", str(path), "--out", str(tmp_path / "local"), "--no-report", "--no-estimate")
    assert local.returncode == 0, local.stderr[-3000:]
    out, marker = tmp_path / "ray", f"DDPLAB_TEST_{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddplab", "sweep", str(path), "--out", str(out), "--executor", "ray", "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, marker: "1", "DDPLAB_FAULT": "hang:epoch=2"},  # each run held in epoch 2 until stopped
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.monotonic() + 180
    while not all((out / "runs" / n / "checkpoints" / "last.pt").is_file() for n in ("a", "b")):  # epoch 1 kept
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and stderr.strip().splitlines()[-1] == "ddplab: interrupted by SIGTERM", stderr
    assert "started a local one for this sweep, 1 node" in stdout and "2 to run on Ray" in stdout, stdout
    runs = {r["name"]: r for r in manifest(out)["runs"]}
    assert manifest(out)["executor"] == "ray"
    assert [(runs[n]["status"], runs[n]["exit_code"]) for n in ("a", "b")] == [("interrupted", 130)] * 2
    while leftover_processes(marker):  # the runs, Ray's workers, its raylet and GCS: all gone
        assert time.monotonic() < deadline + 60, leftover_processes(marker)
        time.sleep(0.2)
    rerun = ddplab_cli("sweep", str(path), "--out", str(out), "--executor", "ray", "--no-report", env={marker: "1"})
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rerun.stdout.count("submitted to Ray (resuming") == 2, rerun.stdout
    assert {r["status"] for r in manifest(out)["runs"]} == {"finished"}
    for name in ("a", "b"):
        assert metrics(out / "runs" / name) == metrics(tmp_path / "local" / "runs" / name), name
    assert leftover_processes(marker) == []


def test_what_ray_cannot_run_is_one_line_before_anything_starts(tmp_path):
    """Ray not installed names the extra; a cluster that does not answer is said within seconds (Ray itself
    retries for minutes); a point across more nodes than the cluster has, or across nodes with torchrun, is refused;
    nothing written for any of them."""
    path = tiny_sweep(tmp_path / "s.toml", TWO_POINTS, epochs=1)
    (tmp_path / "noray" / "ray").mkdir(parents=True)
    (tmp_path / "noray" / "ray" / "__init__.py").write_text("raise ImportError('no module named ray')\n")
    missing = ddplab_cli("sweep", str(path), "--out", str(tmp_path / "a"), "--executor", "ray",
                         env={"PYTHONPATH": str(tmp_path / "noray")})  # fmt: skip
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "ddplab: error: --executor ray needs Ray, which this Python lacks: pip install 'ddplab[ray]'"
    )
    assert not (tmp_path / "a").exists()
    pytest.importorskip("ray", reason="Ray comes with the ray extra (pip install 'ddplab[ray]')")
    started = time.monotonic()
    away = ddplab_cli("sweep", str(path), "--out", str(tmp_path / "b"), "--executor", "ray", "--ray.address",
                      "127.0.0.1:1")  # fmt: skip
    assert away.returncode == 2 and time.monotonic() - started < 60, away.stderr[-3000:]
    assert (
        away.stderr.strip()
        .splitlines()[-1]
        .startswith("ddplab: error: cannot reach the Ray cluster at 127.0.0.1:1 (ConnectionRefusedError")
    )
    across = tiny_sweep(tmp_path / "n.toml", '[[variants]]\nlabel = "two nodes"\n"dist.strategy" = "ddp"\n'
                        '"dist.nnodes" = 2\n', epochs=1)  # fmt: skip
    two = ddplab_cli("sweep", str(across), "--out", str(tmp_path / "c"), "--executor", "ray")
    assert two.returncode == 2, two.stderr[-3000:]
    assert two.stderr.strip().splitlines()[-1] == (
        "ddplab: error: sweep run two-nodes spans 2 nodes, each asking for 1 CPU(s) and 0 GPU(s), and the cluster "
        "has 1 such node(s) of 1"
    )
    (tmp_path / "r.toml").write_text(across.read_text() + 'launch = "torchrun"\n')
    torchrun = ddplab_cli("sweep", str(tmp_path / "r.toml"), "--out", str(tmp_path / "c"), "--executor", "ray")
    assert torchrun.returncode == 2 and torchrun.stderr.strip().splitlines()[-1] == (
        'ddplab: error: sweep run two-nodes spans 2 nodes with launch = "torchrun": on Ray each node runs '
        "ddplab's launcher (leave launch out, or run it with --executor slurm)"
    )
    big = tiny_sweep(tmp_path / "t.toml", '[[variants]]\nlabel = "wide"\n"train.threads" = 4096\n', epochs=1)
    wide = ddplab_cli("sweep", str(big), "--out", str(tmp_path / "d"), "--executor", "ray")
    assert wide.returncode == 2, wide.stderr[-3000:]
    assert re.search(r"sweep run \S+ asks for 4096 CPU\(s\) and 0 GPU\(s\) on one node, and the cluster's largest "
                     r"node has \d+ and 0$", wide.stderr.strip().splitlines()[-1]), wide.stderr[-3000:]  # fmt: skip
    assert not any((tmp_path / d).exists() for d in "bcd")
