"""The dataset registry: a name, a data root and a split in, an `ImageDataset` out.

Every dataset is normalized with its *training* split's statistics, whichever split is
loaded, so train and test see the same transform; they are computed from the files (not
hard-coded), because a copy that is not the official release has different ones.
`make_splits` cuts the optional subset and validation hold-out; `dataset_info` and
`verify_dataset` describe and check a data root for the CLI.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddplab.data import download as dl
from ddplab.data import formats
from ddplab.data.dataset import ImageDataset
from ddplab.data.options import (
    CIFAR10_FORMATS,
    CIFAR100_LABELS,
    DATASETS,
    OFFICIAL_SPLIT_SIZES,
    STL10_FOLDS,
    SYNTHETIC_TRAIN_SIZE,
    default_root,
)
from ddplab.errors import ConfigError, DataError

_ARCHIVE_KEY = {"cifar10": "cifar10", "cifar100": "cifar100", "stl10": "stl10"}
_TRAIN_STATS: dict[tuple, tuple[tuple[float, ...], tuple[float, ...]]] = {}


@dataclass(frozen=True)
class _Options:
    image_size: int | None
    fold: int | None
    cifar10_format: str
    cifar100_labels: str
    synthetic_size: int | None
    num_classes: int
    seed: int


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")


def dataset_folder(name: str, root: Path) -> Path:
    """The canonical folder of `name` under `root` (the root itself for imagefolder/synthetic)."""
    _check_name(name)
    root = Path(root)
    return root / dl.ARCHIVES[_ARCHIVE_KEY[name]].folder if name in _ARCHIVE_KEY else root


def holds_cifar10(root: str | os.PathLike) -> bool:
    """Whether `root` holds all of CIFAR-10 in a format the loader reads (binary or python)."""
    return not dl.missing_files("cifar10", root) or not dl.missing_files("cifar10-python", root)


def _cifar10_archive(root: Path, fmt: str) -> str:
    """ARCHIVES key for CIFAR-10: "auto" prefers a complete binary folder, then a python one."""
    if fmt == "python" or (
        fmt == "auto" and dl.missing_files("cifar10", root) and not dl.missing_files("cifar10-python", root)
    ):
        return "cifar10-python"
    return "cifar10"


def _check_options(name: str, split: str, o: _Options) -> None:
    if split not in ("train", "test"):
        raise ConfigError(f"split must be 'train' or 'test', got {split!r}")
    if o.image_size is not None and (not isinstance(o.image_size, int) or o.image_size < 1):
        raise ConfigError(f"data.image_size must be a positive integer or unset, got {o.image_size!r}")
    if o.fold is not None and (name != "stl10" or not 0 <= o.fold < STL10_FOLDS):
        raise ConfigError(
            f"data.fold selects one of STL-10's folds 0..{STL10_FOLDS - 1} (stl10 only), got {o.fold!r} for {name}"
        )
    if o.cifar10_format not in CIFAR10_FORMATS:
        raise ConfigError(f"load_dataset(cifar10_format={o.cifar10_format!r}): choose auto, binary or python")
    if o.cifar100_labels not in CIFAR100_LABELS:
        raise ConfigError(f"cifar100_labels must be fine or coarse, got {o.cifar100_labels!r}")
    if o.synthetic_size is not None and o.synthetic_size < 1:
        raise ConfigError(f"synthetic_size must be a positive integer, got {o.synthetic_size!r}")
    if o.num_classes < 2:  # as data.num_classes: a classifier needs two classes
        raise ConfigError(f"load_dataset(num_classes={o.num_classes!r}): a classifier needs at least 2 classes")


def _read(name: str, root: Path, split: str, o: _Options, download: bool, progress: bool) -> ImageDataset:
    """The requested split, with its own statistics."""
    if name == "synthetic":
        n = o.synthetic_size or SYNTHETIC_TRAIN_SIZE
        n = n if split == "train" else max(1, n // 4)
        return formats.synthetic(n, o.num_classes, o.image_size or 32, 3, o.seed, split)
    if name == "imagefolder":
        return formats.read_image_folder(root, split, image_size=o.image_size)
    if name == "stl10":
        folder = dl.ensure_dataset("stl10", root, download, progress)
        fold = o.fold if split == "train" else None
        return formats.read_stl10(folder, split, fold=fold, image_size=o.image_size)
    if name == "cifar100":
        data = formats.read_cifar100_binary(
            dl.ensure_dataset("cifar100", root, download, progress), split, o.cifar100_labels
        )
    else:
        key = _cifar10_archive(root, o.cifar10_format)
        folder = dl.ensure_dataset(key, root, download, progress)
        reader = formats.read_cifar10_binary if key == "cifar10" else formats.read_cifar10_python
        data = reader(folder, split)
    if o.image_size and o.image_size != data.images.shape[-1]:
        data = formats.make_dataset(
            formats.resize_images(data.images, o.image_size), data.labels, data.classes, data.name
        )
    return data


def _signature(name: str, root: Path, o: _Options) -> tuple:
    """What the train statistics depend on besides the options: the files' sizes and times."""
    if name == "synthetic":
        return ()
    if name == "imagefolder":
        train = formats.image_folder_splits(root)["train"]
        dirs = [train, *formats.class_folders(train)]
        return tuple((str(d), d.stat().st_mtime_ns) for d in dirs)
    key = _cifar10_archive(root, o.cifar10_format) if name == "cifar10" else _ARCHIVE_KEY[name]
    folder = root / dl.ARCHIVES[key].folder
    stats = [(f, (folder / f).stat()) for f in dl.ARCHIVES[key].files if (folder / f).is_file()]
    return (key, *((f, s.st_size, s.st_mtime_ns) for f, s in stats))


def load_dataset(
    name: str,
    root: str | Path | None,
    split: str,
    *,
    image_size: int | None = None,
    download: bool = False,
    fold: int | None = None,
    cifar10_format: str = "auto",
    cifar100_labels: str = "fine",
    synthetic_size: int | None = None,
    num_classes: int = 10,
    seed: int = 0,
    progress: bool = True,
) -> ImageDataset:
    """Load one split of `name` from `root` (None: $DDPLAB_DATA or ./data), on the CPU.

    mean/std are the training split's statistics (for STL-10 with `fold`, that fold's).
    `synthetic_size` is the synthetic train size (default 2048); its test split is a quarter.
    `num_classes` and `seed` apply to synthetic only; `fold` to stl10 only.
    """
    _check_name(name)
    opts = _Options(image_size, fold, cifar10_format, cifar100_labels, synthetic_size, num_classes, seed)
    _check_options(name, split, opts)
    root = Path(root).expanduser() if root is not None else default_root()
    data = _read(name, root, split, opts, download, progress)
    key = (name, str(root.resolve()), opts, _signature(name, root, opts))
    if split == "train":
        _TRAIN_STATS[key] = (data.mean, data.std)
    elif key not in _TRAIN_STATS:
        train = _read(name, root, "train", opts, download=False, progress=progress)
        _TRAIN_STATS[key] = (train.mean, train.std)
    data.mean, data.std = _TRAIN_STATS[key]
    data.name = name
    return data


def _class_quota(counts: torch.Tensor, fraction: float) -> torch.Tensor:
    """Images to hold out per class: round(fraction * N) in total, split by largest remainder."""
    quota = counts.double() * fraction
    take = quota.floor().long()
    extra = int(torch.floor(counts.sum() * torch.tensor(fraction, dtype=torch.float64) + 0.5)) - int(take.sum())
    if extra > 0:
        take[torch.argsort(take.double() - quota, stable=True)[:extra]] += 1
    return torch.minimum(take, (counts - 1).clamp_min(0))  # keep one image of each class to train on


def first_n(name: str, n: int, data: ImageDataset, split: str = "training") -> int:
    if not isinstance(n, int) or not 1 <= n <= len(data):
        raise ConfigError(
            f"{name}={n!r} must be between 1 and {len(data)}, the size of the "
            f"{data.name + ' ' if data.name else ''}{split} set"
        )
    return n


def _stratified_holdout(labels: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    """Seeded, class-stratified validation indices (sorted), `_class_quota` per class."""
    labels = labels.cpu()
    n = len(labels)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    order = torch.argsort(labels[perm], stable=True)  # grouped by class, random within a class
    grouped = perm[order]
    grouped_labels = labels[grouped]
    counts = torch.bincount(labels)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n) - starts[grouped_labels]
    take = _class_quota(counts, fraction)
    return grouped[rank < take[grouped_labels]].sort().values


def make_splits(
    train: ImageDataset,
    test: ImageDataset,
    *,
    subset: int | None,
    val_fraction: float,
    seed: int,
    test_subset: int | None = None,
) -> tuple[ImageDataset, ImageDataset, str]:
    """(train, eval, eval_name): the first `subset` training images, minus a held-out validation set.

    With val_fraction > 0, a seeded, class-stratified fraction of the (subsetted) training set
    becomes the evaluation set ("val") and the test set is not used; else eval is the test set,
    or its first `test_subset` images. Both keep the loaded training statistics, and both keep
    the original image order.
    """
    if subset is not None:
        train = train.select(slice(0, first_n("data.subset", subset, train)))
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction={val_fraction!r} must be in [0, 1)")
    if val_fraction == 0.0:
        if test_subset is not None:
            test = test.select(slice(0, first_n("data.test_subset", test_subset, test, split="test")))
        return train, test, "test"
    val_idx = _stratified_holdout(train.labels, val_fraction, seed)
    keep = torch.ones(len(train), dtype=torch.bool)
    keep[val_idx] = False
    if len(val_idx) == 0:
        raise ConfigError(
            f"data.val_fraction={val_fraction} holds out no image of {len(train)}: raise it or use a larger subset"
        )
    return train.select(keep.nonzero().squeeze(1)), train.select(val_idx), "val"


# ----------------------------------------------------------------------------- info / verify
def _archive_key(name: str, root: Path) -> str:
    return _cifar10_archive(root, "auto") if name == "cifar10" else _ARCHIVE_KEY[name]


def _file_entries(key: str, folder: Path) -> list[dict]:
    files = {**dl.ARCHIVES[key].files, **dl.OPTIONAL_FILES.get(key, {})}
    entries = []
    for fname, official in files.items():
        path = folder / fname
        if not path.is_file():
            continue
        hashes = dl.file_hashes(path, ("md5", "sha256"))
        entries.append(
            {
                "file": fname,
                "size": path.stat().st_size,
                **hashes,
                "official_md5": official,
                "md5_ok": None if official is None else hashes["md5"] == official,
            }
        )
    return entries


def _split_entry(data: ImageDataset) -> dict:
    counts = torch.bincount(data.labels, minlength=data.num_classes)
    return {"count": len(data), "class_counts": counts.tolist()}


def dataset_info(name: str, root: str | Path | None) -> dict:
    """Counts per split and class, classes, image shape, train mean/std, and per-file hashes."""
    _check_name(name)
    root = Path(root).expanduser() if root is not None else default_root()
    if name == "imagefolder":
        return _image_folder_info(root)
    splits = {s: load_dataset(name, root, s) for s in ("train", "test")}
    train = splits["train"]
    info: dict[str, Any] = {
        "name": name,
        "root": str(root),
        "folder": str(dataset_folder(name, root)),
        "classes": train.classes,
        "num_classes": train.num_classes,
        "image_shape": list(train.image_shape),
        "mean": list(train.mean),
        "std": list(train.std),
        "splits": {s: _split_entry(d) for s, d in splits.items()},
        "files": [],
    }
    if name != "synthetic":
        key = _archive_key(name, root)
        info["folder"] = str(root / dl.ARCHIVES[key].folder)
        info["format"] = key
        info["files"] = _file_entries(key, Path(info["folder"]))
    return info


def _image_folder_info(root: Path) -> dict:
    splits: dict[str, dict[str, Any]] = {}
    classes: list[str] = []
    for split in formats.image_folder_splits(root):
        files, labels, classes = formats.image_folder_index(root, split)
        counts = torch.bincount(torch.tensor(labels), minlength=len(classes))
        splits[split] = {"count": len(files), "class_counts": counts.tolist()}
        first = files[0]
    shape = formats.decode_image(first, None).shape
    return {
        "name": "imagefolder",
        "root": str(root),
        "folder": str(root),
        "classes": classes,
        "num_classes": len(classes),
        "image_shape": [shape[2], shape[0], shape[1]],
        "splits": splits,
        "files": [],
    }


def verify_dataset(name: str, root: str | Path | None) -> list[str]:
    """Problems found in a data root, one line each, starting with a severity.

    "error: ..." means the dataset cannot be used (missing, truncated, bad labels or pickles);
    "warning: ..." means it loads but is not the official release (checksum or size differs);
    "note: ..." says what could not be checked. An empty list means nothing was found.
    """
    _check_name(name)
    root = Path(root).expanduser() if root is not None else default_root()
    if name == "synthetic":
        return []
    if name == "imagefolder":
        return _verify_image_folder(root)
    key = _archive_key(name, root)
    spec, folder = dl.ARCHIVES[key], root / dl.ARCHIVES[key].folder
    missing = dl.missing_files(key, root)
    problems = [f"error: {folder / f} is missing" for f in missing]
    for fname, official in spec.files.items():
        if official is None or fname in missing:
            continue
        md5 = dl.md5_file(folder / fname)
        if md5 != official:
            problems.append(
                f"warning: {folder / fname}: md5 {md5} differs from the official {official}: "
                f"not the official release (rebuilt or modified); it loads, "
                f"but results may not match published ones"
            )
    unknown = [f for f, md5 in spec.files.items() if md5 is None and f not in missing]
    if unknown:
        problems.append(
            f"note: no official checksum is known for {', '.join(unknown)} in {folder}; "
            f"their sizes and labels were checked, their pixels were not"
        )
    if missing:
        return problems
    fmt = "python" if key == "cifar10-python" else "binary"
    for split, official_size in zip(("train", "test"), OFFICIAL_SPLIT_SIZES[name], strict=True):
        try:
            data = load_dataset(name, root, split, cifar10_format=fmt)
        except DataError as exc:
            problems.append(f"error: {exc}")
            continue
        if len(data) != official_size:
            problems.append(
                f"warning: the {split} split of {folder} has {len(data):,} images; "
                f"the official one has {official_size:,}"
            )
        if name == "stl10" and split == "train":
            try:
                formats.read_stl10_folds(folder, len(data))
            except DataError as exc:
                problems.append(f"error: {exc}")
    return list(dict.fromkeys(problems))  # the test split reads the train files too (for its normalization)


def _verify_image_folder(root: Path) -> list[str]:
    problems = []
    try:
        splits = formats.image_folder_splits(root)
    except DataError as exc:
        return [f"error: {exc}"]
    if "test" not in splits:
        problems.append(f"note: {root} has no test split; evaluate on a validation hold-out (data.val_fraction)")
    for split in splits:
        try:
            formats.read_image_folder(root, split)
        except DataError as exc:
            problems.append(f"error: {exc}")
    return problems
