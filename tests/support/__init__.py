"""What the tests share, in one place (pytest puts tests/ on the path: pyproject's `pythonpath`).

- cli: the one way a test runs `python -m ddplab ...` (a process of its own, forked warm where it can be);
- settings: the repository's root, the tiny run every quick test trains (as a config, and as CLI flags);
- readers: what tests read back from a run folder and the machine (a run's comparable records, its
  processes left, the CIFAR-10 root);
- runs, reports, sweeps: run folders, reported sweeps and sweep files with known numbers, written as ddplab
  writes them;
- tiers: what this machine should run, and the check that a suite's skips kept to it (also a script);
- slurm_cluster, mlflow_store, old_torch: a real Slurm, an MLflow store read back, the oldest torch's APIs.
"""
