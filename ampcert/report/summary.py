"""The suite summary: per-run rows and per-precision aggregates, as JSON and HTML.

Derived only from what is stored in the results folder, so ``ampcert report
DIR`` re-renders it at any time and gets the same answer.
"""

from __future__ import annotations

import statistics
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from ampcert.results import (
    ResultsDir,
    ResultSet,
    atomic_write_json,
    atomic_write_text,
    capped_groups,
    not_comparable,
)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _std(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def build(rs: ResultSet) -> dict[str, Any]:
    df = rs.frame()
    groups: list[dict[str, Any]] = []
    # The summary groups without the backend; a capped group is capped on every backend it ran.
    capped = {(label, amp, precision): cap for (label, _, amp, precision), cap in capped_groups(rs.runs).items()}
    if len(df):
        fp32_speed: dict[str, float] = {}
        for (label, amp, precision), g in df.groupby(["workload", "amp", "precision"], sort=False):
            done = g[g.status == "completed"]
            speeds = [float(v) for v in done.samples_per_s.dropna()]
            metrics = [float(v) for v in done.final_metric.dropna()]
            if precision == "fp32" and speeds:
                fp32_speed[label] = statistics.fmean(speeds)
            reached = done.target_reached.dropna()
            groups.append({
                "workload": label, "amp": amp, "precision": precision,
                "runs": int(len(g)), "completed": int(len(done)),
                "failed": int((g.status == "failed").sum()), "skipped": int((g.status == "skipped").sum()),
                "metric": done.metric.iloc[0] if len(done) else None,
                "final_metric_mean": _mean(metrics), "final_metric_std": _std(metrics),
                "target_reached": f"{int(reached.sum())}/{len(reached)}" if len(reached) else None,
                "steps_to_target_mean": _mean([float(v) for v in done.steps_to_target.dropna()]),
                "samples_per_s_mean": _mean(speeds),
                "flops_per_step": _mean([float(v) for v in done.flops_per_step.dropna()]),
                "mfu_mean": _mean([float(v) for v in done.mfu.dropna()]),
                "data_share_mean": _mean([float(v) for v in done.data_share.dropna()]),
                "j_per_sample_mean": _mean([float(v) for v in done.j_per_sample.dropna()]),
                "accelerated": bool(g.accelerated.all()),
                "note": not_comparable(capped[label, amp, precision]) if (label, amp, precision) in capped else None,
            })
        for row in groups:
            base = fp32_speed.get(row["workload"])
            row["speedup_vs_fp32"] = (row["samples_per_s_mean"] / base
                                      if base and row["samples_per_s_mean"] else None)
    phases = {k: 0.0 for k in ("startup_s", "build_s", "train_s", "eval_s", "other_s")}
    for r in rs.runs:
        if r.phases:
            for k in phases:
                phases[k] += getattr(r.phases, k)
    return {
        "suite": rs.suite_name,
        "counts": {
            "planned": len(rs.plan), "completed": sum(r.status == "completed" for r in rs.runs),
            "failed": sum(r.status == "failed" for r in rs.runs),
            "skipped": sum(r.status == "skipped" for r in rs.runs), "missing": len(rs.missing),
        },
        "groups": groups,
        "runs": df.astype(object).where(df.notna(), None).to_dict(orient="records") if len(df) else [],
        "missing": rs.missing,
        "worker_phases_s": phases,
    }


_env = Environment(loader=PackageLoader("ampcert", "report/templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True))


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


_env.filters["fmt"] = fmt


def render_html(summary: dict[str, Any]) -> str:
    return _env.get_template("summary.html.j2").render(s=summary)


def write(rs: ResultSet) -> dict[str, Any]:
    summary = build(rs)
    rd = ResultsDir(rs.root)
    atomic_write_json(rd.summary_json, summary)
    atomic_write_text(rd.summary_html, render_html(summary))
    return summary
