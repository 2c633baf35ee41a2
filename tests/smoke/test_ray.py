"""`ddplab sweep --executor ray` (sweep/ray_executor.py) on a local Ray that the sweep starts itself, without root: a
stopped sweep leaves nothing running and its point resumable, and what cannot run is one line before anything starts.
A cluster of several hosts (points spread and across nodes, a resume to the local executor's runs, a lost node, what
a cluster cannot run): tests/distributed/test_ray_cluster.py."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

from support import tiers
from support.cli import ddplab_cli
from support.readers import leftover_processes
from support.sweeps import TWO_POINTS, tiny_sweep


def manifest(out):
    return json.loads((out / "manifest.json").read_text())


def test_a_stopped_sweep_on_its_own_local_ray_leaves_no_process_and_its_point_resumable(tmp_path):
    """A local Ray the sweep starts itself (said in one line). SIGTERM at the sweep (started as a script's `cmd &`,
    SIGINT ignored: Ray's workers inherit that from the sweep that started them, and Ray cancels a task with SIGINT)
    cancels its task, the run stopped resumable (130), and no Ray or run process is left: the run's, Ray's workers,
    its raylet and GCS. (Resuming on Ray to the local executor's run: tests/distributed/test_ray_cluster.py.)"""
    tiers.importorskip("ray", "ray", "Ray comes with the ray extra (pip install 'ddplab[ray]')")
    path = tiny_sweep(tmp_path / "s.toml", '[[variants]]\nlabel = "a"\n"train.threads" = 1\n', epochs=3)
    out, marker = tmp_path / "ray", f"DDPLAB_TEST_{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddplab", "sweep", str(path), "--out", str(out), "--executor", "ray", "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, marker: "1", "DDPLAB_FAULT": "hang:epoch=2"},  # the run held in epoch 2 until stopped
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.monotonic() + 180
    while not (out / "runs" / "a" / "checkpoints" / "last.pt").is_file():  # epoch 1 kept
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and stderr.strip().splitlines()[-1] == "ddplab: interrupted by SIGTERM", stderr
    assert "started a local one for this sweep, 1 node" in stdout and "1 to run on Ray" in stdout, stdout
    (run,) = manifest(out)["runs"]
    assert manifest(out)["executor"] == "ray" and (run["status"], run["exit_code"]) == ("interrupted", 130)
    while leftover_processes(marker):
        assert time.monotonic() < deadline + 60, leftover_processes(marker)
        time.sleep(0.2)


def test_what_ray_cannot_run_is_one_line_before_anything_starts(tmp_path):
    """Ray not installed names the extra; a cluster that does not answer is said within seconds (Ray itself
    retries for minutes); nothing written for either. (What a cluster cannot run: test_ray_cluster.py.)"""
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
    tiers.importorskip("ray", "ray", "Ray comes with the ray extra (pip install 'ddplab[ray]')")
    started = time.monotonic()
    away = ddplab_cli("sweep", str(path), "--out", str(tmp_path / "b"), "--executor", "ray", "--ray.address",
                      "127.0.0.1:1")  # fmt: skip
    assert away.returncode == 2 and time.monotonic() - started < 60, away.stderr[-3000:]
    assert (
        away.stderr.strip()
        .splitlines()[-1]
        .startswith("ddplab: error: cannot reach the Ray cluster at 127.0.0.1:1 (ConnectionRefusedError")
    )
    assert not (tmp_path / "b").exists()
