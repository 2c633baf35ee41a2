"""Fetch, verify and unpack the official dataset archives.

A download streams into `<file>.part`, resumes it with an HTTP Range request, checks the
archive's MD5 and only then renames it into place; extraction happens in a temporary folder
inside the data root that is renamed into place at the end. So a crash or Ctrl-C never leaves
a half-written file or folder that a later run would take for a good one (contracts 8, 9).
When the network is down the error says exactly which folder is missing and how to put the
files there by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import posixpath
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddplab.errors import ConfigError, DataError

CHUNK = 1 << 20


@dataclass(frozen=True)
class ArchiveSpec:
    """One official archive: where it lives, its MD5, the folder it unpacks to, the files needed.

    `files` maps each required file to its official MD5 where a public source gives one
    (torchvision's lists for cifar-10-batches-py and stl10_binary), else None (unknown).
    """

    title: str
    url: str
    md5: str
    folder: str
    files: dict[str, str | None]


# Archive MD5s as published on https://www.cs.toronto.edu/~kriz/cifar.html and in torchvision.
ARCHIVES: dict[str, ArchiveSpec] = {
    "cifar10": ArchiveSpec(
        "CIFAR-10 (binary)",
        "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
        "c32a1d4ab5d03f1284b67883e8d87530",
        "cifar-10-batches-bin",
        {**{f"data_batch_{i}.bin": None for i in range(1, 6)}, "test_batch.bin": None, "batches.meta.txt": None},
    ),
    "cifar10-python": ArchiveSpec(
        "CIFAR-10 (python)",
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        "c58f30108f718f92721af3b95e74349a",
        "cifar-10-batches-py",
        {
            "data_batch_1": "c99cafc152244af753f735de768cd75f",
            "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
            "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
            "data_batch_4": "634d18415352ddfa80567beed471001a",
            "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
            "test_batch": "40351d587109b95175f43aff81a1287e",
            "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
        },
    ),
    "cifar100": ArchiveSpec(
        "CIFAR-100 (binary)",
        "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
        "03b5dce01913d631647c71ecec9e9cb8",
        "cifar-100-binary",
        {"train.bin": None, "test.bin": None, "fine_label_names.txt": None, "coarse_label_names.txt": None},
    ),
    "stl10": ArchiveSpec(
        "STL-10 (binary)",
        "http://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz",
        "91f7769df0f17e558f3565bffb0c7dfb",
        "stl10_binary",
        {
            "train_X.bin": "918c2871b30a85fa023e0c44e0bee87f",
            "train_y.bin": "5a34089d4802c674881badbb80307741",
            "test_X.bin": "7f263ba9f9e0b06b93213547f721ac82",
            "test_y.bin": "36f9794fa4beb8a2c72628de14fa638e",
            "class_names.txt": None,
            "fold_indices.txt": None,
        },
    ),
}

# Known but not required (2.6 GB, unused by ddplab): reported by dataset_info only if present.
OPTIONAL_FILES = {"stl10": {"unlabeled_X.bin": "5242ba1fed5e4be9e1e742405eb56ca4"}}


class NetworkError(DataError):
    """The server could not be reached or the transfer broke; the .part file is kept to resume."""


def file_hashes(path: Path, algorithms: tuple[str, ...] = ("md5",)) -> dict[str, str]:
    """Hex digests of one file, read once in 1 MiB chunks."""
    hashers = {a: hashlib.new(a) for a in algorithms}
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            for h in hashers.values():
                h.update(chunk)
    return {a: h.hexdigest() for a, h in hashers.items()}


def md5_file(path: Path) -> str:
    return file_hashes(path)["md5"]


def _progress_bar(total: int | None, initial: int, desc: str, progress: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not (progress and sys.stderr.isatty()),
        leave=False,
    )


def _open(url: str, offset: int, timeout: float):
    request = urllib.request.Request(url, headers={"User-Agent": "ddplab"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (fixed https/http URLs)


def _range_start(response) -> int | None:
    """First byte of a 206 answer, from `Content-Range: bytes START-END/TOTAL`."""
    value = response.headers.get("Content-Range", "")
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _fetch(url: str, part: Path, timeout: float, progress: bool) -> None:
    """Append the missing bytes of `url` to `part` (all of it if the server ignores Range)."""
    offset = part.stat().st_size if part.is_file() else 0
    try:
        response = _open(url, offset, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # nothing left to send: the checksum will tell
            return
        raise NetworkError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise NetworkError(f"{url}: {getattr(exc, 'reason', exc)}") from None
    if offset and response.status == 206 and _range_start(response) != offset:
        response.close()  # a range we did not ask for: start over from byte 0
        part.unlink()
        return _fetch(url, part, timeout, progress)
    with response:
        if offset and response.status != 206:
            offset = 0  # the server ignored Range and sends the whole file: start over
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        written = offset
        try:
            out = open(part, "ab" if offset else "wb")
        except OSError as exc:
            raise DataError(f"cannot write {part}: {exc}") from None
        with out, _progress_bar(total, offset, part.name, progress) as bar:
            while True:
                try:
                    chunk = response.read(CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    raise NetworkError(
                        f"{url}: transfer broke after {written:,} bytes ({exc}); run again to resume"
                    ) from None
                if not chunk:
                    break
                try:
                    out.write(chunk)
                except OSError as exc:
                    raise DataError(f"cannot write {part}: {exc}") from None
                written += len(chunk)
                bar.update(len(chunk))
    if total is not None and written < total:
        raise NetworkError(f"{url}: connection closed after {written:,} of {total:,} bytes; run again to resume")


def download_archive(
    url: str,
    dest_dir: str | Path,
    md5: str | None,
    progress: bool = True,
    *,
    filename: str | None = None,
    timeout: float = 60.0,
) -> Path:
    """Download `url` into `dest_dir`, resuming `<file>.part`, verify `md5`, rename into place.

    A file already in place with the right MD5 is not fetched again. A checksum mismatch
    deletes the .part (so the next try starts clean) and raises DataError; a network failure
    raises NetworkError and keeps the .part for the next try.
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / (filename or posixpath.basename(urllib.parse.urlparse(url).path) or "download")
    if dest.is_file():
        if md5 is None or md5_file(dest) == md5:
            return dest
        dest.unlink()  # a stale or damaged copy: fetch it again
    part = dest.with_name(dest.name + ".part")
    _fetch(url, part, timeout, progress)
    got = md5_file(part) if part.is_file() else "nothing"
    if md5 is not None and got != md5:
        part.unlink(missing_ok=True)
        raise DataError(
            f"checksum mismatch for {url}: md5 {got}, expected {md5}; the partial file was deleted, "
            f"run again (if it fails again, something between you and the server alters the file)"
        )
    os.replace(part, dest)
    return dest


def _check_member(member: tarfile.TarInfo, archive: Path) -> None:
    """Refuse absolute paths, `..`, links leading out of the archive and device files."""

    def escapes(name: str) -> bool:
        norm = posixpath.normpath(name)
        return name.startswith(("/", "\\")) or norm == ".." or norm.startswith("../") or ":" in name.split("/")[0]

    bad = escapes(member.name) or ".." in member.name.replace("\\", "/").split("/")
    if member.issym():
        target = posixpath.join(posixpath.dirname(member.name), member.linkname)
        bad |= escapes(target) or member.linkname.startswith("/")
    elif member.islnk():
        bad |= escapes(member.linkname)
    elif not (member.isfile() or member.isdir()):
        bad = True
    if bad:
        raise DataError(
            f"refusing to extract {archive}: member {member.name!r} "
            f"{'-> ' + member.linkname if member.linkname else ''} is unsafe (absolute path, '..', "
            f"a link leaving the archive, or a device file); the archive is not an official one"
        )


def extract(archive: str | Path, root: str | Path) -> list[Path]:
    """Unpack a tar archive into `root` safely; return the top-level paths it created.

    Members are checked first, then extracted (with tarfile's "data" filter where Python has
    it) into a temporary folder inside `root`, and each top-level entry is renamed into place,
    replacing an older entry of the same name (ensure_dataset only extracts over an incomplete
    folder). A bad member or a damaged archive leaves `root` untouched.
    """
    archive, root = Path(archive), Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(member, archive)
            kwargs: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(tmp, members=members, **kwargs)
        placed = []
        for entry in sorted(tmp.iterdir()):
            target = root / entry.name
            if target.exists() or target.is_symlink():
                os.replace(target, tmp / f".old-{entry.name}")  # removed with tmp below
            os.replace(entry, target)
            placed.append(target)
        return placed
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise DataError(
            f"cannot extract {archive} into {root} ({exc}); if the archive is damaged, delete it and download it again"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def missing_files(name: str, root: str | os.PathLike[str]) -> list[str]:
    """Required files of dataset `name` absent from its canonical folder under `root`."""
    spec = spec_for(name)
    folder = Path(root) / spec.folder
    return [f for f in spec.files if not (folder / f).is_file()]


def spec_for(name: str) -> ArchiveSpec:
    if name not in ARCHIVES:
        raise ConfigError(f"no archive known for {name!r}; known: {', '.join(ARCHIVES)}")
    return ARCHIVES[name]


@contextlib.contextmanager
def _root_lock(root: Path):
    """Serialize downloads into one root across processes (e.g. several DDP ranks)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(root / ".ddplab-download.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _advice(spec: ArchiveSpec, root: Path) -> str:
    first = next(iter(spec.files))
    return (
        f"download {spec.url} elsewhere and extract it into {root} so that {root / spec.folder / first} "
        f"exists, or pass --data-dir / set DDPLAB_DATA to a root that holds {spec.folder}/"
    )


def ensure_dataset(
    name: str, root: str | Path, download: bool, progress: bool = True, *, timeout: float = 60.0
) -> Path:
    """Return the canonical folder of `name` under `root`, downloading it first if allowed.

    `name` is a key of ARCHIVES: "cifar10" (binary), "cifar10-python", "cifar100", "stl10".
    """
    spec = spec_for(name)
    root = Path(root).expanduser()
    folder = root / spec.folder
    missing = missing_files(name, root)
    if not missing:
        return folder
    what = f"{spec.title} not found: {folder} is missing {', '.join(missing)}"
    if not download:
        raise DataError(f"{what}. Run `ddplab data download {name.split('-')[0]}`, or {_advice(spec, root)}")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{what}, and the data root cannot be created ({exc}); {_advice(spec, root)}") from None
    with _root_lock(root):
        if missing_files(name, root):  # another process may have finished meanwhile
            try:
                archive = download_archive(spec.url, root, spec.md5, progress, timeout=timeout)
            except NetworkError as exc:
                reason = " ".join(str(exc).split())  # one line, whatever the OS error says
                raise DataError(f"{what}, and the download failed ({reason}); {_advice(spec, root)}") from None
            extract(archive, root)
    still = missing_files(name, root)
    if still:
        raise DataError(
            f"the archive from {spec.url} did not provide {', '.join(still)} in {folder}: "
            f"it is not the official archive; delete it from {root} and run again"
        )
    return folder
