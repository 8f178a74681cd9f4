"""Precision recipes in training (amp/recipes.py, backends/features/recipe.py): each
trains what its plain loop trains, holds the bytes it promises, is certified as a
precision is (one built to fail FAILs, saying why), and the reduction recipe runs on
two ranks through torchrun."""

from __future__ import annotations

import io
import json
import re

import pytest
import torch
from factories import warm_cli

from ampcert import mllog
from ampcert.backends import loop, torch_backend
from ampcert.spec import expand, parse_suite
from ampcert.workloads import registry


def _spec(precision: str, steps: int = 6, workload: str = "digits", **suite):
    doc = {"name": "recipe", "amp": "native", "device": "cpu", "precisions": ["fp32"], "seeds": [1],
           "train": {"steps": steps, "eval_every": 3}, "workloads": [{"workload": workload}], **suite}
    if precision != "fp32":
        doc["recipes" if precision.count("-") else "precisions"] = [precision]
    return next(s for s in expand(parse_suite(doc), "cpu") if s.precision == precision)


def _train(spec):
    return torch_backend.train(spec, mllog.MLLogger(io.StringIO()))


def test_bf16_true_trains_what_a_model_converted_to_bf16_trains():
    """Lightning's bf16-true, written out: the model in bf16, its float inputs cast to bf16,
    the workload's own optimizer on the bf16 weights, no autocast."""
    spec = _spec("bf16-true")
    out = _train(spec)
    torch_backend.seed_everything(spec.seed, "cpu")
    workload = registry.get(spec.workload)
    task = workload.build(workload.Params.model_validate(spec.params), spec.seed, "cpu")
    model = task.model.to(torch.bfloat16)
    opt = task.make_optimizer(model.parameters())
    batches = loop.index_batches(len(task.train_x), task.batch_size, spec.seed)
    model.train()
    losses = []
    for _ in range(spec.train.step_limit):
        idx = torch.from_numpy(next(batches))
        opt.zero_grad(set_to_none=True)
        loss = task.loss_fn(model(task.train_x[idx].bfloat16()), task.train_y[idx])
        loss.backward()
        opt.step()
        losses.append(float(loss.detach().float()))
    assert out.weights_sha256 == torch_backend.weights_digest(model)
    assert out.loss == losses
    assert out.amp_policy["name"].startswith("none (bf16-true")


def test_each_recipe_holds_the_bytes_per_parameter_it_promises():
    """digits trains with SGD and momentum: one state tensor per weight."""
    per_param = {}
    for precision in ("fp32", "bf16", "bf16-true", "bf16-true-sr", "bf16-state"):
        state = _train(_spec(precision, steps=3)).training_state
        assert state is not None
        per_param[precision] = (state.weights_bytes / state.parameters, state.gradients_bytes / state.parameters,
                                round(state.optimizer_state_bytes / state.parameters, 3), state.optimizer)
    assert per_param["fp32"][:3] == per_param["bf16"][:3] == (4.0, 4.0, 4.0)  # AMP keeps fp32 weights and state
    assert per_param["bf16-true"][:3] == per_param["bf16-true-sr"][:3] == (2.0, 2.0, 2.0)  # half of fp32's
    assert per_param["bf16-state"][:3] == (4.0, 4.0, 2.0)
    assert per_param["bf16-true"][3] == "torch.optim.sgd.SGD"  # the workload's own, on bf16 weights
    assert per_param["bf16-true-sr"][3] == per_param["bf16-state"][3] == "ampcert.amp.torch.recipe_optim.SGD"


def test_a_recipe_the_workloads_optimizer_cannot_take_fails_in_one_line():
    from ampcert.backends.contract import Unsupported

    with pytest.raises(Unsupported, match="recipe bf16-adamw8bit: 8-bit optimizer state is torchao's AdamW8bit: "
                                          "the workload trains with SGD"):
        _train(_spec("bf16-adamw8bit", steps=2))


def test_a_recipe_built_to_fail_fails_parity_and_convergence_and_says_why(tmp_path, write_suite):
    """stagnation stores its weights near 4, where bf16's step swallows every SGD update:
    bf16-true never learns; fp32, AMP and stochastic rounding do."""
    suite = write_suite("""
name: stagnation
amp: native
device: cpu
precisions: [fp32, bf16]
recipes: [bf16-true, bf16-true-sr]
seeds: [0, 1, 2]
certify: default
workloads:
  - workload: stagnation
""")
    out = tmp_path / "out"
    proc = warm_cli("run", suite, "--out", out, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = json.loads((out / "verdicts.json").read_text())
    status = {s["subject"]["precision"]: s["status"] for s in verdicts["subjects"]}
    found = {(v["subject"]["precision"], v["rule"]): v for v in verdicts["verdicts"]}
    assert status["bf16-true"] == "FAIL" and status["bf16"] == "PASS"
    assert found["bf16-true", "parity.final_metric"]["status"] == "FAIL"
    convergence = found["bf16-true", "convergence.samples_to_target"]
    assert convergence["status"] == "FAIL" and "did not reach the target 0.85" in convergence["summary"]
    assert found["bf16-true-sr", "convergence.samples_to_target"]["status"] == "PASS"
    assert found["bf16-true-sr", "parity.final_metric"]["status"] != "FAIL"
    report = json.loads((out / "report.json").read_text())
    rows = {t["subject"]["precision"]: t for t in report["training_state"]}
    assert rows["bf16-true"]["total_vs_fp32"] == pytest.approx(0.5)
    assert rows["bf16"]["total_vs_fp32"] == 1.0
    assert "what training holds per parameter" in (out / "report.html").read_text()


@pytest.mark.parametrize(("doc", "message"), [
    ({"recipes": ["bf16"]}, "`recipes` names bf16, a precision: list it under `precisions`"),
    ({"recipes": ["bf16-reduce"]}, "recipe bf16-reduce reduces gradients across ranks in bf16: workload 'digits' "
                                   "needs `launcher: torchrun` with two or more ranks"),
    ({"recipes": ["bf16-true-sr"], "backend": "jax", "amp": "ampcert"},
     "recipe bf16-true-sr trains with torch; this suite's backend is jax"),
    ({"precisions": ["fp32", "bf16-state"], "backend": "jax", "amp": "ampcert"}, "recipe bf16-state trains with torch"),
])
def test_a_recipe_a_suite_cannot_train_is_refused_when_the_suite_is_read(doc, message):
    from ampcert.errors import UserError

    with pytest.raises(UserError, match=re.escape(message)):
        parse_suite({"name": "r", "train": {"steps": 2}, "workloads": [{"workload": "digits"}], **doc})


def test_jax_certifies_bf16_true_as_torch_does(tmp_path, write_suite):
    """The same recipe on the other framework: the parameters (and so optax's state) in
    bf16, the inputs cast to them, no autocast; certified by the same pack."""
    pytest.importorskip("jax")
    suite = write_suite("""
name: jax-recipe
backend: jax
amp: ampcert
device: cpu
precisions: [fp32]
recipes: [bf16-true]
seeds: [0, 1, 2]
certify: default
workloads:
  - workload: gpt
    params: {size: tiny}
    train: {target: 2.75, max_steps: 600, eval_every: 5}
""")
    out = tmp_path / "out"
    proc = warm_cli("run", suite, "--out", out, timeout=900)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # a certificate, whichever its verdict
    verdicts = json.loads((out / "verdicts.json").read_text())
    found = {v["rule"]: v["status"] for v in verdicts["verdicts"] if v["subject"]["precision"] == "bf16-true"}
    # Judged by every rule the default pack has for bf16. Parity holds (mean difference -0.0001
    # bits/byte over these seeds); samples to target came out 1.31x fp32's on 3 seeds here
    # (one seed 170 steps against 130), a finding the convergence rule reports, not asserted.
    assert set(found) == {"parity.final_metric", "convergence.samples_to_target", "determinism.repeat_run",
                          "determinism.seed_spread", "numerics.finite_loss", "gains.speedup", "gains.peak_memory"}
    assert found["parity.final_metric"] == found["determinism.repeat_run"] == found["numerics.finite_loss"] == "PASS"
    report = json.loads((out / "report.json").read_text())
    rows = {t["subject"]["precision"]: t for t in report["training_state"]}
    assert rows["bf16-true"]["weights_dtype"] == "bfloat16" and rows["fp32"]["weights_dtype"] == "float32"
    assert rows["bf16-true"]["total_vs_fp32"] == pytest.approx(0.5, abs=0.01)  # params, grads, Adam's moments
    run = next(r for r in report["runs"] if r["spec"]["precision"] == "bf16-true")
    assert run["lowest_precision"]["linear"] == "bfloat16"


def test_the_reduction_recipes_train_on_two_ranks_through_torchrun(tmp_path, write_suite):
    """DDP's bf16 gradient reduction, and FSDP2's fully_shard with MixedPrecisionPolicy(
    param_dtype=bf16, reduce_dtype=fp32 | bf16), on two ranks (gloo)."""
    suite = write_suite("""
name: reduce
amp: native
device: cpu
precisions: [fp32]
recipes: [bf16-reduce, bf16-fsdp, bf16-fsdp-reduce]
seeds: [0]
train: {steps: 4, eval_every: 2}
launcher: torchrun
torchrun: {nproc_per_node: 2}
workloads:
  - workload: digits
""")
    out = tmp_path / "out"
    proc = warm_cli("run", suite, "--out", out, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {r["spec"]["precision"]: r for r in
               (json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/result.json")))}
    for run in results.values():
        assert run["status"] == "completed", run.get("reason")
        assert run["environment"]["distributed"]["world_size"] == 2
        assert run["training_state"]["weights_dtype"] == "float32"  # fp32 master weights
    # MLLOG's comm disclosure: what the gradients crossed the wire in
    assert {p: r["lowest_precision"]["comm"] for p, r in results.items()} == {
        "fp32": "fp32", "bf16-reduce": "bfloat16", "bf16-fsdp": "fp32", "bf16-fsdp-reduce": "bfloat16"}
    for name in ("bf16-fsdp", "bf16-fsdp-reduce"):
        state = results[name]["training_state"]
        # per rank: half of the fp32 weights (4 bytes a parameter, sharded over 2 ranks)
        assert state["weights_bytes"] / state["parameters"] == pytest.approx(2.0, rel=0.02)
        assert results[name]["lowest_precision"]["linear"] == "bfloat16"  # each layer gathered in bf16
    assert len({r["weights_sha256"] for r in results.values()}) == 4
