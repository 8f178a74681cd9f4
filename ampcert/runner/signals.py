"""Signals: one policy for SIGINT, SIGTERM and SIGHUP, in every phase of every command.

Whether a signal reaches ampcert alone (``kill PID``) or its whole process
group (a terminal's Ctrl-C or hangup), and whichever phase the command is in
(planning, running, finishing: certify, summary, report; signing; merging;
exporting), the first one raises :class:`~ampcert.errors.Interrupted` in the
main thread. On the way up the executor stops the runs in flight (they stay
without a result, pending for ``--resume``), the atomic writers leave every
file whole, the folder lock is released, and the CLI ends with one line and
exit code 128 + signum. A further signal during that shutdown (one that
hangs, say on a worker that cannot be reaped) ends the process at once, with
the same line.

Workers ignore SIGINT (stopping them is the executor's job; a
KeyboardInterrupt in each would be a traceback), and multiprocessing's helper
processes start with the three signals blocked, so that they end with ampcert,
never in the middle of its shutdown (``local_executor``).

Every session function runs inside :func:`interruptible`; the CLI enters one
block around the whole command as well, so that the time between the session's
return and the last line printed is covered too.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ampcert.errors import Interrupted
from ampcert.runner.procs import STOP_SIGNALS


class _Interrupts:
    """The process's signal state: handlers are per process, so there is one (``_interrupts``)."""

    def __init__(self) -> None:
        self.folders: list[Path | None] = []  # of the interruptible blocks entered, innermost last
        self.previous: dict[int, Any] = {}     # the handlers that ours replaced
        self.raised: Interrupted | None = None
        self.worker: Any = None                # the local worker process of the run in flight (kill())
        self.closing = False                   # the command is done: a signal ends the process at once

    def handle(self, signum: int, frame: object) -> None:
        if self.closing and self.raised is None:
            self.exit_now(Interrupted(signum))
        if self.raised is None:
            self.raised = Interrupted(signum, self.folders[-1] if self.folders else None)
            raise self.raised
        self.exit_now(self.raised)

    def exit_now(self, exc: Interrupted) -> None:
        """A further signal after ``exc``: stop the worker, end the process now."""
        if exc.written is False:  # the CLI is writing the line, and exits right after
            return
        if exc.written is None:
            # os.write, not print: this runs between two bytecodes of the main
            # thread, which may be in the middle of a print to the same stream.
            try:
                os.write(2, (exc.line + "\n").encode("utf-8", "replace"))
            except OSError:
                pass
        try:
            if os.isatty(1) and os.environ.get("TERM") != "dumb":
                os.write(1, b"\x1b[?25h")  # the live progress display hides the cursor until it stops
        except OSError:
            pass
        try:
            if self.worker is not None:
                self.worker.kill()
        except Exception:  # noqa: BLE001 - gone already; its watchdog ends it anyway (worker.exit_with)
            pass
        # What a normal exit does first (multiprocessing's atexit hook): unlink the
        # run queue's semaphores, which the resource tracker would otherwise
        # report as leaked. A private function: where it is missing, the warning is all.
        import multiprocessing.util

        try:
            getattr(multiprocessing.util, "_run_finalizers", lambda minpriority: None)(0)
        except Exception:  # noqa: BLE001 - nothing may stand between a second signal and the exit
            pass
        os._exit(exc.exit_code)


_interrupts = _Interrupts()


@contextmanager
def interruptible(folder: Path | None = None):
    """Inside the block, SIGINT, SIGTERM and SIGHUP raise Interrupted(signum,
    folder) in the main thread, once; a further signal ends the process at
    once, with the same line (:meth:`_Interrupts.exit_now`). Blocks nest, and
    the innermost one's folder is named: the session enters one for a whole
    command and one with the results folder once its plan.json makes it resumable.

    A signal ignored on entry stays ignored (``nohup``, a background job of a
    script): that was the user's choice. Handlers belong to the main thread, so
    in any other the block changes nothing. The outermost block puts the
    previous handlers back, unless a signal interrupted it: the process is then
    shutting down, and a further signal must still end it at once (a program
    that catches Interrupted and carries on sets its own handlers again)."""
    state = _interrupts
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outermost = not state.folders
    if outermost:
        state.raised = None  # a new command (after one that was interrupted, in a program that went on)
        for sig in STOP_SIGNALS:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN or current == state.handle:
                continue
            state.previous[sig] = current
            signal.signal(sig, state.handle)
    state.folders.append(folder)
    try:
        yield
    finally:
        state.folders.pop()
        if outermost and state.raised is None and not state.closing:
            for sig, previous in state.previous.items():
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)
            state.previous.clear()


def closing() -> None:
    """The command is done (its output printed, its exit code known): from
    here until the process exits, inside the outermost :func:`interruptible`
    block and after it, a signal ends the process at once with the one line
    and 128 + signum. What is left is the interpreter's teardown (atexit
    hooks, multiprocessing's finalizers), where an exception would only be
    a traceback and the default action an exit with no line."""
    _interrupts.closing = True


def watch_worker(process: Any) -> None:
    """The local worker process now in flight (anything with ``kill()``), or
    None: a further signal during shutdown kills it before the process exits."""
    _interrupts.worker = process


@contextmanager
def deferred() -> Iterator[None]:
    """Inside the block, SIGINT, SIGTERM and SIGHUP wait (blocked); one that
    arrived meanwhile is delivered, and raises Interrupted, as the block ends.
    For the few steps that must not be cut in half (a worker started but not
    yet recorded as ours to stop). Children started inside inherit the mask:
    keep exec'd programs out of it."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
