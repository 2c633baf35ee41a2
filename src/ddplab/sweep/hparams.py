"""A sweep's finished runs in TensorBoard's HParams view (`tensorboard --logdir SWEEP/tensorboard`).

Each finished run is one session: its axis values and seed as hyperparameters, its final and
best test accuracy and its training throughput (images/s over the epochs after the first) as
metrics. The folder is derived data, rewritten whole after each sweep command, so a re-run
never doubles a session. Nothing is written without TensorBoard installed (an optional extra).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ddplab.errors import DataError
from ddplab.rundir.epochs import training_rate
from ddplab.rundir.runread import read_run
from ddplab.sweepdir.folder import Manifest, Status, SweepFolder

FOLDER = "tensorboard"
ACCURACIES = {  # the HParams view's metric tag: (summary.json part, field)
    "hparams/final_test_acc": ("final", "test_acc"),
    "hparams/best_test_acc": ("best", "test_acc"),
}
THROUGHPUT = "hparams/images_per_s"  # training images a second over the epochs after the first, as the report
METRICS = (*ACCURACIES, THROUGHPUT)


def sessions(folder: SweepFolder, manifest: Manifest) -> list[tuple[str, dict[str, Any], dict[str, float]]]:
    """(run folder name, hyperparameters, metrics) of each finished run that can be read. An axis keeps its
    values as numbers where all are numbers; otherwise every value of it is shown as text (the view wants one
    type an axis, and torch's writer would turn a boolean into the number 1)."""
    found = []
    for entry in manifest.runs:
        if entry.status is not Status.FINISHED:
            continue
        try:
            run = read_run(folder.root / entry.dir)
        except DataError:
            continue  # the report lists an unreadable run; the HParams view leaves it out
        if run.summary is None:
            continue
        summary: dict[str, Any] = dict(run.summary)
        metrics = {
            tag: float(value)
            for tag, (part, key) in ACCURACIES.items()
            if isinstance(value := (summary.get(part) or {}).get(key), (int, float))
        }
        if (rate := training_rate(run.history)) is not None:
            metrics[THROUGHPUT] = rate
        found.append((Path(entry.dir).name, {**entry.point, "seed": entry.seed}, metrics))
    kinds: dict[str, set[str]] = {}
    for _, hp, _ in found:
        for axis, value in hp.items():
            kinds.setdefault(axis, set()).add(kind_of(value))
    return [
        (name, {a: v if kinds[a] == {"number"} else str(v) for a, v in hp.items()}, metrics)
        for name, hp, metrics in found
    ]


def kind_of(value: Any) -> str:
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else "text"


def write(folder: SweepFolder, manifest: Manifest) -> Path | None:
    """Write the HParams sessions under the sweep folder; None when TensorBoard is not installed or nothing
    finished."""
    try:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams
    except ImportError:  # torch's writer needs the tensorboard package
        return None
    found = sessions(folder, manifest)
    out = folder.root / FOLDER
    shutil.rmtree(out, ignore_errors=True)
    if not found:
        return None
    # Every value a text axis takes, so that the view offers them as filters.
    domains: dict[str, list[str]] = {}
    for _, hp, _ in found:
        for axis, value in hp.items():
            if isinstance(value, str) and value not in domains.setdefault(axis, []):
                domains[axis].append(value)
    domains = {axis: values for axis, values in domains.items() if values}
    for name, hp, metrics in found:
        experiment, start, end = hparams(hp, metrics, domains)
        with SummaryWriter(log_dir=str(out / name)) as writer:
            for summary in (experiment, start, end):
                writer.file_writer.add_summary(summary)
            for tag, value in metrics.items():
                writer.add_scalar(tag, value)
    return out
