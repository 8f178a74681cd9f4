"""What each metric's samples are: the values read from one side's runs.

Per metric, a value per completed run, and for throughput also per-step
samples within each run where step times were recorded (``step_times_ms``):
the data the significance tests and the medians are taken over. Where a run
has no value, :class:`Samples` says why (shown as N/A in the table). This is
the only place that knows which attribute of a run a gate metric reads; the
metric names are a closed set (:data:`ampcert.gate.settings.MetricName`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ampcert.results import RunResult


@dataclass
class Samples:
    """One side's samples of one metric: a value per run, and per-step samples
    within runs where the metric has them."""

    per_run: list[float]
    groups: list[np.ndarray] | None = None  # per-step samples, one array per run
    missing: str | None = None  # why a run had no value
    note: str | None = None

    @property
    def pooled(self) -> np.ndarray:
        if self.groups:
            return np.concatenate(self.groups)
        return np.asarray(self.per_run, dtype=float)

    @property
    def n_samples(self) -> int:
        return int(sum(len(g) for g in self.groups)) if self.groups else len(self.per_run)


def _energy_reason(r: RunResult) -> str:
    energy = (r.telemetry or {}).get("energy") or {}
    return str(energy.get("reason") or "no energy measurement in the run's telemetry")


def collect_samples(metric: str, runs: list[RunResult]) -> Samples:
    """``metric``'s samples over the completed ``runs``."""
    done = [r for r in runs if r.status == "completed"]
    if not done:
        return Samples([], missing="no completed run")
    if metric == "samples_per_s":
        vals = [r.samples_per_s for r in done if r.samples_per_s]
        groups = []
        for r in done:
            if r.step_times_ms and r.steps:
                batch = r.train_samples / r.steps
                ms = np.asarray([t for t in r.step_times_ms if t > 0], dtype=float)
                if len(ms):
                    groups.append(batch * 1e3 / ms)
        use_steps = len(groups) == len(done)
        return Samples(vals, groups if use_steps else None, None if vals else "samples/s not recorded",
                       None if use_steps else "per run (no per-step times recorded)")
    if metric == "time_to_target_s":
        vals, censored = [], 0
        for r in done:
            if r.target_reached and r.time_to_target_s is not None:
                vals.append(r.time_to_target_s)
            else:
                censored += 1
                ph = r.phases
                vals.append((ph.train_s + ph.eval_s) if ph is not None else (r.wall_s or math.inf))
        note = (f"target missed in {censored}/{len(done)} runs: counted at their whole training time"
                if censored else None)
        return Samples(vals, note=note)
    if metric == "final_metric":
        vals = [r.final_metric for r in done if r.final_metric is not None]
        return Samples(vals, missing=None if vals else "no final metric")
    if metric == "peak_memory_bytes":
        vals = [r.peak_memory.value for r in done if r.peak_memory and r.peak_memory.value is not None]
        return Samples(vals, missing=None if vals else "peak memory not measured")
    if metric == "energy_j_per_sample":
        vals = [v for r in done if (v := ((r.telemetry or {}).get("energy") or {}).get("train_j_per_sample"))
                is not None]
        return Samples(vals, missing=None if vals else f"energy not measured: {_energy_reason(done[0])}")
    raise ValueError(metric)  # pragma: no cover - MetricName admits only these
