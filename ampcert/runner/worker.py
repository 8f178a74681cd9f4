"""The worker: trains exactly one run in its own process and writes its result.

Everything that can go wrong inside a run (an exception in the workload, a
non-finite loss) ends here as a failed RunResult with the reason; what kills
the process outright (a signal, the out-of-memory killer, a timeout) is
recorded by the orchestrator, which sees the exit code and no result file.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ampcert import mllog
from ampcert.errors import UserError
from ampcert.results import Phases, ResultsDir, RunResult, atomic_write_json
from ampcert.spec import RunSpec, require_backend


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def exit_with(pid: int, interval_s: float = 0.2) -> None:
    """End this process when process ``pid`` (its orchestrator) dies.

    Only the orchestrator enforces a run's timeout and owns the results
    folder's lock: a worker that outlived it (the orchestrator SIGKILLed, or
    killed by the out-of-memory killer) would train on unwatched, hang
    forever if it hangs, hold its memory and write into a folder that a
    resumed invocation is writing too. The worker's parent is the forkserver,
    not the orchestrator, so the kernel's parent-death signal cannot help."""
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


def execute(spec: RunSpec, root: Path, progress=None, spawned_at: float | None = None) -> RunResult:
    """Train ``spec`` and write its result.json atomically; never raises for a run's own failure."""
    entered = time.time()
    rd = ResultsDir(root)
    run_dir = rd.run_dir(spec.run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "error.txt").unlink(missing_ok=True)
    started_at = now_iso()
    t0 = time.perf_counter()
    # A redone run starts its log afresh: the log describes this attempt only.
    rd.mllog_file(spec.run_id).unlink(missing_ok=True)
    rd.telemetry_file(spec.run_id).unlink(missing_ok=True)
    log = mllog.MLLogger.open(rd.mllog_file(spec.run_id), namespace=spec.run_id)
    fields: dict[str, Any] = {}
    status, reason = "completed", None
    try:
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
        fields = backend.train(spec, log, progress)
    except Exception as exc:  # noqa: BLE001 - a run's failure is data, not a crash
        status = "failed"
        known = type(exc).__name__ in ("RunFailed", "UserError")
        reason = str(exc) if known else f"{type(exc).__name__}: {exc}"
        (run_dir / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        log.end(mllog.RUN_STOP, metadata={"status": "aborted", "reason": reason})
    finally:
        log.close()
    wall_s = time.perf_counter() - t0
    partial = fields.pop("phases_partial", None)
    recorder = fields.pop("telemetry_series", None)
    if recorder is not None and fields.get("telemetry") is not None:
        try:
            fields["telemetry"]["series_file"] = recorder.write_series(rd.telemetry_file(spec.run_id)).name
        except OSError as exc:  # the summary still stands without its series
            fields["telemetry"]["series_file"] = None
            fields["telemetry"]["notes"].append(f"series not written: {exc}")
    phases = None
    if partial is not None:
        startup = max(entered - spawned_at, 0.0) if spawned_at else 0.0
        accounted = partial["build_s"] + partial["train_s"] + partial["eval_s"]
        phases = Phases(startup_s=startup, build_s=partial["build_s"], train_s=partial["train_s"],
                        eval_s=partial["eval_s"], other_s=max(wall_s - accounted, 0.0))
    result = RunResult(
        run_id=spec.run_id, spec=spec, status=status, reason=reason,
        started_at=started_at, finished_at=now_iso(), wall_s=wall_s, phases=phases,
        accelerated=spec.accelerated, capability_note=spec.capability_note,
        amp_policy=fields.pop("policy", None),
        **fields,
    )
    atomic_write_json(rd.result_file(spec.run_id), result)
    return result


def process_main(spec_json: str, root: str, queue, spawned_at: float, orchestrator: int | None = None) -> None:
    """Entry point of a worker process (see orchestrator)."""
    spec = RunSpec.model_validate_json(spec_json)
    if orchestrator is not None:
        exit_with(orchestrator)

    def progress(update: dict) -> None:
        queue.put({"run_id": spec.run_id, **update})

    execute(spec, Path(root), progress, spawned_at)
