"""Run results in, verdicts out: one verdict per (rule, subject).

A *subject* is what a certificate speaks about: one workload entry (its
label), backend, AMP implementation and precision, across its seeds. Its FP32
*reference* is the FP32 runs of the same entry, backend and AMP. Each check
returns PASS, FAIL or INCONCLUSIVE with its evidence (the numbers, the test,
the sample sizes) and a one-line summary; a check that does not apply to a
subject (loss-scaler rules on a run without a scaler) returns nothing.

INCONCLUSIVE is never a quiet PASS: too few seeds, a reference that did not
converge, budgets that differ (steps capped on an unaccelerated precision)
or an interval that straddles the margin all say so, and a certificate with
a required INCONCLUSIVE is itself INCONCLUSIVE.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar, cast

from ampcert.aggregate import group_runs, is_repeat, not_comparable, reference_key
from ampcert.amp.precision import REFERENCE, Precision
from ampcert.certify import rules as R
from ampcert.certify.certificate import (  # noqa: F401 - the certificate's types, re-exported where they lived
    Certificate,
    SubjectVerdict,
    Verdict,
    certificate_of,
    format_certificate,
)
from ampcert.certify.stats import olympic_mean, paired_tost
from ampcert.memory import LEVEL, MemoryFit, fit_sweep
from ampcert.results import RunResult
from ampcert.vocabulary import Status, Subject, worst

__all__ = ["CHECK_FUNCTIONS", "CHECK_SPECS", "Certificate", "CheckSpec", "Status", "Subject", "SubjectVerdict",
           "Verdict", "evaluate", "format_certificate", "judges", "worst"]


# --------------------------------------------------------------------------- grouping


class _Group:
    """The runs of one subject and of its FP32 reference."""

    def __init__(self, subject: Subject, runs: list[RunResult], ref: list[RunResult],
                 siblings: dict[str, list[RunResult]] | None = None):
        self.subject = subject
        self.all = [r for r in runs if r.status != "skipped"]
        self.primary = [r for r in self.all if not is_repeat(r)]
        self.ref = [r for r in ref if r.status != "skipped" and not is_repeat(r)]
        self.workload = runs[0].spec.workload
        # The other precisions of the same entry, backend and amp (a rule may compare with BF16).
        self._siblings = siblings or {}
        # The memory sweep's fit of this subject, with its saving against FP32's (None: not swept).
        self.memory: MemoryFit | None = None

    def reference(self, precision: Precision) -> list[RunResult]:
        """The primary runs of ``precision`` that this subject is compared with."""
        if precision == REFERENCE:
            return self.ref
        return [r for r in self._siblings.get(precision, []) if r.status != "skipped" and not is_repeat(r)]

    def completed(self, runs: list[RunResult] | None = None) -> list[RunResult]:
        return [r for r in (self.primary if runs is None else runs) if r.status == "completed"]

    def by_seed(self, runs: list[RunResult]) -> dict[int, RunResult]:
        return {r.spec.seed: r for r in runs}


def _first_difference(a: list[Any], b: list[Any]) -> int | None:
    """The 0-based index where two series first differ (where the shorter ends, if it is the
    other's start); None where they are the same."""
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return first


def _repeat(r: RunResult) -> int:
    return getattr(r.spec, "repeat", 0) or 0


def _verdict(rule: R.RuleModel, group: _Group, status: Status, summary: str, required: bool | None = None,
             **evidence: Any) -> Verdict:
    return Verdict(rule=rule.id, check=rule.check, subject=group.subject, status=status,
                   required=rule.required if required is None else required, summary=summary,
                   evidence=evidence)


def _failed(runs: list[RunResult]) -> list[dict[str, Any]]:
    return [{"run_id": r.run_id, "seed": r.spec.seed, "reason": r.reason} for r in runs if r.status == "failed"]


def _budgets_differ(group: _Group) -> list[str]:
    """The subject's runs trained on another budget than its FP32 reference's (capped);
    none where there is no FP32 run to differ from (see :func:`_no_fp32`)."""
    if not group.ref:
        return []
    ref_budgets = {r.spec.budget_key() for r in group.ref}
    return [r.run_id for r in group.primary if r.spec.budget_key() not in ref_budgets]


def _no_fp32(rule: R.RuleModel, group: _Group) -> Verdict:
    """INCONCLUSIVE for a check that compares with FP32 where the entry ran none (nothing
    was capped: there is nothing to compare with)."""
    return _verdict(rule, group, Status.INCONCLUSIVE, "no fp32 runs of this entry to compare with: add fp32 "
                    "to the suite's precisions", reference="fp32")


def _capped_summary(group: _Group, capped: list[str], why: str) -> str:
    """The INCONCLUSIVE text for a group trained on a smaller budget than FP32's, in the
    words the tables use (ampcert.aggregate.not_comparable)."""
    cap = max(r.spec.step_limit or 0 for r in group.primary if r.run_id in capped)
    return f"{not_comparable(cap)}: training budget differs from FP32's (steps capped on an unaccelerated precision){why}"


# --------------------------------------------------------------------------- the registry

CheckFunction = Callable[[Any, _Group], "Verdict | None"]
_F = TypeVar("_F", bound=Callable[..., "Verdict | None"])


class CheckSpec(NamedTuple):
    """One check, declared once: the id a rule pack names (the model's ``check``
    Literal), the model of its parameters (certify/rules.py) and the function that
    judges one subject (here, registered with :func:`judges`)."""

    id: str
    rule_model: type[R.RuleModel]
    function: CheckFunction


#: every check by id, filled by @judges as this module is read
CHECK_SPECS: dict[str, CheckSpec] = {}


def judges(model: type[R.RuleModel]) -> Callable[[_F], _F]:
    """Register the decorated ``check_<name>(rule, group)`` as the function of ``model``'s check.

    Returns a :class:`Verdict` with its evidence, or None where the check does not
    apply to the subject. Importing this module fails if a rule model has no function."""

    def register(function: _F) -> _F:
        if not model.check_id:
            raise TypeError(f"{model.__name__} declares no check (a one-value Literal `check` field)")
        if model.check_id in CHECK_SPECS:
            raise TypeError(f"check {model.check_id!r} is judged twice: {CHECK_SPECS[model.check_id].function.__name__} "
                            f"and {function.__name__}")
        CHECK_SPECS[model.check_id] = CheckSpec(model.check_id, model, function)
        return function

    return register


# --------------------------------------------------------------------------- checks


@judges(R.AccuracyParity)
def check_accuracy_parity(rule: R.AccuracyParity, g: _Group) -> Verdict | None:
    if rule.reference == g.subject.precision:
        return None  # a precision is not compared with itself
    margin = rule.threshold(g.subject.workload, g.workload)
    ref_runs = g.reference(rule.reference)
    if rule.reference != REFERENCE and not ref_runs:
        return _verdict(rule, g, Status.INCONCLUSIVE, f"no {rule.reference} runs of this entry to compare with: "
                        f"add {rule.reference} to the suite's precisions", reference=rule.reference)
    failed = _failed(g.primary)
    if failed:
        f = failed[0]
        return _verdict(rule, g, Status.FAIL, f"{len(failed)} run(s) failed, e.g. seed {f['seed']}: {f['reason']}",
                        failed_runs=failed, margin=margin)
    if not ref_runs:
        return _no_fp32(rule, g)
    capped = _budgets_differ(g)
    if capped:
        return _verdict(rule, g, Status.INCONCLUSIVE, _capped_summary(g, capped, ": final metrics are not comparable"),
                        runs=capped)
    low, ref = g.by_seed(g.completed()), g.by_seed(g.completed(ref_runs))
    seeds = sorted(set(low) & set(ref))
    pairs = {s: (low[s].final_metric, ref[s].final_metric) for s in seeds}
    if len(seeds) < rule.min_seeds:
        return _verdict(rule, g, Status.INCONCLUSIVE, f"{len(seeds)} seed(s) with both precisions completed; the "
                        f"rule needs at least {rule.min_seeds}", n=len(seeds), min_seeds=rule.min_seeds,
                        pairs=pairs, margin=margin, reference=rule.reference)
    # completed runs: their final metrics are set
    t = paired_tost([cast(float, pairs[s][0]) for s in seeds], [cast(float, pairs[s][1]) for s in seeds],
                    margin, rule.alpha)
    ci = f"{100 * (1 - 2 * rule.alpha):.0f}% CI [{t.ci_low:+.4f}, {t.ci_high:+.4f}]"
    text = f"mean difference {t.mean_diff:+.4f} over {t.n} seeds, {ci}, margin ±{margin:g}, TOST p={t.p_value:.3g}"
    if rule.reference != REFERENCE:
        text = f"vs {rule.reference}: {text}"
    status = Status.PASS if t.equivalent else Status.FAIL if t.outside else Status.INCONCLUSIVE
    if status == Status.INCONCLUSIVE:
        text += " (the interval crosses the margin: more seeds would decide)"
    return _verdict(rule, g, status, text, tost=t.as_dict(), pairs=pairs, metric=g.completed()[0].metric,
                    reference=rule.reference)


@judges(R.Convergence)
def check_convergence(rule: R.Convergence, g: _Group) -> Verdict | None:
    if not g.primary or g.primary[0].spec.target is None:
        return None  # a fixed step budget has no target to converge to
    limit = rule.threshold(g.subject.workload, g.workload)
    if not g.ref:
        return _no_fp32(rule, g)
    capped = _budgets_differ(g)
    if capped:
        return _verdict(rule, g, Status.INCONCLUSIVE, _capped_summary(g, capped, ""), runs=capped)
    ref = g.completed(g.ref)
    missed_ref = [r.spec.seed for r in g.ref if not (r.status == "completed" and r.target_reached)]
    if missed_ref or not ref:
        return _verdict(rule, g, Status.INCONCLUSIVE, f"the FP32 reference did not reach the target for seeds "
                        f"{missed_ref or 'all'}", reference_missed=missed_ref)
    missed = [{"seed": r.spec.seed, "status": r.status, "reason": r.reason, "final_metric": r.final_metric}
              for r in g.primary if not (r.status == "completed" and r.target_reached)]
    if missed:
        return _verdict(rule, g, Status.FAIL, f"{len(missed)} of {len(g.primary)} seed(s) did not reach the target "
                        f"{g.primary[0].spec.target:g}", missed=missed)
    if len(g.primary) < rule.min_seeds:
        return _verdict(rule, g, Status.INCONCLUSIVE, f"{len(g.primary)} seed(s); the rule needs at least "
                        f"{rule.min_seeds}", n=len(g.primary), min_seeds=rule.min_seeds)
    low_s = [cast(int, r.samples_to_target) for r in g.primary]  # every run reached the target (above)
    ref_s = [cast(int, r.samples_to_target) for r in ref]
    ratio = olympic_mean(low_s) / olympic_mean(ref_s)
    status = Status.PASS if ratio <= limit else Status.FAIL
    return _verdict(rule, g, status, f"samples-to-target {olympic_mean(low_s):.0f} vs FP32 "
                    f"{olympic_mean(ref_s):.0f} (olympic means): ratio {ratio:.3f}, limit {limit:g}",
                    ratio=ratio, max_ratio=limit, samples_to_target=low_s, reference_samples_to_target=ref_s,
                    score="olympic mean (drop fastest and slowest with >= 3 seeds)")


@judges(R.Determinism)
def check_determinism(rule: R.Determinism, g: _Group) -> Verdict | None:
    repeats = [r for r in g.all if _repeat(r) > 0]
    if not repeats:
        return _verdict(rule, g, Status.INCONCLUSIVE, "no repeated seed was run (a suite with `certify:` schedules "
                        "them)", repeats_found=0)
    originals = g.by_seed(g.primary)
    compared, problems, unjudged = [], [], []
    for rep in repeats:
        orig = originals.get(rep.spec.seed)
        if orig is None:
            continue
        entry: dict[str, Any] = {"seed": rep.spec.seed, "repeat": _repeat(rep), "run_ids": [orig.run_id, rep.run_id],
                 "weights_sha256": [orig.weights_sha256, rep.weights_sha256],
                 "deterministic_algorithms": [orig.determinism.get("deterministic_algorithms"),
                                              rep.determinism.get("deterministic_algorithms")]}
        if orig.status != rep.status:
            problems.append(f"seed {rep.spec.seed}: statuses differ ({orig.status} vs {rep.status})")
        elif orig.status != "completed":
            # Two failures agree on nothing that was computed: there is nothing to compare.
            unjudged.append(f"seed {rep.spec.seed}: the run and its repeat both {orig.status}")
            continue
        elif orig.status == "completed" and orig.spec.command is not None:
            # An own job reports no loss, weights or determinism settings: its
            # evaluations, value by value, are what a repeat can be held to.
            first = _first_difference([e.value for e in orig.evals], [e.value for e in rep.evals])
            entry["first_differing_eval"] = None if first is None else first + 1
            if first is not None:
                problems.append(f"seed {rep.spec.seed}: the job's evaluations differ from eval {first + 1}")
        elif orig.status == "completed":
            first = _first_difference(orig.loss, rep.loss)
            entry["first_differing_step"] = None if first is None else first + 1
            if first is not None:
                problems.append(f"seed {rep.spec.seed}: loss differs from step {first + 1}")
            if orig.weights_sha256 != rep.weights_sha256:
                problems.append(f"seed {rep.spec.seed}: final weights differ")
            if not all(entry["deterministic_algorithms"]):
                problems.append(f"seed {rep.spec.seed}: deterministic algorithms not enabled/recorded")
        compared.append(entry)
    if problems:
        return _verdict(rule, g, Status.FAIL, "; ".join(problems), compared=compared)
    if unjudged:
        return _verdict(rule, g, Status.INCONCLUSIVE, "; ".join(unjudged) + ": nothing computed to compare",
                        compared=compared)
    if not compared:
        return _verdict(rule, g, Status.INCONCLUSIVE, "repeats found, but not of a seed that ran once normally")
    if all(r.spec.command is not None for r in repeats):
        return _verdict(rule, g, Status.PASS, f"{len(compared)} repeated run(s): the job's evaluations identical "
                        "bit for bit (an own job reports no loss or weights to compare)", compared=compared)
    return _verdict(rule, g, Status.PASS, f"{len(compared)} repeated run(s): loss trajectories and final-weight "
                    "digests identical bit for bit", compared=compared)


@judges(R.ResumeEquivalence)
def check_resume_equivalence(rule: R.ResumeEquivalence, g: _Group) -> Verdict | None:
    if g.all and all(r.spec.command is not None for r in g.all):
        return None  # an own job checkpoints itself, if at all: ampcert stops and resumes its own training
    resumed = [r for r in g.all if r.spec.resume.resume_after_window == rule.after_window]
    if not resumed:
        return _verdict(rule, g, Status.INCONCLUSIVE, f"no run resumed after window {rule.after_window} "
                        "(a suite with `certify:` schedules one)")
    originals = g.by_seed(g.primary)
    compared, problems, unjudged = [], [], []
    for run in resumed:
        orig = originals.get(run.spec.seed)
        at = run.determinism.get("resumed_after_step")
        entry: dict[str, Any] = {"seed": run.spec.seed, "resumed_after_step": at,
                                 "run_ids": [orig.run_id if orig else None, run.run_id]}
        if orig is None or orig.status != "completed" or run.status != "completed":
            unjudged.append(f"seed {run.spec.seed}: " + (
                "no uninterrupted run" if orig is None else f"the run {orig.status}, the resumed run {run.status}"
                + (f" ({run.reason})" if run.reason else "")))
            continue
        if at is None:
            unjudged.append(f"seed {run.spec.seed}: training ended before window {rule.after_window}, "
                            "so nothing was resumed")
            continue
        first = _first_difference(orig.loss, run.loss)
        same_weights = orig.weights_sha256 == run.weights_sha256
        delta = abs(cast(float, run.final_metric) - cast(float, orig.final_metric))
        entry.update(first_differing_step=None if first is None else first + 1, same_weights=same_weights,
                     metric_delta=delta)
        compared.append(entry)
        if first is None and same_weights:
            continue
        where = (f"loss differs from step {first + 1}" if first is not None else "final weights differ")
        if rule.max_metric_delta and delta <= rule.max_metric_delta:
            entry["within_tolerance"] = True
        else:
            problems.append(f"seed {run.spec.seed}: resumed after step {at}, {where}; final metric "
                            f"{delta:.4g} from the uninterrupted run's"
                            + (f" (tolerance {rule.max_metric_delta:g})" if rule.max_metric_delta else ""))
    if problems:
        return _verdict(rule, g, Status.FAIL, "; ".join(problems), compared=compared)
    if unjudged:
        return _verdict(rule, g, Status.INCONCLUSIVE, "; ".join(unjudged), compared=compared)
    steps = sorted({e["resumed_after_step"] for e in compared})
    if all(not e.get("within_tolerance") for e in compared):
        return _verdict(rule, g, Status.PASS, f"resumed from its checkpoint after step {', '.join(map(str, steps))}: "
                        "loss trajectory and final weights identical to the uninterrupted run's bit for bit",
                        compared=compared)
    return _verdict(rule, g, Status.PASS, f"resumed after step {', '.join(map(str, steps))}: final metric within "
                    f"the declared {rule.max_metric_delta:g} of the uninterrupted run's", compared=compared)


@judges(R.SeedSpread)
def check_seed_spread(rule: R.SeedSpread, g: _Group) -> Verdict | None:
    done = g.completed()
    limit = rule.threshold(g.subject.workload, g.workload)
    if len(done) < rule.min_seeds:
        return _verdict(rule, g, Status.INCONCLUSIVE, f"{len(done)} completed seed(s); the rule needs at least "
                        f"{rule.min_seeds}", n=len(done))
    values = {r.spec.seed: cast(float, r.final_metric) for r in done}
    spread = max(values.values()) - min(values.values())
    # What shows that the seed reaches the run: the final weights' digest, or, for a
    # own job (which reports none), its whole series of evaluations.
    outputs = {r.weights_sha256 if r.weights_sha256 is not None else tuple(e.value for e in r.evals)
               for r in done}
    if len(outputs) == 1:
        what = "final weights" if done[0].weights_sha256 is not None else "evaluations"
        return _verdict(rule, g, Status.FAIL, f"{len(done)} different seeds produced identical {what}: the "
                        "seed does not reach the run", final_metric=values)
    status = Status.PASS if spread <= limit else Status.FAIL
    return _verdict(rule, g, status, f"final metric ranges {spread:.4f} across {len(done)} seeds "
                    f"(limit {limit:g})", spread=spread, max_spread=limit, final_metric=values)


def _post_warmup(r: RunResult, warmup: int) -> int:
    return max(r.steps - warmup, 0)


@judges(R.ScalerSkipRate)
def check_scaler_skip_rate(rule: R.ScalerSkipRate, g: _Group) -> Verdict | None:
    scaled = [r for r in g.completed(g.all) if r.loss_scale is not None]
    if not scaled:
        return None
    limit = rule.threshold(g.subject.workload, g.workload)
    rates = {}
    for r in scaled:
        n = _post_warmup(r, rule.warmup_steps)
        if n == 0:
            return _verdict(rule, g, Status.INCONCLUSIVE, f"run {r.run_id} has no steps after the warm-up of "
                            f"{rule.warmup_steps}")
        rates[r.run_id] = sum(1 for s in (r.skipped_steps or []) if s > rule.warmup_steps) / n
    worst_id = max(rates, key=rates.__getitem__)
    status = Status.PASS if rates[worst_id] <= limit else Status.FAIL
    return _verdict(rule, g, status, f"skipped-step rate after step {rule.warmup_steps}: worst "
                    f"{rates[worst_id]:.3f} ({worst_id}), limit {limit:g}", rates=rates, max_rate=limit)


@judges(R.ScalerFloor)
def check_scaler_floor(rule: R.ScalerFloor, g: _Group) -> Verdict | None:
    scaled = [r for r in g.completed(g.all) if r.loss_scale]
    if not scaled:
        return None
    limit = rule.threshold(g.subject.workload, g.workload)
    shares = {}
    for r in scaled:
        post = (r.loss_scale or [])[rule.warmup_steps:]
        if not post:
            return _verdict(rule, g, Status.INCONCLUSIVE, f"run {r.run_id} has no steps after the warm-up")
        shares[r.run_id] = sum(1 for s in post if s <= rule.floor) / len(post)
    worst_id = max(shares, key=shares.__getitem__)
    status = Status.PASS if shares[worst_id] <= limit else Status.FAIL
    return _verdict(rule, g, status, f"share of steps with the scale at or below {rule.floor:g}: worst "
                    f"{shares[worst_id]:.3f} ({worst_id}), limit {limit:g}", shares=shares,
                    final_scales={r.run_id: (r.loss_scale or [])[-1] for r in scaled})


@judges(R.NonFiniteLoss)
def check_nonfinite_loss(rule: R.NonFiniteLoss, g: _Group) -> Verdict | None:
    from ampcert.results import FailureKind

    limit = rule.threshold(g.subject.workload, g.workload)
    # The runs stopped by a non-finite loss or metric, as their results say (never their wording).
    nonfinite = [r for r in g.all if r.failure_kind == FailureKind.NON_FINITE]
    stopped = _failed(nonfinite)
    if stopped:
        return _verdict(rule, g, Status.FAIL, f"{len(stopped)} run(s) stopped on a non-finite loss, e.g. seed "
                        f"{stopped[0]['seed']}: {stopped[0]['reason']}", stopped=stopped)
    other = _failed(g.all)
    done = g.completed(g.all)
    if not done:
        return _verdict(rule, g, Status.INCONCLUSIVE, "no completed run" + (f"; failures: {other[0]['reason']}"
                                                                    if other else ""), failed_runs=other)
    if all(r.spec.command is not None for r in done):
        # An own job logs no loss: what it does log, its evaluations, must be finite.
        bad = {r.run_id: sum(1 for e in r.evals if not math.isfinite(e.value)) for r in done}
        worst = max(bad, key=bad.__getitem__)
        status = Status.PASS if bad[worst] == 0 else Status.FAIL
        return _verdict(rule, g, status, f"the job logs no loss; non-finite evaluations: worst {bad[worst]} "
                        f"({worst})", nonfinite_evals=bad)
    shares = {r.run_id: (sum(1 for v in r.loss if v is None) / len(r.loss)) if r.loss else 0.0 for r in done}
    worst_id = max(shares, key=shares.__getitem__)
    status = Status.PASS if shares[worst_id] <= limit else Status.FAIL
    return _verdict(rule, g, status, f"non-finite losses: worst {shares[worst_id]:.3f} of steps ({worst_id}), "
                    f"limit {limit:g}", shares=shares)


def _ratio_check(rule, g: _Group, value: Callable[[RunResult], float | None], what: str,
                 higher_is_good: bool) -> Verdict | None:
    low = [v for v in (value(r) for r in g.completed()) if v]
    ref = [v for v in (value(r) for r in g.completed(g.ref)) if v]
    devices = {r.spec.device for r in g.primary} | {r.spec.device for r in g.ref}
    unaccelerated = [r.run_id for r in g.primary if not r.accelerated]
    required = rule.required and not unaccelerated
    note = {"advisory_because": f"{g.subject.precision} is not accelerated on this device"} if unaccelerated else {}
    if not g.ref:
        return _verdict(rule, g, Status.INCONCLUSIVE, "no fp32 runs of this entry to compare with: add fp32 to "
                        "the suite's precisions", required=required, reference="fp32", **note)
    if not low or not ref:
        return _verdict(rule, g, Status.INCONCLUSIVE, f"no {what} measured for the precision or for FP32",
                        required=required, **note)
    if len(devices) > 1:
        return _verdict(rule, g, Status.INCONCLUSIVE, f"runs on different devices {sorted(devices)}",
                        required=required, **note)
    ratio = statistics.median(low) / statistics.median(ref)
    limit = rule.threshold(g.subject.workload, g.workload)
    ok = ratio >= limit if higher_is_good else ratio <= limit
    text = f"{what} {ratio:.3f}x FP32 (median over {len(low)} vs {len(ref)} runs), " \
           f"{'at least' if higher_is_good else 'at most'} {limit:g}"
    if unaccelerated:
        text += f"; advisory: {g.subject.precision} is not accelerated on this device"
    return _verdict(rule, g, Status.PASS if ok else Status.FAIL, text, required=required, ratio=ratio, limit=limit,
                    values=low, reference_values=ref, **note)


@judges(R.Speedup)
def check_speedup(rule: R.Speedup, g: _Group) -> Verdict | None:
    return _ratio_check(rule, g, lambda r: r.samples_per_s, "training samples/s", True)


@judges(R.MemoryRatio)
def check_memory_ratio(rule: R.MemoryRatio, g: _Group) -> Verdict | None:
    return _ratio_check(rule, g, lambda r: r.peak_memory.value if r.peak_memory else None, "peak memory", False)


@judges(R.MemorySaving)
def check_memory_saving(rule: R.MemorySaving, g: _Group) -> Verdict | None:
    fit, limit = g.memory, rule.threshold(g.subject.workload, g.workload)
    if fit is None:
        return None
    saving = fit.saving
    if saving is None or saving.interval is None:  # a required rule is never decided on a point estimate
        why = (f"the sweep has no line for this precision or for fp32 ({fit.note or 'fp32 not swept'})" if saving is None
               else f"{saving.fraction:.1%} saved, with no interval: each line needs three or more batch sizes")
        return _verdict(rule, g, Status.INCONCLUSIVE, f"no saving per sample to judge: {why}", limit=limit)
    low, high = saving.interval
    status = Status.PASS if low >= limit else Status.FAIL if high < limit else Status.INCONCLUSIVE
    shown = f"{saving.fraction:.1%} ({LEVEL:.0%} interval {low:.1%} to {high:.1%})"
    return _verdict(rule, g, status, f"saves {shown} of fp32's memory per sample, at least {limit:.0%} wanted",
                    saving=saving.fraction, interval=saving.interval, limit=limit, bytes_per_sample=fit.bytes_per_sample)


@judges(R.PrecisionDisclosure)
def check_precision_disclosure(rule: R.PrecisionDisclosure, g: _Group) -> Verdict | None:
    """Each run's measured lowest precision (result.json ``lowest_precision``)
    against the suite's declaration for its precision, field by field."""
    declared: dict[str, str] = {}
    for r in g.all:
        claim = r.spec.submission.lowest_precision.get(r.spec.precision)
        if claim is not None:
            declared = {k: v for k, v in claim.model_dump().items() if v is not None}
            break
    if not declared:
        return None  # nothing declared for this precision: nothing to hold the runs to
    mismatches, unmeasured = [], []
    for r in g.all:
        if r.lowest_precision is None:
            unmeasured.append(r.run_id)
            continue
        for part, value in sorted(declared.items()):
            observed = getattr(r.lowest_precision, part)
            if observed != value:
                mismatches.append({"run_id": r.run_id, "seed": r.spec.seed, "part": part,
                                   "declared": value, "observed": observed})
    shown = ", ".join(f"{k} {v}" for k, v in sorted(declared.items()))
    if mismatches:
        m = mismatches[0]
        return _verdict(rule, g, Status.FAIL, f"{len(mismatches)} disclosure(s) differ from the declared {shown}, "
                        f"e.g. seed {m['seed']}: {m['part']} declared {m['declared']}, measured {m['observed']}",
                        declared=declared, mismatches=mismatches, unmeasured=unmeasured)
    if unmeasured:
        return _verdict(rule, g, Status.INCONCLUSIVE, f"{len(unmeasured)} run(s) recorded no measured precision "
                        f"to hold to the declared {shown}", declared=declared, unmeasured=unmeasured)
    return _verdict(rule, g, Status.PASS, f"every run measured the declared {shown}", declared=declared)


@judges(R.CompileHealth)
def check_compile_health(rule: R.CompileHealth, g: _Group) -> Verdict | None:
    """Each compile: true run compiled, with at most ``max_graph_breaks`` graph breaks (a whole
    step: ``max_step_graph_breaks``, where set) and ``max_recompiles`` recompiles."""
    compiled = [(r, r.compile_stats) for r in g.all if r.compile_stats is not None]
    if not compiled:
        return None
    forward_limit = int(rule.threshold(g.subject.workload, g.workload))
    problems = []
    for r, c in compiled:
        limit = forward_limit if c.scope == "forward" else rule.max_step_graph_breaks
        if not c.compiled:
            problems.append(f"seed {r.spec.seed} did not compile ({c.fallback_reason}) and ran eagerly")
        elif limit is not None and (c.graph_breaks or 0) > limit:
            problems.append(f"seed {r.spec.seed}: {c.graph_breaks} graph break(s), limit {limit}"
                            + (f" ({c.break_reasons[0]})" if c.break_reasons else ""))
        elif (c.recompiles or 0) > rule.max_recompiles:
            problems.append(f"seed {r.spec.seed}: {c.recompiles} recompile(s), limit {rule.max_recompiles}")
    stats = {r.run_id: c.model_dump(mode="json") for r, c in compiled}
    if problems:
        return _verdict(rule, g, Status.FAIL, "; ".join(problems[:3]), runs=stats)
    worst_breaks = max(c.graph_breaks or 0 for _, c in compiled)
    worst_recompiles = max(c.recompiles or 0 for _, c in compiled)
    step_limit = "none: recorded" if rule.max_step_graph_breaks is None else rule.max_step_graph_breaks
    scopes = {c.scope for _, c in compiled}
    why = "; ".join([f"limit {forward_limit}"] * ("forward" in scopes) + [f"whole step, limit {step_limit}"] * ("step" in scopes))
    return _verdict(rule, g, Status.PASS, f"{len(compiled)} compiled run(s): at most {worst_breaks} graph break(s) "
                    f"({why}) and {worst_recompiles} recompile(s) (limit {rule.max_recompiles})",
                    runs=stats)


@judges(R.Fp8Health)
def check_fp8_health(rule: R.Fp8Health, g: _Group) -> Verdict | None:
    """FP8's overflow and its unsafe layers, from each run's eligibility map."""
    runs = [r for r in g.all if r.fp8 is not None and r.fp8.converted_layers]
    if not runs:
        return None
    limit = int(rule.threshold(g.subject.workload, g.workload))
    nonfinite = {r.run_id: r.fp8.nonfinite_amax_steps for r in runs if r.fp8}
    unsafe = sorted({layer.name for r in runs if r.fp8 for layer in r.fp8.layers
                     if layer.converted and layer.verdict == "unsafe"})
    review = sorted({layer.name for r in runs if r.fp8 for layer in r.fp8.layers
                     if layer.converted and layer.verdict == "review"})
    worst = max(nonfinite.values())
    recipe = runs[0].fp8.recipe if runs[0].fp8 else "?"
    problems = []
    if worst > limit:
        problems.append(f"up to {worst} layer-step(s) with a non-finite FP8 amax (limit {limit})")
    if len(unsafe) > rule.max_unsafe_layers:
        problems.append(f"{len(unsafe)} converted layer(s) unsafe in FP8: {', '.join(unsafe[:5])}"
                        f" (limit {rule.max_unsafe_layers})")
    status = Status.FAIL if problems else Status.PASS
    text = "; ".join(problems) if problems else (
        f"{recipe}: no non-finite amax in {len(runs)} run(s); no converted layer unsafe"
        + (f"; to review: {', '.join(review[:5])}" if review else ""))
    return _verdict(rule, g, status, text, nonfinite_amax_steps=nonfinite, unsafe_layers=unsafe,
                    review_layers=review, max_nonfinite_steps=limit, max_unsafe_layers=rule.max_unsafe_layers)


def _every_check_judged() -> dict[str, CheckFunction]:
    missing = [c for c in R.CHECKS if c not in CHECK_SPECS]
    if missing:
        raise RuntimeError(f"rule models in certify/rules.py without an @judges function here: {missing}")
    return {c: CHECK_SPECS[c].function for c in R.CHECKS}


#: each check's function by id, in rules.CHECKS order (what evaluate calls)
CHECK_FUNCTIONS: dict[str, CheckFunction] = _every_check_judged()


# --------------------------------------------------------------------------- evaluation


def evaluate(results: Iterable[RunResult], pack: R.RulePack, memory_runs: Iterable[RunResult] = (),
             missing: Iterable[str] = ()) -> Certificate:
    """Every rule of ``pack`` on every subject it applies to (``memory_runs``: the suite's
    memory sweep, which the memory rules judge). ``missing``: the ids of planned runs with
    no readable result; any makes the certificate INCOMPLETE, never PASS (FAIL stays FAIL)."""
    # The subjects are the groups of every other view (ampcert.aggregate), repeats
    # included: they are the determinism check's evidence.
    groups = group_runs(results, repeats=True)
    fits = {f.subject: f for f in fit_sweep(memory_runs)}
    verdicts: list[Verdict] = []
    for subject in sorted(groups):
        runs = groups[subject]
        siblings = {p: groups.get(subject.with_precision(p), []) for p in ("bf16",)}
        group = _Group(subject, runs, groups.get(reference_key(subject), []), siblings)
        group.memory = fits.get(subject)
        for rule in pack.rules:
            if not rule.applies_to.matches(subject.workload, runs[0].spec.workload, subject.backend, subject.amp,
                                           runs[0].spec.precision, runs[0].spec.device):
                continue
            v = CHECK_FUNCTIONS[rule.check](rule, group)
            if v is not None:
                verdicts.append(v)
    return certificate_of(verdicts, pack, missing)
