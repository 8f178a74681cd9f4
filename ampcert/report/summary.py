"""The suite summary: per-run rows and per-precision aggregates, as JSON and HTML.

Derived only from what is stored in the results folder, so ``ampcert report
DIR`` re-renders it at any time and gets the same answer.
"""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from ampcert import formats
from ampcert.aggregate import aggregate, steady
from ampcert.report.model import memory_fits, portable_tree
from ampcert.results import ResultsDir, ResultSet, atomic_write_json, atomic_write_text


def build(rs: ResultSet) -> dict[str, Any]:
    """summary.json: the counts, one group per (workload, backend, amp, precision)
    (:func:`ampcert.aggregate.aggregate`, the table report.json holds too), one row per run
    and, where the suite swept memory, report.json's memory fits."""
    df = rs.frame()
    groups = []
    for row in aggregate(rs.runs):
        group = row.model_dump()
        group["note"] = row.comparability  # the console and summary.html show it as a note
        groups.append(group)
    phases = {k: 0.0 for k in ("startup_s", "build_s", "train_s", "eval_s", "other_s")}
    for r in rs.runs:
        if r.phases:
            for k in phases:
                phases[k] += getattr(r.phases, k)
    summary: dict[str, Any] = {
        "suite": rs.suite_name,
        "counts": {
            "planned": len(rs.plan), "completed": sum(r.status == "completed" for r in rs.runs),
            "failed": sum(r.status == "failed" for r in rs.runs),
            "skipped": sum(r.status == "skipped" for r in rs.runs), "missing": len(rs.missing),
        },
        "groups": groups,
        "runs": _with_steady_state(rs, df.astype(object).where(df.notna(), None).to_dict(orient="records")
                                   if len(df) else []),
        "missing": rs.missing,
        "worker_phases_s": phases,
    }
    fits = memory_fits(rs)
    if fits:  # only then: a summary without a sweep keeps the bytes it had
        summary["memory"] = [fit.model_dump(mode="json") for fit in fits]
    # Install paths in run reasons and notes named by package, as in report.json (model.portable).
    return portable_tree(summary)


def _with_steady_state(rs: ResultSet, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's row with its steady-state throughput: the median after the warm-up, its
    95% interval, the CV and the warm-up steps (``ampcert.steady_state``; null where not timed)."""
    by_id = {r.run_id: r for r in rs.runs}
    for row in rows:
        found = steady(by_id[row["run_id"]]) if row["status"] == "completed" else None
        row["step_samples_per_s"] = found.samples_per_s if found else None
        row["step_samples_per_s_ci"] = found.ci if found else None
        row["step_cv"] = found.cv if found else None
        row["warmup_steps"] = found.warmup_steps if found else None
        row["steady_state_reached"] = found.reached if found else None
    return rows


_env = Environment(loader=PackageLoader("ampcert", "report/templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True))


fmt = formats.number  # the one number format of every view (ampcert.formats)


_env.filters["fmt"] = fmt
_env.filters["size"] = formats.size
_env.filters["fine_size"] = formats.fine_size
_env.filters["budget"] = formats.budget
_env.filters["percent"] = formats.percent


def render_html(summary: dict[str, Any]) -> str:
    return _env.get_template("summary.html.j2").render(s=summary)


def write(rs: ResultSet) -> dict[str, Any]:
    summary = build(rs)
    rd = ResultsDir(rs.root)
    atomic_write_json(rd.summary_json, summary)
    atomic_write_text(rd.summary_html, render_html(summary))
    return summary
