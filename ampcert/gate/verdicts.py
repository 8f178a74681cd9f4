"""Regressions that are not measurements: verdict changes and failed runs.

Independently of speed and accuracy, a subject or a required rule whose
certificate verdict FAILs now but did not in the baseline is a regression
(``verdicts.new_fail``), and so, optionally, is a PASS that became
INCONCLUSIVE (``verdicts.new_inconclusive``). More failed runs in the
candidate than in the baseline are one too (``failed_runs``).
"""

from __future__ import annotations

from ampcert.certify.checks import Certificate
from ampcert.gate.result import RunFailures, VerdictChange
from ampcert.gate.settings import GateConfig
from ampcert.results import RunResult
from ampcert.vocabulary import Status, Subject


def compare_verdicts(base: Certificate | None, cand: Certificate | None, pairs: list[tuple[Subject, Subject]],
                     cfg: GateConfig, notes: list[str]) -> list[VerdictChange]:
    """The verdicts that changed, per matched subject and required rule (``notes`` gets what is not compared)."""
    if base is None and cand is None:
        return []
    if cand is None:
        notes.append("the baseline is certified but the candidate is not: verdicts not compared "
                     "(run `ampcert certify DIR` on the candidate)")
        return []
    if base is None:
        notes.append("the candidate is certified but the baseline is not: verdicts not compared")
        return []
    if base.rules.get("sha256") != cand.rules.get("sha256"):
        notes.append(f"rule packs differ: baseline {base.rules.get('name')} ({str(base.rules.get('sha256'))[:12]}), "
                     f"candidate {cand.rules.get('name')} ({str(cand.rules.get('sha256'))[:12]})")

    def regressed(b: Status | None, c: Status | None) -> bool:
        if c == Status.FAIL and b != Status.FAIL:
            return cfg.verdicts.new_fail
        return c == Status.INCONCLUSIVE and b == Status.PASS and cfg.verdicts.new_inconclusive

    b_subj = {s.subject: s for s in base.subjects}
    c_subj = {s.subject: s for s in cand.subjects}
    b_rule = {(v.subject, v.rule): v for v in base.verdicts}
    changes = []
    for bk, ck in pairs:
        if bk not in b_subj and ck not in c_subj:
            continue
        subject = bk
        b = b_subj[bk].status if bk in b_subj else None
        c = c_subj[ck].status if ck in c_subj else None
        if b == c:
            continue
        reg = regressed(b, c)
        failed = ", ".join(c_subj[ck].failed) if ck in c_subj and c_subj[ck].failed else ""
        changes.append(VerdictChange(subject=subject, rule=None, baseline=b, candidate=c, regression=reg,
                                     summary=f"certificate {b} -> {c}" + (f" (failed: {failed})" if failed else "")))
        if c is not None and b == Status.PASS and c == Status.INCONCLUSIVE and not reg:
            notes.append(f"{subject}: verdict PASS -> INCONCLUSIVE ({', '.join(c_subj[ck].inconclusive)})")
        for v in cand.verdicts:
            if v.subject != ck or not v.required:
                continue
            bv = b_rule.get((bk, v.rule))
            if bv is not None and bv.status == v.status:
                continue
            b_status = bv.status if bv is not None else None
            changes.append(VerdictChange(subject=subject, rule=v.rule, baseline=b_status, candidate=v.status,
                                         regression=regressed(b_status, v.status), summary=v.summary))
    return changes


def compare_failures(base: list[RunResult], cand: list[RunResult], subject: Subject,
                     cfg: GateConfig) -> RunFailures | None:
    """The subject's failed runs on either side; None where no run failed."""
    bf = [r for r in base if r.status == "failed"]
    cf = [r for r in cand if r.status == "failed"]
    if not bf and not cf:
        return None
    return RunFailures(subject=subject, baseline_failed=len(bf), candidate_failed=len(cf), runs=len(cand),
                       reasons=[f"seed {r.spec.seed}: {r.reason}" for r in cf],
                       regression=cfg.failed_runs and len(cf) > len(bf))
