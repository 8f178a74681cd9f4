"""The gate's result: what a comparison produces, and the schema of ``--json``.

One :class:`MetricComparison` per subject and metric (a row of the table),
one :class:`VerdictChange` per certificate or required rule whose verdict
changed, one :class:`RunFailures` per subject with failed runs, and a
:class:`GateResult` that holds them with the two sources and the regressions
in one line each. The field order here is the JSON's key order.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ampcert.gate.settings import GateModel, MetricName
from ampcert.vocabulary import Status, Subject

# A row's finding (a measurement's change), not a verdict: the verdicts are Status.
RowStatus = Literal["REGRESSION", "INCONCLUSIVE", "IMPROVED", "OK", "N/A"]

#: the gate's name for a :class:`~ampcert.vocabulary.Subject` (kept for code written against it)
SubjectKey = Subject


class Side(GateModel):
    value: float | None = Field(description="the median of the samples (the estimate compared)")
    runs: int
    samples: int
    per_run: list[float] = Field(default_factory=list, description="each run's own value (samples/s: the run's mean)")
    note: str | None = None


class MetricComparison(GateModel):
    subject: Subject
    candidate_subject: Subject | None = Field(default=None, description="set where the AMP implementation changed")
    metric: MetricName
    unit: str
    direction: Literal["higher", "lower"]
    baseline: Side
    candidate: Side
    change: float | None = Field(description="candidate vs baseline: relative (c/b - 1) or absolute (c - b), per kind")
    kind: Literal["relative", "absolute"]
    threshold: float
    alpha: float
    test: str | None = Field(description="the test that decided whether the change is significant")
    p_value: float | None = Field(default=None, description="one-sided Mann-Whitney U p for 'the candidate is worse'")
    ci: list[float] | None = Field(default=None, description="bootstrap (1 - alpha) interval of the change")
    status: RowStatus
    summary: str


class VerdictChange(GateModel):
    subject: Subject
    rule: str | None = Field(description="a required rule's id; null for the subject's overall verdict")
    baseline: Status | None
    candidate: Status | None
    regression: bool
    summary: str


class RunFailures(GateModel):
    subject: Subject
    baseline_failed: int
    candidate_failed: int
    runs: int
    reasons: list[str]
    regression: bool


class SourceInfo(GateModel):
    path: str
    kind: str
    suite: str
    suite_sha256: str | None
    runs: int
    devices: list[str]
    certificate: Status | None = Field(description="the certificate's status, if the source has one")


class GateResult(GateModel):
    status: Literal[Status.PASS, Status.FAIL]
    regressions: list[str] = Field(description="one line per regression")
    baseline: SourceInfo
    candidate: SourceInfo
    gate: dict[str, str] = Field(description="name, source and sha256 of the gate config")
    comparisons: list[MetricComparison]
    verdict_changes: list[VerdictChange]
    run_failures: list[RunFailures]
    notes: list[str]

    @property
    def exit_code(self) -> int:
        return 1 if self.status == Status.FAIL else 0
