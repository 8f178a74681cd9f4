"""The `precision_disclosure` rule: a suite's declared MLPerf precision
disclosure (submission.lowest_precision) held to what each run measured."""

from __future__ import annotations

from conftest import assert_one_line_error, run_cli
from factories import completed, plan

from ampcert.certify import evaluate, load_rules
from ampcert.results import LowestPrecision

MEASURED = {"fp32": ("fp32", "fp32", "fp32"), "bf16": ("bfloat16", "bfloat16", "fp32")}


def _runs(declared: dict | None, measured: dict = MEASURED, unmeasured_seed: int | None = None):
    suite = {"name": "d", "precisions": ["fp32", "bf16"], "seeds": [0, 1, 2],
             "workloads": [{"workload": "gpt", "train": {"steps": 4}}]}
    if declared is not None:
        suite["submission"] = {"lowest_precision": declared}
    runs = []
    for spec in plan(suite):
        linear, attn, comm = measured[spec.precision]
        lowest = None if spec.seed == unmeasured_seed else LowestPrecision(linear=linear, attn=attn, comm=comm)
        runs.append(completed(spec, final_metric=1.0, lowest_precision=lowest))
    return runs


def _verdicts(runs):
    cert = evaluate(runs, load_rules("default"))
    return {v.subject.precision: v for v in cert.verdicts if v.rule == "disclosure.lowest_precision"}


def test_nothing_declared_gives_no_verdict():
    assert _verdicts(_runs(None)) == {}


def test_a_declaration_that_matches_the_measurement_passes():
    verdicts = _verdicts(_runs({"bf16": {"linear": "bfloat16", "attn": "bfloat16", "comm": "fp32"}}))
    assert set(verdicts) == {"bf16"}  # fp32 declared nothing
    assert verdicts["bf16"].status == "PASS" and verdicts["bf16"].required


def test_a_declaration_the_runs_did_not_compute_in_fails_naming_the_part():
    # A submitter claiming fp16 attention for a bf16 run: every seed contradicts it.
    verdicts = _verdicts(_runs({"bf16": {"attn": "fp16"}, "fp32": {"linear": "fp32"}}))
    assert verdicts["fp32"].status == "PASS"
    v = verdicts["bf16"]
    assert v.status == "FAIL"
    assert "attn declared fp16, measured bfloat16" in v.summary
    assert [m["seed"] for m in v.evidence["mismatches"]] == [0, 1, 2]


def test_a_run_without_a_measurement_is_inconclusive():
    v = _verdicts(_runs({"bf16": {"linear": "bfloat16"}}, unmeasured_seed=1))["bf16"]
    assert v.status == "INCONCLUSIVE" and len(v.evidence["unmeasured"]) == 1


def test_a_value_outside_mlperfs_list_is_one_line_at_planning(write_suite):
    suite = write_suite("""\
        name: d
        device: cpu
        precisions: [bf16]
        submission: {lowest_precision: {bf16: {linear: bf16}}}
        workloads: [{workload: digits}]
        """)
    assert_one_line_error(run_cli("run", suite, "--out", suite.parent / "out"), "lowest_precision", "linear")
    assert not (suite.parent / "out").exists()
