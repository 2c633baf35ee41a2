"""ddplab: train image classifiers on one device or many, with numbers you can trust.

from ddplab import RunConfig, train, run_sweep
result = train(RunConfig())          # -> RunResult(run_dir, summary, history)
swept = run_sweep("optimizers")      # -> SweepResult(folder, manifest, report): as `ddplab sweep optimizers`
"""

__all__ = ["RunConfig", "RunResult", "train", "run_sweep", "__version__"]


def __getattr__(name: str):
    # Lazy, so `import ddplab` (and `ddplab --help`) does not pay for importing torch.
    if name == "__version__":  # pyproject.toml's, as installed; a source tree run without installing has none
        from importlib import metadata

        try:
            return metadata.version("ddplab")
        except metadata.PackageNotFoundError:
            return "0+unknown"
    if name == "RunConfig":
        from ddplab.config import RunConfig

        return RunConfig
    if name == "train":
        from ddplab.launch.elastic import train

        return train
    if name == "run_sweep":
        from ddplab.sweep.run import run_sweep

        return run_sweep
    if name == "RunResult":
        from ddplab.engine.worker import RunResult

        return RunResult
    raise AttributeError(f"module 'ddplab' has no attribute {name!r}")
