"""What each metric's samples are: the values read from one side's runs.

Per metric, a value per completed run (the run's figure of that name, as
every view reads it: ``aggregate.run_value``), and for ``step_samples_per_s``
also the per-step samples within each run (``step_times_ms``): the data the
significance tests and the medians are taken over. Where a run
has no value, :class:`Samples` says why (shown as N/A in the table). This is
the only place that knows which attribute of a run a gate metric reads; the
metric names are a closed set (:data:`ampcert.gate.settings.MetricName`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ampcert.aggregate import run_value, step_throughputs
from ampcert.results import RunResult
from ampcert.steady_state import steady_steps


@dataclass
class Samples:
    """One side's samples of one metric: a value per run, and per-step samples
    within runs where the metric has them."""

    per_run: list[float]
    groups: list[np.ndarray] | None = None  # per-step samples, one array per run
    missing: str | None = None  # why a run had no value
    note: str | None = None

    @property
    def n_samples(self) -> int:
        return int(sum(len(g) for g in self.groups)) if self.groups else len(self.per_run)


def _energy_reason(r: RunResult) -> str:
    energy = (r.telemetry or {}).get("energy") or {}
    return str(energy.get("reason") or "no energy measurement in the run's telemetry")


MISSING = {"samples_per_s": "samples/s not recorded", "final_metric": "no final metric",
           "peak_memory_bytes": "peak memory not measured"}


def collect_samples(metric: str, runs: list[RunResult]) -> Samples:
    """``metric``'s samples over the completed ``runs``: each run's value of the
    figure of that name (``aggregate.run_value``, what every view shows)."""
    done = [r for r in runs if r.status == "completed"]
    if not done:
        return Samples([], missing="no completed run")
    if metric == "step_samples_per_s":
        groups = [steady_steps(step_throughputs(r)) for r in done]  # after each run's own warm-up
        if not all(len(g) for g in groups):
            return Samples([], missing="per-step times not recorded")
        return Samples([float(np.median(g)) for g in groups], groups)
    if metric == "time_to_target_s":
        if not any(r.target is not None or r.spec.target is not None for r in done):
            return Samples([], missing="no target")
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
    vals = [v for r in done if (v := run_value(r, metric)) is not None and (v or metric != "samples_per_s")]
    if vals:
        return Samples(vals)
    if metric == "energy_j_per_sample":
        return Samples([], missing=f"energy not measured: {_energy_reason(done[0])}")
    return Samples([], missing=MISSING.get(metric, f"no {metric}"))
