"""The local executor: runs train on this machine, one at a time, each in its own process.

It is an :class:`~ampcert.runner.fleet.Executor` like Ray's and Slurm's, so
:func:`~ampcert.runner.fleet.run_fleet` is the one driver for every engine:
``submit`` starts the run's worker (capacity one: runs on one machine would
only slow each other and blur their timings), ``poll`` forwards its progress
and checks that it lives and is within its timeout, ``cancel`` stops it.

Isolation is by process: a run that raises, diverges, hangs past its timeout
or is killed (out of memory, a signal) becomes a failed RunResult with its
reason, and the suite goes on. The worker writes its result into the results
folder itself, so what ``poll`` returns is the run's *stored* result, never a
payload to validate; a run here is never lost to a cluster, so never retried.

Workers are forked from a forkserver that has already imported the harness
(and, for torch suites, torch), so each run pays for a fork, not for a fresh
interpreter and framework import. Runs with ``launcher: torchrun`` start
torch.distributed.run instead (:mod:`ampcert.runner.torchrun`), with the same
handle. Nothing here imports a framework at module level.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import signal
import time
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Protocol

from ampcert.frameworks import missing_framework, require_backend
from ampcert.results import ResultsDir, RunResult
from ampcert.runner import signals
from ampcert.runner.procs import STOP_SIGNALS
from ampcert.spec import RunSpec
from ampcert.vocabulary import Event

# Imported once in the forkserver, so each worker starts with them loaded.
# torch._inductor is what torch.use_deterministic_algorithms imports (~3 s).
# JAX is not preloaded: the worker sets JAX_PLATFORMS and XLA_FLAGS before it
# imports JAX, which reads the first on import and the second when its backend starts.
_HARNESS = ["ampcert.runner.worker", "ampcert.workloads.digits", "ampcert.workloads.resnet",
            "ampcert.workloads.gpt"]
_PRELOAD = {
    "torch": [*_HARNESS, "ampcert.backends.torch_backend", "ampcert.workloads.torch_models", "torch._inductor"],
    "jax": [*_HARNESS, "ampcert.backends.jax_backend"],
}
# Last, after every backend's modules: freezes what they built (see the module).
_PRELOAD_DONE = "ampcert.runner.preload_done"
# The process context workers start from: one per process, because the
# forkserver is one per process and preloads once (see _mp_context).
_context: Any = None
# How long one wait for a worker's events lasts: also how often liveness and
# the timeout are checked.
_TICK_S = 0.25


def _mp_context(backends: AbstractSet[str]):
    """The process context workers start from. The forkserver is one per
    process and preloads once, so the backends of its first use decide what
    it preloads (only what is installed)."""
    global _context
    if _context is None:
        method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        _context = mp.get_context(method)
        if method == "forkserver":
            _context.set_forkserver_preload(
                [*dict.fromkeys(m for b in sorted(backends) if missing_framework(b) is None
                                for m in _PRELOAD[b]), _PRELOAD_DONE])
    return _context


def _start_helpers(ctx: Any) -> None:
    """Start multiprocessing's resource tracker and forkserver (the first time;
    then this is cheap) with SIGINT, SIGTERM and SIGHUP blocked. They keep the
    mask (the tracker ignores SIGINT and SIGTERM besides), so a signal to the
    whole process group does not end them in the middle of ampcert's
    shutdown, where the tracker would report its semaphores as leaked; they end
    when ampcert does. Workers forked from the forkserver inherit the
    mask, so no signal lands before they have set their own (worker.process_main)."""
    if ctx.get_start_method() != "forkserver" or not hasattr(signal, "pthread_sigmask"):
        return
    from multiprocessing import forkserver, resource_tracker

    # One at a time: starting the tracker unblocks SIGINT and SIGTERM behind itself.
    for start in (resource_tracker.ensure_running, forkserver.ensure_running):
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class RunningRun(Protocol):
    """One run on this machine: a worker process, or torchrun and its ranks.

    Made, then registered by the executor, then started, so that a signal
    at any point finds it where :meth:`stop` can reach it."""

    spec: RunSpec

    def start(self) -> None:
        """Start it (once)."""
        ...

    def events(self, wait_s: float) -> list[Event]:
        """Progress since the last call (waiting up to ``wait_s`` for the first)."""
        ...

    def ended(self) -> bool:
        """Whether it is over: exited, or past its timeout (then it is killed)."""
        ...

    def finish(self) -> RunResult:
        """Its stored result once it has ended: the worker's, or a failed one written here."""
        ...

    def stop(self) -> None:
        """Kill it unfinished (an interrupt): it stays without a result, pending."""
        ...


def _failure_reason(exitcode: int | None, timed_out: bool, timeout_s: int) -> str:
    if timed_out:
        return f"timeout: run exceeded {timeout_s} s and was killed"
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else str(-exitcode)
        hint = " (the out-of-memory killer sends SIGKILL)" if name == "SIGKILL" else ""
        return f"worker killed by {name}{hint} before writing its result"
    return f"worker exited with code {exitcode} before writing its result"


class WorkerRun:
    """A run in its worker process (forked from the forkserver), with its own event queue."""

    def __init__(self, spec: RunSpec, root: Path):
        self.spec = spec
        self.root = root
        self.rd = ResultsDir(root)
        self.process: Any = None
        self.queue: Any = None
        self.timed_out = False

    def start(self) -> None:
        from ampcert.runner.worker import now_iso

        spec = self.spec
        ctx = _mp_context({spec.backend})
        _start_helpers(ctx)  # before the queue, whose semaphores start the resource tracker
        self.queue = ctx.Queue()  # one queue per run: a killed worker cannot poison the next one
        self.started_at = now_iso()
        self.spawned = time.time()
        process = ctx.Process(
            target=_process_entry,
            args=(spec.model_dump_json(), str(self.root), self.queue, self.spawned, os.getpid()),
            name=f"ampcert-{spec.run_id}", daemon=True,
        )
        # A signal in the middle of start() would leave a worker that nobody stops
        # (and that cannot read its queue once ampcert is gone): it waits until the
        # worker is ours to stop. The worker's own mask comes from the forkserver.
        with signals.deferred():
            process.start()
            self.process = process
            signals.watch_worker(process)
        self.deadline = time.monotonic() + spec.timeout_s

    def events(self, wait_s: float) -> list[Event]:
        out: list[Event] = []
        try:
            out.append(self.queue.get(timeout=wait_s))
            while True:
                out.append(self.queue.get_nowait())
        except (queue_mod.Empty, OSError, ValueError, EOFError):
            pass
        return out

    def ended(self) -> bool:
        if not self.process.is_alive():
            return True
        if time.monotonic() > self.deadline:
            self.timed_out = True
            self.process.kill()
            return True
        return False

    def finish(self) -> RunResult:
        from ampcert.runner.worker import record_unfinished

        self.process.join()
        self._release()
        result = self.rd.read_result(self.spec.run_id)
        if result is None or self.timed_out:
            result = record_unfinished(
                self.rd, self.spec, _failure_reason(self.process.exitcode, self.timed_out, self.spec.timeout_s),
                timed_out=self.timed_out, started_at=self.started_at, spawned=self.spawned)
        return result

    def stop(self) -> None:
        """SIGKILL (its result.json is written atomically, so it is whole or
        absent), then remove the temp file of a write it may have been in the
        middle of (the folder lock is ours). A result.json the worker wrote
        before it was stopped stands."""
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join()
        self._release()
        for tmp in self.rd.run_dir(self.spec.run_id).glob(".*.tmp"):
            tmp.unlink(missing_ok=True)

    def _release(self) -> None:
        signals.watch_worker(None)
        if self.queue is not None:
            self.queue.close()


def _process_entry(spec_json: str, root: str, events, spawned: float, orchestrator: int) -> None:
    from ampcert.runner.worker import process_main

    process_main(spec_json, root, events, spawned, orchestrator)


def local_run(spec: RunSpec, root: Path) -> RunningRun:
    """One run on this machine, not started: an own job, torchrun's ranks for
    ``launcher: torchrun``, else a worker."""
    if spec.command is not None:  # a team's own job, run and read by ampcert
        from ampcert.own_job.run import OwnJobRun

        return OwnJobRun(spec, root)
    if spec.launch.launcher == "torchrun":  # data-parallel ranks under torch.distributed.run
        from ampcert.runner.torchrun import TorchrunRun

        return TorchrunRun(spec, root)
    return WorkerRun(spec, root)


class LocalExecutor:
    """This machine as an executor: one run at a time, written straight into ``root``."""

    name = "local"
    capacity: int | None = 1
    keeps_log = False  # fleet.jsonl records placements on a cluster; here there is one place

    def __init__(self, root: Path):
        self.root = Path(root)
        self._tickets = 0
        self._running: dict[int, RunningRun] = {}
        self._started: list[Event] = []

    def check(self, runs: Sequence[RunSpec], cpus_per_run: int) -> None:
        """A resumed folder was planned elsewhere: its framework may be missing
        here (one line before any run). The forkserver preloads what they need."""
        backends = {s.backend for s in runs if not s.skip_reason and s.command is None}
        for backend in sorted(backends):
            require_backend(backend, str(self.root))
        if backends:  # own jobs start their own programs, never a worker
            _mp_context(backends)

    def submit(self, specs: Sequence[RunSpec], cpus_per_run: int) -> list[Any]:
        tickets = []
        for spec in specs:
            self._tickets += 1
            run = self._running[self._tickets] = local_run(spec, self.root)
            run.start()
            self._started.append({"kind": "running", "run_id": spec.run_id})
            tickets.append(self._tickets)
        return tickets

    def poll(self, timeout_s: float) -> tuple[list[tuple[Any, RunResult]], list[Event]]:
        events, self._started = self._started, []
        ended: list[tuple[Any, RunResult]] = []
        waited = 0.0
        while not ended:
            for ticket, run in list(self._running.items()):
                events += [{**e, "kind": "step", "run_id": run.spec.run_id} for e in run.events(_TICK_S)]
                if run.ended():
                    events += [{**e, "kind": "step", "run_id": run.spec.run_id}  # what it sent before it ended
                               for e in run.events(0.0)]
                    ended.append((ticket, run.finish()))
                    del self._running[ticket]
            waited += _TICK_S
            if waited >= timeout_s or not self._running:
                break
        return ended, events

    def cancel(self) -> None:
        for run in self._running.values():
            run.stop()
        self._running.clear()

    def close(self) -> None:
        self.cancel()
