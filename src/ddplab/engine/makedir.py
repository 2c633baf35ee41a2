"""The run folder as a run starts: rank 0 makes it and writes config.toml (first: it marks the folder
as a run) and env.json (versions, machine, hosts). Whether it may be used was decided before, when
the run was prepared (runfolder.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ddplab.config import RunConfig, build_config, save_config
from ddplab.distributed import DistContext
from ddplab.errors import FileSystemError
from ddplab.io import files
from ddplab.rundir import runfiles


@dataclass(frozen=True)
class FolderIdentity:
    """The run folder as the run found it (device and inode): a folder moved or removed while the run trains
    must stop it, not be made again at the old path, half, by its next write (no config.toml, no log), while
    the moved copy, resumed, became a second run of the same one."""

    path: Path
    device: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> FolderIdentity:
        found = os.stat(path)
        return cls(Path(path), found.st_dev, found.st_ino)

    def check(self) -> None:
        """Before the run writes into its folder: still there, still the same folder."""
        try:
            found = os.stat(self.path)
        except OSError:
            found = None
        if found is None or (found.st_dev, found.st_ino) != (self.device, self.inode):
            raise FileSystemError(
                f"the run folder {self.path} was moved or removed while the run trained: stopped before writing "
                "there again; where the folder went, its last checkpoint resumes the run "
                "(ddplab train --out NEW_PLACE --resume)"
            )


def prepare_run_dir(config: RunConfig, ctx: DistContext) -> Path:
    """Rank 0 creates the folder (checked when the run was prepared); the others wait for it."""
    assert config.output.out is not None
    run_dir = Path(config.output.out)
    if ctx.is_main:
        files.make_dir(run_dir)
        # First: it marks the folder as a run. On resume it records a changed epoch count.
        save_config(as_saved(config), run_dir / runfiles.CONFIG)
        files.make_dir(run_dir / runfiles.CHECKPOINTS)
        files.write_json(run_dir / runfiles.ENV, environment(ctx))
    ctx.barrier()
    return run_dir


def as_saved(config: RunConfig) -> RunConfig:
    """The config as saved: without the folder and resume flag, so `--config` starts a fresh run;
    with the data root absolute, so the folder finds its data from any working directory."""
    values = config.with_data_root().to_dict()
    values["output"].pop("out", None)
    values["output"]["resume"] = False
    return build_config(values)


def environment(ctx: DistContext) -> dict:
    from importlib import metadata

    from ddplab.metrics.system import machine, network_link

    spread = len(set(ctx.hosts)) > 1  # several nodes: the link between them, as rank 0's side sees it
    try:
        version: str | None = metadata.version("ddplab")  # the installed distribution's (pyproject.toml)
    except metadata.PackageNotFoundError:
        version = None  # a source tree run without installing it (PYTHONPATH=src): git_sha says which
    return {
        "ddplab": version,
        "git_sha": git_sha(),
        **machine(ctx.device),
        "world_size": ctx.world_size,
        **({"hosts": list(ctx.hosts), "network": network_link(ctx.hosts[0])} if spread else {}),
        "argv": sys.argv,
    }


def git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=5,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
