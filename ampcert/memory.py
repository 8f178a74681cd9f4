"""What each precision lets a team fit: peak memory against batch size, fitted.

A suite's ``memory:`` sweep (:class:`ampcert.spec.MemorySweep`) trains each
workload entry and precision for a few steps at three or more batch sizes.
Per subject, this module fits the measured peaks with a straight line,

    peak(batch) = fixed_bytes + bytes_per_sample * batch

(ordinary least squares, ``scipy.stats.linregress``), keeps its residuals and
standard errors, and answers the capacity question with it: the largest batch
whose predicted peak stays within each memory budget (the suite's
``budgets``, or else the device's own memory), and how much memory per
sample a low precision saves against FP32, with an interval.

A run that ran out of device memory is a finding, not a gap: it is listed as
"does not fit at batch N" and left out of the fit. What a peak includes is
the runs' own measurement method (on CUDA the allocator's tensors after the
first step; on a CPU the worker's peak RSS, framework and data set
included), carried into every fit so that a reader knows what was fitted.

On a CPU, autocast keeps bf16 copies of the weights beside the FP32 ones and
casts activations per op, so bf16 may cost memory rather than save it; the
fit says so when it does, instead of assuming the saving.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ampcert import formats
from ampcert.aggregate import REFERENCE, TABLE_ORDER, group_key
from ampcert.configio import read_yaml_file
from ampcert.errors import UserError
from ampcert.results import FailureKind, ResultsDir, ResultSet, RunResult
from ampcert.spec import MemorySweep, RunSpec, SweepPoint
from ampcert.stored_plan import StoredPlan
from ampcert.vocabulary import Subject

# The interval on the saving per sample: two-sided, at this level.
LEVEL = 0.90


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryPoint(_Model):
    batch: int
    peak_bytes: float
    run_id: str
    residual_bytes: float = Field(description="measured peak minus the fitted line's")
    device_used_bytes: float | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="NVML's view beside the allocator's: the device's peak used memory over the run (every "
                    "process, the CUDA context and the evaluation included); absent without NVML")


class UnfitBatch(_Model):
    """A sweep point whose batch did not fit (the run that found it, and its reason)."""

    batch: int
    run_id: str
    reason: str


class Confirmation(_Model):
    """The run at a budget's fitted largest batch, trained after the sweep: does the line hold there?"""

    run_id: str
    batch: int
    predicted_bytes: float
    peak_bytes: float | None = None
    error: float | None = Field(default=None, description="(measured - predicted) / predicted")
    fits: bool | None = Field(default=None, description="True: trained, and its peak stayed within the budget; "
                                                        "False: out of memory, or a peak over the budget; "
                                                        "None: no answer (see note)")
    note: str = ""


class BudgetFit(_Model):
    budget_bytes: int
    source: str = Field(description="'suite' (the suite's memory.budgets) or 'device' (its own memory)")
    largest_batch: int | None = Field(description="the largest batch whose fitted peak fits; None: see note")
    note: str = ""
    confirmation: Confirmation | None = Field(default=None, exclude_if=lambda v: v is None,
                                              description="the confirming run at largest_batch, where one ran")


class Saving(_Model):
    """Memory per sample saved against FP32: ``1 - bytes_per_sample / fp32's``."""

    fraction: float
    interval: list[float] | None = Field(description=f"{LEVEL:.0%} interval (delta method on the two slopes)")
    note: str = ""


class MemoryFit(_Model):
    subject: Subject
    method: str = Field(description="what each peak includes (the runs' measurement)")
    points: list[MemoryPoint]
    does_not_fit: list[UnfitBatch] = Field(default_factory=list)
    fixed_bytes: float | None = None
    bytes_per_sample: float | None = None
    fixed_stderr: float | None = None
    per_sample_stderr: float | None = None
    max_residual_share: float | None = Field(
        default=None, description="the largest |residual| over its measured peak")
    budgets: list[BudgetFit] = Field(default_factory=list)
    saving: Saving | None = None
    note: str = ""

    def predict(self, batch: int) -> float | None:
        """The fitted peak at ``batch``, in bytes (None without a fit)."""
        if self.fixed_bytes is None or self.bytes_per_sample is None:
            return None
        return self.fixed_bytes + self.bytes_per_sample * batch

    def largest_batch(self, budget_bytes: float) -> int | None:
        """The largest batch whose fitted peak is at most ``budget_bytes`` (None: no fit, no
        growth with the batch, or not even batch 1 fits)."""
        if self.fixed_bytes is None or self.bytes_per_sample is None or self.bytes_per_sample <= 0:
            return None
        batch = math.floor((budget_bytes - self.fixed_bytes) / self.bytes_per_sample)
        return batch if batch >= 1 else None


def device_memory(environment: dict[str, Any] | None, device: str) -> int | None:
    """The device's own memory from a folder's environment fingerprint: the first GPU's
    (CUDA) or the host's (CPU); None where it was not recorded."""
    env = environment or {}
    if device == "cuda":
        devices = (env.get("gpu") or {}).get("devices") or []
        value = devices[0].get("memory_bytes") if devices else None
    else:
        value = (env.get("cpu") or {}).get("memory_bytes")
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def fit_sweep(runs: Iterable[RunResult], budgets: Iterable[int] = (), device_bytes: int | None = None
              ) -> list[MemoryFit]:
    """One fit per subject of a folder's memory-sweep runs, in table order, each with the
    largest batch per budget (the suite's ``budgets``, else ``device_bytes``) and, for a low
    precision, its saving per sample against FP32 where FP32 was swept too."""
    groups: dict[Subject, list[RunResult]] = {}
    for r in runs:
        groups.setdefault(group_key(r), []).append(r)
    wanted = [(int(b), "suite") for b in budgets] or ([(device_bytes, "device")] if device_bytes else [])
    fits = {subject: _fit(subject, group, wanted) for subject, group in groups.items()}
    for subject, fit in fits.items():
        ref = fits.get(subject.with_precision(REFERENCE))
        if subject.precision != REFERENCE and ref is not None:
            fit.saving = _saving(fit, ref)
            if fit.saving is not None and fit.saving.note:
                fit.note = "; ".join(filter(None, [fit.note, fit.saving.note]))
    order: dict[str, int] = {p: i for i, p in enumerate(TABLE_ORDER)}
    return [fits[s] for s in sorted(fits, key=lambda s: (s.workload, s.backend, s.amp,
                                                          order.get(s.precision, len(order)), s.precision))]


def _fit(subject: Subject, runs: list[RunResult], budgets: list[tuple[int, str]]) -> MemoryFit:
    # (batch, run, peak): a completed run with a peak measured; one whose peak reads null measured nothing
    measured = sorted(((r.spec.sweep.batch_size or 0, r, r.peak_memory.value) for r in runs
                       if r.status == "completed" and r.peak_memory is not None and r.peak_memory.value is not None),
                      key=lambda t: t[0])
    too_big = sorted((UnfitBatch(batch=r.spec.sweep.batch_size or 0, run_id=r.run_id, reason=r.reason or "")
                      for r in runs if r.failure == FailureKind.OUT_OF_MEMORY), key=lambda d: d.batch)
    failed = [r for r in runs if r.status != "completed" and r.failure != FailureKind.OUT_OF_MEMORY]
    methods = sorted({r.peak_memory.method for _, r, _ in measured if r.peak_memory is not None})
    fit = MemoryFit(subject=subject, method="; ".join(methods), does_not_fit=too_big, points=[])
    notes = [f"does not fit at batch {d.batch}" for d in too_big]
    notes += [f"batch {r.spec.sweep.batch_size} failed: {r.reason}" for r in failed]
    batches = [float(b) for b, _, _ in measured]
    peaks = [p for _, _, p in measured]
    if len(set(batches)) < 2:
        fit.points = [MemoryPoint(batch=int(b), peak_bytes=p, run_id=r.run_id, residual_bytes=0.0)
                      for b, r, p in measured]
        fit.note = "; ".join(notes + [f"{len(measured)} batch size(s) measured: a line needs two or more"])
        return fit
    # imported here: a suite's validation imports this module (~1 s for scipy.stats), most commands fit nothing
    from scipy import stats

    line = stats.linregress(batches, peaks)
    fit.fixed_bytes, fit.bytes_per_sample = float(line.intercept), float(line.slope)
    if len(batches) > 2:  # with two points the line passes through both: no error to estimate
        fit.fixed_stderr, fit.per_sample_stderr = float(line.intercept_stderr), float(line.stderr)
    fit.points = [MemoryPoint(batch=int(b), peak_bytes=p, run_id=r.run_id, device_used_bytes=_device_used(r),
                              residual_bytes=p - (fit.fixed_bytes + fit.bytes_per_sample * b))
                  for b, r, p in measured]
    fit.max_residual_share = max(abs(p.residual_bytes) / p.peak_bytes for p in fit.points)
    if fit.bytes_per_sample <= 0:
        notes.append("the peak does not grow with the batch over the sizes swept: sweep larger batches")
    for budget, source in budgets:
        fit.budgets.append(fit_budget(fit, budget, source))
    fit.note = "; ".join(notes)
    return fit


def _device_used(r: RunResult) -> float | None:
    """NVML's peak used memory of the run's GPU(s), from its telemetry (``<gpu>.mem_used_bytes``)."""
    peaks = (r.telemetry or {}).get("peak_memory") or {}
    values = [v.get("value") for k, v in peaks.items() if k.endswith(".mem_used_bytes") and isinstance(v, dict)]
    found = [float(v) for v in values if isinstance(v, (int, float))]
    return max(found) if found else None


def fit_budget(fit: MemoryFit, budget: int, source: str) -> BudgetFit:
    """The largest batch ``fit`` puts within ``budget`` bytes, with why where none. A batch
    that ran out of memory caps it only where ``source`` is "device": measured there."""
    batch = fit.largest_batch(budget)
    note = ""
    if fit.bytes_per_sample is None:
        note = fit.note or "no line was fitted"
    elif batch is None and fit.bytes_per_sample > 0:
        note = "not even batch 1: the fixed bytes alone are more than this budget"
    elif batch is None:
        note = "no limit from this fit (the peak does not grow with the batch)"
    elif fit.points and batch > 4 * max(p.batch for p in fit.points):
        note = f"extrapolated {batch / max(p.batch for p in fit.points):.0f}x past the largest batch swept"
    refuted = [d.batch for d in fit.does_not_fit if batch is not None and d.batch <= batch]
    if refuted and source == "device":  # measured on this device: the run that did not fit wins over the line
        batch = refuted[0] - 1 if refuted[0] > 1 else None
        note = f"batch {refuted[0]} did not fit on the device, below the fitted limit"
    return BudgetFit(budget_bytes=budget, source=source, largest_batch=batch, note=note)


def _saving(fit: MemoryFit, ref: MemoryFit) -> Saving | None:
    a, b = fit.bytes_per_sample, ref.bytes_per_sample
    if a is None or b is None or b <= 0:
        return None
    fraction = 1 - a / b
    interval = None
    if fit.per_sample_stderr is not None and ref.per_sample_stderr is not None:
        # delta method for a / b with independent slopes; t with the smaller fit's degrees of freedom
        se = abs(a / b) * math.sqrt((fit.per_sample_stderr / a) ** 2 + (ref.per_sample_stderr / b) ** 2) if a else (
            fit.per_sample_stderr / b)
        dof = min(len(fit.points), len(ref.points)) - 2
        from scipy import stats

        t = float(stats.t.ppf(0.5 + LEVEL / 2, dof))
        interval = [fraction - t * se, fraction + t * se]
    note = ""
    if fraction <= 0:  # measured, not assumed: CPU autocast keeps bf16 weight copies beside fp32's
        note = (f"{fit.subject.precision} does not save memory here: {-fraction:.0%} more per sample than "
                f"{REFERENCE}")
        if interval is not None and interval[1] > interval[0]:
            note += f" ({LEVEL:.0%} interval: {_more_or_less(interval[1])} to {_more_or_less(interval[0])})"
    elif interval is not None and interval[0] <= 0:
        note = f"{fit.subject.precision}'s saving per sample is not distinguishable from none at {LEVEL:.0%}"
    return Saving(fraction=fraction, interval=interval, note=note)


def _more_or_less(saving: float) -> str:
    return f"{saving:.0%} less" if saving > 0 else f"{-saving:.0%} more"


# --------------------------------------------------------------------------- a results folder's fits


def sweep_of(suite_doc: dict[str, Any], where: object = "suite.yaml") -> MemorySweep | None:
    """The suite's ``memory:`` as stored in the folder's suite.yaml (``where``; plan.json stores
    the suite's name only); None where there is none. One that no longer parses (it was valid
    when the suite ran, so the stored copy was edited since) is a UserError naming it: its
    budgets, and whether to confirm them, are not guessed from the device's memory instead."""
    if "memory" not in suite_doc or suite_doc["memory"] is None:
        return None
    try:
        return MemorySweep.model_validate(suite_doc["memory"])
    except ValidationError as exc:
        first = exc.errors()[0]
        at = ".".join(str(part) for part in first["loc"])
        raise UserError(f"{where}: memory{'.' + at if at else ''}: {first['msg']} (the stored suite was "
                        "edited after the run; restore it, or run the sweep again)") from None


def stored_sweep(rd: ResultsDir) -> MemorySweep | None:
    """The suite's ``memory:`` as the folder stores it (suite.yaml), typed: None where the
    suite has none, or the folder no suite.yaml (one put together by hand or by a tool: the
    device's own memory is then the budget, and the report says which). An unreadable
    suite.yaml, or a ``memory:`` that no longer parses, is a UserError naming it: its budgets
    are never replaced by the device's memory without a word."""
    if not rd.suite_file.exists():
        return None
    doc, _ = read_yaml_file(rd.suite_file, "stored suite (suite.yaml)", mapping="suite settings")
    return sweep_of(doc, rd.suite_file)


def folder_fits(rs: ResultSet, plan: StoredPlan, sweep: MemorySweep | None) -> list[MemoryFit]:
    """The sweep's fits of a results folder, against the suite's budgets (``sweep``, the
    stored suite's: :func:`stored_sweep`) or else the device's own memory, each budget with
    its confirming run where one ran (:func:`confirming_runs`)."""
    fits, confirming = _fits_and_confirmations(rs, plan, sweep)
    rd = ResultsDir(rs.root)
    for fit, budget, spec in confirming:
        result = rd.read_result(spec.run_id)
        if result is not None:
            budget.confirmation = _confirmation(fit, budget, result)
    return fits


def confirming_runs(rs: ResultSet, plan: StoredPlan, sweep: MemorySweep | None) -> list[RunSpec]:
    """The runs that confirm a finished sweep: per subject, one at the fitted largest batch of the
    smallest budget the device at hand holds, on CUDA limited to that budget (a suite's budget is
    a smaller card, emulated as the sweep's ``device_memory`` is), so that a line that understates
    the memory runs out of it there. A CPU's own memory is not confirmed (the host's, shared with
    everything on it; a suite's budgets are). Derived from the stored results, the same on every
    call: `--resume` finds them done."""
    return [spec for _, _, spec in _fits_and_confirmations(rs, plan, sweep)[1]]


def _fits_and_confirmations(rs: ResultSet, plan: StoredPlan, sweep: MemorySweep | None
                            ) -> tuple[list[MemoryFit], list[tuple[MemoryFit, BudgetFit, RunSpec]]]:
    """The fits, and each confirming run with the fit and the budget it confirms."""
    if not rs.memory_runs:
        return [], []
    budgets = [int(b) for b in sweep.budgets] if sweep is not None else []
    # An emulated smaller card (memory.device_memory) is the device the sweep ran on.
    emulated = next((r.spec.sweep.device_memory_limit for r in rs.memory_runs if r.spec.sweep.device_memory_limit), None)
    device = plan.device or ""
    device_bytes = emulated or device_memory(plan.environment, device)
    fits = fit_sweep(rs.memory_runs, budgets, device_bytes)
    if sweep is None or not sweep.confirm or device_bytes is None:
        return fits, []
    confirming = []
    for fit in fits:
        swept = [r.spec for r in rs.memory_runs if group_key(r) == fit.subject]
        held = [b for b in fit.budgets if b.largest_batch is not None and b.budget_bytes <= device_bytes
                and (device == "cuda" or b.source == "suite")
                and b.largest_batch not in {s.sweep.batch_size for s in swept}]  # a swept batch is measured already
        if not held or not swept:
            continue
        budget = min(held, key=lambda b: b.budget_bytes)
        like = max(swept, key=lambda s: s.sweep.batch_size or 0)
        confirming.append((fit, budget, like.model_copy(update={"sweep": SweepPoint(
            batch_size=budget.largest_batch, confirms_budget=budget.budget_bytes,
            # a suite's budget is a smaller card, emulated where torch can (JAX measures its peak on
            # the card itself); the device's own (or the sweep's emulated card, which the sweep's
            # runs carry) is the card itself
            device_memory_limit=budget.budget_bytes
            if device == "cuda" and budget.source == "suite" and like.backend == "torch"
            else like.sweep.device_memory_limit)})))
    return fits, confirming


def _confirmation(fit: MemoryFit, budget: BudgetFit, result: RunResult) -> Confirmation:
    predicted = fit.predict(budget.largest_batch or 0) or 0.0
    found = Confirmation(run_id=result.run_id, batch=budget.largest_batch or 0, predicted_bytes=predicted)
    if result.status == "completed" and result.peak_memory is not None and result.peak_memory.value is not None:
        found.peak_bytes = peak = float(result.peak_memory.value)
        found.error = (peak - predicted) / predicted if predicted else None
        found.fits = peak <= budget.budget_bytes
        found.note = f"tried at batch {found.batch}: peak {formats.size(peak)}" + (
            f", {found.error:+.1%} from the line's {formats.size(predicted)}" if found.error is not None else "")
        found.note += (", within the budget" if found.fits
                       else ", over the budget: the line understates the memory at this batch")
    elif result.failure == FailureKind.OUT_OF_MEMORY:
        found.fits = False
        found.note = (f"did not fit at batch {found.batch}, the fitted largest: the line understates the memory there "
                      f"({result.reason})")
    else:
        found.note = f"the confirming run at batch {found.batch} {result.status}: {result.reason}"
    return found
