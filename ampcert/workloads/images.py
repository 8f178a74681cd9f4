"""Image classification data, loaded into memory as numpy arrays.

Three sources, all deterministic (the same files give the same tensors and
the same train/eval split on every machine, seed and precision):

- **digits** (default, offline): scikit-learn's bundled 8x8 handwritten
  digits, 1 channel, with the same fixed split as the ``digits`` workload
  (1,438 train / 359 eval).
- **cifar10**: the CIFAR-10 "python version" from a local folder
  (``data_batch_1`` .. ``data_batch_5`` for training, ``test_batch`` for
  eval; optional ``batches.meta`` for class names). Each batch is a pickled
  dict with ``b"data"``, a uint8 array (N, 3072) holding the 1024 red, then
  1024 green, then 1024 blue values of a 32x32 image in row-major order,
  and ``b"labels"``, N ints in 0..9. Nothing is downloaded: fetch and unpack
  ``cifar-10-python.tar.gz`` yourself and point ``path`` at
  ``cifar-10-batches-py``. Unpickling is restricted to the few numpy
  constructors the format needs, so a hostile file cannot run code.
- **imagefolder**: one sub-folder per class, as torchvision's
  ``ImageFolder`` (class names sorted -> indices 0..K-1; files with a common
  image extension, searched recursively). Each image is decoded with PIL,
  converted to RGB, its shorter side resized to ``image_size`` and
  centre-cropped to a square. The eval split takes ``eval_fraction`` of each
  class (stratified), chosen by a fixed split seed.

Every loader returns an :class:`ImageData` with float32 NCHW images in
[0, 1] and int64 labels, as numpy arrays: nothing here needs torch or JAX,
and each backend makes its own tensors from them. Normalisation is the
workload's business. Every failure is a
:class:`~ampcert.workloads.base.DataError` whose message is one line,
``<path>: <problem>``. Each source also has a cheap ``check_*``
for plan-time validation (paths exist, files parse) that raises the same
errors without decoding everything.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ampcert.workloads.base import DataError

SPLIT_SEED = 1234
EVAL_FRACTION = 0.2

CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_EVAL_FILE = "test_batch"
CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck")

# torchvision's IMG_EXTENSIONS, matched case-insensitively.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass
class ImageData:
    """A source's images and labels, already split, in memory."""

    train_x: np.ndarray  # float32 (N, C, H, W) in [0, 1]
    train_y: np.ndarray  # int64 (N,)
    eval_x: np.ndarray
    eval_y: np.ndarray
    classes: list[str]
    source: str
    path: str | None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def channels(self) -> int:
        return int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train_x.shape[-1])

    def info(self) -> dict[str, Any]:
        """Provenance for the run result: where the data came from and a
        digest of exactly the training arrays used."""
        return {
            "source": self.source,
            "path": self.path,
            "n_train": len(self.train_x),
            "n_eval": len(self.eval_x),
            "sha256": array_sha256(self.train_x),
            "labels_sha256": array_sha256(self.train_y),
            "classes": list(self.classes),
            "image_shape": list(self.train_x.shape[1:]),
            **self.extra,
        }


def array_sha256(a: np.ndarray) -> str:
    """sha256 of an array's raw bytes in C order: for the same data, the
    digest a torch tensor's ``contiguous().numpy()`` bytes give."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _error(path: Path | str, problem: Any) -> DataError:
    """A DataError with the one-line ``<path>: <problem>`` message."""
    text = " ".join(str(problem).split())  # newlines and runs of spaces -> one space
    return DataError(f"{path}: {text}")


def _limit(x: np.ndarray, y: np.ndarray, n: int | None) -> tuple[np.ndarray, np.ndarray]:
    return (x, y) if n is None else (x[:n], y[:n])


# ---------------------------------------------------------------- digits


def digits_file() -> Path:
    """scikit-learn's bundled copy of the digits (a gzipped CSV: 64 pixels, then
    the label). Found without importing sklearn, which costs ~2 s per process."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the digits workload needs scikit-learn (it ships the data set)")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.exists():
        raise RuntimeError(f"scikit-learn's digits data is missing: {path}")
    return path


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 images as float32 (N, 1, 8, 8) in [0, 1], and int64 labels."""
    data = np.loadtxt(digits_file(), delimiter=",", dtype=np.float32)
    x = np.ascontiguousarray(data[:, :-1].reshape(-1, 1, 8, 8) / np.float32(16.0))
    return x, data[:, -1].astype(np.int64)


def fixed_split(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_x, train_y, eval_x, eval_y): the first ``EVAL_FRACTION`` of a
    permutation seeded by ``SPLIT_SEED`` evaluates, the rest trains; the same
    on every machine and for every run seed (the digits, resnet and numerics
    workloads all split the digits this way)."""
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_eval = int(len(x) * EVAL_FRACTION)
    eval_idx, train_idx = order[:n_eval], order[n_eval:]
    return x[train_idx], y[train_idx], x[eval_idx], y[eval_idx]


def check_digits() -> None:
    """The bundled data is present (scikit-learn installed)."""
    try:
        digits_file()
    except RuntimeError as exc:
        raise _error("digits", exc) from None


def load_digits(max_train: int | None = None, max_eval: int | None = None) -> ImageData:
    """scikit-learn's digits, (N, 1, 8, 8), with the digits workload's fixed split."""
    check_digits()
    train_x, train_y, eval_x, eval_y = fixed_split(*load_digits_arrays())
    train_x, train_y = _limit(train_x, train_y, max_train)
    eval_x, eval_y = _limit(eval_x, eval_y, max_eval)
    return ImageData(
        np.ascontiguousarray(train_x), np.ascontiguousarray(train_y),
        np.ascontiguousarray(eval_x), np.ascontiguousarray(eval_y),
        classes=[str(i) for i in range(10)], source="digits", path=str(digits_file()),
        note=f"sklearn load_digits: {len(train_x)} train / {len(eval_x)} eval, fixed split",
    )


# ---------------------------------------------------------------- CIFAR-10


def _unit(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels as float32 in [0, 1] (one correctly rounded division each)."""
    return pixels.astype(np.float32) / np.float32(255)


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Resolves only the globals a pickled numpy array needs; anything else in
    the file (which could run code) is refused."""

    ALLOWED = {
        ("_codecs", "encode"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
        ("numpy._core.numeric", "_frombuffer"),
    }

    def find_class(self, module: str, name: str) -> Any:
        # Pickles written by numpy 1.x (and Python 2, as CIFAR's are) say
        # numpy.core; numpy 2 keeps those under numpy._core.
        if module.startswith("numpy.core") and hasattr(np, "_core"):
            module = "numpy._core" + module[len("numpy.core"):]
        elif module.startswith("numpy._core") and not hasattr(np, "_core"):
            module = "numpy.core" + module[len("numpy._core"):]
        canon = module.replace("numpy.core", "numpy._core")
        if (canon, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refuses to unpickle global {module}.{name}")
        return super().find_class(module, name)


def _unpickle(path: Path) -> Any:
    if not path.exists():
        raise _error(path, "does not exist")
    if not path.is_file():
        raise _error(path, "is not a file")
    try:
        with path.open("rb") as f:
            return _NumpyOnlyUnpickler(f, encoding="bytes").load()
    except OSError as exc:
        raise _error(path, f"cannot read: {exc.strerror or exc}") from None
    except EOFError:
        raise _error(path, "truncated pickle (ended early)") from None
    except Exception as exc:  # noqa: BLE001 - UnpicklingError, ValueError, ... from bad bytes
        raise _error(path, f"not a CIFAR-10 python batch (unpickling failed: "
                           f"{type(exc).__name__}: {exc})") from None


def _get(d: dict, key: str) -> Any:
    """A batch key, whether the pickle stored it as bytes (Python 2, the
    official files) or str (re-pickled under Python 3)."""
    if key.encode() in d:
        return d[key.encode()]
    return d.get(key)


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file as uint8 (N, 3, 32, 32) and int64 (N,), validated."""
    obj = _unpickle(path)
    if not isinstance(obj, dict):
        raise _error(path, f"not a CIFAR-10 python batch: holds a {type(obj).__name__}, expected a dict")
    data, labels = _get(obj, "data"), _get(obj, "labels")
    if data is None or labels is None:
        keys = sorted(k.decode() if isinstance(k, bytes) else str(k) for k in obj)
        raise _error(path, f"not a CIFAR-10 python batch: needs keys 'data' and 'labels', has {keys}")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        desc = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise _error(path, f"'data' must be a uint8 array of shape (N, 3072), got {desc}")
    try:
        y = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise _error(path, "'labels' must be a list of ints") from None
    if len(y) != len(data):
        raise _error(path, f"'labels' has {len(y)} entries for {len(data)} images")
    if len(y) and (y.min() < 0 or y.max() > 9):
        raise _error(path, f"'labels' must be in 0..9, found {int(y.min())}..{int(y.max())}")
    return data.reshape(-1, 3, 32, 32), y


def _cifar_root(path: str | Path) -> Path:
    root = Path(path)
    if not root.exists():
        raise _error(root, "does not exist")
    if not root.is_dir():
        raise _error(root, "expected the CIFAR-10 folder (cifar-10-batches-py), found a file")
    missing = [n for n in (*CIFAR_TRAIN_FILES, CIFAR_EVAL_FILE) if not (root / n).is_file()]
    if missing:
        raise _error(root / missing[0], "does not exist (a CIFAR-10 python folder holds "
                                        "data_batch_1..5 and test_batch)")
    return root


def check_cifar10(path: str | Path) -> None:
    """All six batch files exist and unpickle to well-formed batches.

    Reads every file (about 30 MB each, well under a second in all): a
    truncated last batch is a common failure of an interrupted copy."""
    root = _cifar_root(path)
    for name in (*CIFAR_TRAIN_FILES, CIFAR_EVAL_FILE):
        _cifar_batch(root / name)


def _cifar_classes(root: Path) -> list[str]:
    meta = root / "batches.meta"
    if meta.is_file():
        try:
            names = _get(_unpickle(meta), "label_names")
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
            if len(names) == 10:
                return names
        except Exception:  # noqa: BLE001 - the names are cosmetic; fall back
            pass
    return list(CIFAR_CLASSES)


def load_cifar10(path: str | Path, max_train: int | None = None, max_eval: int | None = None) -> ImageData:
    """CIFAR-10 from its python batches: 50,000 train / 10,000 eval images,
    (N, 3, 32, 32) in [0, 1]. ``max_train`` / ``max_eval`` keep the first N
    of each (the batches are already shuffled), reading only the files needed."""
    root = _cifar_root(path)
    xs, ys, have = [], [], 0
    for name in CIFAR_TRAIN_FILES:
        if max_train is not None and have >= max_train:
            break
        x, y = _cifar_batch(root / name)
        xs.append(x)
        ys.append(y)
        have += len(x)
    ex, ey = _cifar_batch(root / CIFAR_EVAL_FILE)
    train_x, train_y = _limit(np.concatenate(xs), np.concatenate(ys), max_train)
    eval_x, eval_y = _limit(ex, ey, max_eval)
    if len(train_x) == 0 or len(eval_x) == 0:
        raise _error(root, f"no images ({len(train_x)} train / {len(eval_x)} eval)")
    return ImageData(
        _unit(train_x), train_y.copy(), _unit(eval_x), eval_y.copy(),
        classes=_cifar_classes(root), source="cifar10", path=str(root.resolve()),
        note=f"CIFAR-10 python batches at {root}: {len(train_x)} train / {len(eval_x)} eval",
    )


# ---------------------------------------------------------------- image folder


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def _scan_folder(path: str | Path) -> tuple[Path, list[str], list[list[Path]]]:
    """Class names (sorted) and each class's image files (sorted), or DataError."""
    root = Path(path)
    if not root.exists():
        raise _error(root, "does not exist")
    if not root.is_dir():
        raise _error(root, "expected a folder with one sub-folder per class, found a file")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise _error(root, "empty image folder: no class sub-folders (expected <root>/<class>/<image>)")
    files: list[list[Path]] = []
    for name in classes:
        found: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(root / name, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            found.extend(Path(dirpath) / f for f in sorted(filenames) if _is_image(f))
        if not found:
            raise _error(root / name, "class folder has no images "
                                      f"(looked for {', '.join(IMAGE_EXTENSIONS)})")
        files.append(found)
    if len(classes) < 2:
        raise _error(root, f"needs at least 2 classes to classify, found 1 ({classes[0]!r})")
    return root, classes, files


def check_image_folder(path: str | Path) -> None:
    """Class folders exist and hold images; the first image of each class
    opens (header only). Does not decode every file."""
    from PIL import Image

    _, _, files = _scan_folder(path)
    for class_files in files:
        first = class_files[0]
        try:
            with Image.open(first) as im:
                im.size  # noqa: B018 - parses the header
        except Exception as exc:  # noqa: BLE001 - PIL raises many types for bad files
            raise _error(first, f"unreadable image: {type(exc).__name__}: {exc}") from None


def _read_image(path: Path, size: int) -> np.ndarray:
    """RGB uint8 (3, size, size): shorter side resized to ``size``, centre crop."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            scale = size / min(w, h)
            nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
            im = im.resize((nw, nh), Image.Resampling.BILINEAR)
            left, top = (nw - size) // 2, (nh - size) // 2
            im = im.crop((left, top, left + size, top + size))
            arr = np.asarray(im, dtype=np.uint8)
    except Exception as exc:  # noqa: BLE001 - OSError, SyntaxError, DecompressionBombError, ...
        raise _error(path, f"unreadable image: {type(exc).__name__}: {exc}") from None
    return arr.transpose(2, 0, 1)


def split_image_folder(files: list[list[Path]], eval_fraction: float = EVAL_FRACTION,
                       split_seed: int = SPLIT_SEED) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]]]:
    """Stratified split: ``round(eval_fraction * n)`` of each class's files
    (at least one when the class has two or more) go to eval, picked by a
    generator seeded with ``split_seed``. Train lists are then interleaved in
    a seeded order so a ``max_train`` prefix covers every class."""
    gen = np.random.default_rng(split_seed)
    train: list[tuple[Path, int]] = []
    evals: list[tuple[Path, int]] = []
    for label, class_files in enumerate(files):
        order = gen.permutation(len(class_files)).tolist()
        n_eval = round(eval_fraction * len(class_files))
        if len(class_files) >= 2:
            n_eval = min(max(n_eval, 1), len(class_files) - 1)
        else:
            n_eval = 0
        evals.extend((class_files[i], label) for i in order[:n_eval])
        train.extend((class_files[i], label) for i in order[n_eval:])
    train = [train[i] for i in gen.permutation(len(train)).tolist()]
    evals = [evals[i] for i in gen.permutation(len(evals)).tolist()]
    return train, evals


def load_image_folder(path: str | Path, image_size: int = 32, max_train: int | None = None,
                      max_eval: int | None = None, eval_fraction: float = EVAL_FRACTION) -> ImageData:
    """A class-per-folder tree as (N, 3, image_size, image_size) in [0, 1],
    split into train/eval by :func:`split_image_folder`."""
    root, classes, files = _scan_folder(path)
    train, evals = split_image_folder(files, eval_fraction)
    train, evals = train[:max_train], evals[:max_eval]
    if not train or not evals:
        raise _error(root, f"too few images to split: {len(train)} train / {len(evals)} eval "
                           "(each class needs at least 2 images)")

    def stack(items: list[tuple[Path, int]]) -> tuple[np.ndarray, np.ndarray]:
        x = np.stack([_read_image(p, image_size) for p, _ in items])
        return _unit(x), np.asarray([label for _, label in items], dtype=np.int64)

    train_x, train_y = stack(train)
    eval_x, eval_y = stack(evals)
    return ImageData(
        train_x, train_y, eval_x, eval_y, classes=classes, source="imagefolder",
        path=str(root.resolve()),
        note=(f"image folder {root}: {len(classes)} classes, {len(train)} train / {len(evals)} eval, "
              f"{image_size}x{image_size} RGB, split seed {SPLIT_SEED}"),
        extra={"image_size": image_size},
    )
