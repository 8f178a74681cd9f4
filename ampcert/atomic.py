"""Atomic file writes: a file holds either its old or its new content, never a
mix, and a write that fails says which file and why in one line.

The leaf every writer of results shares (results, the telemetry series, the
report), so that a full disk reads the same from each of them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ampcert.errors import WriteFailed


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8, newlines as given) atomically: see :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` so that ``path`` holds either the old or the new content,
    never a mix: temp file in the same folder, fsync, rename.

    A write that fails (a full disk, a read-only folder) removes its temp file,
    leaves ``path`` as it was and raises :class:`WriteFailed` naming ``path``
    and the errno: one line for the CLI, not a traceback."""
    atomic_write_chunks(path, (data,))


def atomic_write_chunks(path: str | Path, chunks: Iterable[bytes]) -> None:
    """:func:`atomic_write_bytes` of the bytes ``chunks`` gives, one at a time (a copy of a
    file of any size, in bounded memory). An exception from ``chunks`` other than OSError
    leaves ``path`` as it was and passes through."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:  # (closes fd whatever fails below)
                os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results are ordinary files
                for chunk in chunks:
                    fh.write(chunk)
                fh.flush()  # a full disk shows here or at fsync, before the rename
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise WriteFailed(path, exc) from exc


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
