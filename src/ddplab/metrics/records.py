"""Field names of metrics.jsonl's epoch records that more than one part reads.

The trainer writes them, the summary adds them up, the report (which reads run folders
anywhere and never imports torch) turns them into shares: one list, here, torch-free.
"""

# Where an epoch's training time went, each summed over its steps. `comm_wait_s` is a probe
# of the all-reduce's wait, measured inside `forward_backward_s`, so the shares of training
# time may add up to more than 100%.
PHASES = ("data_s", "forward_backward_s", "optimizer_s", "comm_wait_s")
