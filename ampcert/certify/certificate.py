"""The certificate: its verdicts (one per rule and subject), each subject's, and the
certificate's own status, formed from them and from what was never judged; and its text.

The checks (:mod:`ampcert.certify.checks`) decide each verdict; this module only
composes them: a subject is the worst of its required verdicts, the certificate the
worst subject, and INCOMPLETE where planned runs have no readable result.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ampcert.vocabulary import Status, Subject, worst

if TYPE_CHECKING:
    from ampcert.certify.rules import RulePack

__all__ = ["Certificate", "SubjectVerdict", "Verdict", "certificate_of", "format_certificate", "missing_line"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# (No docstrings on the models below: pydantic would write them into report.v1.schema.json.)

# One rule's finding on one subject (verdicts.json's ``verdicts``).
class Verdict(_Model):
    rule: str
    check: str
    subject: Subject
    status: Status
    required: bool
    summary: str = Field(description="one line: the finding and the numbers behind it")
    evidence: dict[str, Any] = Field(default_factory=dict)


# A subject's verdict: the worst of its required rules' (verdicts.json's ``subjects``).
class SubjectVerdict(_Model):
    subject: Subject
    status: Status
    failed: list[str] = Field(default_factory=list)
    inconclusive: list[str] = Field(default_factory=list)


# Every verdict of a rule pack on a folder's subjects; its status is the worst subject's,
# and INCOMPLETE (unless one FAILs) where planned runs have no readable result.
class Certificate(_Model):
    rules: dict[str, str] = Field(description="name, source and sha256 of the rule pack")
    status: Status
    subjects: list[SubjectVerdict]
    verdicts: list[Verdict]
    # Written only when set, so certificates of complete folders keep their bytes.
    missing_runs: list[str] = Field(
        default_factory=list, exclude_if=lambda v: not v,
        description="planned runs without a readable result: nothing they would have shown was judged")


def certificate_of(verdicts: list[Verdict], pack: RulePack, missing: Iterable[str] = ()) -> Certificate:
    """The certificate of ``pack``'s verdicts; ``missing``: the planned runs with no readable
    result, which make it INCOMPLETE, never PASS (a FAIL among what was judged stays FAIL)."""
    subjects = []
    for subject in sorted({v.subject for v in verdicts}):
        mine = [v for v in verdicts if v.subject == subject]
        required = [v for v in mine if v.required]
        subjects.append(SubjectVerdict(
            subject=mine[0].subject, status=worst(v.status for v in required),
            failed=[v.rule for v in required if v.status == Status.FAIL],
            inconclusive=[v.rule for v in required if v.status == Status.INCONCLUSIVE]))
    missing_runs = sorted(missing)
    status = worst([*(s.status for s in subjects), *([Status.INCOMPLETE] if missing_runs else [])])
    return Certificate(rules={"name": pack.name, "source": pack.source, "sha256": pack.sha256},
                       status=status, subjects=subjects, verdicts=verdicts, missing_runs=missing_runs)


def missing_line(cert: Certificate) -> str | None:
    """The certificate's line on planned runs without a readable result (None: there are none)."""
    if not cert.missing_runs:
        return None
    shown = ", ".join(cert.missing_runs[:5]) + (f" and {len(cert.missing_runs) - 5} more"
                                                  if len(cert.missing_runs) > 5 else "")
    return (f"  INCOMPLETE   {len(cert.missing_runs)} planned run(s) without a readable result, "
            f"never judged: {shown} (`ampcert run --resume DIR` runs them)")


def format_certificate(cert: Certificate) -> str:
    lines = [f"certificate: {cert.status}  (rules {cert.rules['name']}, sha256 {cert.rules['sha256'][:12]})"]
    if (missing := missing_line(cert)) is not None:
        lines.append(missing)
    for s in cert.subjects:
        lines.append(f"  {s.status:<12} {s.subject}")
        for v in cert.verdicts:
            if v.subject == s.subject:
                tag = "" if v.required else " (advisory)"
                lines.append(f"      {v.status:<12} {v.rule}{tag}: {v.summary}")
    return "\n".join(lines)
