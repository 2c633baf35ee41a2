"""Download, resume, checksum and extraction against a local HTTP server the test runs itself.

Nothing here touches the network: the server listens on 127.0.0.1 and serves a tar.gz in
CIFAR-10's binary layout that the test builds, with tiny batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import socket
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from ddplab.data import download as dl
from ddplab.data.datasets import load_dataset
from ddplab.errors import DataError

NAMES = "airplane automobile bird cat deer dog frog horse ship truck".split()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves server.files; honours `Range: bytes=N-` unless server.ignore_range."""

    def do_GET(self):  # noqa: N802 (http.server's naming)
        srv = self.server
        srv.requests.append((self.path, self.headers.get("Range")))
        blob = srv.files.get(self.path)
        if blob is None:
            self.send_error(404)
            return
        start, rng = 0, self.headers.get("Range")
        if rng and not srv.ignore_range:
            start = int(rng.split("=")[1].split("-")[0])
            if start >= len(blob):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(blob)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(blob) - 1}/{len(blob)}")
        else:
            self.send_response(200)
        body = blob[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if srv.cut_next:  # promise the whole body, send a third, hang up
            srv.cut_next = False
            body = body[: len(body) // 3]
        srv.sent += len(body)  # counted before writing: the client may finish reading before this thread resumes
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.files, srv.requests, srv.ignore_range, srv.cut_next, srv.sent = {}, [], False, False, 0
    srv.base = f"http://127.0.0.1:{srv.server_address[1]}"
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _tar_gz(members: dict[str, bytes], links: dict[str, tuple[str, str]] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, (kind, target) in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


def _cifar10_archive(per_batch: int = 2) -> tuple[bytes, list[int]]:
    """cifar-10-binary.tar.gz's layout with `per_batch` records per batch; returns the train labels."""
    rng = np.random.default_rng(0)
    files, train_labels = {"cifar-10-batches-bin/batches.meta.txt": "\n".join(NAMES).encode() + b"\n"}, []
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        labels = rng.integers(0, 10, per_batch)
        pixels = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        files[f"cifar-10-batches-bin/{name}"] = b"".join(
            bytes([lab]) + px.tobytes() for lab, px in zip(labels, pixels, strict=True)
        )
        if name != "test_batch.bin":
            train_labels += labels.tolist()
    files["cifar-10-batches-bin/readme.html"] = b"<html></html>"
    return _tar_gz(files), train_labels


def _blob(n: int = 300_000) -> bytes:
    return np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_download_verifies_and_renames(server, tmp_path):
    blob = _blob()
    server.files["/a.tar.gz"] = blob
    path = dl.download_archive(server.base + "/a.tar.gz", tmp_path, hashlib.md5(blob).hexdigest(), progress=False)
    assert path == tmp_path / "a.tar.gz" and path.read_bytes() == blob
    assert not (tmp_path / "a.tar.gz.part").exists()
    dl.download_archive(server.base + "/a.tar.gz", tmp_path, hashlib.md5(blob).hexdigest(), progress=False)
    assert len(server.requests) == 1  # already there and verified: not fetched again


def test_resume_from_partial_file(server, tmp_path):
    blob = _blob()
    half = len(blob) // 2
    server.files["/a.tar.gz"] = blob
    (tmp_path / "a.tar.gz.part").write_bytes(blob[:half])
    path = dl.download_archive(server.base + "/a.tar.gz", tmp_path, hashlib.md5(blob).hexdigest(), progress=False)
    assert path.read_bytes() == blob
    assert server.requests == [("/a.tar.gz", f"bytes={half}-")] and server.sent == len(blob) - half


def test_restart_when_server_ignores_range(server, tmp_path):
    blob = _blob()
    server.files["/a.tar.gz"], server.ignore_range = blob, True
    (tmp_path / "a.tar.gz.part").write_bytes(b"x" * 1000)  # not even a prefix of the file
    path = dl.download_archive(server.base + "/a.tar.gz", tmp_path, hashlib.md5(blob).hexdigest(), progress=False)
    assert path.read_bytes() == blob and server.sent == len(blob)


def test_broken_transfer_keeps_part_then_resumes(server, tmp_path):
    blob = _blob()
    server.files["/a.tar.gz"], server.cut_next = blob, True
    md5 = hashlib.md5(blob).hexdigest()
    with pytest.raises(dl.NetworkError, match="run again to resume"):
        dl.download_archive(server.base + "/a.tar.gz", tmp_path, md5, progress=False)
    part = tmp_path / "a.tar.gz.part"
    assert 0 < part.stat().st_size < len(blob) and not (tmp_path / "a.tar.gz").exists()
    assert dl.download_archive(server.base + "/a.tar.gz", tmp_path, md5, progress=False).read_bytes() == blob
    assert server.requests[-1][1] == f"bytes={len(blob) // 3}-"
    part.write_bytes(blob)  # a complete .part: the server answers 416, the checksum accepts it
    (tmp_path / "a.tar.gz").unlink()
    assert dl.download_archive(server.base + "/a.tar.gz", tmp_path, md5, progress=False).read_bytes() == blob


def test_bad_checksum_is_rejected_and_part_removed(server, tmp_path):
    server.files["/a.tar.gz"] = _blob()
    with pytest.raises(DataError, match=r"checksum mismatch .*expected 0{32}"):
        dl.download_archive(server.base + "/a.tar.gz", tmp_path, "0" * 32, progress=False)
    assert list(tmp_path.iterdir()) == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_network_gives_one_line_with_advice(monkeypatch, tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/cifar-10-binary.tar.gz"
    monkeypatch.setitem(dl.ARCHIVES, "cifar10", dataclasses.replace(dl.ARCHIVES["cifar10"], url=url))
    with pytest.raises(DataError) as err:
        dl.ensure_dataset("cifar10", tmp_path, download=True, progress=False, timeout=5)
    msg = str(err.value)
    assert "\n" not in msg and url in msg
    assert f"{tmp_path / 'cifar-10-batches-bin'} is missing data_batch_1.bin" in msg
    assert f"extract it into {tmp_path} so that {tmp_path / 'cifar-10-batches-bin' / 'data_batch_1.bin'}" in msg
    assert "--data-dir" in msg and "DDPLAB_DATA" in msg
    with pytest.raises(DataError, match=r"ddplab data download cifar10.*DDPLAB_DATA"):
        dl.ensure_dataset("cifar10", tmp_path / "other", download=False)


def test_ensure_dataset_downloads_extracts_and_loads(server, monkeypatch, tmp_path):
    archive, train_labels = _cifar10_archive()
    server.files["/cifar-10-binary.tar.gz"] = archive
    spec = dataclasses.replace(
        dl.ARCHIVES["cifar10"], url=server.base + "/cifar-10-binary.tar.gz", md5=hashlib.md5(archive).hexdigest()
    )
    monkeypatch.setitem(dl.ARCHIVES, "cifar10", spec)
    stale = tmp_path / "cifar-10-batches-bin"
    stale.mkdir()
    (stale / "data_batch_1.bin").write_bytes(b"half-extracted")  # an incomplete folder is replaced
    train = load_dataset("cifar10", tmp_path, "train", download=True, progress=False)
    assert train.labels.tolist() == train_labels and train.images.shape == (10, 3, 32, 32)
    assert dl.ensure_dataset("cifar10", tmp_path, download=True) == stale
    assert len(server.requests) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".ddplab-download.lock",
        "cifar-10-batches-bin",
        "cifar-10-binary.tar.gz",
    ]


@pytest.mark.parametrize(
    "members, links",
    [
        ({"../evil": b"x"}, None),
        ({"cifar-10-batches-bin/../../evil": b"x"}, None),
        ({"/tmp/ddplab-evil-abs": b"x"}, None),
        ({"cifar-10-batches-bin/a.bin": b"x"}, {"cifar-10-batches-bin/link": ("sym", "../../evil")}),
        ({"cifar-10-batches-bin/a.bin": b"x"}, {"cifar-10-batches-bin/hard": ("hard", "../evil")}),
    ],
)
def test_extract_refuses_paths_leaving_root(tmp_path, members, links):
    archive = tmp_path / "bad.tar.gz"
    archive.write_bytes(_tar_gz(members, links))
    root = tmp_path / "root"
    with pytest.raises(DataError, match="refusing to extract .*unsafe"):
        dl.extract(archive, root)
    assert list(root.iterdir()) == []  # no temp folder, nothing half-extracted
    assert not (tmp_path / "evil").exists() and not Path("/tmp/ddplab-evil-abs").exists()


def test_extract_corrupt_archive(tmp_path):
    archive = tmp_path / "x.tar.gz"
    archive.write_bytes(_tar_gz({"d/a": b"1" * 1000})[:40])
    with pytest.raises(DataError, match="cannot extract"):
        dl.extract(archive, tmp_path / "root")
    assert list((tmp_path / "root").iterdir()) == []
