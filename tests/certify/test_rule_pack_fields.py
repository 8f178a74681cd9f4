"""A rule pack sets thresholds, never the code's own wiring: which attribute a
rule reads (``threshold_field``) and the pack's recorded source and digest are
not fields a file can set. Each is one line and exit 2, never a traceback."""

from __future__ import annotations

import pytest
from conftest import assert_one_line_error, run_cli

from ampcert.certify.rules import AccuracyParity, load_rules
from ampcert.errors import UserError

PACK = """\
name: mine
rules:
  - id: parity
    check: accuracy_parity
    measures: accuracy within the margin
    margin: 0.02
{extra}"""


@pytest.mark.parametrize("extra, fragment", [
    ("    threshold_field: id\n", "accuracy_parity.threshold_field: unknown field"),
    ("    threshold_field: margin\n", "accuracy_parity.threshold_field: unknown field"),
    ("sha256: " + "0" * 64 + "\n", "`sha256` is recorded by ampcert"),
    ("source: configs/rules/default.yaml\n", "`source` is recorded by ampcert"),
])
def test_wiring_fields_are_refused_in_one_line(tmp_path, extra, fragment):
    path = tmp_path / "mine.yaml"
    path.write_text(PACK.format(extra=extra))
    with pytest.raises(UserError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        load_rules(path)


def test_a_suite_naming_such_a_pack_stops_at_planning(tmp_path):
    (tmp_path / "mine.yaml").write_text(PACK.format(extra="    threshold_field: id\n"))
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: t\ndevice: cpu\nprecisions: [fp32]\ntrain: {steps: 2, eval_every: 2}\n"
                     "certify: mine.yaml\nworkloads: [{workload: digits}]\n")
    assert_one_line_error(run_cli("run", suite, "--dry-run", cwd=tmp_path), "threshold_field: unknown field")


def test_the_threshold_is_read_from_the_rule_class():
    rule = load_rules(None).of("accuracy_parity")[0]
    assert type(rule).threshold_field == "margin" and "threshold_field" not in AccuracyParity.model_fields
    assert rule.threshold("x", "y") == rule.margin
    pack = load_rules("default")
    assert len(pack.sha256) == 64 and pack.source.endswith("default.yaml")  # set by the loader
