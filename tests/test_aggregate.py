"""Every view of one results folder agrees with the one aggregation (ampcert.aggregate).

The folder is synthetic (no training): two backends, fp32 and bf16, three
seeds, a determinism repeat of seed 0 whose numbers differ wildly (so any
view that counted it as a seed would show it), a failed run and a skipped
run. The console table, summary.json, summary.html, report.json, the
certificate, `compare` and `plan` must all show the same groups with the same
run counts, and the first four the same means.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from ampcert import session
from ampcert.aggregate import aggregate, group_key, group_runs
from ampcert.certify import evaluate, load_rules
from ampcert.cli import views
from ampcert.results import (
    EvalPoint,
    FailureKind,
    ResultsDir,
    RunResult,
    StepTimes,
    atomic_write_json,
    load,
)
from ampcert.spec import expand, parse_suite
from ampcert.vocabulary import Subject


def _subject(row: dict) -> Subject:
    """A JSON row's four subject columns as a Subject."""
    return Subject(row["workload"], row["backend"], row["amp"], row["precision"])


def _specs(backend: str):
    suite = parse_suite({"name": "agree", "backend": backend, "amp": "ampcert", "precisions": ["fp32", "bf16"], "seeds": [0, 1, 2],
                         "train": {"steps": 8, "eval_every": 4}, "workloads": [{"workload": "resnet", "params": {"size": "tiny"}}]}, "t.yaml")
    return expand(suite, "cpu", repeats=1)


def _result(spec, index: int) -> RunResult:
    low = spec.precision == "bf16"
    jax = spec.backend == "jax"
    if spec.repeat:  # a repeat with numbers no seed has: counted as a seed, it moves every mean
        final, speed = 0.01, 1e6
    else:
        final, speed = 0.90 + 0.01 * spec.seed - 0.004 * low - 0.02 * jax, 1000.0 + 100 * spec.seed + 300 * low
    if spec.backend == "jax" and spec.precision == "bf16" and spec.seed == 2 and not spec.repeat:
        return RunResult(run_id=spec.run_id, spec=spec, status="failed", reason="non-finite loss at step 3 (bf16)",
                         failure=FailureKind.NON_FINITE, loss=[1.0, 0.9, None])
    if spec.backend == "torch" and spec.precision == "bf16" and spec.seed == 1:
        return RunResult(run_id=spec.run_id, spec=spec, status="skipped", reason="skipped by the test")
    steps_ms = [1000.0 * 64 / speed * (1 + 0.01 * (k % 3)) for k in range(8)]
    return RunResult(
        run_id=spec.run_id, spec=spec, status="completed", steps=8, train_samples=512, metric="accuracy",
        higher_is_better=True, final_metric=final, loss=[1.0 - 0.1 * k for k in range(8)],
        evals=[EvalPoint(step=8, samples=512, train_time_s=0.5, value=final)], samples_per_s=speed,
        step_times_ms=steps_ms, step_time=StepTimes(n=8, mean_ms=steps_ms[0], std_ms=0.1, p50_ms=steps_ms[0],
                                                    p90_ms=steps_ms[0], p99_ms=steps_ms[0], min_ms=steps_ms[0],
                                                    max_ms=steps_ms[0], method="synthetic"),
        mfu=0.1 + 0.01 * index, weights_sha256=f"w{spec.precision}{spec.seed}{spec.backend}",
        telemetry={"energy": {"train_j_per_sample": 0.5 + 0.1 * low, "scope": "host", "method": "synthetic"}},
        accelerated=True, capability_note="synthetic",
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("agree")
    specs = _specs("torch") + _specs("jax")
    (root / "suite.yaml").write_text("name: agree\n")
    atomic_write_json(ResultsDir(root).plan_file, {
        "tool": "test", "created_at": "2026-01-01T00:00:00+00:00", "suite": "agree", "suite_source": "t.yaml",
        "suite_sha256": "0" * 64, "device": "cpu", "capabilities": {}, "certify": None, "environment": {},
        "runs": [s.model_dump(mode="json") for s in specs]})
    for i, spec in enumerate(specs):
        atomic_write_json(ResultsDir(root).result_file(spec.run_id), _result(spec, i))
    session.certify(root, "default")  # writes verdicts.json, summary and report
    return root


def test_the_folder_has_what_the_views_could_disagree_on(folder):
    runs = load(folder).runs
    assert {r.spec.backend for r in runs} == {"torch", "jax"}
    assert sum(bool(r.spec.repeat) for r in runs) == 4 and any(r.status == "failed" for r in runs)
    assert len(group_runs(runs, repeats=True)) == len(group_runs(runs)) == 4


def test_summary_report_console_html_and_certificate_agree(folder):
    rows = aggregate(load(folder).runs)
    expected = {row.key: row for row in rows}
    assert len(expected) == 4
    # the repeats are not seeds: every group has its three seeds, the repeat's 1e6 samples/s nowhere
    assert all(row.runs == 3 for row in rows)
    assert all(row.samples_per_s < 2000 for row in rows)

    summary = json.loads((folder / "summary.json").read_text())
    report = json.loads((folder / "report.json").read_text())
    for group in summary["groups"]:
        row = expected[_subject(group)]
        assert (group["runs"], group["completed"], group["failed"], group["skipped"]) == \
            (row.runs, row.completed, row.failed, row.skipped)
        assert group["final_metric"] == row.final_metric and group["speedup_vs_fp32"] == row.speedup_vs_fp32
    for table_row in report["table"]:
        row = expected[_subject(table_row)]
        assert (table_row["runs"], table_row["completed"], table_row["failed"]) == (row.runs, row.completed, row.failed)
        assert table_row["final_metric"] == row.final_metric
        assert table_row["samples_per_s"] == row.samples_per_s
    assert len(summary["groups"]) == len(report["table"]) == 4
    assert [_subject(g) for g in summary["groups"]] == [_subject(t) for t in report["table"]] == list(expected)

    # the console table: one line per group, with the backend column (two backends here) and the same numbers
    out = Console(record=True, width=200, force_terminal=False)
    views.print_summary(out, load(folder), summary)
    text = out.export_text()
    for row in rows:
        line = next(ln for ln in text.splitlines()
                    if re.search(rf"\b{row.backend}\b.*\b{row.precision}\b\s", ln) and row.workload in ln)
        assert f"{row.completed}/{row.runs}" in line and views.fmt(row.final_metric) in line, line

    # summary.html: the same groups, counts and means
    html = (folder / "summary.html").read_text()
    for row in rows:
        cells = f"<td>{row.workload}</td><td class=\"text\">{row.backend}</td><td class=\"text\">{row.amp}</td>" \
                f"<td class=\"text\">{row.precision}</td>\n<td>{row.completed}/{row.runs}</td>"
        assert cells in html
        assert views.fmt(row.final_metric) in html

    # the certificate speaks about the same subjects, and its verdict is in report.json's row
    cert = evaluate(load(folder).runs, load_rules("default"))
    subjects = {s.subject: s.status for s in cert.subjects}
    assert set(subjects) <= set(expected) and {k for k in expected if k.precision == "bf16"} <= set(subjects)
    for table_row in report["table"]:
        assert table_row["verdict"] == subjects.get(_subject(table_row))


def test_compare_and_plan_group_the_same_runs(folder):
    expected = {row.key: row for row in aggregate(load(folder).runs)}
    result = session.compare(folder, folder)
    compared = {}
    for c in result.comparisons:
        compared.setdefault(c.subject, set()).add(c.baseline.runs)
    assert set(compared) == set(expected)
    for key, counts in compared.items():
        assert max(counts) == expected[key].completed, key

    cap = session.capacity(folder, 10_000)
    assert {r.key: r.seeds for r in cap.plan.rows} == \
        {k: row.completed for k, row in expected.items()}


def test_group_key_names_the_entry_backend_amp_and_precision(folder):
    run = load(folder).runs[0]
    assert group_key(run) == Subject(run.spec.label, run.spec.backend, run.spec.amp, run.spec.precision)
    assert str(group_key(run)) == f"{run.spec.label}/{run.spec.backend}/{run.spec.amp}/{run.spec.precision}"
