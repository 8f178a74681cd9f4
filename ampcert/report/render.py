"""Render report.json and report.html for a results folder, reproducibly.

``write(root)`` builds the :class:`~ampcert.report.model.Report`, writes
``report.json`` (canonical JSON) and ``report.html`` (one self-contained file:
inline CSS and SVG, a Content-Security-Policy that forbids any fetch, every
string from suites or results escaped by jinja2's autoescaping) atomically.
The same folder always renders to the same bytes.
"""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from ampcert import formats
from ampcert.memory import LEVEL, MemoryFit
from ampcert.report import plots
from ampcert.report.model import Report, build_report, report_json
from ampcert.report.speed_probe import EXPLANATION as SPEED_PROBE_EXPLANATION
from ampcert.report.summary import fmt
from ampcert.results import ResultSet, atomic_write_text, load

REPORT_JSON, REPORT_HTML = "report.json", "report.html"

_env = Environment(loader=PackageLoader("ampcert", "report/templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True))
_env.filters["fmt"] = fmt
_env.filters["size"] = formats.size
_env.filters["percent"] = formats.percent
_env.filters["fine_size"] = formats.fine_size
_env.filters["budget"] = formats.budget


def _workloads(report: Report, root: Path) -> list[dict]:
    out = []
    keys = []
    for row in report.table:
        k = (row.workload, row.backend, row.amp)
        if k not in keys:
            keys.append(k)
    for label, backend, amp in keys:
        rows = [r for r in report.table if (r.workload, r.backend, r.amp) == (label, backend, amp)]
        runs = [r for r in report.runs if (r.spec.label, r.spec.backend, r.spec.amp) == (label, backend, amp)]
        salt = f"{label}-{backend}-{amp}"
        made = {
            "loss curves": plots.loss_curves(salt, runs),
            "eval metric over time": plots.eval_curves(salt, runs),
            "loss scale": plots.loss_scale(salt, runs),
            "power over time": plots.power(salt, runs, root),
            "speed-up": plots.bars(f"{label}: speed-up vs fp32", [r.precision for r in rows],
                                   [r.speedup_vs_fp32 for r in rows], "x fp32", f"speedup-{salt}", reference=1.0),
            "energy per sample": plots.bars(f"{label}: energy per sample", [r.precision for r in rows],
                                            [r.energy_j_per_sample for r in rows], "J", f"energy-{salt}"),
        }
        missing = [name for name, svg in made.items() if svg is None]
        reasons = {"loss scale": "no run used a loss scaler", "power over time": "no power readings in telemetry",
                   "energy per sample": "energy not measured", "speed-up": "no fp32 reference throughput"}
        out.append({"label": label, "backend": backend, "amp": amp, "rows": rows,
                    "plots": [svg for svg in made.values() if svg is not None],
                    "missing_plots": [f"{m} ({reasons.get(m, 'no data')})" for m in missing]})
    return out


def _memory(report: Report) -> list[dict]:
    """The memory section: per workload entry, backend and amp, its precisions' fits (one
    table row each), the budgets they were fitted against (one column each) and the plot."""
    groups: dict[tuple[str, str, str], list[MemoryFit]] = {}
    for fit in report.memory:  # already in table order (memory.fit_sweep)
        groups.setdefault((fit.subject.workload, fit.subject.backend, fit.subject.amp), []).append(fit)
    out = []
    for (label, backend, amp), fits in groups.items():
        budgets: list[tuple[int, str]] = []
        for fit in fits:  # a fit with too few points has no budgets: the columns are every fit's
            budgets += [(b.budget_bytes, b.source) for b in fit.budgets if (b.budget_bytes, b.source) not in budgets]
        out.append({"label": label, "backend": backend, "amp": amp, "fits": fits, "budgets": budgets,
                    "methods": sorted({f.method for f in fits if f.method}),
                    "plot": plots.memory_fit(label, fits, f"memory-{label}-{backend}-{amp}")})
    return out


def render_html(report: Report, root: Path) -> str:
    cert = report.certificate

    def verdicts_of(subject):
        return [v for v in (cert.verdicts if cert else []) if v.subject.key() == subject.key()]

    return _env.get_template("report.html.j2").render(r=report, workloads=_workloads(report, root),
                                                      verdicts_of=verdicts_of, memory=_memory(report),
                                                      memory_level=LEVEL,
                                                      speed_probe_explanation=SPEED_PROBE_EXPLANATION)


def write(rs: ResultSet | str | Path) -> tuple[Path, Path]:
    """Write report.json and report.html into the results folder; returns their paths."""
    if not isinstance(rs, ResultSet):
        rs = load(rs)
    report = build_report(rs)
    root = Path(rs.root)
    atomic_write_text(root / REPORT_JSON, report_json(report))
    atomic_write_text(root / REPORT_HTML, render_html(report, root))
    return root / REPORT_JSON, root / REPORT_HTML
