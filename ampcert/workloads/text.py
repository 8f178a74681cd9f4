"""Byte-level text corpora as in-memory arrays, for next-byte prediction.

A language model here reads raw bytes (a 256-symbol vocabulary), so any file
is valid input and no tokenizer has to be trained, shipped or versioned. This
module turns a corpus into the training and evaluation windows both backends
train on (numpy; no framework needed), and checks cheaply, before any run
starts, that it can.

Two sources:

``python-stdlib`` (the default)
    Text that ships with every CPython 3.10-3.13, so it needs no download: the
    source files named in :data:`DEFAULT_FILES`, read from
    ``sysconfig.get_paths()["stdlib"]`` in that order. They are docstring- and
    comment-rich modules (English prose interleaved with code), and the last,
    ``pydoc_data/topics.py``, is the language reference's prose that ``help()``
    shows. Their content differs between Python releases, so the corpus's
    sha256 is recorded with every run: it says exactly which text was used.

``text``
    Any local file, or a folder: every file under it (recursively, hidden
    entries skipped) whose name ends in one of the given extensions, in sorted
    order of the path relative to the folder (``/``-separated, so the order is
    the same on every OS).

In both cases files are read as raw bytes (no decoding, so nothing can fail
to decode, and non-UTF-8 bytes are simply symbols), joined with
:data:`SEPARATOR`, and cut to the first ``max_bytes`` bytes if a cap is given;
the cap bounds what is read, not only what is kept (a file is read no further
than the cap reaches).

Windowing (:func:`make_windows`): the first 90% of the bytes are for
training, the last 10% for evaluation. A training sample is *every* offset
``i``: ``x = bytes[i : i+T]``, ``y = bytes[i+1 : i+T+1]``, so ``y`` is ``x``
shifted by one. Those (N, T) int64 arrays are strided views of one byte
array (``sliding_window_view``; in torch, ``Tensor.unfold`` of the same
bytes), so they cost the corpus's size, not N*T; indexing them with a batch
of indices copies only that batch. Evaluation windows do not overlap, are
spread evenly over the eval split, and their number is capped so an
evaluation costs the same whatever the corpus size.

Every failure is a :class:`~ampcert.workloads.base.DataError` with one line,
``<path>: <problem>``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ampcert.workloads.base import DataError

# Present (as these paths) in every CPython 3.10-3.13 standard library,
# including Debian/Ubuntu's split packages (no tkinter, idlelib, lib2to3,
# distutils or ensurepip, which distributions may leave out or which left the
# stdlib; no module that turned into a package between 3.10 and 3.13, like
# re, pathlib or zipfile).
DEFAULT_FILES: tuple[str, ...] = (
    "textwrap.py",
    "argparse.py",
    "optparse.py",
    "difflib.py",
    "heapq.py",
    "statistics.py",
    "fractions.py",
    "random.py",
    "functools.py",
    "contextlib.py",
    "dataclasses.py",
    "enum.py",
    "typing.py",
    "inspect.py",
    "doctest.py",
    "pydoc.py",
    "threading.py",
    "subprocess.py",
    "shutil.py",
    "tarfile.py",
    "configparser.py",
    "logging/__init__.py",
    "collections/__init__.py",
    "unittest/case.py",
    "email/message.py",
    "http/server.py",
    "_pydecimal.py",
    "pydoc_data/topics.py",
)

# Between two files: newline, ASCII "file separator" (0x1C), newline. A byte
# that text almost never contains, so the model can learn where a file ends.
SEPARATOR = b"\n\x1c\n"
DEFAULT_EXTENSIONS: tuple[str, ...] = (".txt", ".md", ".rst", ".py")
EVAL_FRACTION = 0.1
# data_info lists at most this many file names (and always the count).
MAX_LISTED_FILES = 256


def _error(path: object, problem: str) -> DataError:
    """A DataError whose message is exactly one line, ``<path>: <problem>``."""
    line = f"{path}: {problem}"
    return DataError(" ".join(line.split("\n")).replace("\r", " "))


def stdlib_dir() -> Path:
    """Where this Python's standard library sources are."""
    return Path(sysconfig.get_paths()["stdlib"])


def min_corpus_bytes(seq_len: int) -> int:
    """The smallest corpus that holds one ``seq_len`` sequence (plus its
    shifted target byte) in both the train (90%) and the eval (10%) split."""
    return 10 * (seq_len + 1)


def split_point(n_bytes: int) -> int:
    """Bytes before this index train; the rest evaluate."""
    return n_bytes - int(n_bytes * EVAL_FRACTION)


@dataclass(frozen=True)
class Corpus:
    """A corpus's bytes and where they came from."""

    data: bytes
    source: str            # "python-stdlib" or the path given
    root: str              # the stdlib folder, or the file/folder read
    files: tuple[str, ...]  # contributing files, relative to root, in order
    capped: bool           # True when max_bytes cut the corpus short

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def info(self) -> dict:
        """Provenance for a run result."""
        out = {
            "source": self.source,
            "root": self.root,
            "files": list(self.files[:MAX_LISTED_FILES]),
            "n_files": len(self.files),
            "n_bytes": len(self.data),
            "capped": self.capped,
            "sha256": self.sha256,
        }
        if self.source == "python-stdlib":
            out["python"] = sys.version.split()[0]
        return out


# -- finding files -----------------------------------------------------------


def _normalise_extensions(extensions: Iterable[str]) -> tuple[str, ...]:
    return tuple(e if e.startswith(".") else f".{e}" for e in extensions)


def list_text_files(folder: Path, extensions: Sequence[str] = DEFAULT_EXTENSIONS) -> list[Path]:
    """Files under ``folder`` (recursively, not following symlinked folders,
    skipping names that start with ".") ending in one of ``extensions``,
    sorted by their ``/``-separated path relative to ``folder``."""
    exts = _normalise_extensions(extensions)
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or not name.endswith(exts):
                continue
            path = Path(dirpath) / name
            if path.is_file():
                found.append((path.relative_to(folder).as_posix(), path))
    return [p for _, p in sorted(found)]


def _sources(path: str | Path, extensions: Sequence[str]) -> tuple[Path, list[Path]]:
    """The files a ``text`` source reads, or DataError."""
    root = Path(path).expanduser()
    if not root.exists():
        raise _error(root, "no such file or folder")
    if root.is_file():
        return root, [root]
    if not root.is_dir():
        raise _error(root, "not a regular file or folder")
    files = list_text_files(root, extensions)
    if not files:
        exts = ", ".join(_normalise_extensions(extensions)) or "(none given)"
        raise _error(root, f"folder has no files ending in {exts} (searched recursively)")
    return root, files


def _stdlib_sources() -> tuple[Path, list[Path]]:
    root = stdlib_dir()
    files = [root / name for name in DEFAULT_FILES]
    for f in files:
        if not f.is_file():
            raise _error(
                f, "missing: the python-stdlib corpus reads this Python's standard-library "
                "sources (some distributions ship only .pyc files); use data: text with a path"
            )
    return root, files


def _size(files: list[Path]) -> int:
    """Corpus size from file sizes alone (no reading)."""
    total = 0
    for i, f in enumerate(files):
        try:
            total += f.stat().st_size
        except OSError as exc:
            raise _error(f, f"cannot read: {exc.strerror or exc}") from None
        if i:
            total += len(SEPARATOR)
    return total


def _check_size(where: Path, n_bytes: int, seq_len: int, max_bytes: int | None) -> int:
    n = n_bytes if max_bytes is None else min(n_bytes, max_bytes)
    need = min_corpus_bytes(seq_len)
    if n < need:
        cap = f" (capped by max_bytes={max_bytes})" if max_bytes is not None and max_bytes < n_bytes else ""
        raise _error(
            where,
            f"corpus has {n} bytes{cap}, fewer than the {need} needed for one {seq_len}-byte "
            "sequence in both the train (90%) and eval (10%) splits",
        )
    return n


# -- plan-time checks (cheap: stat only) ---------------------------------------


def check_text(
    path: str | Path,
    seq_len: int,
    max_bytes: int | None = None,
    extensions: Sequence[str] = DEFAULT_EXTENSIONS,
) -> int:
    """Validate a ``text`` source without reading it; returns the corpus size
    in bytes (after the cap). Raises DataError: missing path, a folder with no
    matching files, or too few bytes for one sequence in each split."""
    root, files = _sources(path, extensions)
    return _check_size(root, _size(files), seq_len, max_bytes)


def check_stdlib(seq_len: int, max_bytes: int | None = None) -> int:
    """Validate the ``python-stdlib`` source without reading it."""
    root, files = _stdlib_sources()
    return _check_size(root, _size(files), seq_len, max_bytes)


# -- loading -----------------------------------------------------------------


def _read_prefix(path: Path, limit: int | None) -> bytes:
    """The first ``limit`` bytes of ``path`` (all of it for None), never more:
    ``max_bytes`` bounds what a worker reads and holds, so a 1 GiB file with a
    1 MiB cap costs 1 MiB, not a read of the whole file cut afterwards."""
    with path.open("rb") as fh:
        if limit is None:
            return fh.read()
        parts: list[bytes] = []
        left = limit
        while left > 0:  # read() may return less than asked (a pipe, a network file system)
            chunk = fh.read(left)
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)


def _read(files: list[Path], root: Path, max_bytes: int | None) -> tuple[bytes, list[str], bool]:
    parts: list[bytes] = []
    names: list[str] = []
    total = 0
    for f in files:
        if max_bytes is not None and total >= max_bytes:
            return b"".join(parts)[:max_bytes], names, True
        if parts:
            parts.append(SEPARATOR)
            total += len(SEPARATOR)
        # What the cap leaves, plus one byte that tells whether the file went on
        # (the corpus is then `capped`).
        limit = None if max_bytes is None else max(max_bytes - total, 0) + 1
        try:
            chunk = _read_prefix(f, limit)
        except OSError as exc:
            raise _error(f, f"cannot read: {exc.strerror or exc}") from None
        parts.append(chunk)
        total += len(chunk)
        names.append(f.relative_to(root).as_posix() if f != root else f.name)
    data = b"".join(parts)
    if max_bytes is not None and len(data) > max_bytes:
        return data[:max_bytes], names, True
    return data, names, False


def load_stdlib(max_bytes: int | None = None) -> Corpus:
    """The default corpus: :data:`DEFAULT_FILES` from this Python's stdlib."""
    root, files = _stdlib_sources()
    data, names, capped = _read(files, root, max_bytes)
    return Corpus(data, "python-stdlib", str(root), tuple(names), capped)


def load_text(
    path: str | Path, max_bytes: int | None = None, extensions: Sequence[str] = DEFAULT_EXTENSIONS
) -> Corpus:
    """A local file, or every matching file under a folder (see the module doc)."""
    root, files = _sources(path, extensions)
    data, names, capped = _read(files, root, max_bytes)
    return Corpus(data, str(path), str(root), tuple(names), capped)


# -- windowing -----------------------------------------------------------------


@dataclass
class Windows:
    """Next-byte prediction pairs: ``train_y[k]`` is ``train_x[k]`` shifted left by one byte.

    The training windows are views of ``train_bytes`` (one row per offset),
    so a framework that wants them on a device moves the bytes once and makes
    its own views there (torch: ``unfold``)."""

    train_bytes: np.ndarray  # int64, the training split
    seq_len: int
    eval_x: np.ndarray  # (N_eval, T) int64, non-overlapping windows
    eval_y: np.ndarray
    n_train_bytes: int
    n_eval_bytes: int

    @property
    def train_x(self) -> np.ndarray:
        """(N_train, T) read-only view: row i is ``train_bytes[i : i+T]``."""
        return np.lib.stride_tricks.sliding_window_view(self.train_bytes[:-1], self.seq_len)

    @property
    def train_y(self) -> np.ndarray:
        return np.lib.stride_tricks.sliding_window_view(self.train_bytes[1:], self.seq_len)


def make_windows(data: bytes, seq_len: int, max_eval_windows: int, where: object = "<corpus>") -> Windows:
    """Cut a corpus into training and evaluation windows (see the module doc)."""
    need = min_corpus_bytes(seq_len)
    if len(data) < need:
        raise _error(
            where, f"corpus has {len(data)} bytes, fewer than the {need} needed for one "
            f"{seq_len}-byte sequence in both the train (90%) and eval (10%) splits",
        )
    if max_eval_windows < 1:
        raise ValueError("max_eval_windows must be at least 1")
    all_bytes = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    cut = split_point(len(data))
    train, held = all_bytes[:cut], all_bytes[cut:]
    # Non-overlapping slots in the held-out bytes; pick up to the cap, evenly spaced.
    slots = (len(held) - 1) // seq_len
    n_eval = min(slots, max_eval_windows)
    starts = (np.arange(n_eval, dtype=np.int64) * slots // n_eval) * seq_len
    offsets = starts[:, None] + np.arange(seq_len, dtype=np.int64)[None, :]
    return Windows(
        train_bytes=train, seq_len=seq_len,
        eval_x=held[offsets], eval_y=held[offsets + 1],
        n_train_bytes=cut, n_eval_bytes=len(held),
    )
