"""`ddplab sweep --executor slurm` on a real one-node Slurm cluster (tests/support/slurm_cluster.py), CPU only."""

import csv
import json
import subprocess
import sys
import time

import pytest

from ddplab.rundir.epochs import read_epochs, reproducible

from support import tiers
from support.cli import ddplab_cli
from support.slurm_cluster import SlurmCluster, why_not
from support.sweeps import THREE_POINTS, tiny_sweep

pytestmark = tiers.skipif("slurm", why_not())

NOT_CLOCKS = (
    "epochs",
    "world_size",
    "global_batch",
    "final_test_acc",
    "best_test_acc",
    "final_train_acc",
    "train_eval_acc",
    "acc_gap",
    "final_test_loss",
    "min_test_loss",
    "min_test_loss_epoch",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


def sweep_file(tmp_path, epochs=2, only=None):
    variants = f'[[variants]]\nlabel = "{only}"\n"optim.lr" = 0.01\n' if only else THREE_POINTS
    return tiny_sweep(tmp_path / "tiny.toml", variants, epochs)


def ddplab(*args, env):
    return ddplab_cli(*args, base_env=env, timeout=600)


def manifest(out):
    return {r["name"]: r for r in json.loads((out / "manifest.json").read_text())["runs"]}


def points(report_dir):
    with open(report_dir / "points.csv", newline="") as f:
        return {row["point"]: {k: row[k] for k in NOT_CLOCKS} for row in csv.DictReader(f)}


def test_a_sweep_submitted_to_slurm_finishes_and_reports_what_the_local_runner_does(cluster, tmp_path):
    path = sweep_file(tmp_path)
    local = ddplab("sweep", path, "--out", tmp_path / "local", "--no-estimate", env=cluster.env)
    assert local.returncode == 0, local.stderr[-3000:]
    sent = ddplab(
        "sweep", path, "--out", tmp_path / "slurm", "--executor", "slurm", "--parallel", "2", "--wait", env=cluster.env
    )
    assert sent.returncode == 0, sent.stderr[-3000:] + cluster.logs()
    assert "submitted job" in sent.stdout and "1 node(s) x 2 task(s) (ddp)" in sent.stdout
    runs = manifest(tmp_path / "slurm")
    assert {r["status"] for r in runs.values()} == {"finished"} and all(r["job"] for r in runs.values())
    for name in ("a", "b", "ddp"):
        assert reproducible_epochs(tmp_path / "slurm" / "runs" / name) == reproducible_epochs(
            tmp_path / "local" / "runs" / name
        ), name
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
    path, out = sweep_file(tmp_path, epochs=3, only="long"), tmp_path / "s"
    held = {**cluster.env, "DDPLAB_FAULT": "hang:epoch=2"}  # the task's run stays in epoch 2 until cancelled
    sent = ddplab("sweep", path, "--out", out, "--executor", "slurm", env=held)
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
    assert len(read_epochs(metrics_file)) == 3  # submitted again without the hold: resumed and finished


def test_a_rejected_submission_is_one_line(cluster, tmp_path):
    path = sweep_file(tmp_path)
    proc = ddplab(
        "sweep", path, "--out", tmp_path / "s", "--executor", "slurm", "--slurm.partition", "nope", env=cluster.env
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ddplab: error: sbatch --partition=nope ddplab-tiny-1x1.sbatch failed: sbatch: error: Batch job submission "
        "failed: Invalid partition name specified"
    ]
    assert not manifest(tmp_path / "s")["a"]["job"]  # nothing recorded as submitted


def test_a_dry_run_prints_each_array_and_submits_nothing(cluster, tmp_path):
    path = sweep_file(tmp_path)
    proc = ddplab(
        "sweep",
        path,
        "--out",
        tmp_path / "s",
        "--executor",
        "slurm",
        "--dry-run",
        "--parallel",
        "2",
        "--slurm.time",
        "0:10:00",
        "--slurm.extra=--mem=1G",
        env=cluster.env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("#!/bin/bash") == 2 and "#SBATCH --array=0-1%2" in proc.stdout
    assert (
        f"$ sbatch --parsable --time=0:10:00 --mem=1G {tmp_path / 's' / 'slurm' / 'ddplab-tiny-1x1.sbatch'}"
        in proc.stdout
    )
    assert "RUNS=(a b)" in proc.stdout and "RUNS=(ddp)" in proc.stdout and not (tmp_path / "s").exists()
    queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=cluster.env)
    assert queue.stdout.strip() == ""


# ---- two nodes, each on a host of its own (ddplab.launch.hosts) --------------------------------------
TWO_NODES = """
[[variants]]
label = "two"
"dist.strategy" = "ddp"
"dist.nnodes" = 2
"dist.timeout_s" = 30
"""


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    from ddplab.launch import hosts

    reason = hosts.why_not_available()
    if reason:
        tiers.skip("root", reason)
    with hosts.cluster(2) as test_hosts:
        cluster = SlurmCluster(tmp_path_factory.mktemp("slurm2"), hosts=test_hosts).start()
        try:
            yield cluster
        finally:
            cluster.stop()


def in_cluster(cluster, *args, env=None):
    """A command run where the cluster's controller is reachable (host 0), as a user on its login node."""
    return subprocess.run(
        [*cluster.prefix, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**cluster.env, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def test_a_two_node_point_runs_across_both_hosts_and_a_cancelled_one_resumes_exactly(two_nodes, tmp_path):
    """srun starts one worker on each node, each in its own network namespace: the group meets at node0's
    address (its NodeAddr: node names resolve nowhere here). Cancelled mid-run, then submitted again, it
    resumes from its checkpoint and ends as the same run on one node does."""
    path, out = tiny_sweep(tmp_path / "two.toml", TWO_NODES, epochs=3), tmp_path / "s"
    reference = tmp_path / "reference"
    sent = in_cluster(
        two_nodes,
        sys.executable,
        "-m",
        "ddplab",
        "sweep",
        path,
        "--out",
        out,
        "--executor",
        "slurm",
        env={"DDPLAB_FAULT": "slow:rank=1:epoch=2:ms=700"},
    )
    assert sent.returncode == 0, sent.stderr[-3000:]
    assert "1 point(s) of 2 node(s) x 1 task(s)" in sent.stdout
    job = manifest(out)["two"]["job"]
    metrics_file = out / "runs" / "two" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics_file.exists() and metrics_file.read_text().strip()):  # epoch 1 done; epoch 2 takes ~6 s
        assert time.monotonic() < deadline, two_nodes.logs() + (out / "logs" / "two.log").read_text()
        time.sleep(0.2)
    assert in_cluster(two_nodes, "scancel", job.split("_")[0]).returncode == 0
    waited = in_cluster(two_nodes, sys.executable, "-m", "ddplab", "sweep", path, "--out", out, "--wait", "--no-report")
    assert waited.returncode == 1 and manifest(out)["two"]["status"] == "interrupted", (
        str(manifest(out)["two"]) + (out / "logs" / "two.log").read_text()[-3000:]
    )
    assert (out / "runs" / "two" / "checkpoints" / "last.pt").is_file()
    # A node taken out of service: --status says so in one line. Drained, not set down: under ReturnToService=2 a
    # down node returns as soon as its slurmd registers again, which a loaded machine's slow commands let happen
    # before --status asks.
    assert in_cluster(two_nodes, "scontrol", "update", "nodename=node1", "state=drain", "reason=cable").returncode == 0
    again = in_cluster(two_nodes, sys.executable, "-m", "ddplab", "sweep", path, "--out", out, "--executor", "slurm")
    assert again.returncode == 0, again.stderr[-3000:]
    status = in_cluster(two_nodes, sys.executable, "-m", "ddplab", "sweep", path, "--out", out, "--status")
    assert [line for line in status.stdout.splitlines() if "out of service" in line] == [
        "slurm: node(s) out of service: node1 drained (cable); a point that needs them waits in the queue (or "
        "fails, when its task was running there)"
    ], status.stdout
    assert "two" in status.stdout and "queued" in status.stdout
    assert in_cluster(two_nodes, "scontrol", "update", "nodename=node1", "state=resume").returncode == 0
    done = in_cluster(two_nodes, sys.executable, "-m", "ddplab", "sweep", path, "--out", out, "--wait", "--no-report")
    assert done.returncode == 0, done.stdout + done.stderr + two_nodes.logs()
    log = (out / "logs" / "two.log").read_text()
    assert (
        "\n$ srun --nodes=2 --ntasks=2 --ntasks-per-node=1 " in log
        and "--resume" in log.split("\n$ ")[2].splitlines()[0]
    )
    summary = json.loads((out / "runs" / "two" / "summary.json").read_text())
    assert summary["run"]["world_size"] == 2
    env = json.loads((out / "runs" / "two" / "env.json").read_text())
    assert sorted(env["hosts"]) == sorted(two_nodes.addresses)  # one worker on each host
    ran = ddplab(
        "train",
        "--config",
        out / "configs" / "two.toml",
        "--dist.nnodes",
        "1",
        "--dist.nproc",
        "2",
        "--out",
        reference,
        env=two_nodes.env,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert reproducible_epochs(out / "runs" / "two") == reproducible_epochs(reference)
