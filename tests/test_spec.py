"""Suite validation, matrix expansion and run ids."""

from __future__ import annotations

import pytest

from ampcert.errors import UserError
from ampcert.spec import apply_capabilities, expand, load_suite, parse_suite

GOOD = """
name: t
precisions: [fp32, bf16]
seeds: [0, 1]
train: {steps: 20, eval_every: 10}
workloads:
  - workload: digits
  - workload: digits
    id: digits-wide
    params: {width: 32}
    seeds: [5]
"""


def test_expansion_order_and_overrides(write_suite):
    suite = load_suite(write_suite(GOOD))
    runs = expand(suite, "cpu")
    assert [(r.label, r.precision, r.seed) for r in runs] == [
        ("digits", "fp32", 0), ("digits", "fp32", 1), ("digits", "bf16", 0), ("digits", "bf16", 1),
        ("digits-wide", "fp32", 5), ("digits-wide", "bf16", 5),
    ]
    # Defaults are filled in, so a changed default would change the run id.
    assert runs[0].params["width"] == 16 and runs[4].params["width"] == 32


def test_run_ids_are_stable_unique_and_content_derived(write_suite):
    a = expand(load_suite(write_suite(GOOD)), "cpu")
    b = expand(load_suite(write_suite(GOOD.replace("name: t", "name: renamed"))), "cpu")
    assert [r.run_id for r in a] == [r.run_id for r in b]  # the suite's name is not content
    assert len({r.run_id for r in a}) == len(a)
    c = expand(load_suite(write_suite(GOOD.replace("steps: 20", "steps: 21"))), "cpu")
    assert all(x.run_id != y.run_id for x, y in zip(a, c, strict=True))
    assert a[0].run_id.startswith("digits-fp32-native-s0-")
    assert expand(load_suite(write_suite(GOOD)), "cuda")[0].run_id != a[0].run_id


def test_explicit_default_param_gives_same_id(write_suite):
    plain = expand(load_suite(write_suite(GOOD)), "cpu")[0]
    explicit = expand(load_suite(write_suite(GOOD.replace("- workload: digits\n  - workload",
                                                           "- workload: digits\n    params: {width: 16}\n  - workload"))), "cpu")[0]
    assert plain.run_id == explicit.run_id


@pytest.mark.parametrize(
    "text, expected",
    [
        ("name: t\nworkloads: [{workload: nosuch}]\n", "workloads[0](nosuch): unknown workload 'nosuch'"),
        ("name: t\nprecisions: [fp4]\nworkloads: [{workload: digits}]\n", "precisions[0]: got 'fp4'"),
        ("name: t\ntrain: {steps: -3}\nworkloads: [{workload: digits}]\n", "train.steps: Input should be greater than 0"),
        ("name: t\nworkloads: [{workload: digits}, {workload: digits}]\n", "duplicate workload entry 'digits'"),
        ("name: t\nworkloads: [{workload: digits, params: {wdith: 3}}]\n", "params: wdith: unknown field"),
        ("name: t\nworkloads: [{workload: digits}]\nbogus: 1\n", "bogus: unknown field"),
        ("name: t\ntrain: {target: 0.9}\nworkloads: [{workload: digits}]\n", "a `target` needs a `max_steps` cap"),
        ("name: t\nworkloads: []\n", "workloads: List should have at least 1 item"),
        ("name: t\nunaccelerated: cap\nworkloads: [{workload: digits}]\n", "needs `unaccelerated_max_steps`"),
        ("- just\n- a list\n", "expected a mapping of suite fields"),
        ("name: t\nworkloads: [{workload: 'fault_workloads:not_a_workload'}]\n", "lacks the workload protocol"),
        ("name: t\nworkloads: [{workload: 'no_such_pkg.mod:thing'}]\n", "does not import: ModuleNotFoundError"),
    ],
)
def test_bad_suites_give_one_line_naming_file_and_field(write_suite, text, expected):
    path = write_suite(text)
    with pytest.raises(UserError) as info:
        load_suite(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert expected in message


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(UserError, match="suite file not found"):
        load_suite(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\nworkloads: [unclosed\n")
    with pytest.raises(UserError, match=r"bad.yaml: malformed YAML at line \d+"):
        load_suite(bad)
    with pytest.raises(UserError, match="expected a suite file, found a folder"):
        load_suite(tmp_path)


def _suite(policy: str, extra: str = ""):
    return parse_suite({"name": "t", "train": {"steps": 400}, "unaccelerated": policy,
                        "workloads": [{"workload": "digits"}], **({"unaccelerated_max_steps": 50} if extra else {})})


CAPS = {"fp32": {"accelerated": True, "note": "reference"},
        "bf16": {"accelerated": True, "note": "accelerated"},
        "fp16": {"accelerated": False, "note": "not accelerated on cpu: 0.01x"}}


def test_unaccelerated_runs_are_marked_never_silently_dropped():
    suite = _suite("run")
    runs = apply_capabilities(suite, expand(suite, "cpu"), CAPS)
    fp16 = [r for r in runs if r.precision == "fp16"][0]
    assert not fp16.accelerated and "not accelerated on cpu" in fp16.capability_note
    assert fp16.skip_reason is None and fp16.train.steps == 400


def test_unaccelerated_skip_and_cap_policies():
    suite = _suite("skip")
    by_prec = {r.precision: r for r in apply_capabilities(suite, expand(suite, "cpu"), CAPS)}
    assert "skipped by the suite's `unaccelerated: skip`" in by_prec["fp16"].skip_reason
    assert by_prec["bf16"].skip_reason is None

    suite = _suite("cap", extra="cap")
    by_prec = {r.precision: r for r in apply_capabilities(suite, expand(suite, "cpu"), CAPS)}
    assert by_prec["fp16"].train.steps == 50 and "capped at 50" in by_prec["fp16"].capability_note
    assert by_prec["fp32"].train.steps == 400
