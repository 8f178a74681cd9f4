"""An own job's MLLOG as a run's result: the same fields ampcert's own loop fills in.

ampcert did not train the job, so what it knows comes from the log the job
wrote (MLPerf's format, read strictly by :mod:`ampcert.mllog.reader`) and
from the telemetry it sampled around the job's process tree:

============================  ==================================================
``final_metric``, ``evals``   the eval_accuracy events (value, samples_count)
``time_to_target_s``          run_start to the first eval at the suite's target
                              (MLPerf's time to train), evals included
``samples_per_s``             the largest samples_count over run_start..run_stop
                              less the time inside eval_start/eval_stop pairs
                              (all of it, where the job logs no eval intervals:
                              then evals count as training, and the result says so)
``steps``                     samples / global_batch_size, where both are logged
``lowest_precision``          lowest_numerical_precision_in_linear/attn/comm,
                              as the job measured them (the callbacks probe the
                              first step); a part it left out is "undisclosed"
``peak_memory``               the largest sampled RSS of the whole process tree
``telemetry``                 energy per phase (phases from the log's events),
                              power, memory, as for any run
============================  ==================================================

What it cannot know: per-step times (no ``step_time``), FLOPs and MFU, the
loss curve, loss scaling, and a digest of the final weights. Those fields
stay empty, never guessed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ampcert.backends.contract import LossNotFinite, PhaseTimes, RunFailed, TrainOutcome
from ampcert.mllog.reader import LogError, TrainingLog, read_training_log
from ampcert.results import EvalPoint, LowestPrecision, Measured, Phases
from ampcert.spec import RunSpec

UNDISCLOSED = "undisclosed"


class JobFailed(RunFailed):
    """The job exited 0 but its log cannot stand as evidence (the reason names the line)."""


def read_log(path: Path) -> TrainingLog:
    """The job's log, strictly; every problem is a :class:`JobFailed` naming the line."""
    name = f"{path.parent.name}/{path.name}"
    if not os.path.lexists(path):
        raise JobFailed(f"the job exited 0 but wrote no MLLOG ({name}): write it to $AMPCERT_MLLOG "
                        "(mlperf_logging.mllog, ampcert.track, or the HF / Lightning callbacks)")
    try:
        # Streamed, in memory bounded by the evaluations (a job's log may be any size); never
        # through a link, never blocked on a FIFO (the MLLOG reader opens regular files only).
        return read_training_log(path, source=name)
    except LogError as exc:
        raise JobFailed(str(exc)) from None


def _eval_ms_before(intervals: list[tuple[float, float]], t_ms: float) -> float:
    return sum(min(stop, t_ms) - start for start, stop in intervals if start < t_ms)


def _lowest_precision(log: TrainingLog) -> LowestPrecision | None:
    if not log.lowest_precision:
        return None
    parts = {p: log.lowest_precision.get(p, UNDISCLOSED) for p in ("linear", "attn", "comm")}
    detail = {p: dict(log.lowest_precision_detail.get(p, {})) for p in parts}
    for p, value in parts.items():
        if value == UNDISCLOSED:
            detail[p] = {"observed": False, "reason": "the job's log does not disclose it"}
    return LowestPrecision(**parts, detail={"source": "the job's MLLOG", **detail})


def outcome(spec: RunSpec, log_path: Path, telemetry: Any, *, argv: list[str], returncode: int | None,
            spawned: float, environment: dict[str, Any]) -> TrainOutcome:
    """The run's result fields from the job's log and the telemetry sampled around it.
    Stops the telemetry. Raises :class:`JobFailed` for a log that cannot stand."""
    job = spec.command
    assert job is not None, "a command entry's run"
    log = read_log(log_path)
    name = log.source
    if not log.succeeded:
        why = log.run_stop_metadata.get("reason")
        raise JobFailed(f"{name} line {log.run_stop_line}: the job logged run_stop with status "
                        f"{log.status!r}" + (f" ({why})" if why else ""))
    if not log.evals:
        raise JobFailed(f"{name}: the job logged no eval_accuracy, so there is no {job.metric} to certify")
    if len(log.metrics) > 1 and job.metric not in log.metrics:
        raise JobFailed(f"{name}: the job's eval_accuracy names metrics {', '.join(map(repr, log.metrics))}; "
                        f"the suite's entry says metric {job.metric!r}")
    if len(log.metrics) == 1 and log.metric is not None and log.metric != job.metric:
        raise JobFailed(f"{name} line {log.evals[0].line}: the job's eval_accuracy is {log.metric!r}, "
                        f"the suite's entry says metric {job.metric!r}")
    judged = log.of(job.metric)  # the suite's metric's evaluations (all of them, where the log names one)
    diverged = next((ev for ev in judged if not math.isfinite(ev.value)), None)
    if diverged is not None:  # judged as diverged (parity, numerics), as ampcert's own loop stops on one
        raise LossNotFinite(f"{name} line {diverged.line}: the job's eval_accuracy is {diverged.value}: "
                            "the run diverged")
    if log.seed is not None and log.seed != spec.seed:
        raise JobFailed(f"{name}: the job logged seed {log.seed} where the run's is {spec.seed}: "
                        "pass {seed} (or $AMPCERT_SEED) to it")
    gbs = log.global_batch_size
    intervals = list(log.eval_intervals)
    eval_s = sum(stop - start for start, stop in intervals) / 1000.0
    samples = log.samples
    last_ms = log.run_stop_ms
    train_s = max((last_ms - log.run_start_ms) / 1000.0 - eval_s, 0.0)
    evals = [EvalPoint(step=(ev.samples_count // gbs) if gbs and ev.samples_count else 0,
                       samples=ev.samples_count or 0,
                       train_time_s=max((ev.time_ms - log.run_start_ms - _eval_ms_before(intervals, ev.time_ms))
                                        / 1000.0, 0.0),
                       value=ev.value) for ev in judged]
    reached = log.first_reaching(job.target, job.higher_is_better, job.metric) if job.target is not None else None
    summary = telemetry.stop(train_samples=samples)
    series = telemetry.series()
    if not intervals:
        summary["notes"].append("the job logged no eval_start/eval_stop: its evaluations count as training "
                                "time (samples_per_s and the train phase's energy include them)")
    tree = getattr(telemetry.sources[0], "tree", None)
    peak = Measured(value=float(tree.peak_rss) if tree is not None and tree.peak_rss else None, unit="bytes",
                    method="the largest sampled sum of RSS over the job's process tree "
                           f"(sampled at {spec.telemetry_rate_hz:g} Hz)")
    build_s = max(log.run_start_ms / 1000.0 - spawned, 0.0)
    return TrainOutcome(
        steps=samples // gbs if samples and gbs else 0,
        train_samples=samples or 0,
        metric=job.metric, higher_is_better=job.higher_is_better,
        final_metric=judged[-1].value, target=job.target,
        target_reached=None if job.target is None else reached is not None,
        steps_to_target=(reached.samples_count // gbs) if reached and reached.samples_count and gbs else None,
        samples_to_target=reached.samples_count if reached else None,
        time_to_target_s=log.seconds_at(reached) if reached else None,
        samples_per_s=samples / train_s if samples and train_s > 0 else None,
        data_info={"source": "the job's own data pipeline (not measured by ampcert)"},
        evals=evals, peak_memory=peak, telemetry=summary,
        lowest_precision=_lowest_precision(log),
        accelerated=spec.accelerated, capability_note=spec.capability_note,
        environment={**environment, "command": argv, "cwd": job.workdir, "exit_code": returncode,
                     "global_batch_size": gbs,
                     **({"submission": log.submission} if log.submission else {})},
        phases=PhaseTimes(build_s=build_s, train_s=train_s, eval_s=eval_s),
        telemetry_series=series,
    )


def phases(outcome: TrainOutcome, wall_s: float) -> Phases:
    """The run's phases: the job's start to its run_start is building (imports, data, model)."""
    t = outcome.phases
    return Phases(startup_s=0.0, build_s=t.build_s, train_s=t.train_s, eval_s=t.eval_s,
                  other_s=max(wall_s - t.build_s - t.train_s - t.eval_s, 0.0))
