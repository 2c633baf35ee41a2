"""Field names of metrics.jsonl's epoch records that more than one part reads.

The trainer writes them, the summary adds them up, the report (which reads run folders
anywhere and never imports torch) turns them into shares: one list, here, torch-free.
"""

import math

# Where an epoch's training time went, each summed over its steps. `comm_wait_s` is a probe
# of the all-reduce's wait, measured inside `forward_backward_s`, so the shares of training
# time add up only with comm wait counted inside forward+backward ("of which", never beside it).
PHASES = ("data_s", "forward_backward_s", "optimizer_s", "comm_wait_s")

# Fields that measure the machine (clocks, memory, load), not the math: two runs of one config
# may differ in these and nothing else. A new field measured from the machine must end with a
# suffix below or be listed, or determinism checks would compare it.
MACHINE_SUFFIXES = ("_s", "_per_s", "_mib", "_share", "_pct")
MACHINE_FIELDS = ("load_avg_1m", "gpu_other_processes")


def is_machine_field(name: str) -> bool:
    return name.endswith(MACHINE_SUFFIXES) or name in MACHINE_FIELDS


def gap_train_acc(record: dict) -> tuple[float | None, str]:
    """The train side of the train-test gap in an epoch record, and which field it is: training images
    measured as the test set is when the run checked them (train.eval_train_images), else the running
    accuracy over augmented batches, which is not the same kind of figure."""
    if record.get("train_eval_acc") is not None:
        return record["train_eval_acc"], "train_eval_acc"
    return record.get("train_acc"), "train_acc (running, augmented)"


def worst_reading(records: list[dict], key: str) -> float | None:
    """The highest finite reading of `key` over epoch records (None: never measured), as the summary
    and the report judge a run's load."""
    values = [r[key] for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return max(values) if values else None
