"""A precision capped at fewer steps than FP32 (``unaccelerated: cap``) is marked
"not comparable (capped at N steps)" in the summary, the report and the
certificate, and never shown as a parity failure. Synthetic results: no training."""

from __future__ import annotations

from pathlib import Path

from ampcert.aggregate import capped_groups, not_comparable
from ampcert.certify import evaluate, load_rules
from ampcert.report import summary
from ampcert.report.model import _table
from ampcert.results import EvalPoint, ResultSet, RunResult
from ampcert.spec import apply_capabilities, expand, parse_suite
from ampcert.vocabulary import Subject

SLOW_BF16 = {"bf16": {"accelerated": False, "note": "bf16 not accelerated on cpu (0.05x fp32)"},
             "fp32": {"accelerated": True, "note": ""}}


def _results(unaccelerated: str) -> list[RunResult]:
    suite = parse_suite({"name": "t", "precisions": ["fp32", "bf16"], "seeds": [0, 1, 2],
                         "train": {"steps": 40, "eval_every": 20}, "unaccelerated": unaccelerated,
                         "unaccelerated_max_steps": 10, "workloads": [{"workload": "digits"}]}, "t.yaml")
    specs = apply_capabilities(suite, expand(suite, "cpu"), SLOW_BF16)
    out = []
    for spec in specs:
        steps = spec.train.step_limit
        # bf16 far from fp32's accuracy: after 10 capped steps that is what a newcomer would
        # misread as "bf16 is broken"; on fp32's own budget it is a real parity failure.
        final = 0.95 + 0.002 * spec.seed if spec.precision == "fp32" else 0.16 + 0.01 * spec.seed
        out.append(RunResult(
            run_id=spec.run_id, spec=spec, status="completed", steps=steps, train_samples=64 * steps,
            metric="accuracy", higher_is_better=True, final_metric=final, loss=[1.0] * steps,
            evals=[EvalPoint(step=steps, samples=64 * steps, train_time_s=0.1, value=final)],
            samples_per_s=1000.0, weights_sha256=f"w{spec.precision}{spec.seed}", accelerated=spec.accelerated,
        ))
    return out


def test_capped_groups_name_the_cap():
    runs = _results("cap")
    assert capped_groups(runs) == {Subject("digits", "torch", "native", "bf16"): 10}
    assert capped_groups(_results("run")) == {}
    assert not_comparable(10) == "not comparable (capped at 10 steps)"


def test_every_view_marks_the_capped_row_and_parity_is_not_a_failure():
    runs = _results("cap")
    rs = ResultSet(root=Path("unused"), suite_name="t", plan=[r.spec for r in runs], runs=runs, missing=[])
    notes = {g["precision"]: g["note"] for g in summary.build(rs)["groups"]}
    assert notes == {"fp32": None, "bf16": "not comparable (capped at 10 steps)"}
    assert "not comparable (capped at 10 steps)" in summary.render_html(summary.build(rs))

    cert = evaluate(runs, load_rules("default"))
    parity = next(v for v in cert.verdicts if v.rule == "parity.final_metric" and v.subject.precision == "bf16")
    assert parity.status == "INCONCLUSIVE"
    assert parity.summary.startswith("not comparable (capped at 10 steps)")
    rows = {row.precision: row for row in _table(runs, cert)}
    assert rows["bf16"].comparability == "not comparable (capped at 10 steps)"
    assert rows["fp32"].comparability is None
    assert rows["bf16"].verdict != "FAIL"


def test_equal_budgets_are_compared_as_usual():
    runs = _results("run")
    cert = evaluate(runs, load_rules("default"))
    parity = next(v for v in cert.verdicts if v.rule == "parity.final_metric" and v.subject.precision == "bf16")
    assert parity.status == "FAIL"  # 0.16 vs 0.95 on the same budget is a real parity failure
    assert all(row.comparability is None for row in _table(runs, cert))
