"""Is a process still there, and which signals stop one? Shared by ampcert (the supervising
process), its workers and torchrun ranks."""

from __future__ import annotations

import os
import signal
from pathlib import Path

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
