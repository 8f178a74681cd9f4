"""Is a process still there, and which signals stop one? Shared by ampcert (the supervising
process), its workers and torchrun ranks."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from ampcert.telemetry.host import process_tree

# The signals of the one stop policy (signals.interruptible): ampcert
# handles them, its helper processes start with them blocked, workers unblock them.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process from /proc, or None where unavailable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return (fields[0], fields[19]) if len(fields) > 19 else None


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = proc_stat(pid)
    return stat is None or stat[0] not in ("Z", "X")


def end_tree(root: int, grace_s: float) -> None:
    """End process ``root`` and its whole tree (its session and every descendant): SIGTERM,
    up to ``grace_s`` seconds for them to exit, then SIGKILL until none is left. Processes
    the tree starts meanwhile are found on each pass."""
    deadline = time.monotonic() + grace_s
    give_up = deadline + 10.0  # a process stuck in the kernel (state D) cannot be killed at all
    sig = signal.SIGTERM if grace_s > 0 else signal.SIGKILL
    while True:
        tree = [p.pid for p in process_tree(root)]
        if not tree or time.monotonic() > give_up:
            return
        for pid in tree:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        try:
            os.killpg(root, sig)
        except OSError:
            pass
        time.sleep(0.05)
        if sig == signal.SIGTERM and time.monotonic() >= deadline:
            sig = signal.SIGKILL
