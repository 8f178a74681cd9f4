"""The comparison: a candidate source against a baseline source, as a GateResult.

:func:`compare` checks that the two sides can be compared at all (runs on
both, the same suite, a subject in common), pairs their subjects, compares
every enabled metric of every pair (:mod:`ampcert.gate.metrics`), the verdicts
and the failed runs (:mod:`ampcert.gate.verdicts`), and collects the
regressions and the notes. The status is FAIL where there is any regression.
"""

from __future__ import annotations

import zlib
from collections import defaultdict

import numpy as np

from ampcert.errors import UserError
from ampcert.gate.metrics import compare_metric
from ampcert.gate.result import GateResult, MetricComparison, RunFailures
from ampcert.gate.settings import GateConfig, load_gate
from ampcert.gate.sources import Source, describe, stack_differences
from ampcert.gate.subjects import group_runs, match_subjects
from ampcert.gate.verdicts import compare_failures, compare_verdicts
from ampcert.vocabulary import Status


def _group_na(comparisons: list[MetricComparison]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for c in comparisons:
        if c.status == "N/A":
            out[c.summary].append(f"{c.metric} of {c.subject}")
    return {why: (rows if len(rows) <= 2 else [c.split(" of ")[0] + f" ({len(rows)} subjects)" for c in rows[:1]])
            for why, rows in out.items()}


def compare(baseline: Source, candidate: Source, cfg: GateConfig | None = None) -> GateResult:
    """Gate ``candidate`` against ``baseline``; UserError where they cannot be compared."""
    cfg = cfg or load_gate()
    if not baseline.runs:
        raise UserError(f"{baseline.path}: no run results to compare (baseline)")
    if not candidate.runs:
        raise UserError(f"{candidate.path}: no run results to compare (candidate)")
    if baseline.suite_name != candidate.suite_name:
        raise UserError(f"suites differ: baseline {baseline.path} is suite {baseline.suite_name!r}, "
                        f"candidate {candidate.path} is suite {candidate.suite_name!r}; "
                        "compare results of the same suite")
    by_b, by_c = group_runs(baseline.runs), group_runs(candidate.runs)
    pairs, only_b, only_c, notes = match_subjects(by_b, by_c)
    if not pairs:
        def names(keys):
            return ", ".join(sorted({f"{k.workload}/{k.backend}/{k.precision}" for k in keys})) or "none"

        raise UserError(f"no common (workload, backend, precision) between baseline {baseline.path} "
                        f"({names(only_b)}) and candidate {candidate.path} ({names(only_c)})")
    if baseline.suite_sha256 and candidate.suite_sha256 and baseline.suite_sha256 != candidate.suite_sha256:
        notes.append(f"suite {baseline.suite_name!r} differs between the two (sha256 "
                     f"{baseline.suite_sha256[:12]} vs {candidate.suite_sha256[:12]}): common subjects compared")
    for k in only_b:
        notes.append(f"{k}: only in the baseline (not compared)")
    for k in only_c:
        notes.append(f"{k}: only in the candidate (not compared)")
    changed = stack_differences(baseline, candidate)
    if changed:
        notes.append(f"environment differs: {'; '.join(changed)}: the two sides ran different software")
    bi, ci = describe(baseline), describe(candidate)
    if bi.devices != ci.devices:
        notes.append(f"devices differ: baseline {', '.join(bi.devices)}; candidate {', '.join(ci.devices)}: "
                     "speed, memory and energy compare different hardware")

    comparisons: list[MetricComparison] = []
    failures: list[RunFailures] = []
    for subject, ck in pairs:
        cand_subject = None if ck == subject else ck
        for metric, mg in cfg.metrics.items():
            if not mg.enabled:
                continue
            # one random stream per (subject, metric): a row does not depend on which others exist
            rng = np.random.default_rng([cfg.seed, zlib.crc32(f"{subject}|{metric}".encode())])
            row = compare_metric(metric, mg, cfg, subject, cand_subject, by_b[subject], by_c[ck], rng)
            if row is not None:
                comparisons.append(row)
        f = compare_failures(by_b[subject], by_c[ck], subject, cfg)
        if f is not None:
            failures.append(f)
    for why, rows in _group_na(comparisons).items():
        notes.append(f"{', '.join(rows)}: not compared, {why}")
    verdicts = compare_verdicts(baseline.certificate, candidate.certificate, pairs, cfg, notes)

    regressions = [f"{c.subject}: {c.metric} {c.summary}" for c in comparisons if c.status == "REGRESSION"]
    regressions += [f"{v.subject}: {'rule ' + v.rule if v.rule else 'verdict'} {v.baseline} -> {v.candidate}"
                    + (f": {v.summary}" if v.rule else "") for v in verdicts if v.regression]
    regressions += [f"{f.subject}: {f.candidate_failed}/{f.runs} run(s) failed (baseline {f.baseline_failed}): "
                    f"{'; '.join(f.reasons)}" for f in failures if f.regression]
    return GateResult(
        status=Status.FAIL if regressions else Status.PASS, regressions=regressions, baseline=bi, candidate=ci,
        gate={"name": cfg.name, "source": cfg.source, "sha256": cfg.sha256},
        comparisons=comparisons, verdict_changes=verdicts, run_failures=failures, notes=notes,
    )
