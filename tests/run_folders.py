"""Finished run folders with known numbers, written the way ddplab writes them, for the report's tests."""

import json
from pathlib import Path

import tomli_w

STEPS_PER_EPOCH = 4


def write_run(run_dir: Path, *, seed=0, strategy="single", nproc=1, batch=32, precision="fp32",
              epoch_s=(12.0, 10.0, 10.0), test_acc=0.70, train_loss=(1.2, 0.9, 0.6), test_loss=(1.0, 0.8, 1.0),
              comm_share=0.0, peak_mib=400.0, steps=False, gpu=False):
    """A finished run folder with known numbers: train_s is epoch_s - 1, shares 10% data / 80% fwd+bwd / 10% optim."""
    run_dir.mkdir(parents=True)
    world = nproc if strategy == "ddp" else 1
    config = {"data": {"dataset": "synthetic"}, "model": {"name": "simple_cnn"},
              "train": {"batch_size": batch, "seed": seed, "precision": precision, "epochs": len(epoch_s)},
              "dist": {"strategy": strategy, "nproc": nproc, "backend": "auto"},
              "output": {"out": str(run_dir)}}  # differs for every run: must not split a point
    (run_dir / "config.toml").write_text(tomli_w.dumps(config))
    history = []
    for i, (e_s, tr_l, te_l) in enumerate(zip(epoch_s, train_loss, test_loss), 1):
        t = e_s - 1.0
        history.append({"epoch": i, "train_loss": tr_l, "train_acc": test_acc + 0.2, "test_loss": te_l,
                        "test_acc": test_acc, "train_samples": 1000, "epoch_s": e_s, "train_s": t, "eval_s": 1.0,
                        "images_per_s": 1000 / t, "data_s": 0.1 * t, "forward_backward_s": 0.8 * t,
                        "optimizer_s": 0.1 * t, "comm_wait_s": comm_share * t, "peak_rss_mib": peak_mib,
                        "rank_peak_rss_mib": [peak_mib] * world})
    last = history[-1]
    summary = {
        "status": "finished",
        "run": {"strategy": strategy, "world_size": world, "device": "cpu", "precision": precision, "seed": seed},
        "batch": {"local": batch, "global": batch * world, "accumulate": 1, "steps_per_epoch": STEPS_PER_EPOCH},
        "final": {k: last[k] for k in ("epoch", "train_loss", "train_acc", "test_loss", "test_acc")},
        "best": {"epoch": 1, "test_acc": test_acc},
        "time": {"total_s": sum(epoch_s) + 2.0, "train_s": sum(e - 1.0 for e in epoch_s)},
        "memory": {"peak_rss_mib": peak_mib}, "gpu_peak_alloc_mib": None,
        "ranks": {"peak_rss_mib": {"per_rank": [peak_mib] * world, "max": peak_mib, "mean": peak_mib}},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    if steps:
        records = [{"epoch": (s - 1) // STEPS_PER_EPOCH + 1, "step": s, "train_loss": 2.0 / s, "lr": 0.1, "t_s": 0.5 * s}
                   for s in range(1, STEPS_PER_EPOCH * len(epoch_s) + 1)]
        (run_dir / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if gpu:
        records = [{"t_s": float(t), "rank": 0, "gpu": 0, "util_pct": 50.0 + 5 * t, "mem_used_mib": 900.0,
                    "power_w": 200.0} for t in range(8)]
        (run_dir / "gpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir
