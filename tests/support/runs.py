"""Finished run folders with known numbers, written the way ddplab writes them, for the report's tests."""

import json
from pathlib import Path

import tomli_w

from ddplab.rundir.epochs import EpochRecord

STEPS_PER_EPOCH = 4


def epoch_fields(epoch: int = 1, **fields) -> dict:
    """An epoch record as metrics.jsonl holds it (schema 1: no version), with the fields ddplab always writes."""
    return {
        "epoch": epoch,
        "step": epoch * STEPS_PER_EPOCH,
        "lr": 0.1,
        "train_loss": 1.0,
        "train_acc": 0.5,
        "test_loss": 1.0,
        "test_acc": 0.5,
        "train_samples": 128,
        "test_samples": 64,
        "epoch_s": 2.0,
        "train_s": 1.5,
        "eval_s": 0.5,
        "images_per_s": 85.3,
        **fields,
    }


def epoch_line(epoch: int = 1, **fields) -> str:
    return json.dumps(epoch_fields(epoch, **fields)) + "\n"


def epoch_record(epoch: int = 1, **fields) -> EpochRecord:
    return EpochRecord.from_json(epoch_fields(epoch, **fields))


def write_run(
    run_dir: Path,
    *,
    seed=0,
    strategy="single",
    nproc=1,
    batch=32,
    precision="fp32",
    epoch_s=(12.0, 10.0, 10.0),
    test_acc=0.70,
    train_loss=(1.2, 0.9, 0.6),
    test_loss=(1.0, 0.8, 1.0),
    comm_share=0.0,
    peak_mib=400.0,
    steps=False,
    gpu=False,
    train_eval_acc=None,
    other_cpu=None,
    cpu_s=None,
    test_images=10_000,
    config=None,
    env=True,
    device="cpu",
    ddp=None,
):
    """A finished run folder with known numbers: train_s is epoch_s - 1, shares 10% data / 80% fwd+bwd / 10% optim.

    Left at None, `train_eval_acc` and `other_cpu` (contention) are absent, as in folders ddplab wrote
    before it measured them; `cpu_s` is each rank's CPU seconds per epoch; `ddp` each rank's DDP timings
    by name ({"comm": [rank 0's, rank 1's], "overlap": [...]}: rank_ddp_comm_s, ...).
    """
    run_dir.mkdir(parents=True)
    world = nproc if strategy == "ddp" else 1
    values = {
        "data": {"dataset": "synthetic"},
        "model": {"name": "simple_cnn"},
        "train": {"batch_size": batch, "seed": seed, "precision": precision, "epochs": len(epoch_s)},
        "dist": {"strategy": strategy, "nproc": nproc, "backend": "auto"},
        "output": {"out": str(run_dir)},
    }  # differs for every run: must not split a point
    for section, update in (config or {}).items():
        values.setdefault(section, {}).update(update)
    (run_dir / "config.toml").write_text(tomli_w.dumps(values))
    history = []
    for i, (e_s, tr_l, te_l) in enumerate(zip(epoch_s, train_loss, test_loss, strict=False), 1):
        t = e_s - 1.0
        record = {
            "epoch": i,
            "step": i * STEPS_PER_EPOCH,
            "lr": 0.001,
            "train_loss": tr_l,
            "train_acc": test_acc + 0.2,
            "test_loss": te_l,
            "test_acc": test_acc,
            "train_samples": 1000,
            "test_samples": test_images,
            "epoch_s": e_s,
            "train_s": t,
            "eval_s": 1.0,
            "images_per_s": 1000 / t,
            "data_s": 0.1 * t,
            "forward_backward_s": 0.8 * t,
            "optimizer_s": 0.1 * t,
            "comm_wait_s": comm_share * t,
            "peak_rss_mib": peak_mib,
            "rank_peak_rss_mib": [peak_mib] * world,
        }
        if train_eval_acc is not None:
            record.update(train_eval_acc=train_eval_acc, train_eval_loss=tr_l)
        if other_cpu is not None:
            record.update(
                other_cpu_share=other_cpu,
                steal_share=0.0,
                cpu_pressure_share=0.0,
                load_avg_1m=1.0,
                gpu_other_processes=None,
            )
        if cpu_s is not None:
            record["rank_cpu_s"] = [cpu_s] * world
        record.update({f"rank_ddp_{name}_s": values for name, values in (ddp or {}).items()})
        history.append(record)
    last = history[-1]
    summary = {
        "status": "finished",
        "run": {
            "dataset": "synthetic",
            "model": "simple_cnn",
            "strategy": strategy,
            "world_size": world,
            "device": device,
            "precision": precision,
            "seed": seed,
            "optimizer": "adam",
            "lr": 0.001,
            "schedule": "none",
            "epochs_planned": len(epoch_s),
        },
        "batch": {"local": batch, "global": batch * world, "accumulate": 1, "steps_per_epoch": STEPS_PER_EPOCH},
        "model": {"params": 1000, "flops_per_image": 2_000_000, "layers": "Conv3x3(3->8) > ReLU > Linear(8->4)"},
        "data": {"train_images": 1000, "eval_images": test_images, "eval_split": "test"},
        "final": {
            k: last.get(k) for k in ("epoch", "train_loss", "train_acc", "train_eval_acc", "test_loss", "test_acc")
        },
        "best": {"epoch": 1, "test_acc": test_acc},
        "time": {
            "total_s": sum(epoch_s) + 2.0,
            "train_s": sum(e - 1.0 for e in epoch_s),
            "eval_s": float(len(epoch_s)),
        },
        "memory": {"peak_rss_mib": peak_mib},
        "gpu_peak_alloc_mib": [peak_mib] * world if device.startswith("cuda") else None,  # what a CUDA run records
        "ranks": {"peak_rss_mib": {"per_rank": [peak_mib] * world, "max": peak_mib, "mean": peak_mib}},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    if env:
        (run_dir / "env.json").write_text(
            json.dumps({"device_name": "CPU Test (2 threads)", "torch": "2.13.0", "cpus": 2})
        )
    if steps:
        records = [
            {"epoch": (s - 1) // STEPS_PER_EPOCH + 1, "step": s, "train_loss": 2.0 / s, "lr": 0.1, "t_s": 0.5 * s}
            for s in range(1, STEPS_PER_EPOCH * len(epoch_s) + 1)
        ]
        (run_dir / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if gpu:
        records = [
            {"t_s": float(t), "rank": 0, "gpu": 0, "util_pct": 50.0 + 5 * t, "mem_used_mib": 900.0, "power_w": 200.0}
            for t in range(8)
        ]
        (run_dir / "gpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def write_manifest(sweep: Path, runs: list[dict], *, axes=("config",), sections=None, name="study", version=2):
    """A sweep's manifest over runs already written under sweep/runs/: each {name, point, seed[, status, error]}."""
    entries = [
        {
            "dir": f"runs/{r['name']}",
            "status": "finished",
            "exit_code": 0,
            "error": None,
            "wall_s": 1.0,
            "launch": "ddplab",
            "config": f"configs/{r['name']}.toml",
            **r,
        }
        for r in runs
    ]
    manifest = {
        "version": version,
        "name": name,
        "description": f"{name} sweep",
        "sweep_file": f"{name}.toml",
        "axes": list(axes),
        "repeats": 1,
        "runs": entries,
    }
    if sections is not None:
        manifest["sections"] = sections
    (sweep / "manifest.json").write_text(json.dumps(manifest))
    return sweep
