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

from pydantic import BaseModel, ConfigDict, Field

from ampcert.results import RunResult
from ampcert.vocabulary import Subject

#: what a table row and a certificate subject speak about (the name from before there was :class:`Subject`)
GroupKey = Subject

# Tables list the reference first, then the low precisions widest-exponent first.
TABLE_ORDER = ("fp32", "bf16", "fp16", "fp8", "mxfp8")
REFERENCE = "fp32"


def group_key(r: RunResult) -> Subject:
    """The subject a run belongs to: its entry's label, backend, amp and precision."""
    return Subject(r.spec.label, r.spec.backend, r.spec.amp, r.spec.precision)


def reference_key(key: Subject) -> Subject:
    """The FP32 group a low-precision group is compared with: same entry, backend and amp."""
    return key.with_precision(REFERENCE)


def is_repeat(r: RunResult) -> bool:
    """A determinism rerun of a seed already in the group."""
    return bool(getattr(r.spec, "repeat", 0))


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


class Aggregate(SubjectRow):
    """One group across its seeds (determinism repeats excluded): counts and means of the completed runs."""

    runs: int
    completed: int
    failed: int
    skipped: int
    metric: str | None = None
    higher_is_better: bool | None = None
    final_metric_mean: float | None = None
    final_metric_std: float | None = None
    target: float | None = None
    target_reached: str | None = Field(default=None, description="'k/n' seeds that reached the target")
    steps_to_target_mean: float | None = None
    time_to_target_s_mean: float | None = None
    samples_per_s_mean: float | None = None
    speedup_vs_fp32: float | None = None
    flops_per_step: float | None = None
    mfu_mean: float | None = None
    data_share_mean: float | None = None
    peak_memory_bytes_mean: float | None = None
    j_per_sample_mean: float | None = None
    accelerated: bool = True
    capability_note: str = ""
    comparability: str | None = Field(
        default=None, description="why this row's metric must not be read against FP32's, e.g. "
        "'not comparable (capped at 30 steps)': a smaller step budget than FP32's")


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _present(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if v is not None]


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
            final_metric_mean=_mean(metrics),
            final_metric_std=statistics.stdev(metrics) if len(metrics) > 1 else None,
            target=first.spec.target,
            target_reached=f"{sum(bool(r.target_reached) for r in reached)}/{len(reached)}" if reached else None,
            steps_to_target_mean=_mean(_present(r.steps_to_target for r in done)),
            time_to_target_s_mean=_mean(_present(r.time_to_target_s for r in done)),
            samples_per_s_mean=_mean([r.samples_per_s for r in done if r.samples_per_s]),
            flops_per_step=_mean(_present(r.flops_per_step for r in done)),
            mfu_mean=_mean(_present(r.mfu for r in done)),
            data_share_mean=_mean(_present(r.data_share for r in done)),
            peak_memory_bytes_mean=_mean(_present(r.peak_memory.value for r in done if r.peak_memory)),
            j_per_sample_mean=_mean(_present(train_j_per_sample(r) for r in done)),
            accelerated=all(r.accelerated for r in g), capability_note=first.capability_note,
            comparability=not_comparable(capped[key]) if key in capped else None,
        ))
    speeds = {row.key: row.samples_per_s_mean for row in rows if row.precision == REFERENCE}
    for row in rows:
        base = speeds.get(reference_key(row.key))
        if base and row.samples_per_s_mean:
            row.speedup_vs_fp32 = row.samples_per_s_mean / base
    return rows
