"""A subject's speed probe, summarised from its processes (ampcert/backends/speed_probe.py).

Per subject (the low precision's; FP32's is its reference) the figures the nightly history
keeps and the report shows:

- ``speedup``: FP32's step time over the low precision's, per round (two windows of one
  round ran a few milliseconds apart, so whatever the machine did then moved both); a
  process's value is the median over its rounds, the subject's the median over its
  processes (a process has a speed of its own: where its memory landed, which cores its
  threads got), with a 95% bootstrap interval that resamples each process's rounds;
- each path's step time (ms) and its cost in units of the calibration kernel's time (the
  median over rounds of the window's step time over the kernel's of the same round): the
  machine's own speed, measured beside the step, divided out;
- hardware counters per step, where the kernel has them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ampcert.aggregate import group_key, reference_key
from ampcert.results import RunResult, SpeedProbeResult
from ampcert.vocabulary import Subject

BOOTSTRAP = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class PathFigures:
    """One path of the probe (FP32's or the low precision's), over the subject's processes."""

    step_ms_per_process: list[float]       # each process's median over its rounds
    kernel_units_per_process: list[float]  # step time / the same round's kernel time, likewise
    counters: dict[str, float] = field(default_factory=dict)  # per step, where counted

    @property
    def step_ms(self) -> float:
        return statistics.median(self.step_ms_per_process)

    @property
    def kernel_units(self) -> float:
        return statistics.median(self.kernel_units_per_process)


@dataclass(frozen=True)
class ProbeSummary:
    subject: Subject
    reference: Subject
    processes: int
    rounds: int
    window_steps: int
    seconds: float            # the budget of one process
    threads: str
    kernel: str
    kernel_ms: float
    low: float                # 95% bootstrap interval of ``speedup``
    high: float
    per_process: list[float]  # each process's median speed-up
    path: PathFigures         # the low precision's
    reference_path: PathFigures
    counters_note: str

    @property
    def speedup(self) -> float:
        """FP32's step time over the low precision's: the median of the processes' medians."""
        return statistics.median(self.per_process)


def _medians(arrays: list[np.ndarray]) -> list[float]:
    return [float(np.median(a)) for a in arrays]


def _interval(ratios: list[np.ndarray]) -> tuple[float, float]:
    rng = np.random.default_rng(0)  # the same folder gives the same interval
    medians = np.empty((BOOTSTRAP, len(ratios)))
    for j, r in enumerate(ratios):
        medians[:, j] = np.median(r[rng.integers(0, len(r), size=(BOOTSTRAP, len(r)))], axis=1)
    draws = np.median(medians, axis=1)
    tail = (1 - CONFIDENCE) / 2
    return float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))


def _path(probes: list[SpeedProbeResult], reference: bool) -> PathFigures:
    steps = [np.asarray(p.reference_step_ms if reference else p.step_ms) for p in probes]
    units = [s / np.asarray(p.kernel_ms) for s, p in zip(steps, probes, strict=True)]
    counted = [p.counters[p.reference if reference else p.precision] for p in probes if p.counters]
    counters = {event: statistics.median(c[event] for c in counted) for event in counted[0]} if counted else {}
    return PathFigures(_medians(steps), _medians(units), counters)


def probe_summaries(runs: Iterable[RunResult]) -> list[ProbeSummary]:
    """One summary per subject with a completed probe process (failed ones left out)."""
    groups: dict[Subject, list[SpeedProbeResult]] = {}
    for r in runs:
        if r.status == "completed" and r.speed_probe is not None and r.speed_probe.rounds:
            groups.setdefault(group_key(r), []).append(r.speed_probe)
    out = []
    for subject, probes in sorted(groups.items()):
        ratios = [np.asarray(p.reference_step_ms) / np.asarray(p.step_ms) for p in probes]
        low, high = _interval(ratios)
        first = probes[0]
        out.append(ProbeSummary(
            subject=subject, reference=reference_key(subject), processes=len(probes),
            rounds=sum(p.rounds for p in probes), window_steps=first.window_steps, seconds=first.seconds,
            threads=first.threads, kernel=first.kernel,
            kernel_ms=statistics.median(_medians([np.asarray(p.kernel_ms) for p in probes])),
            low=low, high=high, per_process=_medians(ratios),
            path=_path(probes, reference=False), reference_path=_path(probes, reference=True),
            counters_note=first.counters_note))
    return out
