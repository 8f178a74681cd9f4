"""A results folder as one night of history: what the store keeps of it.

A *night* is one ``ampcert run`` (its plan.json: the digest of that file is
its identity, so adding a folder twice adds it once). Its *points* are, per
subject (workload entry, backend, AMP, precision: ``aggregate.group_runs``'s
groups, determinism repeats left out) and metric, the median over the seeds
that have a value, with those values kept beside it. The metrics are the
gate's (``gate.samples.collect_samples``: throughput, time to quality, final
quality, peak memory, energy per sample), a low precision's speed-up over
FP32 paired by seed within the night (the machine's load moves both runs of a
pair), the speed probe's figures (``ampcert.probe_summary``: the speed-up measured
in one process in alternating windows, each path's step time, absolute and in
units of the calibration kernel, and hardware counters per step where counted),
and two counts: optimizer updates the loss scaler skipped, and failed runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ampcert.aggregate import paired_speedups
from ampcert.errors import UserError
from ampcert.gate.samples import collect_samples
from ampcert.gate.subjects import group_runs
from ampcert.probe_summary import PathFigures, ProbeSummary, probe_summaries
from ampcert.results import ResultsDir, RunResult, load
from ampcert.vocabulary import Status, Subject

# Metrics kept per subject, with the direction that is better.
METRICS: dict[str, str] = {
    "samples_per_s": "higher",
    "step_samples_per_s": "higher",
    "paired_speedup_vs_fp32": "higher",  # a low precision's gain, measured in the same night (aggregate.paired_speedups)
    # The speed probe's (ampcert.probe_summary): not figures of the certified runs.
    "probe_speedup_vs_fp32": "higher",   # the gain, measured in one process, windows alternating
    "probe_step_ms": "lower",            # the probe's step time
    "probe_step_kernel_units": "lower",  # the same in units of the calibration kernel's time
    "instructions_per_step": "lower",    # hardware counters, where the kernel has them
    "cycles_per_step": "lower",
    "time_to_target_s": "lower",
    "final_metric": "workload",   # the workload's metric says (accuracy higher, bits per byte lower)
    "peak_memory_bytes": "lower",
    "energy_j_per_sample": "lower",
    "scaler_skips": "lower",
    "failed_runs": "lower",
}
# The probe's path figures (ampcert.probe_summary.PathFigures) and counters, by metric.
_PROBE_PATH = {"probe_step_ms": "step_ms", "probe_step_kernel_units": "kernel_units"}
_COUNTERS = {"instructions_per_step": "instructions", "cycles_per_step": "cycles"}
PROBE_METRICS = ("probe_speedup_vs_fp32", *_PROBE_PATH, *_COUNTERS)


@dataclass(frozen=True)
class Point:
    subject: Subject
    metric: str
    value: float           # median over the seeds (a count for failed_runs)
    samples: list[float]   # the per-seed values (empty for failed_runs)
    higher_is_better: bool


@dataclass(frozen=True)
class VerdictRecord:
    """A certificate's verdict as the store keeps it: one rule's on a subject, or the subject's own."""

    subject: Subject
    rule: str              # "" for the subject's overall status
    status: Status


@dataclass
class Night:
    digest: str            # sha256 of plan.json: the run invocation's identity
    suite: str
    suite_sha256: str | None
    created_at: str        # when the run was planned (plan.json)
    machine: str
    source: str            # the folder it was read from
    tool: str
    certificate: Status | None
    fingerprint: dict[str, Any]
    points: list[Point] = field(default_factory=list)
    verdicts: list[VerdictRecord] = field(default_factory=list)
    # What the gate says beside its signals (the probe's counters, or why none); not stored.
    notes: list[str] = field(default_factory=list)


def default_machine(fingerprint: dict[str, Any]) -> str:
    """Host name, CPU model and GPUs of the fingerprint: a runner's series stay apart."""
    # A plan.json is input from elsewhere: a field of the wrong shape counts as not recorded.
    def part(mapping: dict[str, Any], key: str, kind: type) -> Any:
        value = mapping.get(key)
        return value if isinstance(value, kind) else kind()

    cpu = part(fingerprint, "cpu", dict)
    gpus = [g.get("name") for g in part(part(fingerprint, "gpu", dict), "devices", list) if isinstance(g, dict)]
    parts = [str(fingerprint.get("hostname") or "unknown host"), str(cpu.get("model") or "unknown CPU")]
    if gpus:
        parts.append(f"{len(gpus)}x {gpus[0]}")
    return " / ".join(parts)


def _higher_is_better(metric: str, runs: list[RunResult]) -> bool:
    direction = METRICS[metric]
    if direction == "workload":
        return runs[0].higher_is_better if runs and runs[0].higher_is_better is not None else True
    return direction == "higher"


def _points(subject: Subject, runs: list[RunResult], speedups: list[float] | None) -> list[Point]:
    points = []
    done = [r for r in runs if r.status == "completed"]
    for metric in METRICS:
        if metric in PROBE_METRICS:  # the probe's own (_probe_points)
            continue
        if metric == "paired_speedup_vs_fp32":
            if not speedups:
                continue
            values, value = speedups, statistics.median(speedups)
        elif metric == "failed_runs":
            values, value = [], float(sum(r.status == "failed" for r in runs))
        elif metric == "scaler_skips":
            values = [float(len(r.skipped_steps)) for r in done if r.skipped_steps is not None]
            if not values:
                continue
            value = statistics.median(values)
        else:
            # (a value that is not finite, such as a time to target never reached without
            # phases, is no level a series can hold)
            values = [float(v) for v in collect_samples(metric, runs).per_run if math.isfinite(v)]
            if not values:
                continue
            value = statistics.median(values)
        points.append(Point(subject, metric=metric, value=value, samples=values,
                            higher_is_better=_higher_is_better(metric, done or runs)))
    return points


def _subject(s: dict[str, Any]) -> Subject:
    """A subject as verdicts.json writes it (an object of four strings)."""
    return Subject(str(s["workload"]), str(s["backend"]), str(s["amp"]), str(s["precision"]))


def _utc_iso(created_at: str, plan_file: Path) -> str:
    """The night's date in UTC, ISO 8601 to the second: the store orders nights by this
    text, which is time order only when every date is written the same way."""
    try:
        when = datetime.fromisoformat(created_at)
    except ValueError:
        raise UserError(f"{plan_file}: created_at {created_at[:40]!r} is not an ISO 8601 date and time") from None
    if when.tzinfo is None:
        raise UserError(f"{plan_file}: created_at {created_at[:40]!r} has no time zone")
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")


def read_night(folder: str | Path, machine: str | None = None) -> Night:
    """One results folder as a night; one clear line (UserError) for anything else."""
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"{root}: results folder not found")
    rd = ResultsDir(root)
    plan = rd.read_plan()  # one line if this is not a results folder
    results = load(root)
    if not results.runs:
        raise UserError(f"{root}: no run results to record")
    raw = rd.plan_file.read_bytes()
    fingerprint: dict[str, Any] = dict(plan.environment or {})
    if plan.code and isinstance(plan.code.get("jobs"), dict):  # each own job's commit, for the gate's notes
        fingerprint["code_jobs"] = plan.code["jobs"]
    certificate = None
    verdicts: list[VerdictRecord] = []
    if rd.verdicts_file.exists():
        try:
            data = json.loads(rd.verdicts_file.read_text(encoding="utf-8"))
            certificate = Status(data["status"]) if data.get("status") is not None else None
            for v in data.get("verdicts", []):
                verdicts.append(VerdictRecord(_subject(v["subject"]), str(v["rule"]), Status(v["status"])))
            for entry in data.get("subjects", []):
                verdicts.append(VerdictRecord(_subject(entry["subject"]), "", Status(entry["status"])))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{rd.verdicts_file}: unreadable verdicts ({type(exc).__name__}: {exc})") from None
    night = Night(digest=hashlib.sha256(raw).hexdigest(), suite=str(plan.suite or results.suite_name),
                  suite_sha256=plan.suite_sha256, created_at=str(plan.created_at or ""),
                  machine=machine or default_machine(fingerprint), source=str(root.resolve()),
                  tool=str(plan.tool or ""), certificate=certificate, fingerprint=fingerprint,
                  verdicts=verdicts)
    if not night.created_at:
        raise UserError(f"{rd.plan_file}: no created_at: the night's date is unknown")
    night.created_at = _utc_iso(night.created_at, rd.plan_file)
    speedups = paired_speedups(results.runs)
    for subject, runs in sorted(group_runs(results.runs).items()):
        night.points += _points(subject, runs, speedups.get(subject))
    summaries = probe_summaries(results.probe_runs)
    night.points += _probe_points(summaries)
    night.notes += sorted({s.counters_note for s in summaries})
    return night



def _probe_points(summaries: list[ProbeSummary]) -> list[Point]:
    """The speed probe's points: each low precision's speed-up (its processes' values the
    samples), and each path's step figures; FP32's, measured beside every low precision,
    the median over them."""
    points = [Point(s.subject, "probe_speedup_vs_fp32", s.speedup, list(s.per_process), True) for s in summaries]
    paths: dict[Subject, list[PathFigures]] = {}
    for s in summaries:
        paths.setdefault(s.subject, []).append(s.path)
        paths.setdefault(s.reference, []).append(s.reference_path)
    for subject, figures in sorted(paths.items()):
        # the value: the median of the probes' figures; the samples: every probe process's
        for metric, name in _PROBE_PATH.items():
            per_process = [v for f in figures for v in getattr(f, f"{name}_per_process")]
            points.append(Point(subject, metric, statistics.median(float(getattr(f, name)) for f in figures),
                                per_process, False))
        for metric, event in _COUNTERS.items():
            counted = [f.counters[event] for f in figures if event in f.counters]
            if counted:
                points.append(Point(subject, metric, statistics.median(counted), counted, False))
    return points
