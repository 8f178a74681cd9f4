"""One benchmark of one published system, scored: MLPerf's official time-to-train, and what it leaves out.

MLPerf's score (``mlperf_logging.result_summarizer``, for a benchmark folder of
``result_*.txt`` logs and an optional ``scaling.json``):

1. each run's time to train is ``run_stop - run_start`` in minutes,
   ``(stop_ms - start_ms) / 60 / 1000``;
2. a run that does not count (its log has no ``run_stop``, its status is not
   ``success``, or MLPerf's compliance checker refuses it) is *dropped*;
3. the score is the olympic mean: the times sorted, the fastest and the slowest
   left out (four each for unet3d), where every dropped run stands in for one
   of the slowest; more dropped runs than that and there is no score;
4. times the review committee's ``scaling_factor`` from ``scaling.json`` (1 without one).

:func:`score_benchmark` computes it with the same operations in the same order,
so the figure is MLPerf's to the last digit (tests/published/test_scores.py runs
both). A run is dropped when ampcert's strict reader (:mod:`ampcert.mllog.reader`)
refuses its log, when it did not succeed, or when MLPerf's compliance checker
refused it (:func:`timed_runs`' ``refused``: the importer runs the checker first), each with its reason.

What the score does not say, and this module adds: the spread of the counted runs
(fastest, slowest, coefficient of variation); a bootstrap interval of the score
(the counted runs resampled, the number dropped kept as observed, each resample
scored by the same rule); a note when the runs
stopped on a few discrete evaluation points (time-to-train then moves in steps of
the evaluation interval, and its spread is not Gaussian); and accelerator-hours per
training run, the score times the system's accelerators.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ampcert.errors import UserError
from ampcert.mllog.reader import LogError, Scanned, TrainingLog, scan

LEVEL = 0.95
RESAMPLES = 10_000
# How many runs the olympic mean leaves out at each end (result_summarizer's max_dropped_scores).
MAX_DROPPED = {"unet3d": 4}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunTime(_Model):
    file: str
    minutes: float | None = Field(description="run_stop - run_start as MLPerf times it; None: dropped")
    dropped: str | None = Field(default=None, description="why the score leaves this run out")
    last_eval_samples: int | None = Field(default=None, description="samples_count at the run's last evaluation")


class BenchmarkScore(_Model):
    benchmark: str
    runs: list[RunTime]
    scaling_factor: float
    score_minutes: float | None = Field(description="MLPerf's time to train: olympic mean x scaling factor")
    no_score: str = ""
    fastest_minutes: float | None = None
    slowest_minutes: float | None = None
    cv: float | None = Field(default=None, description="coefficient of variation of the counted runs' times")
    interval_minutes: list[float] | None = Field(
        default=None, description=f"{LEVEL:.0%} bootstrap interval of the score ({RESAMPLES:,} resamples of the "
                                  "counted runs, the dropped ones kept as observed)")
    discrete_note: str = ""
    accelerators: int | None = None
    accelerator_hours_per_run: float | None = Field(
        default=None, description="the score (minutes) x accelerators / 60: one training run's accelerator-hours")


def olympic_score(minutes: list[float], dropped: int, benchmark: str,
                  scaling_factor: float = 1.0) -> tuple[float | None, str]:
    """MLPerf's score of ``minutes`` (the counted runs) with ``dropped`` runs dropped, and
    why there is none where there is none. The result summarizer's operations, in its order."""
    max_dropped = MAX_DROPPED.get(benchmark, 1)
    if dropped > max_dropped:
        return None, f"{dropped} runs dropped, more than the {max_dropped} MLPerf's olympic mean allows"
    scores = sorted(minutes)
    countable = scores[max_dropped:len(scores) - (max_dropped - dropped)]
    if not countable:
        return None, f"{len(minutes)} counted run(s): none left once the fastest and slowest are left out"
    return sum(countable) * 1.0 / len(countable) * scaling_factor, ""


def scaling_factor(folder: Path) -> float:
    """The folder's ``scaling.json`` factor (1.0 without the file); one line if it is not a positive number."""
    path = folder / "scaling.json"
    if not path.is_file():
        return 1.0
    try:
        value = json.loads(path.read_text())["scaling_factor"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: no scaling_factor to read ({type(exc).__name__}: {exc})") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{path}: scaling_factor {value!r} is not a positive number")
    return float(value)


def result_files(folder: Path) -> list[Path]:
    """``result_*.txt`` (``result_N.txt``, or SMC's ``result_<job>_<N>.txt``), in numeric order."""
    def key(path: Path) -> list[int | str]:
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]

    return sorted(folder.glob("result_*.txt"), key=key)


def run_time(path: Path, scanned: Scanned | None = None) -> tuple[RunTime, TrainingLog | None]:
    """One log's time to train, or why it is dropped; ``scanned``: the file's one reading
    (:func:`~ampcert.mllog_reader.scan`), where the caller has read it already (its digest
    and the time then come from the same bytes)."""
    try:
        # Ranks interleave (mllog_reader.parse); streamed, so a log of any size is read in bounded memory.
        scanned = scanned or scan(path, in_order=False, source=path.name)
        log = scanned.log_or_raise()
    except LogError as exc:
        return RunTime(file=path.name, minutes=None, dropped=exc.detail), None
    last = log.evals[-1].samples_count if log.evals else None
    if not log.succeeded:
        reason = log.run_stop_metadata.get("reason")
        return RunTime(file=path.name, minutes=None, last_eval_samples=last,
                       dropped=f"run_stop status {log.status}" + (f": {reason}" if reason else "")), log
    minutes = (float(log.run_stop_ms) - float(log.run_start_ms)) / 60 / 1000
    return RunTime(file=path.name, minutes=minutes, last_eval_samples=last), log


Timed = list[tuple[RunTime, TrainingLog | None]]


def timed_runs(files: Sequence[Path], refused: Mapping[str, str] | None = None,
               scanned: Mapping[Path, Scanned] | None = None) -> Timed:
    """Each result file's :func:`run_time` (from its ``scanned`` reading where given), a run ``refused`` names
    (MLPerf's compliance checker refused it: name -> why) dropped, as the summarizer drops it.
    What :func:`score_benchmark` and the energy (:mod:`.energy`) both read, read once."""
    timed = [run_time(path, (scanned or {}).get(path)) for path in files]
    return [(run.model_copy(update={"minutes": None, "dropped": refused[run.file]}), log)
            if refused and run.minutes is not None and run.file in refused else (run, log) for run, log in timed]


def score_benchmark(folder: str | Path, benchmark: str | None = None, accelerators: int | None = None,
                    seed: int = 0, timed: Timed | None = None) -> BenchmarkScore:
    """Score the benchmark folder ``folder`` (its name is the benchmark unless given), from its
    result files' ``timed`` runs (:func:`timed_runs`; read here unless given)."""
    folder = Path(folder)
    benchmark = benchmark or folder.name
    files = result_files(folder)
    if not files:
        raise UserError(f"{folder}: no result_*.txt logs: not an MLPerf benchmark folder")
    factor = scaling_factor(folder)
    timed = timed_runs(files) if timed is None else timed
    runs = [run for run, _ in timed]
    counted = [run.minutes for run in runs if run.minutes is not None]
    dropped = len(runs) - len(counted)
    score, why = olympic_score(counted, dropped, benchmark, factor)
    interval = bootstrap(counted, dropped, benchmark, factor, seed) if score is not None else None
    cv = (float(np.std(counted, ddof=1) / np.mean(counted)) if len(counted) > 1 else None)
    return BenchmarkScore(
        benchmark=benchmark, runs=runs, scaling_factor=factor, score_minutes=score, no_score=why,
        fastest_minutes=min(counted, default=None), slowest_minutes=max(counted, default=None), cv=cv,
        interval_minutes=interval,
        discrete_note=_discrete_note([(run, log) for run, log in timed if run.minutes is not None and log is not None]),
        accelerators=accelerators,
        accelerator_hours_per_run=None if score is None or accelerators is None else score * accelerators / 60)


def bootstrap(counted: list[float], dropped: int, benchmark: str, factor: float = 1.0,
              seed: int = 0) -> list[float] | None:
    """The score's percentile interval ([low, high]) over resamples of the counted runs, the
    dropped runs kept as observed (every resample is then scored by the rule the score was;
    the caller asks only where the runs as measured have a score); None under two runs."""
    if len(counted) < 2:
        return None
    rng = np.random.default_rng(seed)
    values = np.asarray(counted)
    found = [olympic_score(list(values[picks]), dropped, benchmark, factor)[0]
             for picks in rng.integers(0, len(values), size=(RESAMPLES, len(values)))]
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(np.asarray(found, dtype=float), [tail, 100 - tail])
    return [float(low), float(high)]


def _discrete_note(counted: list[tuple[RunTime, TrainingLog]]) -> str:
    """Where the counted runs converged at a few evaluation points, say so, with the step."""
    stops = Counter(run.last_eval_samples for run, _ in counted if run.last_eval_samples)
    if len(counted) < 3 or not stops or len(stops) > len(counted) / 2:
        return ""
    gaps = [(b.time_ms - a.time_ms) / 60_000 for _, log in counted
            for evals in [log.of(log.metrics[0]) if log.metrics else ()]  # one metric's (SD logs two at once)
            for a, b in zip(evals, evals[1:], strict=False)]
    points = ", ".join(f"{samples:,} samples ({count} run{'s' if count > 1 else ''})"
                       for samples, count in sorted(stops.items()))
    step = f" about {median(gaps):.2f} min apart" if gaps else ""
    return (f"the {len(counted)} counted runs reached the target at {len(stops)} evaluation point(s): {points}; "
            f"evaluations are{step}, so time to train moves in those steps and its spread is not Gaussian")
