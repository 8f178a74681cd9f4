"""A run stopped and resumed from its own checkpoint (backends/features/resume.py) and the
rule that judges it (resume_equivalence): every recipe and AMP precision continues bit for
bit, and a restore that perturbs the optimizer's state is caught."""

from __future__ import annotations

import io
import json

import pytest
import torch
from factories import completed, plan

from ampcert import mllog
from ampcert.backends import torch_backend
from ampcert.certify.checks import evaluate
from ampcert.certify.rules import load_rules
from ampcert.results import RunResult
from ampcert.spec import RunSpec
from ampcert.vocabulary import Status

SUITE = {"name": "resume", "amp": "native", "device": "cpu", "precisions": ["fp32", "bf16", "fp16"],
         "recipes": ["bf16-true", "bf16-true-sr", "bf16-state"], "seeds": [3],
         "train": {"steps": 8, "eval_every": 3}, "certify": "recipes", "workloads": [{"workload": "digits"}]}


def _result(spec: RunSpec) -> RunResult:
    out = torch_backend.train(spec, mllog.MLLogger(io.StringIO()))
    return RunResult(run_id=spec.run_id, spec=spec, status="completed", **out.trained_fields())


def _pairs(amp: str = "native") -> list[tuple[RunSpec, RunSpec]]:
    runs = plan({**SUITE, "amp": amp})
    resumed = {r.precision: r for r in runs if r.resume.resume_after_window is not None}
    return [(r, resumed[r.precision]) for r in runs if r.seed == 3 and not r.is_rerun]


def test_the_recipes_pack_schedules_one_resumed_run_per_subject_apart_from_its_samples():
    runs = plan(SUITE)
    resumed = [r for r in runs if r.resume.resume_after_window is not None]
    assert sorted(r.precision for r in resumed) == sorted(SUITE["precisions"] + SUITE["recipes"])
    assert all(r.seed == 3 and r.repeat == 0 and r.is_rerun and "-s3-k1-" in r.run_id for r in resumed)
    stored = json.loads(resumed[0].model_dump_json())
    assert stored["resume_after_window"] == 1 and "resume" not in stored  # stored flat, as the other groups
    assert "resume_after_window" not in json.loads(runs[0].model_dump_json())  # written only when set


@pytest.mark.parametrize("amp", ["native", "ampcert"])
def test_every_recipe_and_amp_precision_resumes_bit_for_bit(amp):
    runs = []
    for plain, resumed in _pairs(amp):
        runs += [_result(plain), _result(resumed)]
        assert runs[-1].determinism["resumed_after_step"] == 3
    cert = evaluate(runs, load_rules("recipes"))
    found = {v.subject.precision: v for v in cert.verdicts if v.rule == "resume.equivalence"}
    assert set(found) == set(SUITE["precisions"] + SUITE["recipes"])
    assert {p: v.status for p, v in found.items()} == dict.fromkeys(found, Status.PASS), \
        {p: v.summary for p, v in found.items()}
    assert "identical to the uninterrupted run's bit for bit" in found["bf16-true-sr"].summary


def test_a_restore_that_perturbs_the_optimizer_state_fails_the_rule(monkeypatch):
    """One step of the momentum buffers' worth of error, added after the state is read back."""
    restore = torch_backend.TorchFramework.restore

    def perturbed(self, state, step):
        restore(self, state, step)
        for buffers in self.optimizer.state.values():
            for value in buffers.values():
                if torch.is_tensor(value) and value.is_floating_point() and value.dim():
                    value.add_(torch.finfo(value.dtype).eps * value.abs().max())

    (plain, resumed), *_ = _pairs()  # fp32, SGD with momentum
    clean = _result(plain)
    monkeypatch.setattr(torch_backend.TorchFramework, "restore", perturbed)
    bad = _result(resumed)
    (verdict,) = [v for v in evaluate([clean, bad], load_rules("recipes")).verdicts if v.rule == "resume.equivalence"]
    assert verdict.status == Status.FAIL
    # an error of one ulp of the largest buffer: no loss it touches changes at 6 digits, the weights do
    assert verdict.summary.startswith("seed 3: resumed after step 3, final weights differ")


def test_what_the_rule_cannot_judge_it_says():
    (plain, resumed), *_ = _pairs()
    pack = load_rules("recipes")
    ended_early = completed(resumed, final_metric=0.5)  # no resumed_after_step: it never got there
    (v,) = [v for v in evaluate([completed(plain, final_metric=0.5), ended_early], pack).verdicts
            if v.rule == "resume.equivalence"]
    assert v.status == Status.INCONCLUSIVE and "ended before window 1" in v.summary
    (v,) = [v for v in evaluate([completed(plain, final_metric=0.5)], pack).verdicts
            if v.rule == "resume.equivalence"]
    assert v.status == Status.INCONCLUSIVE and "no run resumed after window 1" in v.summary


def test_jax_runs_resume_bit_for_bit_too():
    pytest.importorskip("jax")
    from ampcert.backends import jax_backend

    runs = plan({"name": "jax-resume", "backend": "jax", "amp": "ampcert", "device": "cpu",
                 "precisions": ["fp32", "bf16", "fp16"], "recipes": ["bf16-true"], "seeds": [1],
                 "train": {"steps": 6, "eval_every": 3}, "certify": "recipes",
                 "workloads": [{"workload": "gpt", "params": {"size": "tiny"}}]})
    results = []
    for spec in (r for r in runs if r.seed == 1 and not r.repeat):
        out = jax_backend.train(spec, mllog.MLLogger(io.StringIO()))
        results.append(RunResult(run_id=spec.run_id, spec=spec, status="completed", **out.trained_fields()))
    found = {v.subject.precision: v for v in evaluate(results, load_rules("recipes")).verdicts
             if v.rule == "resume.equivalence"}
    assert {p: v.status for p, v in found.items()} == dict.fromkeys(["fp32", "bf16", "fp16", "bf16-true"], Status.PASS), \
        {p: v.summary for p, v in found.items()}
