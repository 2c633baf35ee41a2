"""Parsers for the on-disk dataset formats; each returns an `ImageDataset`.

Binary formats are read whole with numpy and reshaped (no per-sample Python), so CIFAR-10
loads in a fraction of a second. Every parser checks sizes and label ranges and fails with a
`DataError` naming the file, what it found and what to do (contract 8). No parser runs code
from data: CIFAR's python pickles go through `RestrictedUnpickler` (contract 9).

Record counts: a file whose size is not a whole number of records is an error (truncated).
A whole number of records that differs from the official count (10,000 per CIFAR-10 batch)
only logs a warning and is reported by `verify_dataset`: tests and users may build small
files in the official layout, and a copy cut exactly at a record boundary is rare.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ddplab import internals
from ddplab.data.dataset import ImageDataset, channel_stats
from ddplab.errors import ConfigError, DataError

log = logging.getLogger(__name__)

CIFAR_PIXELS = 3 * 32 * 32
STL_SIDE = 96
STL_PIXELS = 3 * STL_SIDE * STL_SIDE
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")

CIFAR10_BIN_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR10_BIN_TEST = ("test_batch.bin",)
CIFAR10_PY_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_PY_TEST = ("test_batch",)

# Images per file in the official releases; a different whole count is only a warning.
OFFICIAL_RECORDS = {
    **{name: 10_000 for name in CIFAR10_BIN_TRAIN + CIFAR10_BIN_TEST + CIFAR10_PY_TRAIN + CIFAR10_PY_TEST},
    "train.bin": 50_000,
    "test.bin": 10_000,
    "train_X.bin": 5_000,
    "test_X.bin": 8_000,
}


def _fix(dataset: str, folder: Path) -> str:
    return (
        f"delete it and run `ddplab data download {dataset}`, or re-extract the official archive into {folder.parent}"
    )


def _file_size(path: Path, dataset: str) -> int:
    if not path.is_file():
        raise DataError(
            f"{path} is missing: run `ddplab data download {dataset}`, "
            f"or extract the official archive into {path.parent.parent}"
        )
    return path.stat().st_size


def _check_count(path: Path, count: int) -> None:
    official = OFFICIAL_RECORDS.get(path.name)
    if official is not None and count != official:
        log.warning("%s holds %d images; the official file holds %d (not the official release?)", path, count, official)


def read_names(path: Path, dataset: str) -> list[str]:
    """Class names, one per line (blank lines, such as a trailing one, are skipped)."""
    _file_size(path, dataset)
    names = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    names = [n for n in names if n]
    if not names:
        raise DataError(f"{path} lists no class names: {_fix(dataset, path.parent)}")
    return names


def make_dataset(images: torch.Tensor, labels: torch.Tensor, classes: list[str], name: str) -> ImageDataset:
    """An ImageDataset with its own statistics computed the fast way (callers may replace them)."""
    mean, std = channel_stats(images)
    return ImageDataset(images, labels, list(classes), name, mean, std)


def resize_images(images: torch.Tensor, size: int, chunk: int = 256) -> torch.Tensor:
    """Batched bilinear resize with antialias, uint8 in and out, by chunks to bound memory."""
    if images.shape[-2:] == (size, size):
        return images
    out = torch.empty((images.shape[0], images.shape[1], size, size), dtype=torch.uint8)
    for start in range(0, images.shape[0], chunk):
        x = images[start : start + chunk].to(torch.float32)
        y = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        out[start : start + chunk] = y.round_().clamp_(0, 255).to(torch.uint8)
    return out


def _check_labels(
    labels: np.ndarray, num_classes: int, path: Path, names_file: str, dataset: str, offset: int = 0
) -> None:
    bad = np.flatnonzero((labels < offset) | (labels >= num_classes + offset))
    if bad.size:
        i = int(bad[0])
        raise DataError(
            f"{path}: image {i} has label {int(labels[i])}, but {names_file} lists {num_classes} classes "
            f"(labels {offset}..{num_classes - 1 + offset} expected): the file is corrupt; {_fix(dataset, path.parent)}"
        )


# ----------------------------------------------------------------------------- CIFAR binary
def _read_records(path: Path, label_bytes: int, dataset: str) -> np.ndarray:
    record = label_bytes + CIFAR_PIXELS
    size = _file_size(path, dataset)
    if size == 0 or size % record:
        official = OFFICIAL_RECORDS.get(path.name)
        expected = f"{official * record:,} bytes for {official:,} records" if official else "a multiple of it"
        raise DataError(
            f"{path} is {size:,} bytes, not a whole number of {record}-byte records (expected {expected}): "
            f"the file is truncated or not in {dataset} binary format; {_fix(dataset, path.parent)}"
        )
    raw = np.fromfile(path, dtype=np.uint8).reshape(-1, record)
    _check_count(path, len(raw))
    return raw


def _read_cifar_binary(
    folder: Path,
    files: tuple[str, ...],
    label_bytes: int,
    label_col: int,
    classes: list[str],
    names_file: str,
    dataset: str,
    name: str,
) -> ImageDataset:
    raws = [_read_records(folder / f, label_bytes, dataset) for f in files]
    for f, raw in zip(files, raws, strict=True):
        _check_labels(raw[:, label_col], len(classes), folder / f, names_file, dataset)
    # One copy from the records into a contiguous block (torch's strided copy is ~3x numpy's).
    pixels = torch.empty((sum(len(raw) for raw in raws), CIFAR_PIXELS), dtype=torch.uint8)
    start = 0
    for raw in raws:
        pixels[start : start + len(raw)].copy_(torch.from_numpy(raw)[:, label_bytes:])
        start += len(raw)
    images = pixels.view(-1, 3, 32, 32)
    labels = torch.from_numpy(np.concatenate([raw[:, label_col] for raw in raws]).astype(np.int64))
    return make_dataset(images, labels, classes, name)


def _check_split(split: str) -> None:
    if split not in ("train", "test"):
        raise ConfigError(f"split must be 'train' or 'test', got {split!r}")


def read_cifar10_binary(folder: str | Path, split: str) -> ImageDataset:
    """CIFAR-10 binary (`cifar-10-batches-bin`): records of 1 label byte + R, G, B planes of 32x32."""
    _check_split(split)
    folder = Path(folder)
    classes = read_names(folder / "batches.meta.txt", "cifar10")
    files = CIFAR10_BIN_TRAIN if split == "train" else CIFAR10_BIN_TEST
    return _read_cifar_binary(folder, files, 1, 0, classes, "batches.meta.txt", "cifar10", "cifar10")


def read_cifar100_binary(folder: str | Path, split: str, label: str = "fine") -> ImageDataset:
    """CIFAR-100 binary (`cifar-100-binary`): records of coarse byte + fine byte + 3072 pixels."""
    _check_split(split)
    if label not in ("fine", "coarse"):
        raise ConfigError(f"CIFAR-100 labels must be 'fine' or 'coarse', got {label!r}")
    folder = Path(folder)
    names_file = f"{label}_label_names.txt"
    classes = read_names(folder / names_file, "cifar100")
    files = ("train.bin",) if split == "train" else ("test.bin",)
    col = 1 if label == "fine" else 0
    return _read_cifar_binary(folder, files, 2, col, classes, names_file, "cifar100", "cifar100")


# ----------------------------------------------------------------------------- CIFAR python
def _np_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 1.26 has no numpy._core
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays, and refuses every other global.

    The default unpickler imports and calls whatever the file names (os.system included);
    this one resolves only the few names that numpy's array pickles need.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        internals.NUMPY_RECONSTRUCT,  # numpy's own private reconstructor: listed in ddplab.internals
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        if name == "_reconstruct":
            return _np_reconstruct()
        return getattr(np, name)


def restricted_load(path: Path, dataset: str = "cifar10") -> object:
    """Load a pickle through `RestrictedUnpickler`; any failure is a DataError naming the file."""
    _file_size(path, dataset)
    try:
        with open(path, "rb") as f:
            # latin1 is how Python 3 reads Python 2 str (CIFAR's pickles are Python 2 pickles).
            return RestrictedUnpickler(f, encoding="latin1").load()
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        MemoryError,
        OverflowError,
    ) as exc:
        raise DataError(f"{path} is not a valid {dataset} python batch ({exc}); {_fix(dataset, path.parent)}") from None


def _as_str(value: object) -> str:
    return value.decode("latin1") if isinstance(value, bytes) else str(value)


def _load_batch_dict(path: Path) -> dict[str, Any]:
    obj = restricted_load(path)
    if not isinstance(obj, dict):
        raise DataError(f"{path} holds a {type(obj).__name__}, not a CIFAR batch dict; {_fix('cifar10', path.parent)}")
    return {_as_str(k): v for k, v in obj.items()}


def _read_py_batch(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    batch = _load_batch_dict(path)
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != CIFAR_PIXELS:
        found = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{path}: 'data' should be uint8 [N, 3072], found {found}; {_fix('cifar10', path.parent)}")
    try:
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        labels = np.empty(0, dtype=np.int64)
    if len(labels) != len(data):
        raise DataError(f"{path}: {len(labels)} labels for {len(data)} images; {_fix('cifar10', path.parent)}")
    _check_labels(labels, num_classes, path, "batches.meta", "cifar10")
    _check_count(path, len(data))
    return data, labels


def read_cifar10_python(folder: str | Path, split: str) -> ImageDataset:
    """CIFAR-10 python (`cifar-10-batches-py`), pickles read through the restricted unpickler."""
    _check_split(split)
    folder = Path(folder)
    meta = _load_batch_dict(folder / "batches.meta")
    classes = [_as_str(n) for n in meta.get("label_names", [])]
    if not classes:
        raise DataError(f"{folder / 'batches.meta'} has no label_names; {_fix('cifar10', folder)}")
    files = CIFAR10_PY_TRAIN if split == "train" else CIFAR10_PY_TEST
    parts = [_read_py_batch(folder / f, len(classes)) for f in files]
    images = torch.from_numpy(np.concatenate([d for d, _ in parts]).reshape(-1, 3, 32, 32))
    labels = torch.from_numpy(np.concatenate([lab for _, lab in parts]))
    return make_dataset(images, labels, classes, "cifar10")


# ----------------------------------------------------------------------------- STL-10
def read_stl10_folds(folder: Path, num_train: int) -> list[np.ndarray]:
    """The 10 predefined labelled folds: 0-based indices into the train split."""
    path = folder / "fold_indices.txt"
    _file_size(path, "stl10")
    folds = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            idx = np.array(line.split(), dtype=np.int64)
        except ValueError:
            raise DataError(f"{path}: a line is not space-separated integers; {_fix('stl10', folder)}") from None
        if idx.size and (idx.min() < 0 or idx.max() >= num_train):
            raise DataError(
                f"{path}: index {int(idx.max())} outside the {num_train} train images; {_fix('stl10', folder)}"
            )
        folds.append(idx)
    if len(folds) != 10:
        raise DataError(f"{path} has {len(folds)} folds, expected 10; {_fix('stl10', folder)}")
    return folds


def read_stl10(
    folder: str | Path, split: str, *, fold: int | None = None, image_size: int | None = None
) -> ImageDataset:
    """STL-10 binary (`stl10_binary`): 3x96x96 images stored column-major, labels 1..10 on disk.

    fold k (train split only) keeps the train images listed on line k of fold_indices.txt.
    """
    _check_split(split)
    if fold is not None and (split != "train" or not 0 <= fold <= 9):
        raise ConfigError(
            f"STL-10 fold must be 0..9 and applies to the train split only, got fold={fold} with split={split!r}"
        )
    folder = Path(folder)
    classes = read_names(folder / "class_names.txt", "stl10")
    x_path, y_path = folder / f"{split}_X.bin", folder / f"{split}_y.bin"
    size = _file_size(x_path, "stl10")
    if size == 0 or size % STL_PIXELS:
        raise DataError(
            f"{x_path} is {size:,} bytes, not a whole number of {STL_PIXELS}-byte images: "
            f"the file is truncated; {_fix('stl10', folder)}"
        )
    n = size // STL_PIXELS
    _check_count(x_path, n)
    _file_size(y_path, "stl10")
    labels = np.fromfile(y_path, dtype=np.uint8)
    if len(labels) != n:
        raise DataError(
            f"{y_path} holds {len(labels)} labels but {x_path.name} holds {n} images: "
            f"one of them is truncated; {_fix('stl10', folder)}"
        )
    _check_labels(labels, len(classes), y_path, "class_names.txt", "stl10", offset=1)
    # Column-major per channel: the bytes are [N, C, W, H], so swap the last two axes.
    images = np.fromfile(x_path, dtype=np.uint8).reshape(n, 3, STL_SIDE, STL_SIDE).transpose(0, 1, 3, 2)
    if fold is not None:
        idx = read_stl10_folds(folder, n)[fold]
        images, labels = images[idx], labels[idx]
    images_t = torch.from_numpy(np.ascontiguousarray(images))
    if image_size:
        images_t = resize_images(images_t, image_size)
    return make_dataset(images_t, torch.from_numpy(labels.astype(np.int64) - 1), classes, "stl10")


# ----------------------------------------------------------------------------- image folder
def class_folders(path: Path) -> list[Path]:
    """Sub-folders of `path`, sorted, hidden ones skipped."""
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def image_folder_splits(root: str | Path) -> dict[str, Path]:
    """Which folder holds each split: root/train + root/test (or root/val), or root itself as train."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(
            f"image folder {root} does not exist: pass --data-dir pointing at a folder "
            f"holding train/<class>/*.png (and test/<class>/...)"
        )
    if (root / "train").is_dir():
        splits = {"train": root / "train"}
        for name in ("test", "val"):
            if (root / name).is_dir():
                splits["test"] = root / name
                break
        return splits
    return {"train": root}


def _list_images(split_dir: Path, classes: list[str]) -> tuple[list[Path], list[int]]:
    files, labels = [], []
    for label, cls in enumerate(classes):
        found = sorted(
            p
            for p in (split_dir / cls).iterdir()
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
        )
        if not found:  # a class nothing teaches or tests: a failed copy, not a dataset
            raise DataError(
                f"class folder {split_dir / cls} holds no images ({', '.join(IMAGE_EXTENSIONS)}): add its "
                "images, or remove the folder from every split"
            )
        files += found
        labels += [label] * len(found)
    return files, labels


def image_folder_index(root: str | Path, split: str) -> tuple[list[Path], list[int], list[str]]:
    """Sorted files, labels and classes of one split, without decoding anything."""
    _check_split(split)
    splits = image_folder_splits(root)
    if split not in splits:
        hint = (
            "it has class folders directly, which is the train split"
            if splits["train"] == Path(root)
            else "it has train/ but no test/ or val/"
        )
        raise DataError(
            f"image folder {root} has no test split ({hint}): add {root}/test/<class>/..., "
            f"or hold out a validation split from train (data.val_fraction)"
        )
    classes = [p.name for p in class_folders(splits["train"])]
    if len(classes) < 2:
        raise DataError(
            f"image folder {splits['train']} has {len(classes) or 'no'} class sub-folder{'' if classes else 's'}"
            f"{' (' + classes[0] + ')' if classes else ''}: a classifier needs at least 2 "
            "(expected <class>/*.png)"
        )
    if split == "test":
        test_classes = [p.name for p in class_folders(splits["test"])]
        if test_classes != classes:
            missing, extra = sorted(set(classes) - set(test_classes)), sorted(set(test_classes) - set(classes))
            raise DataError(
                f"{splits['test']} must have the same class folders as {splits['train']}: "
                f"missing {missing}, extra {extra}"
            )
    files, labels = _list_images(splits[split], classes)
    return files, labels, classes


def decode_image(path: Path, image_size: int | None) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if image_size:
                im = im.resize((image_size, image_size), Image.Resampling.BILINEAR)
            return np.asarray(im, dtype=np.uint8)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DataError(f"cannot decode image {path} ({exc}): delete or replace the file") from None


def read_image_folder(root: str | Path, split: str, *, image_size: int | None = None) -> ImageDataset:
    """`root/<split>/<class>/*.png|jpg|...` decoded with Pillow to RGB, in sorted order."""
    files, labels, classes = image_folder_index(root, split)
    first = decode_image(files[0], image_size)
    out = np.empty((len(files), *first.shape), dtype=np.uint8)  # [N, H, W, 3]
    out[0] = first
    for i, path in enumerate(files[1:], start=1):
        img = decode_image(path, image_size)
        if img.shape != first.shape:
            raise DataError(
                f"{path} is {img.shape[1]}x{img.shape[0]} but {files[0]} is {first.shape[1]}x{first.shape[0]}: "
                f"images must share one size; pass --data.image_size N to resize them all to NxN"
            )
        out[i] = img
    images = torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()
    return make_dataset(images, torch.tensor(labels, dtype=torch.int64), classes, "imagefolder")


# ----------------------------------------------------------------------------- synthetic
def _split_generator(seed: int, split: str) -> torch.Generator:
    code = {"train": 1, "test": 2}[split]
    state = int(np.random.SeedSequence([seed, code]).generate_state(1, dtype=np.uint64)[0])
    return torch.Generator().manual_seed(state)


def synthetic(
    num_samples: int = 2048,
    num_classes: int = 10,
    image_size: int = 32,
    channels: int = 3,
    seed: int = 0,
    split: str = "train",
) -> ImageDataset:
    """A learnable, seeded stand-in for a real dataset (no files, no network).

    Each class has a smooth random template drawn from `seed` alone (so train and test share
    them); a sample is its class template plus noise drawn from (seed, split). A small CNN
    separates the classes well above chance within an epoch.
    """
    _check_split(split)
    for field_name, value in (
        ("num_samples", num_samples),
        ("num_classes", num_classes),
        ("image_size", image_size),
        ("channels", channels),
    ):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"synthetic {field_name} must be a positive integer, got {value!r}")
    if seed < 0:
        raise ConfigError(f"synthetic seed must be >= 0, got {seed}")
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes, channels, 4, 4, generator=g)
    templates = F.interpolate(coarse, size=(image_size, image_size), mode="bilinear", align_corners=False)
    templates = templates / templates.std(dim=(1, 2, 3), keepdim=True).clamp_min(1e-6)
    gs = _split_generator(seed, split)
    labels = (torch.arange(num_samples) % num_classes)[torch.randperm(num_samples, generator=gs)]
    noise = torch.randn(num_samples, channels, image_size, image_size, generator=gs)
    x = 128.0 + 40.0 * templates[labels] + 48.0 * noise  # per-pixel SNR < 1: not solvable from one pixel
    images = x.round_().clamp_(0, 255).to(torch.uint8)
    return make_dataset(images, labels, [f"class_{i}" for i in range(num_classes)], "synthetic")
