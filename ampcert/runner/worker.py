"""The worker: trains exactly one run in its own process and writes its result.

Everything that can go wrong inside a run (an exception in the workload, a
non-finite loss) ends here as a failed RunResult with the reason; what kills
the process outright (a signal, the out-of-memory killer, a timeout) is
recorded by the local executor in the ampcert process, which sees the exit
code and no result file.
"""

from __future__ import annotations

import io
import os
import signal
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ampcert import mllog
from ampcert.backends.contract import (
    DoesNotFit,
    LossNotFinite,
    RunFailed,
    TrainOutcome,
    Unsupported,
)
from ampcert.errors import UserError, WriteFailed
from ampcert.frameworks import require_backend
from ampcert.results import FailureKind, Phases, ResultsDir, RunResult, atomic_write_json
from ampcert.runner.procs import STOP_SIGNALS
from ampcert.spec import RunSpec


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def record_unfinished(rd: ResultsDir, spec: RunSpec, reason: str, *, timed_out: bool, started_at: str,
                      spawned: float) -> RunResult:
    """Store the failed result of a run whose process ended without writing a trusted
    one (killed, crashed, or past its timeout): a worker's or torchrun's, seen from
    the local executor."""
    result = RunResult(
        run_id=spec.run_id, spec=spec, status="failed", reason=reason,
        failure=FailureKind.TIMEOUT if timed_out else FailureKind.WORKER_LOST,
        started_at=started_at, finished_at=now_iso(), wall_s=time.time() - spawned,
        accelerated=spec.accelerated, capability_note=spec.capability_note,
    )
    atomic_write_json(rd.result_file(spec.run_id), result)
    return result


def exit_with(pid: int, interval_s: float = 0.2) -> None:
    """End this process when process ``pid`` (ampcert) dies.

    Only ampcert (its local executor) enforces a run's timeout and owns the results
    folder's lock: a worker that outlived it (ampcert SIGKILLed, or
    killed by the out-of-memory killer) would train on unwatched, hang
    forever if it hangs, hold its memory and write into a folder that a
    resumed invocation is writing too. The worker's parent is the forkserver,
    not ampcert, so the kernel's parent-death signal cannot help."""
    from ampcert.runner.procs import alive as _alive
    from ampcert.runner.procs import proc_stat as _proc_stat

    started = _proc_stat(pid)

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            now = _proc_stat(pid)
            gone = not _alive(pid) or (started is not None and (now is None or now[1] != started[1]))
            if gone:  # (a different start time: the pid was reused by another process)
                os._exit(70)

    threading.Thread(target=watch, name="ampcert-orchestrator-watch", daemon=True).start()


# The kind of a run's failure, by the exception's type (the first that matches);
# anything else is an error in the training code.
FAILURE_KINDS: tuple[tuple[type[Exception], FailureKind], ...] = (
    (LossNotFinite, FailureKind.NON_FINITE),
    (DoesNotFit, FailureKind.OUT_OF_MEMORY),
    (Unsupported, FailureKind.UNSUPPORTED),
    (RunFailed, FailureKind.ERROR),
    (UserError, FailureKind.BAD_INPUT),
)


def classify(exc: Exception) -> tuple[FailureKind, str]:
    """A run's exception as (the kind of failure, the reason recorded).

    The kind comes from the exception's type (:data:`FAILURE_KINDS`), never
    from its message. The harness's own exceptions (RunFailed and its kinds,
    UserError) are recorded by their message alone, others with their type's
    name in front."""
    for cls, kind in FAILURE_KINDS:
        if isinstance(exc, cls):
            return kind, str(exc)
    return FailureKind.ERROR, f"{type(exc).__name__}: {exc}"


def execute(spec: RunSpec, root: Path, progress=None, spawned_at: float | None = None) -> RunResult:
    """Train ``spec`` and write its result.json atomically; never raises for a run's own failure.

    Nor for a file it cannot write (a full disk: :class:`WriteFailed`). A run
    whose log cannot be written stops there, failed with that one-line reason
    (``cannot write .../run.mllog: [Errno 28] ...``): what it did could not be
    recorded, so it is no evidence. Where its result.json cannot be written, a
    compact failed result says so (``cannot write .../result.json: ...``;
    ``--resume --retry-failed`` redoes the run); where not even that can be,
    the result is returned unstored and nothing is printed (a traceback here
    would be a second, noisier message): the local executor finds no result and
    records the failure itself, or, on a disk still full, stops with that same
    one line (exit 1), and ``--resume`` redoes the run once there is space."""
    entered = time.time()
    rd = ResultsDir(root)
    run_dir = rd.run_dir(spec.run_id)
    started_at = now_iso()
    t0 = time.perf_counter()
    log: mllog.MLLogger | None = None
    outcome: TrainOutcome | None = None
    status, reason, failure = "completed", None, None
    try:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "error.txt").unlink(missing_ok=True)
            # A redone run starts its log afresh: the log describes this attempt only.
            rd.mllog_file(spec.run_id).unlink(missing_ok=True)
            rd.telemetry_file(spec.run_id).unlink(missing_ok=True)
        except OSError as exc:
            raise WriteFailed(run_dir, exc) from exc
        # A speed probe trains no certified run: it writes no MLLOG (its models' events go nowhere).
        log = (mllog.MLLogger(io.StringIO(), namespace=spec.run_id) if spec.is_speed_probe
               else mllog.MLLogger.open(rd.mllog_file(spec.run_id), namespace=spec.run_id))
        # Planning refused a missing framework already; this catches a folder
        # resumed, or a worker started, where it is missing.
        require_backend(spec.backend, f"run {spec.run_id}")
        # Only the run's own backend is imported: a JAX run never imports torch.
        if spec.backend == "torch":
            from ampcert.backends import torch_backend as backend
        elif spec.backend == "jax":
            from ampcert.backends import jax_backend as backend
        else:  # pragma: no cover - the spec's Literal admits only these
            raise UserError(f"backend {spec.backend!r} is not available")
        outcome = backend.train(spec, log, progress)
    except Exception as exc:  # noqa: BLE001 - a run's failure is data, not a crash
        status = "failed"
        # A file that cannot be written is the machine's failure, not the suite's bad input
        # (WriteFailed is a UserError, for its one line): recorded as an error, by its message.
        failure, reason = (FailureKind.ERROR, str(exc)) if isinstance(exc, WriteFailed) else classify(exc)
        try:
            (run_dir / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        except OSError:  # the disk that failed the run: its reason still goes into result.json
            pass
        if log is not None:
            try:
                log.end(mllog.RUN_STOP, metadata={"status": "aborted", "reason": reason})
            except WriteFailed:
                pass
    finally:
        if log is not None:
            try:
                log.close()
            except WriteFailed as exc:  # the log's last lines are lost: the run is no evidence
                if status == "completed":
                    outcome, status, failure, reason = None, "failed", FailureKind.ERROR, str(exc)
    wall_s = time.perf_counter() - t0
    # The fields training fills in (results.TrainedFields): the outcome's, or, for a run that
    # did not complete, their defaults and what its spec says of the device.
    trained: dict[str, Any] = {"accelerated": spec.accelerated, "capability_note": spec.capability_note}
    phases = None
    if outcome is not None:
        trained = outcome.trained_fields()
        if outcome.telemetry_series is not None:
            try:
                outcome.telemetry["series_file"] = outcome.telemetry_series.write(rd.telemetry_file(spec.run_id)).name
            except (WriteFailed, OSError) as exc:  # the summary still stands without its series
                outcome.telemetry["series_file"] = None
                outcome.telemetry["notes"].append(f"series not written: {exc}")
        startup = max(entered - spawned_at, 0.0) if spawned_at else 0.0
        times = outcome.phases
        accounted = times.build_s + times.train_s + times.eval_s
        phases = Phases(startup_s=startup, build_s=times.build_s, train_s=times.train_s,
                        eval_s=times.eval_s, other_s=max(wall_s - accounted, 0.0))
    result = RunResult(
        run_id=spec.run_id, spec=spec, status=status, reason=reason, failure=failure,
        started_at=started_at, finished_at=now_iso(), wall_s=wall_s, phases=phases, **trained,
    )
    try:
        atomic_write_json(rd.result_file(spec.run_id), result)
    except WriteFailed as exc:
        # The failure itself, compactly (a few hundred bytes where the result held curves
        # and telemetry), so that the folder says why rather than "worker lost".
        result = RunResult(
            run_id=spec.run_id, spec=spec, status="failed", reason=str(exc), failure=FailureKind.ERROR,
            started_at=started_at, finished_at=now_iso(), wall_s=wall_s,
            accelerated=spec.accelerated, capability_note=spec.capability_note,
        )
        try:
            atomic_write_json(rd.result_file(spec.run_id), result)
        except WriteFailed:  # nothing can be recorded here: see the docstring
            pass
    return result


def process_main(spec_json: str, root: str, queue, spawned_at: float, orchestrator: int | None = None) -> None:
    """Entry point of a worker process (see orchestrator)."""
    # The worker's side of the signal policy (see signals.interruptible).
    # SIGINT is ignored: a terminal's Ctrl-C reaches the whole process group, and
    # stopping the run is the local executor's job (a KeyboardInterrupt here would
    # only print a traceback). SIGTERM and SIGHUP keep what the worker inherited
    # (they end it, or stay ignored under nohup), so a worker can still be
    # stopped on its own, which the local executor records as a failed run. The
    # worker began with all three blocked (its forkserver was started so), so
    # none could land before this; one pending since is delivered on unblocking.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    spec = RunSpec.model_validate_json(spec_json)
    if orchestrator is not None:
        exit_with(orchestrator)

    def progress(update: dict) -> None:
        queue.put({"run_id": spec.run_id, **update})

    execute(spec, Path(root), progress, spawned_at)
