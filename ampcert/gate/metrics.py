"""One metric of one subject: effect, support, and the row's status.

A metric regresses only when both hold: the candidate is worse than the
baseline by more than the threshold (the effect), and the change is
significant over the repeated samples (the support), by the bootstrap
interval or the Mann-Whitney U test the gate settings name. A large change
without support is INCONCLUSIVE, never a failure, and with fewer than
``min_runs`` runs a side nothing is significant. :func:`compare_metric` makes
that decision and words it for the table (the test, the evidence, the verdict).
"""

from __future__ import annotations

import math

import numpy as np

from ampcert.gate.output import fmt_change, fmt_threshold
from ampcert.gate.result import MetricComparison, RowStatus, Side
from ampcert.gate.samples import Samples, collect_samples
from ampcert.gate.settings import GateConfig, MetricGate
from ampcert.gate.significance import bootstrap_medians, change, mannwhitney_p
from ampcert.results import RunResult
from ampcert.steady_state import window_for
from ampcert.vocabulary import Subject

UNITS = {"samples_per_s": "samples/s", "step_samples_per_s": "samples/s", "time_to_target_s": "s", "peak_memory_bytes": "bytes",
         "energy_j_per_sample": "J/sample"}


def compare_metric(metric: str, mg: MetricGate, cfg: GateConfig, subject: Subject,
                   cand_subject: Subject | None, base: list[RunResult], cand: list[RunResult],
                   rng: np.random.Generator) -> MetricComparison | None:
    """The row for ``metric`` of one subject; None where the metric does not apply (no target to reach)."""
    if metric == "time_to_target_s" and not any(r.target is not None for r in base + cand):
        return None  # fixed step budgets: no target to reach
    known = [r for r in base + cand if r.higher_is_better is not None]
    unit = UNITS.get(metric) or next((r.metric for r in known if r.metric), "")
    if mg.direction == "workload":
        higher = known[0].higher_is_better if known else True
    else:
        higher = mg.direction == "higher"
    alpha = mg.alpha or cfg.alpha
    threshold = mg.threshold_for(subject.workload)
    bs, cs = collect_samples(metric, base), collect_samples(metric, cand)

    def side(s: Samples) -> Side:
        return Side(value=float(np.median(s.per_run)) if s.per_run else None, runs=len(s.per_run),
                    samples=s.n_samples, per_run=[float(v) for v in s.per_run],
                    note=s.missing or s.note)

    row = dict(subject=subject, candidate_subject=cand_subject, metric=metric, unit=unit,
               direction="higher" if higher else "lower", baseline=side(bs), candidate=side(cs),
               kind=mg.kind, threshold=threshold, alpha=alpha)
    if not bs.per_run or not cs.per_run:
        if not bs.per_run and not cs.per_run and bs.missing == cs.missing:
            why = f"on neither side: {bs.missing}"
        else:
            why = "; ".join(f"{name}: {x.missing}" for name, x in (("baseline", bs), ("candidate", cs))
                            if not x.per_run)
        return MetricComparison(**row, change=None, test=None, status="N/A", summary=why)
    b_est, c_est = row["baseline"].value, row["candidate"].value
    if mg.kind == "relative" and b_est == 0:
        return MetricComparison(**row, change=None, test=None, status="N/A",
                                summary="baseline value is 0: no relative change")
    delta = float(change(b_est, c_est, mg.kind))
    # grouped (per-step) samples only where both sides have them
    grouped = bs.groups is not None and cs.groups is not None
    b_groups = bs.groups if grouped else [np.array([v]) for v in bs.per_run]
    c_groups = cs.groups if grouped else [np.array([v]) for v in cs.per_run]
    test = mg.test
    if test == "auto":
        enough = min(len(bs.per_run), len(cs.per_run)) >= cfg.mannwhitney_min_runs
        test = "bootstrap" if grouped or not enough else "mannwhitney"
    # bootstrap interval of the change (always reported; decides with test=bootstrap)
    # steps are drawn in windows, as each run's own interval draws them (ampcert.steady_state)
    window = window_for(min(len(g) for g in b_groups + c_groups)) if grouped else 1
    level = f"runs x {window}-step windows" if grouped else "runs"
    boots = change(bootstrap_medians(b_groups, cfg.bootstrap_resamples, rng, window),
                   bootstrap_medians(c_groups, cfg.bootstrap_resamples, rng, window), mg.kind)
    boots = boots[np.isfinite(boots)]
    ci = [float(np.percentile(boots, 100 * alpha / 2)), float(np.percentile(boots, 100 * (1 - alpha / 2)))] \
        if len(boots) else None
    b_flat = np.concatenate(b_groups)
    c_flat = np.concatenate(c_groups)
    p_worse = mannwhitney_p(c_flat, b_flat, "less" if higher else "greater")
    p_better = mannwhitney_p(c_flat, b_flat, "greater" if higher else "less")
    if test == "mannwhitney":
        label = f"Mann-Whitney U, one-sided, over {'steps' if grouped else 'runs'} (n={len(b_flat)} vs {len(c_flat)})"
        worse_sig, better_sig = p_worse < alpha, p_better < alpha
        evidence = f"p={p_worse:.3g}"
    else:
        label = (f"bootstrap {100 * (1 - alpha):.0f}% CI of the change in medians, over {level} "
                 f"({len(bs.per_run)} vs {len(cs.per_run)} runs, {cfg.bootstrap_resamples} resamples)")
        lo, hi = ci if ci else (-math.inf, math.inf)
        worse_sig = (hi < 0) if higher else (lo > 0)
        better_sig = (lo > 0) if higher else (hi < 0)
        evidence = f"CI [{fmt_change(lo, mg.kind)}, {fmt_change(hi, mg.kind)}]"
    few = min(len(bs.per_run), len(cs.per_run)) < cfg.min_runs
    if few:  # two runs cannot show how much runs vary: no interval over them is trustworthy
        worse_sig = better_sig = False
        label = (f"none: {len(bs.per_run)} vs {len(cs.per_run)} runs, support needs >= {cfg.min_runs} "
                 "per side (interval shown for information)")
        evidence += f", {len(bs.per_run)} vs {len(cs.per_run)} runs (support needs >= {cfg.min_runs} per side)"
    worse = delta < 0 if higher else delta > 0
    beyond = abs(delta) > threshold
    if worse and beyond and worse_sig:
        status: RowStatus = "REGRESSION"
        verdict = "worse beyond the threshold, significant"
    elif worse and beyond:
        status = "INCONCLUSIVE"
        verdict = ("worse beyond the threshold, too few runs to tell it from noise" if few else
                   "worse beyond the threshold, but not significant (noise cannot be ruled out)")
    elif not worse and beyond and better_sig:
        status, verdict = "IMPROVED", "better beyond the threshold, significant"
    else:
        status = "OK"
        verdict = "within the threshold" if not beyond else "better, not significant"
    summary = (f"{fmt_change(delta, mg.kind)} (threshold {fmt_threshold(threshold, mg.kind)}), "
               f"{evidence}: {verdict}")
    notes = [n for n in (bs.note, cs.note) if n]
    if notes:
        summary += f" [{'; '.join(dict.fromkeys(notes))}]"
    return MetricComparison(**row, change=delta, test=label, p_value=p_worse, ci=ci, status=status,
                            summary=summary)
