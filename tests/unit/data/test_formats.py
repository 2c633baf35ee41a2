"""Each format is written here in its real on-disk layout, by code independent of the parser,
then read back and compared pixel for pixel and label for label."""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ddplab.config import build_config
from ddplab.data import datasets, formats
from ddplab.data.datasets import DATASETS, dataset_info, load_dataset, make_splits, verify_dataset
from ddplab.data.formats import RestrictedUnpickler
from ddplab.errors import ConfigError, DataError

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def rand_images(n: int, side: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 3, side, side), dtype=np.uint8)


def cifar_record(label_bytes: bytes, image: np.ndarray) -> bytes:
    """One record as the CIFAR page describes it: labels, then the R, G, B planes, row-major."""
    return label_bytes + image[0].tobytes() + image[1].tobytes() + image[2].tobytes()


def write_cifar10_bin(root: Path, per_batch: int = 3, test_n: int = 4) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    (folder / "batches.meta.txt").write_text("\n".join(CIFAR10_NAMES) + "\n\n")
    out = {}
    for split, files, n in (
        ("train", [f"data_batch_{i}.bin" for i in range(1, 6)], per_batch),
        ("test", ["test_batch.bin"], test_n),
    ):
        imgs, labs = [], []
        for k, fname in enumerate(files):
            img = rand_images(n, seed=hash((split, k)) % 1000)
            lab = np.random.default_rng(k + 7).integers(0, 10, n, dtype=np.uint8)
            (folder / fname).write_bytes(b"".join(cifar_record(bytes([lab[i]]), img[i]) for i in range(n)))
            imgs.append(img)
            labs.append(lab)
        out[split] = (np.concatenate(imgs), np.concatenate(labs).astype(np.int64))
    return out


# ----------------------------------------------------------------------------- CIFAR binary
def test_cifar10_binary_reads_planes_and_labels(tmp_path):
    expected = write_cifar10_bin(tmp_path)
    for split in ("train", "test"):
        data = formats.read_cifar10_binary(tmp_path / "cifar-10-batches-bin", split)
        images, labels = expected[split]
        assert data.images.dtype == torch.uint8 and data.images.shape == (len(images), 3, 32, 32)
        assert np.array_equal(data.images.numpy(), images)
        assert data.labels.tolist() == labels.tolist()
        assert data.classes == CIFAR10_NAMES
    # Pixel (row 0, col 1) of image 0's green plane is byte 1 + 1024 + 1 of the first record.
    raw = (tmp_path / "cifar-10-batches-bin" / "data_batch_1.bin").read_bytes()
    data = formats.read_cifar10_binary(tmp_path / "cifar-10-batches-bin", "train")
    assert data.images[0, 1, 0, 1].item() == raw[1 + 1024 + 1]
    assert data.images[1, 2, 31, 31].item() == raw[3073 + 3072]


def test_cifar10_binary_truncated_file_is_named(tmp_path):
    write_cifar10_bin(tmp_path)
    path = tmp_path / "cifar-10-batches-bin" / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError) as err:
        formats.read_cifar10_binary(tmp_path / "cifar-10-batches-bin", "train")
    msg = str(err.value)
    assert "data_batch_3.bin" in msg and "3073-byte records" in msg and "30,730,000 bytes" in msg
    assert "ddplab data download cifar10" in msg and str(tmp_path) in msg


def test_cifar10_binary_label_out_of_range(tmp_path):
    write_cifar10_bin(tmp_path)
    path = tmp_path / "cifar-10-batches-bin" / "test_batch.bin"
    raw = bytearray(path.read_bytes())
    raw[3073] = 12  # label of the second record
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"test_batch.bin: image 1 has label 12"):
        formats.read_cifar10_binary(tmp_path / "cifar-10-batches-bin", "test")


def test_cifar10_missing_file_is_named(tmp_path):
    write_cifar10_bin(tmp_path)
    (tmp_path / "cifar-10-batches-bin" / "data_batch_5.bin").unlink()
    with pytest.raises(DataError, match="data_batch_5.bin is missing"):
        formats.read_cifar10_binary(tmp_path / "cifar-10-batches-bin", "train")


def test_cifar100_binary_fine_and_coarse(tmp_path):
    folder = tmp_path / "cifar-100-binary"
    folder.mkdir()
    (folder / "fine_label_names.txt").write_text("\n".join(f"fine{i}" for i in range(100)) + "\n")
    (folder / "coarse_label_names.txt").write_text("\n".join(f"coarse{i}" for i in range(20)) + "\n")
    rng = np.random.default_rng(3)
    for fname, n in (("train.bin", 5), ("test.bin", 3)):
        img, fine, coarse = rand_images(n, seed=n), rng.integers(0, 100, n), rng.integers(0, 20, n)
        (folder / fname).write_bytes(b"".join(cifar_record(bytes([coarse[i], fine[i]]), img[i]) for i in range(n)))
        split = fname.split(".")[0]
        fine_ds = formats.read_cifar100_binary(folder, split)
        coarse_ds = formats.read_cifar100_binary(folder, split, label="coarse")
        assert np.array_equal(fine_ds.images.numpy(), img) and np.array_equal(coarse_ds.images.numpy(), img)
        assert fine_ds.labels.tolist() == fine.tolist() and coarse_ds.labels.tolist() == coarse.tolist()
        assert len(fine_ds.classes) == 100 and coarse_ds.classes[3] == "coarse3"
    (folder / "test.bin").write_bytes((folder / "test.bin").read_bytes()[: 3074 * 2 + 5])
    with pytest.raises(DataError, match=r"test.bin is 6,153 bytes, not a whole number of 3074-byte records"):
        formats.read_cifar100_binary(folder, "test")


# ----------------------------------------------------------------------------- CIFAR python
def _py2_pickle(data: np.ndarray, labels: list[int]) -> bytes:
    """The opcodes Python 2's cPickle (protocol 2) writes for a CIFAR batch: str keys, str data."""

    def s(b: bytes) -> bytes:
        return b"U" + bytes([len(b)]) + b

    def i(v: int) -> bytes:
        return b"K" + bytes([v]) if v < 256 else b"M" + struct.pack("<H", v)

    dtype = (
        b"cnumpy\ndtype\n"
        + s(b"u1")
        + i(0)
        + i(1)
        + b"\x87R("
        + i(3)
        + s(b"|")
        + b"NNN"
        + b"J\xff\xff\xff\xff" * 2
        + i(0)
        + b"tb"
    )
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
        + i(0)
        + b"\x85"
        + s(b"b")
        + b"\x87R("
        + i(1)
        + i(data.shape[0])
        + i(data.shape[1])
        + b"\x86"
        + dtype
        + b"\x89T"
        + struct.pack("<i", data.nbytes)
        + data.tobytes()
        + b"tb"
    )
    return (
        b"\x80\x02}("
        + s(b"data")
        + array
        + s(b"labels")
        + b"]("
        + b"".join(i(v) for v in labels)
        + b"e"
        + s(b"batch_label")
        + s(b"training batch")
        + b"u."
    )


def write_cifar10_py(root: Path, n: int = 3) -> dict[str, tuple[np.ndarray, list[int]]]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    meta = {b"label_names": [name.encode() for name in CIFAR10_NAMES], b"num_cases_per_batch": n}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=4))
    out: dict[str, tuple[list, list]] = {"train": ([], []), "test": ([], [])}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for k, fname in enumerate(names):
        data = rand_images(n, seed=40 + k).reshape(n, 3072)
        labels = [(k + j) % 10 for j in range(n)]
        if k % 2:  # a Python 3 pickle with bytes keys, as the brief's readers expect
            blob = pickle.dumps(
                {b"data": data, b"labels": labels, b"batch_label": b"b", b"filenames": [b"x"] * n}, protocol=4
            )
        else:  # the official files are Python 2 pickles
            blob = _py2_pickle(data, labels)
        (folder / fname).write_bytes(blob)
        split = "test" if fname == "test_batch" else "train"
        out[split][0].append(data.reshape(n, 3, 32, 32))
        out[split][1].extend(labels)
    return {s: (np.concatenate(imgs), labs) for s, (imgs, labs) in out.items()}


def test_cifar10_python_format_roundtrip(tmp_path):
    expected = write_cifar10_py(tmp_path)
    for split in ("train", "test"):
        data = formats.read_cifar10_python(tmp_path / "cifar-10-batches-py", split)
        assert np.array_equal(data.images.numpy(), expected[split][0])
        assert data.labels.tolist() == expected[split][1]
        assert data.classes == CIFAR10_NAMES


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_restricted_unpickler_refuses_code(tmp_path):
    write_cifar10_py(tmp_path)
    marker = tmp_path / "pwned"
    evil = pickle.dumps({b"data": _Evil(marker), b"labels": [0]}, protocol=2)
    (tmp_path / "cifar-10-batches-py" / "data_batch_2").write_bytes(evil)
    with pytest.raises(DataError, match=r"data_batch_2 is not a valid cifar10 python batch .*refusing to load global"):
        formats.read_cifar10_python(tmp_path / "cifar-10-batches-py", "train")
    assert not marker.exists()
    # Builtins that could run code are refused as well, not only os.system.
    import io

    for payload in (pickle.dumps(eval), pickle.dumps(getattr), b"cbuiltins\nexec\n(S'1'\ntR."):
        with pytest.raises(pickle.UnpicklingError, match="refusing"):
            RestrictedUnpickler(io.BytesIO(payload)).load()


def test_cifar10_python_wrong_shape_rejected(tmp_path):
    write_cifar10_py(tmp_path)
    blob = pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, protocol=4)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(blob)
    with pytest.raises(DataError, match=r"test_batch: 'data' should be uint8 \[N, 3072\], found uint8 \(2, 100\)"):
        formats.read_cifar10_python(tmp_path / "cifar-10-batches-py", "test")


# ----------------------------------------------------------------------------- STL-10
STL_NAMES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]


def write_stl10(root: Path, n_train: int = 12, n_test: int = 5) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    (folder / "class_names.txt").write_text("\n".join(STL_NAMES) + "\n")
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        imgs = rand_images(n, side=96, seed=n)
        labels = np.arange(n) % 10  # 0-based here, 1-based on disk
        # Column-major per channel: Fortran order of each 96x96 plane.
        planes = (imgs[i, c].tobytes(order="F") for i in range(n) for c in range(3))
        (folder / f"{split}_X.bin").write_bytes(b"".join(planes))
        (folder / f"{split}_y.bin").write_bytes(bytes((labels + 1).tolist()))
        out[split] = (imgs, labels)
    folds = [[(k + j) % n_train for j in range(3)] for k in range(10)]
    (folder / "fold_indices.txt").write_text("".join(" ".join(map(str, f)) + " \n" for f in folds))
    out["folds"] = folds
    return out


def test_stl10_column_major_labels_and_folds(tmp_path):
    expected = write_stl10(tmp_path)
    folder = tmp_path / "stl10_binary"
    for split in ("train", "test"):
        data = formats.read_stl10(folder, split)
        assert np.array_equal(data.images.numpy(), expected[split][0])
        assert data.labels.tolist() == expected[split][1].tolist()
        assert data.classes == STL_NAMES
    raw = (folder / "train_X.bin").read_bytes()
    data = formats.read_stl10(folder, "train")
    assert data.images[0, 0, 1, 0].item() == raw[1]  # second byte runs down the first column
    assert data.images[0, 0, 0, 1].item() == raw[96]
    fold = formats.read_stl10(folder, "train", fold=3)
    idx = expected["folds"][3]
    assert np.array_equal(fold.images.numpy(), expected["train"][0][idx])
    assert fold.labels.tolist() == expected["train"][1][idx].tolist()


def test_stl10_resize_and_errors(tmp_path):
    write_stl10(tmp_path)
    folder = tmp_path / "stl10_binary"
    small = formats.read_stl10(folder, "test", image_size=48)
    assert small.images.shape == (5, 3, 48, 48) and small.images.dtype == torch.uint8
    # Antialiased bilinear agrees with Pillow's BILINEAR resize (an independent implementation).
    full = formats.read_stl10(folder, "test").images.numpy()
    ref = np.stack(
        [np.asarray(Image.fromarray(im.transpose(1, 2, 0)).resize((48, 48), Image.Resampling.BILINEAR)) for im in full]
    ).transpose(0, 3, 1, 2)
    assert np.abs(small.images.numpy().astype(int) - ref).max() <= 1
    flat = torch.full((1, 3, 96, 96), 77, dtype=torch.uint8)
    assert torch.equal(formats.resize_images(flat, 128), torch.full((1, 3, 128, 128), 77, dtype=torch.uint8))
    with pytest.raises(ConfigError):
        formats.read_stl10(folder, "test", fold=1)
    (folder / "test_y.bin").write_bytes(b"\x01\x02")
    with pytest.raises(DataError, match=r"test_y.bin holds 2 labels but test_X.bin holds 5 images"):
        formats.read_stl10(folder, "test")
    (folder / "train_X.bin").write_bytes((folder / "train_X.bin").read_bytes()[:-1])
    with pytest.raises(DataError, match=r"train_X.bin is 331,775 bytes"):
        formats.read_stl10(folder, "train")


# ----------------------------------------------------------------------------- image folder
def _save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_image_folder_png_jpeg_order_and_labels(tmp_path):
    rng = np.random.default_rng(0)
    pngs = {}
    for cls in ("dog", "cat"):
        for name in ("b.png", "a.PNG"):
            arr = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
            _save(tmp_path / "train" / cls / name, arr)
            pngs[(cls, name)] = arr
        _save(tmp_path / "test" / cls / "x.jpg", rng.integers(0, 256, (6, 5, 3), dtype=np.uint8))
    (tmp_path / "train" / "cat" / "notes.txt").write_text("ignored")
    train = formats.read_image_folder(tmp_path, "train")
    assert train.classes == ["cat", "dog"] and train.labels.tolist() == [0, 0, 1, 1]
    order = [("cat", "a.PNG"), ("cat", "b.png"), ("dog", "a.PNG"), ("dog", "b.png")]
    expected = np.stack([pngs[k] for k in order]).transpose(0, 3, 1, 2)
    assert np.array_equal(train.images.numpy(), expected)
    test = formats.read_image_folder(tmp_path, "test")
    jpeg = np.asarray(Image.open(tmp_path / "test" / "cat" / "x.jpg").convert("RGB")).transpose(2, 0, 1)
    assert test.images.shape == (2, 3, 6, 5) and np.array_equal(test.images[0].numpy(), jpeg)


def test_image_folder_sizes_resize_and_bad_files(tmp_path):
    _save(tmp_path / "train" / "a" / "1.png", np.zeros((8, 8, 3), np.uint8))
    _save(tmp_path / "train" / "b" / "2.png", np.full((10, 12, 3), 200, np.uint8))
    with pytest.raises(DataError, match=r"b/2.png is 12x10 but .*a/1.png is 8x8.*--data.image_size"):
        formats.read_image_folder(tmp_path, "train")
    data = formats.read_image_folder(tmp_path, "train", image_size=4)
    assert data.images.shape == (2, 3, 4, 4) and data.images[1].eq(200).all()
    (tmp_path / "train" / "b" / "3.jpg").write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"cannot decode image .*b/3.jpg"):
        formats.read_image_folder(tmp_path, "train", image_size=4)
    with pytest.raises(DataError, match=r"no test split .*val_fraction"):
        formats.read_image_folder(tmp_path, "test")


def test_image_folder_layouts(tmp_path):
    flat = tmp_path / "flat"
    _save(flat / "x" / "1.bmp", np.zeros((4, 4, 3), np.uint8))
    _save(flat / "y" / "1.webp", np.zeros((4, 4, 3), np.uint8))
    assert formats.read_image_folder(flat, "train").classes == ["x", "y"]
    with pytest.raises(DataError, match="class folders directly, which is the train split"):
        formats.read_image_folder(flat, "test")
    split = tmp_path / "split"
    for part, classes in (("train", ("x", "y")), ("val", ("x", "z"))):
        for cls in classes:
            _save(split / part / cls / "1.png", np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(DataError, match=r"same class folders .*missing \['y'\], extra \['z'\]"):
        formats.read_image_folder(split, "test")
    _save(split / "val" / "y" / "1.png", np.zeros((4, 4, 3), np.uint8))
    (split / "val" / "z" / "1.png").unlink()
    (split / "val" / "z").rmdir()
    assert len(formats.read_image_folder(split, "test")) == 2  # val/ serves as the test split


def test_image_folder_degenerate_classes_are_refused(tmp_path):
    """An empty class folder (a failed copy) and a single class are not datasets; each is one DataError."""
    _save(tmp_path / "train" / "cat" / "1.png", np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(DataError, match=r"has 1 class sub-folder \(cat\): a classifier needs at least 2"):
        formats.read_image_folder(tmp_path, "train")
    (tmp_path / "train" / "dog").mkdir()
    (tmp_path / "train" / "dog" / "readme.txt").write_text("no images here")
    with pytest.raises(DataError, match=r"class folder .*train/dog holds no images .*add its images, or remove"):
        formats.read_image_folder(tmp_path, "train")
    _save(tmp_path / "train" / "dog" / "1.png", np.zeros((4, 4, 3), np.uint8))
    for cls in ("cat", "dog"):
        (tmp_path / "test" / cls).mkdir(parents=True)
    _save(tmp_path / "test" / "cat" / "1.png", np.zeros((4, 4, 3), np.uint8))
    assert len(formats.read_image_folder(tmp_path, "train")) == 2
    with pytest.raises(DataError, match=r"class folder .*test/dog holds no images"):
        formats.read_image_folder(tmp_path, "test")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty has no class sub-folders: a classifier needs at least 2"):
        formats.read_image_folder(tmp_path / "empty", "train")


# ----------------------------------------------------------------------------- synthetic
def test_synthetic_is_seeded_and_learnable():
    a = formats.synthetic(400, 10, 16, seed=1, split="train")
    assert torch.equal(a.images, formats.synthetic(400, 10, 16, seed=1, split="train").images)
    assert not torch.equal(a.images, formats.synthetic(400, 10, 16, seed=2, split="train").images)
    test = formats.synthetic(200, 10, 16, seed=1, split="test")
    assert not torch.equal(a.images[:200], test.images)
    assert torch.bincount(a.labels).tolist() == [40] * 10
    # Train and test share the class templates: nearest class mean is far above chance (10%).
    x, xt = a.images.flatten(1).float(), test.images.flatten(1).float()
    means = torch.stack([x[a.labels == c].mean(0) for c in range(10)])
    acc = (torch.cdist(xt, means).argmin(1) == test.labels).float().mean().item()
    assert acc > 0.8
    with pytest.raises(ConfigError):
        formats.synthetic(0)


# ----------------------------------------------------------------------------- registry
def test_load_dataset_uses_train_statistics_for_every_split(tmp_path):
    expected = write_cifar10_bin(tmp_path)
    train = load_dataset("cifar10", tmp_path, "train")
    test = load_dataset("cifar10", tmp_path, "test")
    pixels = torch.from_numpy(expected["train"][0]).double() / 255  # float64 reference, summed directly
    ref_mean = pixels.mean(dim=(0, 2, 3)).tolist()
    ref_std = pixels.std(dim=(0, 2, 3), unbiased=False).tolist()
    assert train.mean == pytest.approx(ref_mean, abs=2e-6) and train.std == pytest.approx(ref_std, abs=2e-6)
    assert test.mean == train.mean and test.std == train.std and test.name == "cifar10"
    big = load_dataset("cifar10", tmp_path, "test", image_size=40)
    assert big.images.shape == (4, 3, 40, 40)
    syn_test = load_dataset("synthetic", None, "test", synthetic_size=64, num_classes=4, image_size=8)
    syn_train = load_dataset("synthetic", None, "train", synthetic_size=64, num_classes=4, image_size=8)
    assert len(syn_test) == 16 and syn_test.mean == syn_train.mean and syn_train.num_classes == 4


def test_load_dataset_formats_and_errors(tmp_path):
    expected = write_cifar10_py(tmp_path)
    data = load_dataset("cifar10", tmp_path, "test")  # auto: no binary folder, so the python one
    assert data.labels.tolist() == expected["test"][1]
    with pytest.raises(DataError, match=r"cifar-10-batches-bin is missing data_batch_1.bin.*DDPLAB_DATA"):
        load_dataset("cifar10", tmp_path, "test", cifar10_format="binary")
    with pytest.raises(ConfigError, match="cifar10, cifar100, stl10, imagefolder, synthetic"):
        load_dataset("mnist", tmp_path, "train")
    for bad in ({"fold": 2}, {"cifar10_format": "zip"}, {"image_size": 0}):
        with pytest.raises(ConfigError):
            load_dataset("cifar10", tmp_path, "train", **bad)
    with pytest.raises(ConfigError):
        load_dataset("cifar10", tmp_path, "validation")
    write_stl10(tmp_path)
    fold = load_dataset("stl10", tmp_path, "train", fold=0)
    test = load_dataset("stl10", tmp_path, "test", fold=0)
    assert len(fold) == 3 and test.mean == fold.mean
    assert datasets.dataset_folder("stl10", tmp_path) == tmp_path / "stl10_binary"
    assert set(DATASETS) == {"cifar10", "cifar100", "stl10", "imagefolder", "synthetic"}


def test_make_splits_subset_and_validation():
    train = formats.synthetic(300, 5, 8, seed=0)
    test = formats.synthetic(50, 5, 8, seed=0, split="test")
    tr, ev, name = make_splits(train, test, subset=100, val_fraction=0.0, seed=0)
    assert name == "test" and ev is test and torch.equal(tr.images, train.images[:100])
    tr, ev, name = make_splits(train, test, subset=100, val_fraction=0.2, seed=3)
    assert name == "val" and len(tr) + len(ev) == 100 and len(ev) == 20
    # Disjoint and covering the subset: match images back to their subset index.
    sub = train.images[:100].flatten(1)
    find = lambda ds: [int((sub == img).all(1).nonzero()[0]) for img in ds.images.flatten(1)]  # noqa: E731
    tr_idx, ev_idx = find(tr), find(ev)
    assert sorted(tr_idx + ev_idx) == list(range(100)) and tr_idx == sorted(tr_idx)
    counts = torch.bincount(train.labels[:100], minlength=5)
    per_class = torch.bincount(ev.labels, minlength=5)
    assert ((per_class == (counts * 0.2).floor()) | (per_class == (counts * 0.2).ceil())).all()  # stratified
    assert tr.mean == train.mean and ev.std == train.std
    again = make_splits(train, test, subset=100, val_fraction=0.2, seed=3)[1]
    other = make_splits(train, test, subset=100, val_fraction=0.2, seed=4)[1]
    assert torch.equal(again.images, ev.images) and not torch.equal(other.images, ev.images)
    for bad in (
        {"subset": 301, "val_fraction": 0.0},
        {"subset": None, "val_fraction": 1.0},
        {"subset": None, "val_fraction": 0.0, "test_subset": 51},
    ):
        with pytest.raises(ConfigError):
            make_splits(train, test, seed=0, **bad)


def test_test_subset_is_the_first_test_images_with_the_training_statistics():
    train = formats.synthetic(300, 5, 8, seed=0)
    test = formats.synthetic(50, 5, 8, seed=0, split="test")
    tr, ev, name = make_splits(train, test, subset=None, val_fraction=0.0, seed=0, test_subset=20)
    assert name == "test" and torch.equal(ev.images, test.images[:20]) and torch.equal(ev.labels, test.labels[:20])
    assert ev.mean == test.mean and tr is train
    with pytest.raises(ConfigError, match="data.test_subset=0 must be between 1 and 50"):
        make_splits(train, test, subset=None, val_fraction=0.0, seed=0, test_subset=0)


def test_info_and_verify_on_test_made_files(tmp_path):
    write_stl10(tmp_path)
    info = dataset_info("stl10", tmp_path)
    assert info["splits"]["train"] == {"count": 12, "class_counts": [2, 2] + [1] * 8}
    assert info["splits"]["test"]["count"] == 5 and info["image_shape"] == [3, 96, 96]
    files = {f["file"]: f for f in info["files"]}
    x = (tmp_path / "stl10_binary" / "train_X.bin").read_bytes()
    assert files["train_X.bin"]["size"] == len(x)
    assert files["train_X.bin"]["sha256"] == hashlib.sha256(x).hexdigest()
    assert files["train_X.bin"]["md5_ok"] is False and files["class_names.txt"]["md5_ok"] is None
    problems = verify_dataset("stl10", tmp_path)
    assert not [p for p in problems if p.startswith("error:")]
    assert any(p.startswith("warning:") and "train_X.bin: md5" in p and "918c2871" in p for p in problems)
    assert any(p.startswith("warning:") and "5,000" in p for p in problems)
    (tmp_path / "stl10_binary" / "test_X.bin").write_bytes(x[:1000])
    problems = verify_dataset("stl10", tmp_path)
    assert any(p.startswith("error:") and "test_X.bin is 1,000 bytes" in p for p in problems)
    (tmp_path / "stl10_binary" / "fold_indices.txt").write_text("0 1 99\n")
    assert any(p.startswith("error:") and "fold_indices.txt" in p for p in verify_dataset("stl10", tmp_path))
    assert verify_dataset("cifar100", tmp_path)[0].startswith("error:")


# ----------------------------------------------------------------------------- the shared copy
def test_shared_cifar10_exact_facts(cifar_root):
    start = time.perf_counter()
    train = load_dataset("cifar10", cifar_root, "train")
    test = load_dataset("cifar10", cifar_root, "test")
    seconds = time.perf_counter() - start
    assert (len(train), len(test)) == (50_000, 10_000)
    assert train.labels[:10].tolist() == [6, 9, 9, 4, 1, 1, 2, 7, 8, 3]
    assert test.labels[:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]
    assert torch.bincount(train.labels[:10_000]).tolist() == [1005, 974, 1032, 1016, 999, 937, 1030, 1001, 1025, 981]
    assert train.classes == CIFAR10_NAMES and train.images.shape[1:] == (3, 32, 32)
    assert train.mean == pytest.approx((0.4913, 0.4821, 0.4465), abs=2e-4) and test.std == train.std
    # Well under 2 s on an idle machine (~0.7 s); the bound is loose because CI cores are shared.
    assert seconds < 6, f"loading CIFAR-10 took {seconds:.1f} s"
    problems = verify_dataset("cifar10", cifar_root)
    assert not [p for p in problems if p.startswith("error:")], problems


def test_the_data_layers_own_checks_agree_with_the_config_and_name_their_argument():
    from ddplab.data.datasets import load_dataset

    with pytest.raises(ConfigError, match=r"load_dataset\(num_classes=1\): a classifier needs at least 2 classes"):
        load_dataset("synthetic", "unused", "train", num_classes=1)
    with pytest.raises(ConfigError, match=r"data\.num_classes=1 is not valid: must be a whole number >= 2"):
        build_config({"data": {"dataset": "synthetic", "num_classes": 1}})
    with pytest.raises(ConfigError, match=r"load_dataset\(cifar10_format='zip'\): choose auto, binary or python"):
        load_dataset("cifar10", "unused", "train", cifar10_format="zip")
