"""A run continued from inside an epoch, by the launcher's restart or a --resume, at its world size or on fewer
workers (dist.on_resize): the data position, augmentation streams and partial sums it reached, for real over
Gloo."""

import json
from pathlib import Path

import pytest
import torch

from ddplab import faults
from ddplab.rundir import checkpoint
from ddplab.rundir.epochs import read_epochs, reproducible

from support.cli import ddplab_cli
from support.settings import TINY

pytestmark = pytest.mark.dist

TINY = [
    *TINY,
    *("--data.crop_padding", "2", "--data.flip", "true", "--model.dropout", "0"),  # augmented, per shard
    *("--batch-size", "16", "--epochs", "2", "--backend", "gloo", "--strategy", "ddp"),
]


def train(*args, env=None, code=0):
    proc = ddplab_cli("train", *TINY, *args, env=env, timeout=300)
    assert proc.returncode == code, proc.stderr[-3000:]
    return proc


def records(run_dir: Path) -> list[dict]:
    return [reproducible(r, per_rank=False) for r in read_epochs(run_dir / "metrics.jsonl")]


def weights(run_dir: Path) -> dict:
    return checkpoint.load(run_dir / "checkpoints" / checkpoint.LAST)["model"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """The undisturbed run: 2 workers, checkpoints at epochs' ends only."""
    out = tmp_path_factory.mktemp("resize") / "whole"
    train("--nproc", "2", "--out", str(out))
    return out


def test_a_worker_killed_inside_an_epoch_is_restarted_from_there_and_the_run_ends_bit_identical(two_ranks, tmp_path):
    proc = train(
        *("--nproc", "2", "--train.checkpoint_every", "3", "--max-restarts", "1", "--out", str(tmp_path / "r")),
        env={"DDPLAB_FAULT": "kill:rank=1:epoch=2:step=5"},
    )
    assert "resumed from epoch 1 and 4 steps of epoch 2 (step 12)" in proc.stderr  # checkpoints at 3, 6, 8, 9, 12
    assert records(tmp_path / "r") == records(two_ranks)
    for key, value in weights(two_ranks).items():
        assert torch.equal(weights(tmp_path / "r")[key], value), key


def test_a_two_worker_run_resumed_on_one_keeps_its_global_batches_when_asked(two_ranks, tmp_path):
    """Stopped inside epoch 2, resumed on 1 worker: refused by default; with keep_global_batch the worker carries
    both shards (the same micro-batches and augmentation draws, two a step) and the run ends as the 2-worker one
    within summation-order noise: rtol 1e-5 on losses and weights, the tolerance the 2-worker-equals-1-worker test
    uses, since only the order of float32 sums differs (the gradient's over ranks against over micro-batches)."""
    out = tmp_path / "r"
    train(
        "--nproc",
        "2",
        "--train.checkpoint_every",
        "2",
        "--out",
        str(out),
        env={"DDPLAB_FAULT": "raise:epoch=2:step=4"},
        code=4,
    )
    refused = train("--nproc", "1", "--out", str(out), "--resume", code=2)
    assert "trained on 2 workers and this resume asks for 1" in refused.stderr
    assert "--dist.on_resize keep_global_batch" in refused.stderr
    more = train("--nproc", "3", "--dist.on_resize", "keep_global_batch", "--out", str(out), "--resume", code=2)
    assert "laid out in 2 data shards, which 3 workers cannot share out; resume on at most 2" in more.stderr
    proc = train("--nproc", "1", "--dist.on_resize", "keep_global_batch", "--out", str(out), "--resume")
    assert "resumed from epoch 1 and 2 steps of epoch 2 (step 10)" in proc.stderr
    assert "1 workers carry the run's 2 data shards (rank 0: 0, 1)" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["world_size"] == 1
    assert (summary["batch"]["global"], summary["batch"]["shards"], summary["batch"]["steps_per_epoch"]) == (32, 2, 8)
    assert (summary["batch"]["on_resize"], summary["batch"]["lr_scale"]) == ("keep_global_batch", 1.0)
    segments = [(s["from_step"], s["to_step"], s["workers"], s["nodes"]) for s in summary["membership"]]
    assert segments == [(0, 10, 2, 1), (10, 16, 1, 1)]  # the 2 steps of epoch 2 after its checkpoint were lost
    assert all(s["images_per_s"] > 0 for s in summary["membership"])
    said = proc.stdout + proc.stderr  # the summary printed at the end
    assert "batch 16 local x 2 data shards on 1 ranks x 1 accumulate = 32 global" in said
    assert "workers       2 then 1: steps 0-10 on 2 (1 node(s), " in said
    assert [r.workers for r in read_epochs(out / "metrics.jsonl")] == [2, 1]
    ours, theirs = records(out), records(two_ranks)
    assert [r["step"] for r in ours] == [r["step"] for r in theirs] == [8, 16]
    for a, b in zip(ours, theirs, strict=True):
        assert a["train_samples"] == b["train_samples"] == 256
        for key in ("train_loss", "test_loss", "lr"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
    mine, reference = weights(out), weights(two_ranks)
    for key, value in reference.items():
        torch.testing.assert_close(mine[key], value, rtol=1e-5, atol=1e-6)


def step_ids(folder: Path) -> dict[tuple[int, int], list[int]]:
    """(epoch, step) -> the dataset indices every rank trained in that step (DDPLAB_RECORD_SAMPLES; one round)."""
    return {(epoch, step): ids for (epoch, step, _), ids in faults.recorded_samples(folder).items()}


def test_a_two_worker_run_resumed_on_one_lets_its_batch_follow_when_asked(tmp_path):
    """keep_local_batch: the global batch halves with the workers, the learning rate with it (linear), and the
    schedule is re-planned over the new 16 steps an epoch, taken up at the progress reached (1.25 epochs: step 20
    of 32); the epoch in progress goes on from its place in the order, every sample trained once."""
    out, first, second = tmp_path / "r", tmp_path / "ids1", tmp_path / "ids2"
    common = ("--optim.schedule", "none", "--train.checkpoint_every", "2", "--out", str(out))
    train("--nproc", "2", *common, env={"DDPLAB_FAULT": "raise:epoch=2:step=4", "DDPLAB_RECORD_SAMPLES": str(first)},
          code=4)  # fmt: skip
    proc = train(
        *("--nproc", "1", "--dist.on_resize", "keep_local_batch", "--resume", *common),
        env={"DDPLAB_RECORD_SAMPLES": str(second)},
    )
    assert (
        "dist.on_resize=keep_local_batch: the global batch follows the workers (2 -> 1 shards), the learning rate "
        "with it (x0.5 of the configured, linear in the global batch), the schedule re-planned over the new steps an "
        "epoch and taken up at its step 20 (1.25 epochs done)"
    ) in proc.stderr
    ours = records(out)
    assert [r["step"] for r in ours] == [8, 22]  # 8 steps of 32, then 2 of them and 12 of 16
    assert ours[1]["lr"] == pytest.approx(ours[0]["lr"] / 2)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["batch"]["global"] == 16 and "shards" not in summary["batch"]
    assert (summary["batch"]["on_resize"], summary["batch"]["lr_scale"]) == ("keep_local_batch", 0.5)
    assert "x0.5 of the configured, linear in the global batch)" in proc.stdout  # the printed summary's batch line
    assert [(s["from_step"], s["to_step"], s["workers"]) for s in summary["membership"]] == [(0, 10, 2), (10, 22, 1)]
    kept = {k: v for k, v in step_ids(first).items() if k[1] <= 10}  # step 11 was trained after the checkpoint
    epoch_2 = [i for (e, _), ids in {**kept, **step_ids(second)}.items() if e == 2 for i in ids]
    assert sorted(epoch_2) == list(range(256))


def test_a_one_worker_run_resumed_on_two_lets_its_batch_grow_when_asked(tmp_path):
    """keep_local_batch upward: stopped inside epoch 2 on 1 worker (16 steps an epoch, a checkpoint every 2), resumed
    on 2, the global batch doubles with the workers and the learning rate with it (x2), the rest of epoch 2 goes on
    from its place in the order on both (224 images: 7 steps of 32), every sample trained once."""
    out, first, second = tmp_path / "r", tmp_path / "ids1", tmp_path / "ids2"
    common = ("--optim.schedule", "none", "--train.checkpoint_every", "2", "--out", str(out))
    train("--nproc", "1", *common, env={"DDPLAB_FAULT": "raise:epoch=2:step=4", "DDPLAB_RECORD_SAMPLES": str(first)},
          code=4)  # fmt: skip
    proc = train(
        *("--nproc", "2", "--dist.on_resize", "keep_local_batch", "--resume", *common),
        env={"DDPLAB_RECORD_SAMPLES": str(second)},
    )
    assert "the global batch follows the workers (1 -> 2 shards), the learning rate with it (x2 " in proc.stderr
    ours = records(out)
    assert [r["step"] for r in ours] == [16, 25]  # 16 steps of 16, then 2 of them and 7 of 32
    assert ours[1]["lr"] == pytest.approx(ours[0]["lr"] * 2)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["batch"]["global"] == 32 and (summary["batch"]["on_resize"], summary["batch"]["lr_scale"]) == (
        "keep_local_batch",
        2.0,
    )
    assert [(s["from_step"], s["to_step"], s["workers"]) for s in summary["membership"]] == [(0, 18, 1), (18, 25, 2)]
    kept = {k: v for k, v in step_ids(first).items() if k[1] <= 18}  # steps after the checkpoint were trained again
    epoch_2 = [i for (e, _), ids in {**kept, **step_ids(second)}.items() if e == 2 for i in ids]
    assert sorted(epoch_2) == list(range(256))
