"""Opening a file of an untrusted folder: a regular file only, never through a link, never blocked.

A results folder, an MLPerf submission and an own job's run folder may come from
elsewhere or be written by code ampcert does not control. A link in one must not make
ampcert read what it points to (``result_10.txt -> /etc/os-release``), and a FIFO or a
device must not hang it (``open`` on a FIFO blocks until a writer comes; ``/dev/zero``
never ends). So the file is opened with ``O_NOFOLLOW`` and ``O_NONBLOCK`` and checked to
be a regular file before a byte is read.

:func:`open_regular` gives the open file, to be read in pieces (a log of any size in
bounded memory); :func:`read_regular_file` reads it whole, for files known to be small.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

#: How much one read takes from a file read in pieces.
CHUNK = 1 << 20


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file reached without
    following a symbolic link. Raises OSError: ELOOP for a link (its target named),
    EINVAL for anything that is not a regular file, FileNotFoundError for none."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):  # O_NOFOLLOW's answer for a link
            raise OSError(errno.ELOOP, f"a symbolic link{link_target(path)}, not followed", str(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: str | Path) -> bytes:
    """The whole content of :func:`open_regular`'s file."""
    with open_regular(path) as fh:
        return fh.read()


def digest_regular_file(path: str | Path) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of :func:`open_regular`'s file, read in pieces."""
    with open_regular(path) as fh:
        read = HashedLines(fh, CHUNK)
        read.drain()
    return read.sha256, read.size


class HashedLines:
    """The lines of an open binary file, each at most ``limit`` bytes (a longer line comes
    in pieces of ``limit``, so memory stays bounded however the file is made), while the
    sha256 and size of every byte read are kept: a log is read once for both its content
    and its digest. :meth:`chunks` gives what is left in pieces of :data:`CHUNK` (a
    copy), :meth:`drain` reads it (after a reader stopped early): either way :attr:`sha256`
    covers every byte read."""

    def __init__(self, fh: BinaryIO, limit: int):
        self._fh, self._limit = fh, limit
        self._sha = hashlib.sha256()
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        while True:
            piece = self._fh.readline(self._limit)
            if not piece:
                return
            self._sha.update(piece)
            self.size += len(piece)
            yield piece

    def chunks(self) -> Iterator[bytes]:
        for chunk in iter(lambda: self._fh.read(CHUNK), b""):
            self._sha.update(chunk)
            self.size += len(chunk)
            yield chunk

    def drain(self) -> None:
        for _ in self.chunks():
            pass

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()


def link_target(path: str | Path) -> str:
    """`` (to TARGET)`` for a symbolic link's message, its target as repr and shortened; ``""``
    where it cannot be read."""
    try:
        target = repr(os.readlink(path))
    except OSError:
        return ""
    return f" (to {target if len(target) <= 300 else target[:275] + '...' + target[-20:]})"
