"""The scaling model against real 2-worker Gloo runs on this machine (CPU): a fixed small case, a loose bound.

The bound is 50% median relative error on the 2-worker throughput. On the 2-core development
VM the model is off by 11-26% on such runs (BENCHMARKS.md), and the same run's throughput
differs by up to 45% from one try to the next when the machine is shared; a tighter bound
would fail on noise. 50% still catches a model that is wrong in kind: a missing factor of
two in the shared cores, a bandwidth in bits for bytes, a communication term a thousand
times off.
"""

import json
import os
import statistics
import subprocess
import sys

import pytest

BOUND = 0.5


def train(out, batch, workers):
    cmd = [sys.executable, "-m", "ddplab", "train", "--dataset", "synthetic", "--data.synthetic_size", "1024",
           "--data.image_size", "32", "--epochs", "3", "--batch-size", str(batch), "--device", "cpu",
           "--strategy", "ddp" if workers > 1 else "single", "--nproc", str(workers),
           "--output.progress", "false", "--output.tensorboard", "false", "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # threads as ddplab splits them
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    return sum(r["train_samples"] for r in epochs) / sum(r["train_s"] for r in epochs)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="2 workers on one node need 2 cores to mean anything")
def test_predicted_two_worker_throughput_is_within_the_bound_of_the_measured(tmp_path):
    from ddplab.cli import main

    assert main(["plan", "--measure", "--max-mib", "16", "--out", str(tmp_path / "links.json")]) == 0
    errors = []
    for batch in (32, 128):
        train(tmp_path / f"one-{batch}", batch, 1)
        measured = train(tmp_path / f"two-{batch}", batch, 2)
        assert main(["plan", str(tmp_path / f"one-{batch}"), "--links-file", str(tmp_path / "links.json"),
                     "--out", str(tmp_path / f"plan-{batch}.json")]) == 0
        rows = json.loads((tmp_path / f"plan-{batch}.json").read_text())["rows"]
        (two,) = [r for r in rows if r["workers"] == 2]
        errors.append(abs(two["images_per_s"] - measured) / measured)
    assert statistics.median(errors) < BOUND, errors
