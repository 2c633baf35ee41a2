"""The files of a run folder, by name: the one place their names are written.

A run folder is read far from where it was written (the report on a laptop, a sweep's
re-run, `ddplab eval` years later), so its names are a file format: every reader and writer
takes them from here. Torch-free. A sweep folder's manifest is named with the manifest
(sweep/manifest.py).
"""

CONFIG = "config.toml"  # the run's settings; first written, it marks the folder as a run
ENV = "env.json"  # versions, device, host
METRICS = "metrics.jsonl"  # one record per epoch
STEPS = "steps.jsonl"  # a few records per epoch: loss, learning rate, clock
GPU = "gpu.jsonl"  # NVML samples per rank (CUDA runs)
SUMMARY = "summary.json"  # written last: the run finished
LOG = "train.log"
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = "last.pt"  # in CHECKPOINTS: the state after the last finished epoch
BEST_CHECKPOINT = "best.pt"  # in CHECKPOINTS: the weights with the best test accuracy
TENSORBOARD = "tensorboard"
LOCK = ".lock"  # who holds the folder (engine/runlock.py)
