"""Writes that are whole or absent (files.py): what a full disk or a power cut may leave under a file's name."""

import errno
import os

import pytest

from ddplab.errors import FileSystemError
from ddplab.io import files


def test_a_write_reaches_the_disk_before_its_name_points_at_it(tmp_path, monkeypatch):
    """A disk that says it is full only when the data is written out (delayed allocation, NFS, a quota) fails
    at the flush: the real name keeps its old content and no temporary file is left. Without the flush before
    the rename the new name pointed at data the disk never took: a short PNG or checkpoint after it filled."""
    path = tmp_path / "plot.png"
    path.write_bytes(b"the whole old plot")
    synced = []

    def full_at_flush(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full_at_flush)
    with pytest.raises(FileSystemError, match="plot.png"):
        files.write_atomic(path, lambda tmp: tmp.write_bytes(b"a new plot"))
    assert synced == [f"{tmp_path}/plot.png.{os.getpid()}.tmp"]  # the data, before any rename
    assert path.read_bytes() == b"the whole old plot" and sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_a_write_flushes_the_file_then_its_folder(tmp_path, monkeypatch):
    path, order = tmp_path / "summary.json", []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        files.os, "fsync", lambda fd: (order.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))
    )
    monkeypatch.setattr(files.os, "replace", lambda a, b: (order.append("rename"), real_replace(a, b)))
    files.write_json(path, {"status": "finished"})
    assert order == [f"{path}.{os.getpid()}.tmp", "rename", str(tmp_path)] and path.read_text().startswith("{")
