"""Field names of metrics.jsonl's epoch records that more than one part reads.

The trainer writes them, the summary adds them up, the report (which reads run folders
anywhere and never imports torch) turns them into shares: one list, here, torch-free.
"""

# Where an epoch's training time went, each summed over its steps. `comm_wait_s` is a probe
# of the all-reduce's wait, measured inside `forward_backward_s`, so the shares of training
# time may add up to more than 100%.
PHASES = ("data_s", "forward_backward_s", "optimizer_s", "comm_wait_s")

# Fields that measure the machine (clocks, memory, load), not the math: two runs of one config
# may differ in these and nothing else. A new field measured from the machine must end with a
# suffix below or be listed, or determinism checks would compare it.
MACHINE_SUFFIXES = ("_s", "_per_s", "_mib", "_share", "_pct")
MACHINE_FIELDS = ("load_avg_1m", "gpu_other_processes")


def is_machine_field(name: str) -> bool:
    return name.endswith(MACHINE_SUFFIXES) or name in MACHINE_FIELDS


def math_only(record: dict) -> dict:
    """`record` without the fields that measure the machine."""
    return {k: v for k, v in record.items() if not is_machine_field(k)}
