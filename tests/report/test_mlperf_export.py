"""`ampcert export mlperf`: a results folder in MLPerf's submission layout,
judged by MLPerf's own tools (mlperf-logging's common rules, system
description checker, package checker and result summarizer)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_one_line_error, snapshot
from factories import completed, plan, warm_cli  # warm_cli: 2-3 s less a command than cold

from ampcert.certify.mlperf import check_system_description
from ampcert.report.mlperf_export import NOT_RECORDED, system_description, system_id

SUITE = """\
name: export
amp: ampcert
device: cpu
precisions: [fp32, bf16]
seeds: [0, 1, 2]
train: {target: 0.5, max_steps: 100, eval_every: 5}
unaccelerated: run
submission: {org: Acme Labs, platform: Test Box 9000}
workloads:
  - workload: digits
  - workload: digits
    id: digits-no-target
    precisions: [fp32]
    seeds: [0]
    train: {steps: 4, eval_every: 2}
  - workload: overflow
    precisions: [fp16]
    seeds: [0]
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """digits in fp32 and bf16 with three seeds each (MLPerf scores three or more), each
    reaching its quality target (0.5 accuracy: 30-40 steps); one digits run without a target;
    and one fp16 run built to overflow: it fails before its first evaluation."""
    folder = tmp_path_factory.mktemp("export")
    (folder / "export.yaml").write_text(SUITE)
    proc = warm_cli("run", folder / "export.yaml", "--out", folder / "res", timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # 1: the overflow run fails, by design
    return folder / "res"


@pytest.fixture(scope="module")
def exported(results, tmp_path_factory) -> tuple[Path, dict, str]:
    out = tmp_path_factory.mktemp("pkg") / "pkg"
    proc = warm_cli("export", "mlperf", results, out, "--json")
    return out, json.loads(proc.stdout), str(proc.returncode)


def _runs(results: Path) -> list[dict]:
    stored = [json.loads(p.read_text()) for p in sorted((results / "runs").glob("*/result.json"))]
    return [r for r in stored if "probe_process" not in r["spec"]]  # the speed probe's are no MLPerf runs


def test_the_layout_is_mlperfs_and_each_result_is_the_runs_log(results, exported):
    out, data, _ = exported
    org = out / "acme_labs"  # "Acme Labs" is no folder name; its submitter field keeps the spelling
    systems = {"test_box_9000_torch_ampcert_fp32", "test_box_9000_torch_ampcert_bf16",
               "test_box_9000_torch_ampcert_fp16"}
    assert {p.stem for p in (org / "systems").glob("*.json")} == systems
    assert {p.name for p in (org / "results").iterdir()} == systems
    for run in _runs(results):
        spec = run["spec"]
        same = sorted((r for r in _runs(results) if (r["spec"]["label"], r["spec"]["precision"])
                       == (spec["label"], spec["precision"])), key=lambda r: r["spec"]["seed"])
        n = [r["run_id"] for r in same].index(run["run_id"])  # result_N: the N-th seed
        written = org / "results" / f"test_box_9000_torch_ampcert_{spec['precision']}" / spec["label"] / f"result_{n}.txt"
        assert written.read_bytes() == (results / "runs" / run["run_id"] / "run.mllog").read_bytes()
    assert sorted((b["system"].rsplit("_", 1)[-1], b["benchmark"], b["results"]) for b in data["benchmarks"]) == [
        ("bf16", "digits", 3), ("fp16", "overflow", 1), ("fp32", "digits", 3), ("fp32", "digits-no-target", 1)]
    desc = json.loads((org / "systems" / "test_box_9000_torch_ampcert_bf16.json").read_text())
    assert desc["submitter"] == "Acme Labs" and desc["division"] == "open"
    assert desc["status"] == "Research, Development, or Internal (RDI)"
    assert desc["accelerators_per_node"] == "0" and desc["accelerator_model_name"] == "N/A"
    assert desc["framework"].startswith("PyTorch ")
    plan_env = json.loads((results / "plan.json").read_text())["environment"]
    assert desc["host_processor_model_name"] == plan_env["cpu"]["model"]
    assert desc["host_processor_vcpu_count"] == str(plan_env["cpu"]["logical_cores"])


def test_mlperfs_checkers_pass_all_but_the_log_that_never_evaluated(exported):
    out, data, code = exported
    # The overflow run failed before its first evaluation; MLPerf's common rules
    # rightly reject a log without eval_accuracy, so the export exits 1 and says which.
    assert code == "1" and not data["ok"]
    assert list(data["log_problems"]) == [
        str(out / "acme_labs/results/test_box_9000_torch_ampcert_fp16/overflow/result_0.txt")]
    assert any("eval_accuracy" in p for p in data["log_problems"][next(iter(data["log_problems"]))])
    assert data["systems"] and not any(data["systems"].values())  # every system description passes


def test_the_summarizers_scores_are_the_olympic_average_of_the_logs(exported):
    out, data, _ = exported
    for precision in ("fp32", "bf16"):
        folder = out / f"acme_labs/results/test_box_9000_torch_ampcert_{precision}/digits"
        minutes = []
        for log in sorted(folder.glob("result_*.txt")):
            times = {e["key"]: e["time_ms"] for e in
                     (json.loads(line.split(" ", 1)[1]) for line in log.read_text().splitlines())}
            minutes.append((times["run_stop"] - times["run_start"]) / 60000)
        row = next(r for r in data["scores"] if r["system_id"] == folder.parent.name)
        assert row["digits"] == pytest.approx(sorted(minutes)[1])  # three runs: the middle one
        assert row["submitter"] == "Acme Labs"


def test_a_run_without_a_target_is_logged_aborted_and_left_without_a_score(results, exported):
    """MLPerf's success is a run that reached its quality target: a run without one (or that
    missed it) logs run_stop `aborted` with the reason, and the export gives its benchmark
    no time-to-train, which MLPerf's summarizer alone would (it times any run_stop)."""
    out, data, _ = exported
    stops = {}
    for run in _runs(results):
        (stop,) = [json.loads(line.split(" ", 1)[1]) for line in
                   (results / "runs" / run["run_id"] / "run.mllog").read_text().splitlines() if '"run_stop"' in line]
        stops[run["spec"]["label"], run["spec"]["precision"], run["spec"]["seed"]] = stop["metadata"]
        assert (stop["metadata"]["status"] == "success") == bool(run["target_reached"]), (run["run_id"], stop)
    assert stops["digits-no-target", "fp32", 0] == {"status": "aborted", "reason": "no quality target"}
    assert stops["overflow", "fp16", 0]["status"] == "aborted"  # the worker's: the run failed
    system = "test_box_9000_torch_ampcert_fp32"
    unscored = out / f"acme_labs/results/{system}/digits-no-target/result_0.txt"
    assert data["unscored"][str(unscored)].endswith(": no quality target")
    assert next(r for r in data["scores"] if r["system_id"] == system)["digits-no-target"] is None
    printed = warm_cli("export", "mlperf", results, out)  # the same files again: the table
    assert f"{unscored}: no time-to-train (" in printed.stdout, printed.stdout


def test_an_export_imported_back_keeps_every_runs_status_and_time_to_target(results, exported, tmp_path):
    """Export and import read and write the same meaning: a run that reached its target is a
    `success` whose run_start..run_stop is its time to target; every other run (no target, the
    failed overflow run) comes back `aborted`, dropped from the score with the reason it was logged with."""
    from ampcert.published.importer import load_published
    from ampcert.results import RunResult

    out, _, _ = exported
    proc = warm_cli("import", "mlperf", out, "--out", tmp_path / "imp", "--json")
    # overflow (its fp16 run failed) and digits-no-target have no score: imported, with the reason, exit 1
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert [row["benchmark"] for row in json.loads(proc.stdout)["imported"]
            if row["score"]["score_minutes"] is None] == ["overflow", "digits-no-target"]
    imported = {(rec.system, rec.benchmark): rec for rec in
                (load_published(Path(row["folder"])) for row in json.loads(proc.stdout)["imported"])}
    runs = [RunResult.model_validate(run) for run in _runs(results)]
    assert len(runs) == sum(len(rec.logs) for rec in imported.values()) == 8
    for r in runs:
        rec = imported[system_id(r), r.spec.label]
        (log,) = [log for log in rec.logs if log.seed == r.spec.seed]
        (timed,) = [t for t in rec.score.runs if f"logs/{t.file}" == log.file]
        assert log.sha256 == hashlib.sha256((results / "runs" / r.run_id / "run.mllog").read_bytes()).hexdigest()
        if r.target_reached:
            assert log.status == "success" and timed.dropped is None, r.run_id
            assert timed.minutes is not None and r.time_to_target_s is not None
            assert abs(timed.minutes * 60 - r.time_to_target_s) < 0.25, (r.run_id, timed.minutes, r.time_to_target_s)
        else:
            assert log.status == "aborted" and timed.minutes is None, r.run_id
            assert timed.dropped is not None and timed.dropped.startswith("run_stop status aborted")
    no_target = imported["test_box_9000_torch_ampcert_fp32", "digits-no-target"]
    assert no_target.score.runs[0].dropped == "run_stop status aborted: no quality target"
    assert no_target.score.score_minutes is None and no_target.fingerprint.accelerators == 0


def test_measured_runs_stand_beside_the_same_runs_published(results, exported, tmp_path):
    """compare-systems reads ampcert's own folder and MLPerf's layout the same way: the digits runs,
    exported and imported back, have the time to train (to the millisecond MLLOG keeps) of the
    folder they came from."""
    out, _, _ = exported
    assert warm_cli("import", "mlperf", out, "--out", tmp_path / "imp").returncode == 1  # overflow, digits-no-target: no score
    proc = warm_cli("compare-systems", tmp_path / "imp", results, "--out", tmp_path / "cmp", "--benchmark", "digits",
                    "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)["comparison"]["rows"]
    published = {row["name"].rsplit("_", 1)[-1]: row for row in rows if row["source"] == "published"}
    measured = {row["precision"]: row for row in rows if row["source"] == "measured"}
    assert sorted(published) == sorted(measured) == ["bf16", "fp32"]
    for precision, row in measured.items():
        twin = published[precision]
        assert row["counted"] == twin["counted"] == 3 and row["runs"] == twin["runs"] == 3
        assert row["time_to_train_minutes"] == pytest.approx(twin["time_to_train_minutes"], abs=0.25 / 60)
        # ampcert's logs disclose the precision they measured (MLPerf 6.x's keys); the import reads it back
        assert twin["precision"] == {"fp32": "attn fp32, comm fp32, linear fp32",
                                     "bf16": "attn bfloat16, comm fp32, linear bfloat16"}[precision]
        assert row["accelerators"] == twin["accelerators"] == 0 and row["accelerator_hours_per_run"] is None
        assert row["compliance"] == "not run" and "not an MLPerf submission" in row["compliance_detail"]
        # an export is no round of MLPerf's: its checkers have no ruleset to judge it by, and say so
        assert twin["compliance"] == "not run" and "no training_results_vX.Y folder" in twin["compliance_detail"]
        assert any("trained on a CPU" in note for note in row["notes"])


def test_mlperfs_package_checker_accepts_the_package_and_can_reject_it(exported, tmp_path):
    out, _, _ = exported

    def package_checker(org: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "mlperf_logging.package_checker", str(org), "training", "6.1.0"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)

    proc = package_checker(out / "acme_labs")
    assert "PACKAGE CHECKER FOUND NO ERRORS" in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert (proc.stdout + proc.stderr).count("System description checker passed") == 3
    # Its result checks skip benchmarks it does not know (documented in docs/mlperf.md).
    assert "Skipping benchmark: digits" in proc.stdout + proc.stderr
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", str(out / "acme_labs"), str(broken)], check=True)
    desc_file = broken / "systems/test_box_9000_torch_ampcert_fp32.json"
    desc = json.loads(desc_file.read_text())
    del desc["host_networking"]
    desc["status"] = "research"
    desc_file.write_text(json.dumps(desc))
    assert check_system_description(desc_file)  # ours says why
    proc = package_checker(broken)
    assert "PACKAGE CHECKER FOUND ERRORS" in proc.stdout + proc.stderr


def test_exporting_again_changes_nothing_and_a_clash_is_one_line(results, exported):
    out, _, _ = exported
    before = snapshot(out)
    assert warm_cli("export", "mlperf", results, out).returncode == 1  # same files, same verdicts
    assert snapshot(out) == before
    victim = next(out.rglob("result_1.txt"))
    victim.write_text("edited by hand\n")
    before = snapshot(out)
    assert_one_line_error(warm_cli("export", "mlperf", results, out), "already exists with other content")
    assert snapshot(out) == before


@pytest.mark.parametrize("make", ["missing", "not_results", "file_out"])
def test_bad_input_is_one_line(results, tmp_path, make):
    args = {"missing": (tmp_path / "nope", tmp_path / "o"),
            "not_results": (tmp_path, tmp_path / "o"),
            "file_out": (results, results / "plan.json")}[make]
    before = snapshot(results)
    assert_one_line_error(warm_cli("export", "mlperf", *args))
    assert snapshot(results) == before


def _gpu_run(environment=None):
    suite = {"name": "g", "device": "cuda", "precisions": ["bf16"], "seeds": [0], "launcher": "torchrun",
             "torchrun": {"nnodes": 2, "nproc_per_node": 4},
             "submission": {"org": "Acme", "platform": "DGX H100", "status": "available"},
             "workloads": [{"workload": "gpt", "train": {"steps": 4}}]}
    spec = plan(suite, device="cuda", capabilities=None)[0]
    if environment is None:
        environment = {"torch": "2.14.1", "device_name": "NVIDIA H100 80GB HBM3"}
    return completed(spec, final_metric=1.0, environment=environment)


GPU_ENV = {"python": "3.11.7", "platform": "Linux-6.8-x86_64",
           "cpu": {"model": "Intel Xeon Platinum 8480C", "logical_cores": 224, "physical_cores": 112, "sockets": 2,
                   "memory_bytes": 2 * 2**40},
           "gpu": {"torch_cuda": "12.8", "driver": "570.86",
                   "devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 2**30}] * 8},
           "packages": {"torch": "2.14.1", "numpy": "2.3.0", "jax": None}}


def test_a_gpu_systems_description_comes_from_its_fingerprint_and_passes(tmp_path):
    r = _gpu_run()
    desc = system_description(r, GPU_ENV, "ampcert 9.9")
    assert system_id(r) == "dgx_h100_torch_native_bf16_2x4"
    assert desc["number_of_nodes"] == "2" and desc["accelerators_per_node"] == "4"
    assert desc["host_processors_per_node"] == "2" and desc["host_processor_core_count"] == "112"
    assert desc["accelerator_model_name"] == "NVIDIA H100 80GB HBM3"
    assert desc["accelerator_memory_capacity"] == "80 GB" and desc["host_memory_capacity"] == "2048 GB"
    assert desc["framework"] == "PyTorch 2.14.1" and desc["status"] == "Available on-premise"
    assert "CUDA 12.8" in desc["other_software_stack"] and "driver 570.86" in desc["other_software_stack"]
    assert all(desc[k] == "" for k in NOT_RECORDED)  # not recorded: empty, and named in hw_notes
    assert all(k in desc["hw_notes"] for k in NOT_RECORDED)
    assert all(isinstance(v, str) for v in desc.values())
    path = tmp_path / "sys.json"
    path.write_text(json.dumps(desc))
    assert check_system_description(path) == []


def test_a_fingerprint_of_the_wrong_shape_counts_as_not_recorded(tmp_path):
    """plan.json may come from elsewhere: odd types give empty fields, not a traceback."""
    desc = system_description(_gpu_run(environment={}), {"cpu": "x", "gpu": {"devices": "y"}, "packages": [1]},
                              "ampcert 9.9")
    assert desc["host_processor_model_name"] == "" and desc["accelerator_model_name"] == ""
    assert "host_processors_per_node taken as 1" in desc["hw_notes"]
    path = tmp_path / "sys.json"
    path.write_text(json.dumps(desc))
    assert check_system_description(path) == []
