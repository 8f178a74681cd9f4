"""The history gate: a new night against its suite's series in the store.

For each (subject, metric) series of the new night's suite on its machine,
the new night's value is appended (it is not written: ``history add`` does
that) and :func:`ampcert.history.changepoints.judge` says whether the newest
nights moved. Accuracy (``final_metric``) is judged by the paired TOST the
certification uses as well: the new night's seeds against the per-seed
medians of the nights before, within the gate's margin for the workload.

Each series answers one *question* (:data:`QUESTIONS`), and the gate decides
each question of a subject on the steadiest signal it has for it, saying which:

- "did the low precision lose its gain": the speed probe's speed-up over FP32,
  measured in one process in alternating windows (``probe_speedup_vs_fp32``), or
  the whole runs' speed-up paired by seed (``paired_speedup_vs_fp32``);
- "did the step get slower": hardware counters per step where the probe read them
  (``instructions_per_step``, ``cycles_per_step``), the probe's step time in units
  of its calibration kernel (``probe_step_kernel_units``: the machine's own speed
  divided out) or absolute (``probe_step_ms``), or the certified runs'
  throughputs (steady-state ``step_samples_per_s``, whole-run ``samples_per_s``);
- accuracy: the paired TOST; every other metric is its own question.

Of a question's signals, the one whose night-to-night noise, relative to its level,
was lowest in the nights before decides (of those with enough nights to tell; the
first listed where none has); the others are shown, not gated.

The gate FAILs (exit 1) on any REGRESSION row it gates on, passes otherwise
(exit 0); a new night whose suite has no history in the store is bad input
(exit 2).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ampcert import formats
from ampcert.envinfo import software_stack, stack_changes
from ampcert.errors import UserError
from ampcert.history.changepoints import DEFAULT_MIN_EFFECT, DEFAULT_WINDOW, judge, noise_sigma
from ampcert.history.records import Night
from ampcert.history.store import Store
from ampcert.vocabulary import Status

TOST_HISTORY_NIGHTS = 7
# Nights of history before a signal's own noise is trusted to choose between signals.
MIN_NIGHTS_TO_CHOOSE = 5

#: The question each metric answers; a question with several metrics is decided by the
#: steadiest of them (:func:`_gating_signals`), listed here in the order preferred when the
#: history is too short to measure their noise.
QUESTIONS: dict[str, tuple[str, ...]] = {
    "gain": ("probe_speedup_vs_fp32", "paired_speedup_vs_fp32"),
    "speed": ("instructions_per_step", "cycles_per_step", "probe_step_kernel_units", "probe_step_ms",
              "step_samples_per_s", "samples_per_s"),
    "time to target": ("time_to_target_s",),
    "accuracy": ("final_metric",),
    "memory": ("peak_memory_bytes",),
    "energy": ("energy_j_per_sample",),
    "loss scaling": ("scaler_skips",),
    "failures": ("failed_runs",),
}
QUESTION_OF = {metric: q for q, metrics in QUESTIONS.items() for metric in metrics}


@dataclass
class SeriesRow:
    subject: str
    metric: str
    nights: int
    status: str                    # REGRESSION, IMPROVEMENT, OK, SHORT, INCONCLUSIVE
    value: float
    change: float | None
    change_night: str | None       # created_at of the night the change starts at
    change_points: list[str]       # created_at of every change point's night
    test: str
    detail: str = ""
    question: str = ""
    # Whether this row decides the verdict: the steadiest signal of its question
    # (a REGRESSION in a row that does not gate is shown, not failed on).
    gated: bool = True
    # The series the row judged, oldest first (the new night last): for the page and the JSON.
    night_dates: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    change_indices: list[int] = field(default_factory=list)


@dataclass
class HistoryGate:
    store: str
    suite: str
    machine: str
    night: str
    in_store: bool
    rows: list[SeriesRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Per subject and question with a choice, which signal decided it and why.
    signals: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[SeriesRow]:
        return [r for r in self.rows if r.status == "REGRESSION" and r.gated]

    @property
    def status(self) -> Status:
        return Status.FAIL if self.regressions else Status.PASS

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, **asdict(self)}


def _tost_row(subject: str, history: list[list[float]], new: list[float], higher: bool, margin: float,
              base: SeriesRow) -> SeriesRow:
    from ampcert.certify.stats import paired_tost

    previous = [h for h in history[-TOST_HISTORY_NIGHTS:] if len(h) == len(new)]
    if len(new) < 2 or not previous:
        return base
    reference = [statistics.median(seed) for seed in zip(*previous, strict=True)]
    tost = paired_tost(new, reference, margin)
    worse = tost.mean_diff < 0 if higher else tost.mean_diff > 0
    if tost.equivalent:
        status = base.status if base.status == "REGRESSION" else "OK"
    elif tost.outside and worse:
        status = "REGRESSION"
    else:
        status = base.status if base.status == "REGRESSION" else "INCONCLUSIVE"
    detail = (f"paired TOST vs the median of {len(previous)} nights per seed: {tost.mean_diff:+.4g}, 90% CI "
              f"[{tost.ci_low:+.4g}, {tost.ci_high:+.4g}], margin ±{margin:g}")
    return replace(base, status=status, test=base.test + "; " + detail.split(":")[0], detail=detail)


def gate_night(store: Store, night: Night, *, window: int = DEFAULT_WINDOW, min_effect: float = DEFAULT_MIN_EFFECT,
               accuracy_margins: dict[str, float] | None = None) -> HistoryGate:
    """Judge ``night`` against its suite's history on its machine in ``store``."""
    nights = store.nights(suite=night.suite, machine=night.machine)
    if not nights:
        suites = sorted({n.suite for n in store.nights()})
        if suites and night.suite not in suites:
            raise UserError(f"{night.source}: suite {night.suite!r} has no history in {store.url} "
                            f"(it holds {', '.join(suites[:5])}): a folder from another suite")
        raise UserError(f"{night.source}: no history of suite {night.suite!r} on machine {night.machine!r} in "
                        f"{store.url}: add past nights first (`ampcert history add DIR`)")
    in_store = any(n.digest == night.digest for n in nights)
    result = HistoryGate(store.url, night.suite, night.machine, night.created_at, in_store)
    before = [n for n in nights if n.digest != night.digest and n.created_at <= night.created_at]
    if before:  # what changed in the software since the night before, beside the verdict
        changed = stack_changes(store.stack(before[-1].digest), software_stack(night.fingerprint, night.tool))
        if changed:
            result.notes.append(f"environment differs from the night before ({before[-1].created_at}): "
                                f"{'; '.join(changed)}")
    margins = accuracy_margins or {}
    histories = {(p.subject, p.metric): [s for s in store.series(night.suite, night.machine, p.subject, p.metric)
                                         if s.digest != night.digest and s.created_at <= night.created_at]
                 for p in night.points}
    gating = _gating_signals(night, {key: [s.value for s in series] for key, series in histories.items()},
                             result.signals)
    result.signals += [f"hardware counters: {note}" for note in night.notes]
    for p in night.points:
        series = histories[(p.subject, p.metric)]
        values = [s.value for s in series] + [p.value]
        stamps = [s.created_at for s in series] + [night.created_at]
        verdict = judge(values, p.higher_is_better, window=window, min_effect=min_effect)
        label = str(p.subject)
        row = SeriesRow(label, p.metric, len(values), verdict.status, p.value, verdict.change,
                        stamps[verdict.at] if verdict.at is not None else None,
                        [stamps[c] for c in verdict.change_points],
                        f"PELT (ruptures, l2), last {window} nights, min effect {min_effect:.0%}",
                        night_dates=stamps, values=values, change_indices=verdict.change_points,
                        question=QUESTION_OF.get(p.metric, p.metric))
        row.gated = gating[(p.subject, row.question)] == p.metric
        if p.metric == "final_metric":
            margin = margins.get(p.subject.workload, margins.get("*", 0.02))
            row = _tost_row(label, [s.samples for s in series], p.samples, p.higher_is_better, margin, row)
        result.rows.append(row)
    return result


def relative_noise(values: list[float]) -> float | None:
    """A series' night-to-night noise relative to its level (None: too few nights to tell)."""
    if len(values) < MIN_NIGHTS_TO_CHOOSE:
        return None
    level = abs(statistics.median(values))
    return noise_sigma(values) / level if level else None


def _gating_signals(night: Night, histories: dict[tuple[Any, str], list[float]], said: list[str]) -> dict[Any, str]:
    """(subject, question) -> the metric that decides it: the one whose nights before
    were steadiest, relative to their level. Writes one line per real choice to ``said``."""
    chosen: dict[Any, str] = {}
    present: dict[Any, list[str]] = {}
    for p in night.points:
        present.setdefault((p.subject, QUESTION_OF.get(p.metric, p.metric)), []).append(p.metric)
    for (subject, question), metrics in present.items():
        order = [m for m in QUESTIONS.get(question, (question,)) if m in metrics] or metrics
        noise = {m: relative_noise(histories.get((subject, m), [])) for m in order}
        measured = {m: n for m, n in noise.items() if n is not None}
        # The steadiest of those with enough nights to tell (a signal new to the store
        # waits its turn); the first listed where none has.
        best = min(measured, key=lambda m: measured[m]) if measured else order[0]
        chosen[(subject, question)] = best
        if len(order) > 1:
            why = (", ".join(f"{m} {n:.2%}" for m, n in measured.items()) if measured else
                   f"fewer than {MIN_NIGHTS_TO_CHOOSE} nights before to measure their noise: the first listed")
            caveat = ("; in kernel units: a regression that slows the kernel's library as well is divided out"
                      if best == "probe_step_kernel_units" else "")
            said.append(f"{subject} {question}: gated on {best} (night-to-night noise: {why}){caveat}")
    return chosen


def to_markdown(gate: HistoryGate) -> str:
    icon = ":x:" if gate.status == Status.FAIL else ":white_check_mark:"
    lines = [f"### {icon} ampcert history gate: {gate.status}", "",
             f"suite `{gate.suite}` on `{gate.machine}`, night {gate.night}, store `{gate.store}`", "",
             "| subject | metric | nights | status | value | change | since |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in gate.rows:
        status = f"**{r.status}**" if r.status == "REGRESSION" and r.gated else r.status
        status += "" if r.gated else " (not gated)"
        change = formats.change(r.change) if r.change is not None else ""
        lines.append(f"| {r.subject} | {r.metric} | {r.nights} | {status} | {formats.figure(r.metric, r.value)} | {change} | "
                     f"{r.change_night or ''} |")
    lines += ["", *(f"_signal: {n}_" for n in gate.signals)] if gate.signals else []
    lines += ["", *(f"_note: {n}_" for n in gate.notes)] if gate.notes else []
    return "\n".join(lines) + "\n"


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>ampcert history gate: {{ gate.status }}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem auto; max-width: 60rem; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: .25rem .5rem; border-bottom: 1px solid #ddd; }
.REGRESSION { color: #b00020; font-weight: bold; } .IMPROVEMENT { color: #2e7d32; }
figure { margin: 1.5rem 0; } svg { max-width: 100%; height: auto; }
.scroll { overflow-x: auto; }
</style></head><body>
<h1>History gate: <span class="{{ 'REGRESSION' if gate.status == 'FAIL' else '' }}">{{ gate.status }}</span></h1>
<p>Suite <b>{{ gate.suite }}</b> on <b>{{ gate.machine }}</b>, night {{ gate.night }}
{%- if not gate.in_store %} (not yet in the store){% endif %}; store {{ gate.store }}.
A series regresses when a change point (ruptures' PELT) falls within its newest nights and the new level
is worse; accuracy is judged by paired TOST against the nights before. Each question is decided by its
steadiest signal; the others are shown, not gated.</p>
<div class="scroll"><table><tr><th>subject</th><th>metric</th><th>nights</th><th>status</th><th>value</th>
<th>change</th><th>since</th><th>change points</th></tr>
{% for r in gate.rows %}<tr><td>{{ r.subject }}</td><td>{{ r.metric }}</td><td>{{ r.nights }}</td>
<td class="{{ r.status if r.gated else '' }}">{{ r.status }}{% if not r.gated %} (not gated){% endif %}</td><td>{{ figure(r.metric, r.value) }}</td>
<td>{{ change(r.change) if r.change is not none else '' }}</td><td>{{ r.change_night or '' }}</td>
<td>{{ r.change_points | join(', ') }}</td></tr>
{% endfor %}</table></div>
{% for line in gate.signals %}<p>Signal: {{ line }}</p>
{% endfor %}{% for metric, svg in plots %}<figure><figcaption>{{ metric }}</figcaption>{{ svg | safe }}</figure>
{% endfor %}</body></html>
"""


def to_html(gate: HistoryGate) -> str:
    """A page with the table and, per metric, every subject's series with its change points."""
    import jinja2

    from ampcert.report.plots import history_series

    plots = []
    for metric in dict.fromkeys(r.metric for r in gate.rows):
        rows = [r for r in gate.rows if r.metric == metric and len(r.values) > 1]
        if not rows:
            continue
        nights = max((r.night_dates for r in rows), key=len)
        svg = history_series(f"{metric}, night by night", nights, {r.subject: r.values for r in rows},
                             {r.subject: r.change_indices for r in rows}, metric, f"history-{metric}")
        if svg:
            plots.append((metric, svg))
    env = jinja2.Environment(autoescape=True)
    return env.from_string(_PAGE).render(gate=gate, plots=plots, figure=formats.figure, change=formats.change)
