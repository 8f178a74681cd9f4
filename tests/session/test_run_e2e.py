"""`ampcert run` end to end, through the real CLI and real worker processes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
from conftest import snapshot
from factories import warm_cli

from ampcert.mllog import reader as mllog_reader
from ampcert.results import ResultsDir, load

TINY = """
name: tiny
precisions: [fp32, bf16]
seeds: [0]
train: {steps: 30, eval_every: 10}
timeout_s: 120
workloads:
  - workload: digits
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """TINY run for real once; the tests below read it or work on copies."""
    folder = tmp_path_factory.mktemp("tiny")
    suite = folder / "suite.yaml"
    suite.write_text(TINY)
    out = folder / "out"
    proc = warm_cli("run", suite, "--out", out)
    return suite, out, proc


def test_run_writes_results_logs_and_summary(tiny, tmp_path):
    _, original, proc = tiny
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    shutil.copytree(original, out)
    rs = load(out)
    assert rs.missing == [] and len(rs.runs) == 2
    for r in rs.runs:
        assert r.status == "completed" and r.steps == 30 and r.train_samples == 30 * 64
        assert len(r.loss) == 30 and [e.step for e in r.evals] == [10, 20, 30]
        assert 0.0 <= r.final_metric <= 1.0 and r.samples_per_s > 0
        assert r.step_time.n == 30 and r.peak_memory.value > 0 and "RSS" in r.peak_memory.method
        assert r.phases.train_s > 0 and r.weights_sha256 and r.determinism["deterministic_algorithms"]
        assert r.flops_per_step > 0 and r.achieved_flops > 0 and r.mfu > 0
        assert r.peak_flops.method.startswith("measured: 512x512 ")
        assert 0 < r.data_share < 1
        events = list(mllog_reader.read(ResultsDir(out).mllog_file(r.run_id)))
        keys = [e.key for e in events]
        # MLPerf's common rules want a cache_clear before init_start.
        assert keys[:2] == ["cache_clear", "init_start"] and keys[-1] == "run_stop"
        assert keys.index("init_stop") < keys.index("run_start") < keys.index("run_stop")
        assert keys.count("eval_accuracy") == 3
        # No quality target: as MLPerf logs a run that has no time-to-train
        assert r.target is None and events[-1].metadata == {"status": "aborted", "reason": "no quality target"}
    bf16 = next(r for r in rs.runs if r.spec.precision == "bf16")
    assert bf16.loss_scale is None  # bf16 trains without a loss scaler
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"] == {"planned": 2, "completed": 2, "failed": 0, "skipped": 0, "missing": 0}
    assert (out / "summary.html").read_text().count("<tr") == 1 + 2 + 1 + 2
    # `ampcert report` re-renders the same summary from what is stored.
    before = snapshot(out)
    assert warm_cli("report", out).returncode == 0
    assert snapshot(out) == before
    assert "digits-fp32-native-s0-" in proc.stdout and "[completed]" in proc.stdout


FAULTS = """
name: faults
precisions: [fp32]
seeds: [0]
train: {steps: 20, eval_every: 10}
timeout_s: 300
workloads:
  - workload: digits
  - workload: "fault_workloads:raising"
  - workload: "fault_workloads:nan"
  - workload: "fault_workloads:nan"
    id: nan-scaled
    precisions: [fp16]
    train: {steps: 10, eval_every: 5}
  - workload: "fault_workloads:hang"
    timeout_s: 3
  - workload: "fault_workloads:killed"
  - workload: "fault_workloads:badbuilder"
"""


def test_failures_are_isolated_and_explained(tmp_path, write_suite):
    out = tmp_path / "out"
    proc = warm_cli("run", write_suite(FAULTS), "--out", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # some runs failed; the suite finished
    assert "Traceback" not in proc.stdout + proc.stderr
    by_label = {r.spec.label: r for r in load(out).runs}
    assert by_label["digits"].status == "completed"
    reasons = {label: r.reason for label, r in by_label.items() if r.status == "failed"}
    assert reasons["raising"] == "ValueError: injected failure at step 7"
    assert reasons["nan"] == "non-finite loss at step 5 (fp32, no loss scaling)"
    assert "non-finite for all 5 steps up to step 10 despite loss scaling" in reasons["nan-scaled"]
    assert reasons["hang"] == "timeout: run exceeded 3 s and was killed"
    assert reasons["killed"].startswith("worker killed by SIGKILL")
    assert reasons["badbuilder"] == "RuntimeError: the user's builder is broken"
    rd = ResultsDir(out)
    raising = by_label["raising"].run_id
    assert "injected failure" in (rd.run_dir(raising) / "error.txt").read_text()  # traceback kept on disk
    last = list(mllog_reader.read(rd.mllog_file(raising)))[-1]
    assert last.key == "run_stop" and last.metadata["status"] == "aborted"


def test_a_second_invocation_on_the_same_folder_is_refused(tiny, tmp_path):
    suite, original, proc = tiny
    out = tmp_path / "out"
    assert warm_cli("run", suite, "--out", out, "--dry-run").returncode == 0
    assert not out.exists() or not any(out.iterdir())  # a dry run leaves the folder free for the run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shutil.copytree(original, out, dirs_exist_ok=True)  # what `ampcert run TINY --out out` wrote there
    (out / ".lock").write_text(str(os.getpid()))  # a live owner: this test process
    again = warm_cli("run", "--resume", out)
    assert again.returncode == 2 and "another ampcert" in again.stderr
    (out / ".lock").write_text("999999999")  # a dead owner: stale, taken over
    assert warm_cli("run", "--resume", out).returncode == 0


def test_plan_json_names_a_shipped_suite_by_its_label_and_a_users_suite_by_its_path(tmp_path):
    """plan.json's suite_source for `ampcert run smoke` is ampcert:suites/smoke.yaml, the same on
    every machine, never the site-packages path of one installation; a user's file keeps its path."""
    from ampcert.resources import from_label
    from ampcert.runner import planning
    from ampcert.session.runs import plan_suite

    planning.write_plan(tmp_path / "shipped", plan_suite("smoke").plan)
    stored = ResultsDir(tmp_path / "shipped").read_plan()
    assert stored.suite_source == "ampcert:suites/smoke.yaml"
    source = from_label(stored.suite_source)  # what a reader of the label finds: the very bytes planned
    assert source is not None and hashlib.sha256(source.read_bytes()).hexdigest() == stored.suite_sha256

    own = tmp_path / "own.yaml"
    own.write_text(TINY)
    planning.write_plan(tmp_path / "own", plan_suite(own).plan)
    assert ResultsDir(tmp_path / "own").read_plan().suite_source == str(own)
