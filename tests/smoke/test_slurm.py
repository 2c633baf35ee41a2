"""`ddplab sweep --executor slurm` on a real one-node Slurm cluster (tests/slurm_cluster.py), CPU only."""

import csv
import json
import subprocess
import sys
import time

import pytest

from ddplab.metrics.records import read_epochs, reproducible
from slurm_cluster import SlurmCluster, why_not
from sweep_files import THREE_POINTS, tiny_sweep

pytestmark = pytest.mark.skipif(why_not() is not None, reason=why_not() or "")

NOT_CLOCKS = ("epochs", "world_size", "global_batch", "final_test_acc", "best_test_acc", "final_train_acc",
              "train_eval_acc", "acc_gap", "final_test_loss", "min_test_loss", "min_test_loss_epoch")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


def sweep_file(tmp_path, epochs=2, only=None):
    variants = f'[[variants]]\nlabel = "{only}"\n"optim.lr" = 0.01\n' if only else THREE_POINTS
    return tiny_sweep(tmp_path / "tiny.toml", variants, epochs)


def ddplab(*args, env):
    return subprocess.run([sys.executable, "-m", "ddplab", *map(str, args)], capture_output=True, text=True, timeout=600,
                          env={**env, "OMP_NUM_THREADS": "1"})


def manifest(out):
    return {r["name"]: r for r in json.loads((out / "manifest.json").read_text())["runs"]}


def points(report_dir):
    with open(report_dir / "points.csv", newline="") as f:
        return {row["point"]: {k: row[k] for k in NOT_CLOCKS} for row in csv.DictReader(f)}


def test_a_sweep_submitted_to_slurm_finishes_and_reports_what_the_local_runner_does(cluster, tmp_path):
    path = sweep_file(tmp_path)
    local = ddplab("sweep", path, "--out", tmp_path / "local", env=cluster.env)
    assert local.returncode == 0, local.stderr[-3000:]
    sent = ddplab("sweep", path, "--out", tmp_path / "slurm", "--executor", "slurm", "--parallel", "2", "--wait",
                  env=cluster.env)
    assert sent.returncode == 0, sent.stderr[-3000:] + cluster.logs()
    assert "submitted job" in sent.stdout and "1 node(s) x 2 task(s) (ddp)" in sent.stdout
    runs = manifest(tmp_path / "slurm")
    assert {r["status"] for r in runs.values()} == {"finished"} and all(r["job"] for r in runs.values())
    for name in ("a", "b", "ddp"):
        assert (reproducible_epochs(tmp_path / "slurm" / "runs" / name)
                == reproducible_epochs(tmp_path / "local" / "runs" / name)), name
    assert points(tmp_path / "slurm" / "report") == points(tmp_path / "local" / "report")
    # The 2-worker point's workers are the tasks of one srun step in its allocation.
    log = (tmp_path / "slurm" / "logs" / "ddp.log").read_text()
    assert "\n$ srun --nodes=1 --ntasks=2 --ntasks-per-node=2 " in log
    assert json.loads((tmp_path / "slurm" / "runs" / "ddp" / "summary.json").read_text())["run"]["world_size"] == 2
    status = ddplab("sweep", path, "--out", tmp_path / "slurm", "--status", env=cluster.env)
    assert status.stdout.splitlines()[0] == "sweep tiny: 3 finished"
    again = ddplab("sweep", path, "--out", tmp_path / "slurm", "--executor", "slurm", env=cluster.env)
    assert again.returncode == 0 and "nothing to submit (every point finished)" in again.stdout


def reproducible_epochs(run_dir):
    return [reproducible(r, per_rank=False) for r in read_epochs(run_dir / "metrics.jsonl")]


def test_a_cancelled_task_is_resumed_by_submitting_again(cluster, tmp_path):
    path, out = sweep_file(tmp_path, epochs=40, only="long"), tmp_path / "s"
    sent = ddplab("sweep", path, "--out", out, "--executor", "slurm", env=cluster.env)
    assert sent.returncode == 0, sent.stderr[-3000:]
    job = manifest(out)["long"]["job"]
    metrics_file = out / "runs" / "long" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics_file.exists() and metrics_file.read_text().strip()):  # it trains
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.2)
    subprocess.run(["scancel", job.split("_")[0]], env=cluster.env, check=True)
    waited = ddplab("sweep", path, "--out", out, "--wait", "--no-report", env=cluster.env)
    assert waited.returncode == 1 and "1 of 1 runs did not finish" in waited.stderr
    entry = manifest(out)["long"]
    assert entry["status"] == "interrupted" and entry["exit_code"] == 130, entry  # stopped resumable, not killed
    assert (out / "runs" / "long" / "checkpoints" / "last.pt").is_file()
    status = ddplab("sweep", path, "--out", out, "--status", env=cluster.env)
    assert "long" in status.stdout and "interrupted" in status.stdout
    again = ddplab("sweep", path, "--out", out, "--executor", "slurm", "--wait", env=cluster.env)
    assert again.returncode == 0, again.stderr[-3000:] + cluster.logs()
    assert manifest(out)["long"]["status"] == "finished" and manifest(out)["long"]["job"] != job
    log = (out / "logs" / "long.log").read_text()
    assert log.count("\n$ ") == 2 and "--resume" in log.split("\n$ ")[2].splitlines()[0]
    assert len(read_epochs(metrics_file)) == 40


def test_a_rejected_submission_is_one_line(cluster, tmp_path):
    path = sweep_file(tmp_path)
    proc = ddplab("sweep", path, "--out", tmp_path / "s", "--executor", "slurm", "--slurm.partition", "nope",
                  env=cluster.env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ddplab: error: sbatch --partition=nope ddplab-tiny-1x1.sbatch failed: sbatch: error: Batch job submission "
        "failed: Invalid partition name specified"]
    assert not manifest(tmp_path / "s")["a"]["job"]  # nothing recorded as submitted


def test_a_dry_run_prints_each_array_and_submits_nothing(cluster, tmp_path):
    path = sweep_file(tmp_path)
    proc = ddplab("sweep", path, "--out", tmp_path / "s", "--executor", "slurm", "--dry-run", "--parallel", "2",
                  "--slurm.time", "0:10:00", "--slurm.extra=--mem=1G", env=cluster.env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("#!/bin/bash") == 2 and "#SBATCH --array=0-1%2" in proc.stdout
    assert f"$ sbatch --parsable --time=0:10:00 --mem=1G {tmp_path / 's' / 'slurm' / 'ddplab-tiny-1x1.sbatch'}" in proc.stdout
    assert "RUNS=(a b)" in proc.stdout and "RUNS=(ddp)" in proc.stdout and not (tmp_path / "s").exists()
    queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=cluster.env)
    assert queue.stdout.strip() == ""

