"""One invocation per results folder: the lock every command that writes a folder holds."""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from ampcert.errors import UserError
from ampcert.runner.procs import alive as _alive


class FolderLock:
    """One invocation per results folder: a second one is refused, not interleaved.

    The lock is an flock on ``.lock`` (which also holds the owner's pid, for
    the message): the kernel drops it when its owner dies, even by SIGKILL, so
    a stale lock file is simply taken over, and two invocations racing for a
    stale lock cannot both win. Once held, temp files of atomic writes that a
    killed writer left behind are removed: nobody else can be writing them.
    """

    def __init__(self, root: Path):
        self.root = root
        self.path = root / ".lock"
        self._fd: int | None = None

    def __enter__(self) -> FolderLock:
        if fcntl is None:  # pragma: no cover - no flock (Windows): the pid file alone
            self._enter_pidfile()
        else:
            self._enter_flock()
        _remove_stale_temp_files(self.root)
        return self

    def _refuse(self, pid: int) -> UserError:
        return UserError(f"{self.root}: another ampcert (pid {pid or 'unknown'}) is writing to this "
                         "folder; wait for it to finish (or stop it), then use `ampcert run --resume`")

    def _enter_flock(self) -> None:
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pid = _read_pid(fd)
                os.close(fd)
                raise self._refuse(pid) from None
            try:  # the file we locked must still be the one at the path (a releasing owner unlinks it)
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            pid = _read_pid(fd)
            if pid and pid != os.getpid() and _alive(pid):
                # A pid lock (not an flock) of a live process: an older ampcert.
                os.close(fd)
                raise self._refuse(pid)
            os.ftruncate(fd, 0)
            try:
                os.pwrite(fd, str(os.getpid()).encode(), 0)
            except OSError:
                # A full disk: the flock is the lock, the pid only names its holder in
                # a refusal, so go on without it rather than fail on a file we own.
                pass
            self._fd = fd
            return
        raise UserError(f"{self.path}: could not take the folder lock")

    def _enter_pidfile(self) -> None:  # pragma: no cover - platforms without fcntl
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    pid = int(self.path.read_text().strip() or 0)
                except (OSError, ValueError):
                    pid = 0
                if pid and _alive(pid):
                    raise self._refuse(pid) from None
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(str(os.getpid()))
            return
        raise UserError(f"{self.path}: could not take the folder lock")

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)  # while still held: nobody can be between lock and check
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).decode("ascii", "replace").strip() or 0)
    except (OSError, ValueError):
        return 0


def _remove_stale_temp_files(root: Path) -> None:
    """Temp files of atomic writes (``.NAME.XXXX.tmp``) in the folder and its
    run folders: left only by a writer that was killed mid-write. A linked
    folder (a tampered results folder) is never entered: its files are not
    ours to delete; reading the plan refuses such a folder afterwards."""
    runs = root / "runs"
    folders = [root]
    if runs.is_dir() and not runs.is_symlink():
        folders += [d for d in runs.iterdir() if d.is_dir() and not d.is_symlink()]
    for folder in folders:
        for p in folder.glob(".*.tmp"):
            if not p.is_symlink() and p.is_file():
                p.unlink(missing_ok=True)
