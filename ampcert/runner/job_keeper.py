"""The keeper of a command job's processes: every process the job starts ends with the run.

ampcert starts a command job through this script (Linux), as a container starts its
command through an init (tini, dumb-init): the keeper makes itself the *child
subreaper* of everything below it (``prctl(PR_SET_CHILD_SUBREAPER)``), starts the
job, and waits for it. A process the job leaves behind, however it left (a daemon
that forks, calls ``setsid`` and forks again is reparented to the nearest subreaper,
not to init), becomes the keeper's child. Once the job has exited the keeper ends
each of them (SIGTERM, ``grace`` seconds, SIGKILL, and again for what they leave in
turn), reaps them, records them in ``STATUS`` (JSON: the job's pid, the survivors'
pids and command lines, or why the job could not start) and exits as the job did
(its code, or its signal). ampcert marks the run failed for any survivor.

Run as a script, with no ampcert import (its start is a bare interpreter's):

    python -I -S job_keeper.py STATUS GRACE_S -- ARGV...

Where the kernel refuses a subreaper (not Linux), the keeper execs the job in its
own place, as if it were not there, and says so in STATUS.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
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


def main(argv: list[str]) -> int:
    status_path, grace_s, sep, *command = argv
    assert sep == "--" and command, "usage: job_keeper.py STATUS GRACE_S -- ARGV..."
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        _write(status_path, {"subreaper": False, "why": os.strerror(ctypes.get_errno())})
        os.execvp(command[0], command)  # the job in the keeper's place (raises if it cannot start)
    # A pipe closed on exec tells the keeper whether the job started (its errno if not).
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    job = os.fork()
    if job == 0:
        os.close(read_end)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(write_end, str(exc.errno or 0).encode())
        os._exit(127)
    os.close(write_end)
    failed = os.read(read_end, 64)
    os.close(read_end)
    for sig in FORWARDED:  # the keeper is ended as the job would be: the job hears it
        signal.signal(sig, lambda signum, _frame: os.kill(job, signum))
    status = 0
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        if pid == job:
            break
    survivors = _end_survivors(float(grace_s))
    record: dict = {"subreaper": True, "pid": job,
                    "survivors": [{"pid": p, "cmdline": c} for p, c in sorted(survivors.items())]}
    if failed:
        record["exec_error"] = os.strerror(int(failed))
    _write(status_path, record)
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    return os.waitstatus_to_exitcode(status) if not failed else 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
