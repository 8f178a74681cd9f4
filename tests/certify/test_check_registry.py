"""One vocabulary: each check declared once (rules.py's model, checks.py's @judges),
one Subject and one Status for certify, the gates, the history and the tables.

No training: synthetic results (tests/factories.py) and the models themselves."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError
from typing import Literal

import factories
import pytest

from ampcert.certify import checks
from ampcert.certify import rules as R
from ampcert.certify.checks import Certificate, evaluate
from ampcert.vocabulary import Status, Subject, worst


def test_every_check_is_one_model_and_one_function_in_one_order():
    assert R.CHECKS == tuple(R.RULE_MODELS) == tuple(checks.CHECK_SPECS) == tuple(checks.CHECK_FUNCTIONS)
    for check, spec in checks.CHECK_SPECS.items():
        assert spec.id == check == spec.rule_model.check_id
        assert spec.rule_model.model_fields["check"].annotation == Literal[check]
        assert checks.CHECK_FUNCTIONS[check] is spec.function and spec.function.__name__ == f"check_{check}"
    # the union a pack is validated against is those models, in that order
    member = R.RulePack.model_validate({"name": "p", "rules": [
        {"id": "x", "check": "speedup", "measures": "m", "min_ratio": 1.1}]}).rules[0]
    assert type(member) is R.RULE_MODELS["speedup"]


def test_a_check_declared_twice_or_without_a_literal_id_is_refused_at_definition():
    with pytest.raises(TypeError, match="'speedup' is already Speedup"):
        class Again(R.RuleModel):  # noqa: F841 - defining it is the test
            check: Literal["speedup"]
    with pytest.raises(TypeError, match="one-value Literal"):
        class Loose(R.RuleModel):  # noqa: F841
            check: str
    assert R.RULE_MODELS["speedup"] is R.Speedup and "Loose" not in {m.__name__ for m in R.RULE_MODELS.values()}
    with pytest.raises(TypeError, match="judged twice"):
        checks.judges(R.Speedup)(lambda rule, group: None)
    assert checks.CHECK_SPECS["speedup"].function is checks.check_speedup


def test_status_reads_as_the_strings_it_replaced():
    assert Status.FAIL == "FAIL" and str(Status.PASS) == "PASS" and f"{Status.INCONCLUSIVE:<14}|" == "INCONCLUSIVE  |"
    assert json.dumps({"s": Status.PASS}) == '{"s": "PASS"}' and Status("FAIL") is Status.FAIL
    assert {"PASS": 1, "FAIL": 2}[Status.FAIL] == 2 and {Status.PASS: 1}["PASS"] == 1  # a key as its string
    assert worst([]) is Status.PASS and worst(["PASS", Status.INCONCLUSIVE]) is Status.INCONCLUSIVE
    assert worst([Status.INCONCLUSIVE, "FAIL", "PASS"]) is Status.FAIL
    with pytest.raises(ValueError):
        Status("MAYBE")


def test_subject_is_a_frozen_ordered_name_and_a_four_key_object_in_json():
    s = Subject("digits", "torch", "native", "bf16")
    assert str(s) == "digits/torch/native/bf16" and tuple(s) == s.key() == ("digits", "torch", "native", "bf16")
    assert s.with_precision("fp32") == Subject("digits", "torch", "native", "fp32")
    assert sorted([s, s.with_precision("bf15"), Subject("a", "z", "z", "z")]) == \
        [Subject("a", "z", "z", "z"), s.with_precision("bf15"), s]
    assert len({s, Subject("digits", "torch", "native", "bf16")}) == 1
    with pytest.raises(FrozenInstanceError):
        s.precision = "fp16"  # type: ignore[misc]

    cert = evaluate(factories.numerics_runs(), R.load_rules("default"))
    data = json.loads(cert.model_dump_json())
    assert data["status"] in ("PASS", "FAIL", "INCONCLUSIVE")
    assert all(list(v["subject"]) == ["workload", "backend", "amp", "precision"] for v in data["verdicts"])
    back = Certificate.model_validate(data)
    assert back.model_dump_json() == cert.model_dump_json() and isinstance(back.subjects[0].subject, Subject)
    assert isinstance(back.verdicts[0].status, Status)
    bad = json.loads(cert.model_dump_json())
    bad["verdicts"][0]["subject"]["extra"] = "x"
    with pytest.raises(ValueError):
        Certificate.model_validate(bad)
