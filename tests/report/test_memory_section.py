"""The report's memory section (issue 37): a suite's memory sweep fitted per precision in
report.json (``memory``), report.html (tables, notes, the plot) and summary.json/html, from
synthetic sweep results whose peaks lie exactly on known lines; a folder without a sweep
keeps its bytes (no ``memory`` key)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml
from factories import completed, failed, plan, write_results

from ampcert.report import render, summary
from ampcert.report.model import SCHEMA_FILE, load_report
from ampcert.results import FailureKind, ResultsDir, atomic_write_json, load

GIB = 2**30
BATCHES = [64, 256, 1024, 4096]
# The true lines the synthetic peaks lie on: (fixed bytes, bytes per sample). bf16 costs 25%
# more per sample than fp32, as autocast's extra weight copies and casts can on a CPU.
LINES = {"fp32": (300e6, 700e3), "bf16": (310e6, 875e3)}
OOM_AT = ("bf16", 4096)  # bf16 at the largest batch runs out of memory: a finding, not a point
DEVICE_MEMORY = 2 * GIB


def _suite(budgets: list[str] | None) -> dict:
    suite = {"name": "memory-section", "device": "cpu", "precisions": ["fp32", "bf16"],
             "workloads": [{"workload": "digits", "train": {"steps": 10}}]}
    if budgets is not None:
        suite["memory"] = {"batch_sizes": BATCHES, "budgets": budgets}
    return suite


def _folder(root: Path, budgets: list[str] | None) -> Path:
    """A results folder as ``ampcert run`` leaves it for ``_suite(budgets)`` (no sweep where
    ``budgets`` is None), with summary and report written."""
    suite = _suite(budgets)
    runs = []
    for spec in plan(suite):
        if not spec.is_memory_sweep:
            runs.append(completed(spec, final_metric=0.9))
        elif (spec.precision, spec.sweep.batch_size) == OOM_AT:
            runs.append(failed(spec, "CUDA out of memory. Tried to allocate 2.00 GiB",
                               failure=FailureKind.OUT_OF_MEMORY))
        else:
            fixed, per_sample = LINES[spec.precision]
            runs.append(completed(spec, final_metric=0.9, batch=spec.sweep.batch_size,
                                  peak_memory=fixed + per_sample * spec.sweep.batch_size))
    write_results(root, runs, suite=suite["name"])
    rd = ResultsDir(root)
    rd.suite_file.write_text(yaml.safe_dump(suite, sort_keys=False), encoding="utf-8")
    plan_json = json.loads(rd.plan_file.read_text())
    atomic_write_json(rd.plan_file, plan_json | {"device": "cpu", "environment": {"cpu": {
        "memory_bytes": DEVICE_MEMORY}}})
    rs = load(root)
    summary.write(rs)
    render.write(rs)
    return root


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    return _folder(tmp_path_factory.mktemp("memory") / "out", ["1GiB"])


def _fits(folder: Path) -> dict[str, dict]:
    report = json.loads((folder / "report.json").read_text())
    return {f["subject"]["precision"]: f for f in report["memory"]}


def test_report_json_recovers_the_lines_and_the_largest_batch_per_budget(swept):
    fits = _fits(swept)
    assert list(fits) == ["fp32", "bf16"]  # table order
    for precision, (fixed, per_sample) in LINES.items():
        fit = fits[precision]
        assert fit["fixed_bytes"] == pytest.approx(fixed, rel=1e-9)
        assert fit["bytes_per_sample"] == pytest.approx(per_sample, rel=1e-9)
        assert all(abs(p["residual_bytes"]) < 1e-3 * per_sample for p in fit["points"])
        assert fit["max_residual_share"] == pytest.approx(0, abs=1e-9)
        [budget] = fit["budgets"]
        assert (budget["budget_bytes"], budget["source"]) == (GIB, "suite")
        assert budget["largest_batch"] == math.floor((GIB - fixed) / per_sample)  # 1105 and 872
    assert [p["batch"] for p in fits["fp32"]["points"]] == BATCHES
    assert all(p["run_id"].startswith("digits-fp32-") for p in fits["fp32"]["points"])
    assert fits["fp32"]["saving"] is None  # the reference


def test_a_precision_costing_more_says_it_does_not_save_memory(swept):
    bf16 = _fits(swept)["bf16"]
    assert bf16["saving"]["fraction"] == pytest.approx(1 - 875 / 700)
    assert "bf16 does not save memory here: 25% more per sample than fp32" in bf16["note"]
    assert "bf16 does not save memory here" in bf16["saving"]["note"]


def test_a_batch_that_ran_out_of_memory_is_listed_not_fitted(swept):
    bf16 = _fits(swept)["bf16"]
    assert [p["batch"] for p in bf16["points"]] == BATCHES[:-1]
    [too_big] = bf16["does_not_fit"]
    assert too_big["batch"] == 4096 and too_big["run_id"].startswith("digits-bf16-") and "-b4096-" in too_big["run_id"]
    assert "does not fit at batch 4096" in bf16["note"]


def test_report_json_with_memory_validates_and_reads_back(swept):
    jsonschema = pytest.importorskip("jsonschema")
    data = json.loads((swept / "report.json").read_text())
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))
    report = load_report(swept / "report.json")
    assert [f.subject.precision for f in report.memory] == ["fp32", "bf16"]
    # Sweep runs are their own: not among the certified runs, nor missing.
    assert not any(r.spec.is_memory_sweep for r in report.runs) and "memory_missing_runs" not in data


def test_report_html_has_the_memory_section_and_its_plot(swept, tmp_path):
    html = (swept / "report.html").read_text()
    section = html[html.index("<h2>Memory: peak against batch size</h2>"):html.index("<h2>Precision capability")]
    assert "<h3>digits" in section and "table.memory th" in html  # the section's style, in the head
    assert section.count("<svg") == 1 and "peak memory against batch size" in section
    assert "largest batch within 1 GiB (suite budget)" in section
    assert "683.6 KiB" in section and "854.5 KiB" in section  # bytes per sample, fp32 and bf16
    assert "1,105" in section and "872" in section  # the largest batch within the budget
    assert "bf16 does not save memory here" in section and "(saves none)" in section
    assert "at batch 4096" in section and "CUDA out of memory" in section
    assert "What each peak includes: synthetic peak RSS." in section
    # The same folder renders to the same bytes (the plot's ids are salted, not random).
    copy = tmp_path / "copy"
    shutil.copytree(swept, copy)
    render.write(load(copy))
    assert (copy / "report.html").read_bytes() == (swept / "report.html").read_bytes()
    assert (copy / "report.json").read_bytes() == (swept / "report.json").read_bytes()


def test_summary_carries_the_fits_and_a_compact_table(swept):
    data = json.loads((swept / "summary.json").read_text())
    assert [f["subject"]["precision"] for f in data["memory"]] == ["fp32", "bf16"]
    assert data["memory"] == json.loads((swept / "report.json").read_text())["memory"]
    swept_ids = {p["run_id"] for f in data["memory"] for p in f["points"]}
    assert swept_ids and not swept_ids & {r["run_id"] for r in data["runs"]}  # sweep runs are not runs here
    html = (swept / "summary.html").read_text()
    assert "Memory: peak against batch size" in html and "1,105 within 1 GiB (suite)" in html


def test_without_budgets_the_device_memory_is_the_budget(tmp_path):
    folder = _folder(tmp_path / "out", [])
    for precision, (fixed, per_sample) in LINES.items():
        [budget] = _fits(folder)[precision]["budgets"]
        assert (budget["budget_bytes"], budget["source"]) == (DEVICE_MEMORY, "device")
        assert budget["largest_batch"] == math.floor((DEVICE_MEMORY - fixed) / per_sample)
    assert "(device memory)" in (folder / "report.html").read_text()


def test_a_folder_without_a_sweep_has_no_memory_section(tmp_path):
    folder = _folder(tmp_path / "out", None)
    report = json.loads((folder / "report.json").read_text())
    assert "memory" not in report and "memory_missing_runs" not in report
    assert "memory" not in json.loads((folder / "summary.json").read_text())
    html = (folder / "report.html").read_text()
    assert "Memory: peak against batch size" not in html and "table.memory" not in html  # nor its style
    assert "Memory: peak against batch size" not in (folder / "summary.html").read_text()


def test_sweep_runs_without_a_result_are_named(swept, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(swept, copy)
    gone = next(p for p in (copy / "runs").iterdir() if "-fp32-" in p.name and "-b256-" in p.name)
    shutil.rmtree(gone)
    render.write(load(copy))
    report = json.loads((copy / "report.json").read_text())
    assert report["memory_missing_runs"] == [gone.name]
    assert [p["batch"] for p in _fits(copy)["fp32"]["points"]] == [64, 1024, 4096]
    assert f"Planned sweep runs without a result: <code>{gone.name}</code>" in (copy / "report.html").read_text()
