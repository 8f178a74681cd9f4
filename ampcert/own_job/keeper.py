"""The keeper of an own job's processes: every process the job starts ends with the run.

ampcert starts an own job through this script (Linux), as a container starts its
command through an init (tini, dumb-init): the keeper makes itself the *child
subreaper* of everything below it (``prctl(PR_SET_CHILD_SUBREAPER)``), starts the
job, and waits for it. A process the job leaves behind, however it left (a daemon
that forks, calls ``setsid`` and forks again is reparented to the nearest subreaper,
not to init), becomes the keeper's child. Once the job has exited the keeper ends
each of them (SIGTERM, ``grace`` seconds, SIGKILL, and again for what they leave in
turn), reaps them, records them in ``STATUS`` (JSON: the job's pid, the survivors'
pids and command lines, or why the job could not start) and exits as the job did
(its code, or its signal). ampcert marks the run failed for any survivor.

The keeper also bounds what the job's output costs: the job writes into pipes, and the
keeper copies each into its own stdout or stderr (the run folder's ``stdout.txt`` and
``stderr.txt``, which ampcert opened for it), keeping the last ``CAP`` bytes of each. A file
grows to twice ``CAP``, then its last ``CAP`` bytes are moved to its start; once the job is
over, a file that lost bytes holds one line saying how many, then the last ``CAP`` bytes
(the end of a job's output is what explains how it ended). A job that writes gigabytes of
progress bars costs ``2 x CAP`` of disk per stream, and the keeper one ``CAP`` of memory,
for a moment.

Run as a script, with no ampcert import (its start is a bare interpreter's):

    python -I -S keeper.py STATUS GRACE_S CAP -- ARGV...

Where the kernel refuses a subreaper, the keeper still starts the job, bounds its output
and waits for it, but cannot find what it leaves behind, and says so in STATUS.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _children(me: int) -> dict[int, str]:
    """{pid: command line} of this process's living children, from /proc."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().decode("utf-8", "replace")
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) != me or fields[0] in ("Z", "X"):
                continue
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        found[int(name)] = cmdline[:200]
    return found


def _reap() -> None:
    """Collect every child that has ended (the job's orphans end here too)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _end_survivors(grace_s: float) -> dict[int, str]:
    """End every process left below the keeper, theirs included; return those found."""
    me = os.getpid()
    seen: dict[int, str] = {}
    deadline = time.monotonic() + grace_s
    give_up = deadline + 10.0  # a process in uninterruptible sleep outlasts any signal
    sig = signal.SIGTERM
    while True:
        _reap()
        left = _children(me)
        if not left or time.monotonic() > give_up:
            return seen
        for pid, cmdline in left.items():
            seen.setdefault(pid, cmdline)
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.05)


def _write(path: str, status: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(status, fh)
    os.replace(tmp, path)


class BoundedTail:
    """The last ``cap`` bytes written to ``fd`` (a regular file open for reading and writing,
    written from its start): see the module's doc."""

    def __init__(self, fd: int, cap: int):
        self.fd, self.cap = fd, cap
        self.size = 0       # bytes in the file now
        self.dropped = 0    # bytes the job wrote that are no longer in it

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)
        self.size += len(data)
        if self.size >= 2 * self.cap:
            self._keep(b"")

    def close(self) -> None:
        if self.dropped:
            self._keep(f"[ampcert: the job wrote {self.dropped + self.size:,} bytes here; the first "
                       f"{self.dropped + self.size - min(self.size, self.cap):,} are dropped, the last "
                       f"{min(self.size, self.cap):,} kept]\n".encode())

    def _keep(self, header: bytes) -> None:
        kept = os.pread(self.fd, self.cap, max(self.size - self.cap, 0))
        self.dropped += self.size - len(kept)
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.write(self.fd, header + kept)
        self.size = len(kept)


def _pump(source: int, tail: BoundedTail) -> None:
    """Copy the pipe ``source`` into ``tail`` until every writer has closed it. Where the file
    fails (a full disk, a file not open for reading), the rest is read and dropped: the job's
    output is lost, never the job (a closed pipe would end it with SIGPIPE)."""
    failed = False
    while chunk := os.read(source, 1 << 16):
        if failed:
            continue
        try:
            tail.write(chunk)
        except OSError:
            failed = True
    try:
        if not failed:
            tail.close()
    except OSError:
        pass
    os.close(source)


def main(argv: list[str]) -> int:
    status_path, grace_s, cap, sep, *command = argv
    assert sep == "--" and command, "usage: keeper.py STATUS GRACE_S CAP -- ARGV..."
    libc = ctypes.CDLL(None, use_errno=True)
    subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    record: dict = {"subreaper": subreaper}
    if not subreaper:
        record["why"] = os.strerror(ctypes.get_errno())
    # The job's stdout and stderr: pipes the keeper copies into its own (bounded, see the doc).
    pipes = [os.pipe2(os.O_CLOEXEC) for _ in (1, 2)]
    # A pipe closed on exec tells the keeper whether the job started (its errno if not).
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    job = os.fork()
    if job == 0:
        os.close(read_end)
        for target, (_, writer) in zip((1, 2), pipes, strict=True):
            os.dup2(writer, target)  # the copy is inherited across exec (dup2 clears O_CLOEXEC)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(write_end, str(exc.errno or 0).encode())
        os._exit(127)
    os.close(write_end)
    pumps = []
    for target, (reader, writer) in zip((1, 2), pipes, strict=True):
        os.close(writer)
        pumps.append(threading.Thread(target=_pump, args=(reader, BoundedTail(target, int(cap))), daemon=True))
        pumps[-1].start()
    failed = os.read(read_end, 64)
    os.close(read_end)
    for sig in FORWARDED:  # the keeper is ended as the job would be: the job hears it
        signal.signal(sig, lambda signum, _frame: os.kill(job, signum))
    status = 0
    while True:
        try:
            pid, status = os.waitpid(-1 if subreaper else job, 0)
        except InterruptedError:
            continue
        if pid == job:
            break
    if subreaper:
        survivors = _end_survivors(float(grace_s))
        record.update(pid=job, survivors=[{"pid": p, "cmdline": c} for p, c in sorted(survivors.items())])
    else:
        record["pid"] = job
    # The pipes close once every writer is gone: the job, and (with a subreaper) what it left.
    # Without one, a process the job left may hold them open: its output is no longer kept.
    for pump in pumps:
        pump.join(timeout=float(grace_s) + 5.0)
    if failed:
        record["exec_error"] = os.strerror(int(failed))
    _write(status_path, record)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    return os.waitstatus_to_exitcode(status) if not failed else 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
