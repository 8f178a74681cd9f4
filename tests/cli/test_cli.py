"""The command line as a user meets it: bad input is one line and exit 2."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, assert_one_line_error, snapshot
from factories import warm_cli


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("name: t\nworkloads: [{workload: nosuch}]\n", ["suite.yaml", "workloads[0]", "unknown workload"]),
        ("name: t\nprecisions: [fp64]\nworkloads: [{workload: digits}]\n", ["precisions[0]", "'fp64'"]),
        ("name: t\ntrain: {steps: -1}\nworkloads: [{workload: digits}]\n", ["train.steps", "greater than 0"]),
        ("name: t\nworkloads: [{workload: digits}, {workload: digits}]\n", ["duplicate workload entry"]),
        ("name: t\nworkloads: [{workload: digits\n", ["malformed YAML at line"]),
        ("name: t\nworkloads: [{workload: resnet, params: {data: cifar10, path: /no/such/cifar}}]\n",
         ["workloads[0](resnet): data: /no/such/cifar"]),
        ("name: t\nworkloads: [{workload: gpt, params: {data: text, path: /no/such/corpus.txt}}]\n",
         ["workloads[0](gpt): data: /no/such/corpus.txt"]),
    ],
)
def test_bad_suite_is_one_line_exit_2_and_output_untouched(tmp_path, write_suite, text, fragments):
    out = tmp_path / "existing"
    (out / "runs" / "r1").mkdir(parents=True)
    (out / "runs" / "r1" / "result.json").write_text('{"precious": true}')
    before = snapshot(out)
    proc = warm_cli("run", write_suite(text), "--out", out)
    assert_one_line_error(proc, *fragments)
    assert snapshot(out) == before


def test_missing_suite_file(tmp_path):
    assert_one_line_error(warm_cli("run", tmp_path / "nope.yaml"), "nope.yaml", "not found")


def test_refuses_non_empty_out_folder_and_keeps_it(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    before = snapshot(out)
    proc = warm_cli("run", "suites/smoke.yaml", "--out", out)
    assert_one_line_error(proc, "not empty", "--resume")
    assert snapshot(out) == before


def test_unwritable_out_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert_one_line_error(warm_cli("run", "suites/smoke.yaml", "--out", blocker / "sub"), "cannot write there")


def test_resume_needs_a_results_folder(tmp_path):
    assert_one_line_error(warm_cli("run", "--resume", tmp_path / "nope"), "--resume", "results folder not found")
    assert_one_line_error(warm_cli("run", "--resume", tmp_path), "not an ampcert results folder")
    assert_one_line_error(warm_cli("report", tmp_path), "no plan.json")


def test_dry_run_prints_the_matrix_and_writes_nothing(tmp_path):
    # from an empty working folder, where a run would write its default reports/<suite>-<time>/
    before = snapshot(REPO / "reports")
    proc = warm_cli("run", REPO / "suites" / "smoke.yaml", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "suite smoke: 12 runs on" in proc.stdout
    for precision in ("fp32", "bf16", "fp16"):
        for workload in ("resnet", "gpt"):
            assert f"{workload}-{precision}-native-s0-" in proc.stdout
        assert f"{precision}: " in proc.stdout  # capability line per precision
    assert list(tmp_path.iterdir()) == []
    assert snapshot(REPO / "reports") == before


def test_list_and_env():
    listing = warm_cli("list")
    assert listing.returncode == 0 and "digits" in listing.stdout and "suites/smoke.yaml" in listing.stdout
    env = warm_cli("env", "--json")
    assert env.returncode == 0, env.stderr
    fp = json.loads(env.stdout)
    assert fp["packages"]["torch"] and fp["cpu"]["logical_cores"] >= 1
    assert "avx2" in fp["cpu"]["flags"]
    # CPU-only: GPU telemetry is reported as unavailable with a reason, never faked.
    if not fp["gpu"].get("cuda_available"):
        assert "unavailable" in fp["gpu"].get("nvml", "unavailable")
