"""One aggregation of run results: per (workload, backend, amp, precision), across seeds.

Every view of a results folder reads its numbers from here: the console
table and summary.json/html (``report.summary``), report.json's table
(``report.model``), the certificate's subjects (``certify.checks``), the
regression gate and the capacity plan. So they cannot disagree on what a
group is (the determinism repeats are the same seed trained again: evidence
for the determinism check, never extra seeds in a mean), on its FP32
reference, or on whether its metric may be read against FP32's.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ampcert.amp.precision import RECIPE_PRECISIONS, REFERENCE
from ampcert.results import RunResult
from ampcert.steady_state import SteadyState, steady_state, steady_steps
from ampcert.vocabulary import Subject

#: what a table row and a certificate subject speak about (the name from before there was :class:`Subject`)
GroupKey = Subject

# Tables list the reference first, then the low precisions widest-exponent first.
# The precision recipes (amp/recipes.py) after the plain precisions, in the table's order.
TABLE_ORDER = ("fp32", "bf16", "fp16", "fp8", "mxfp8", *RECIPE_PRECISIONS)


def group_key(r: RunResult) -> Subject:
    """The subject a run belongs to: its entry's label, backend, amp and precision."""
    return Subject(r.spec.label, r.spec.backend, r.spec.amp, r.spec.precision)


def reference_key(key: Subject) -> Subject:
    """The FP32 group a low-precision group is compared with: same entry, backend and amp."""
    return key.with_precision(REFERENCE)


def is_repeat(r: RunResult) -> bool:
    """A rerun of a seed already in the group (a determinism repeat, a resumed run): not
    one of the group's samples (:attr:`RunSpec.is_rerun`; a spec without it, as the gate's
    duck-typed runs, by its repeat)."""
    rerun = getattr(r.spec, "is_rerun", None)
    return bool(getattr(r.spec, "repeat", 0)) if rerun is None else rerun


def sort_key(key: Subject) -> tuple[str, str, str, int]:
    """Table order: by entry, backend and amp, then the precisions in :data:`TABLE_ORDER`."""
    order = TABLE_ORDER.index(key.precision) if key.precision in TABLE_ORDER else len(TABLE_ORDER)
    return (key.workload, key.backend, key.amp, order)


def group_runs(runs: Iterable[RunResult], *, repeats: bool = False,
               skipped: bool = True) -> dict[Subject, list[RunResult]]:
    """The runs of each group, groups in table order, runs in the order given.

    ``repeats=False`` leaves out determinism reruns (the seeds of a group are
    its samples); ``skipped=False`` leaves out runs the plan skipped."""
    groups: dict[Subject, list[RunResult]] = {}
    for r in runs:
        if (not repeats and is_repeat(r)) or (not skipped and r.status == "skipped"):
            continue
        groups.setdefault(group_key(r), []).append(r)
    return {k: groups[k] for k in sorted(groups, key=sort_key)}


# --------------------------------------------------------------------------- comparability


def capped_groups(runs: Iterable[RunResult]) -> dict[Subject, int]:
    """The groups trained on a smaller step budget than FP32's, with their step cap.

    A suite with ``unaccelerated: cap`` trains a precision the device does not
    accelerate for fewer steps than FP32, to keep the suite short. Its final
    metric then answers another question ("where is it after 30 steps?"), so
    every view (console table, summary, report, certificate) marks such a
    group :func:`not_comparable` instead of setting its metric beside FP32's
    as if it were a parity result. Decided from the stored budgets alone, so
    a folder reads the same way whoever renders it.
    """
    runs = list(runs)
    reference: dict[Subject, set[str]] = {}
    for r in runs:
        if r.spec.precision == REFERENCE:
            reference.setdefault(group_key(r), set()).add(r.spec.budget_key())
    capped: dict[Subject, int] = {}
    for r in runs:
        key = group_key(r)
        budgets = reference.get(reference_key(key))
        if r.spec.precision == REFERENCE or not budgets or r.spec.budget_key() in budgets:
            continue
        capped[key] = max(capped.get(key, 0), r.spec.step_limit or 0)
    return capped


def not_comparable(step_cap: int) -> str:
    """The words every view uses for a capped group (see :func:`capped_groups`)."""
    return f"not comparable (capped at {step_cap} steps)"


# --------------------------------------------------------------------------- the numbers


_Row = TypeVar("_Row", bound="SubjectRow")


class SubjectRow(BaseModel):
    """A table row's first four columns: its :class:`~ampcert.vocabulary.Subject`, flat.

    The rows of summary.json, report.json's table and the capacity plan carry the
    subject as four keys of their own (their JSON predates :class:`Subject`), so
    they declare them here, once, and read them back as one :attr:`key`."""

    model_config = ConfigDict(extra="forbid")

    workload: str
    backend: str
    amp: str
    precision: str

    @property
    def key(self) -> Subject:
        return Subject(self.workload, self.backend, self.amp, self.precision)

    @classmethod
    def of(cls: type[_Row], subject: Subject, **columns: Any) -> _Row:
        """The row of ``subject`` with the other ``columns``."""
        return cls(workload=subject.workload, backend=subject.backend, amp=subject.amp,
                   precision=subject.precision, **columns)


# --------------------------------------------------------------------------- a run's figures

#: Every figure of a run by the one name all views use for it (docs/reports.md
#: defines each): the gate, the history, the plan and the tables read a run's
#: value through :func:`run_value`, and a group's is the median over its seeds.
FIGURES: dict[str, str] = {
    "final_metric": "the workload's quality metric at the last eval",
    "steps_to_target": "steps until the first eval that met the target",
    "time_to_target_s": "run_start to the first eval that met the target, evals included",
    "samples_per_s": "training samples / training time (whole run: every timed step, data loading included)",
    "step_samples_per_s": "steady-state throughput: the median of a step's samples / its time over the timed "
                          "steps after the warm-up (ampcert.steady_state)",
    "flops_per_step": "forward+backward FLOPs of one step",
    "mfu": "achieved FLOP/s / the device's peak for the precision",
    "data_share": "share of training time spent on batches",
    "peak_memory_bytes": "peak memory of the run (the device's where measured)",
    "energy_j_per_sample": "energy of the training phase / training samples",
}


def step_throughputs(r: RunResult) -> list[float]:
    """Samples/s of each timed step of ``r``: a step's samples (training samples
    over steps) over its time; empty where the steps were not timed one by one."""
    if not r.step_times_ms or not r.steps:
        return []
    batch = r.train_samples / r.steps
    return [batch * 1e3 / ms for ms in r.step_times_ms if ms > 0]


def steady(r: RunResult) -> SteadyState | None:
    """``r``'s steady-state throughput (warm-up found in its step times, an interval, a CV);
    None where its steps were not timed one by one."""
    return steady_state(step_throughputs(r))


def run_value(r: RunResult, name: str) -> float | None:
    """Run ``r``'s figure ``name`` (a key of :data:`FIGURES`); None where the run has none."""
    if name == "step_samples_per_s":
        # the median of steady_state(), without its bootstrap interval: every view reads this
        # figure, often several times a run, and only the report shows the interval
        steps = steady_steps(step_throughputs(r))
        return float(np.median(steps)) if len(steps) else None
    if name == "peak_memory_bytes":
        value = r.peak_memory.value if r.peak_memory else None
    elif name == "energy_j_per_sample":
        value = train_j_per_sample(r)
    elif name in FIGURES:
        value = getattr(r, name)
    else:
        raise KeyError(f"not a figure: {name}")
    return None if value is None else float(value)


def median_value(runs: Iterable[RunResult], name: str) -> float | None:
    """A group's figure: the median over its completed runs that have one."""
    values = _present(run_value(r, name) for r in runs if r.status == "completed")
    return statistics.median(values) if values else None


def paired_speedups(runs: Iterable[RunResult]) -> dict[Subject, list[float]]:
    """Per low-precision group, each seed's steady-state throughput over FP32's of the
    same seed (same entry, backend and amp): a ratio of two runs that ran next to each
    other (``spec.expand`` interleaves the precisions of a seed), so the machine's
    load, which moves both, cancels. The figure ``paired_speedup_vs_fp32`` of a group
    is their median."""
    groups = group_runs(runs)
    out: dict[Subject, list[float]] = {}
    for key, members in groups.items():
        reference = groups.get(reference_key(key))
        if key.precision == REFERENCE or not reference:
            continue
        fp32 = {r.spec.seed: v for r in reference if r.status == "completed"
                and (v := run_value(r, "step_samples_per_s"))}
        ratios = [v / fp32[r.spec.seed] for r in members if r.status == "completed" and r.spec.seed in fp32
                  and (v := run_value(r, "step_samples_per_s"))]
        if ratios:
            out[key] = ratios
    return out


class Aggregate(SubjectRow):
    """One group across its seeds (determinism repeats excluded): counts, and each
    figure of :data:`FIGURES` as the median over the completed runs that have it."""

    runs: int
    completed: int
    failed: int
    skipped: int
    metric: str | None = None
    higher_is_better: bool | None = None
    final_metric: float | None = None
    final_metric_std: float | None = Field(default=None, description="spread of final_metric over the seeds")
    target: float | None = None
    target_reached: str | None = Field(default=None, description="'k/n' seeds that reached the target")
    steps_to_target: float | None = None
    time_to_target_s: float | None = Field(default=None, description="median over the seeds that reached the target")
    samples_per_s: float | None = None
    step_samples_per_s: float | None = None
    speedup_vs_fp32: float | None = Field(
        default=None, description="measured: samples_per_s / FP32's samples_per_s of the same entry, backend and amp "
        "(the capability probe's ratio is a matmul's, not the workload's)")
    paired_speedup_vs_fp32: float | None = Field(
        default=None, description="median over seeds of the run's step_samples_per_s over FP32's run of the same "
        "seed, which ran next to it: the machine's load cancels (aggregate.paired_speedups)")
    flops_per_step: float | None = None
    mfu: float | None = None
    data_share: float | None = None
    peak_memory_bytes: float | None = None
    energy_j_per_sample: float | None = None
    accelerated: bool = True
    capability_note: str = ""
    comparability: str | None = Field(
        default=None, description="why this row's figures must not be read against FP32's, e.g. "
        "'not comparable (capped at 30 steps)': a smaller step budget than FP32's; or its runs "
        "slowed on purpose (the suite's inject_slowdown)")


def _present(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if v is not None]


def injected(runs: Iterable[RunResult]) -> str | None:
    """The note of a group whose runs were slowed on purpose (a suite's ``inject_slowdown``)."""
    fractions = sorted({r.spec.fault.injected_slowdown for r in runs if r.spec.fault.injected_slowdown})
    if not fractions:
        return None
    return (f"slowed {'/'.join(f'{f:.0%}' for f in fractions)} on purpose (inject_slowdown: a fault "
            "injected to test a gate, not this precision's speed)")


def train_j_per_sample(r: RunResult) -> float | None:
    return ((r.telemetry or {}).get("energy") or {}).get("train_j_per_sample")


def aggregate(runs: Iterable[RunResult]) -> list[Aggregate]:
    """The table: one :class:`Aggregate` per group, in table order."""
    runs = list(runs)
    capped = capped_groups(runs)
    rows: list[Aggregate] = []
    for key, g in group_runs(runs).items():
        done = [r for r in g if r.status == "completed"]
        metrics = _present(r.final_metric for r in done)
        reached = [r for r in done if r.target_reached is not None]
        first = g[0]
        rows.append(Aggregate.of(
            key, runs=len(g), completed=len(done),
            failed=sum(r.status == "failed" for r in g), skipped=sum(r.status == "skipped" for r in g),
            metric=first.metric, higher_is_better=first.higher_is_better,
            final_metric_std=statistics.stdev(metrics) if len(metrics) > 1 else None,
            target=first.spec.target,
            target_reached=f"{sum(bool(r.target_reached) for r in reached)}/{len(reached)}" if reached else None,
            accelerated=all(r.accelerated for r in g), capability_note=first.capability_note,
            comparability="; ".join(filter(None, [not_comparable(capped[key]) if key in capped else None,
                                                  injected(g)])) or None,
            **{name: median_value(done, name) for name in FIGURES},
        ))
    speeds = {row.key: row.samples_per_s for row in rows if row.precision == REFERENCE}
    for row in rows:
        base = speeds.get(reference_key(row.key))
        if base and row.samples_per_s:
            row.speedup_vs_fp32 = row.samples_per_s / base
    by_key = {row.key: row for row in rows}
    for key, ratios in paired_speedups(runs).items():
        by_key[key].paired_speedup_vs_fp32 = statistics.median(ratios)
    return rows
