"""The suite's `compile` axis: `compile: [false, true]` runs each entry eagerly and
with its training step compiled, records what torch.compile did, shows it in the
report, certifies it, and says so when compilation fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error
from factories import completed, plan, warm_cli

from ampcert.certify import evaluate, load_rules
from ampcert.errors import UserError
from ampcert.results import CompileStats

SUITE = """\
name: compiled
amp: ampcert
device: cpu
precisions: PRECISIONS
seeds: [0]
compile: COMPILE
torch_compile: {backend: BACKEND, fallback: FALLBACK, scope: SCOPE}
train: {steps: 4, eval_every: 2}
workloads:
  - workload: digits
"""


def _run(folder: Path, backend: str = "aot_eager", fallback: str = "fail", env: dict | None = None,
         precisions: str = "[bf16]", compile: str = "[false, true]", scope: str = "forward"):
    suite = folder / "compiled.yaml"
    suite.write_text(SUITE.replace("BACKEND", backend).replace("FALLBACK", fallback)
                     .replace("PRECISIONS", precisions).replace("COMPILE", compile).replace("SCOPE", scope))
    # Through factories.warm_cli: the same CLI, forked warm (2-3 s less a command than cold).
    proc = warm_cli("run", suite, "--out", folder / "out", timeout=600, env=env)
    warm_cli("certify", folder / "out")  # the default rules over the runs as they are (no seeds added)
    runs = {json.loads(p.read_text())["spec"]["label"] + "/" + json.loads(p.read_text())["spec"]["precision"]:
            json.loads(p.read_text()) for p in (folder / "out" / "runs").glob("*/result.json")}
    return proc, runs, folder / "out"


@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("compiled"))


def test_each_entry_runs_eagerly_and_compiled(compiled_run):
    proc, runs, _ = compiled_run
    assert set(runs) == {"digits/bf16", "digits-compiled/bf16"}
    for key, r in runs.items():
        assert r["status"] == "completed", r.get("reason")
        if key.startswith("digits-compiled"):
            c = r["compile_stats"]
            assert c["compiled"] is True and c["backend"] == "aot_eager" and c["mode"] == "default"
            # ampcert's autocast compiles whole: one graph, no break, no recompile from step to step
            assert (c["graph_breaks"], c["graphs"], c["recompiles"]) == (0, 1, 0)
            assert c["compile_s"] > 0
        else:
            assert "compile_stats" not in r
    # Uncompiled runs keep the ids they had before the axis existed.
    base = plan({"name": "x", "amp": "ampcert", "precisions": ["bf16"], "seeds": [0],
                 "train": {"steps": 4, "eval_every": 2}, "workloads": [{"workload": "digits"}]})[0]
    assert runs["digits/bf16"]["run_id"] == base.run_id


def test_the_report_and_the_certificate_show_it(compiled_run):
    _, _, folder = compiled_run
    html = (folder / "report.html").read_text()
    assert "<h2>torch.compile</h2>" in html and "aot_eager, default" in html
    verdicts = json.loads((folder / "verdicts.json").read_text())["verdicts"]
    compile_verdicts = {v["subject"]["workload"] + "/" + v["subject"]["precision"]: v["status"]
                        for v in verdicts if v["rule"] == "compile.graph_breaks"}
    assert compile_verdicts == {"digits-compiled/bf16": "PASS"}


def test_the_whole_step_compiled_trains_as_eagerly_and_records_its_breaks(tmp_path):
    """`torch_compile: {scope: step}`: from the autocast region to the scaler's update,
    compiled as a user compiles a step; fp16 with ampcert's DynamicLossScaler. Under
    aot_eager the compiled steps compute what the eager ones do, bit for bit."""
    proc, runs, folder = _run(tmp_path, precisions="[fp16]", scope="step")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    eager, compiled = runs["digits/fp16"], runs["digits-compiled/fp16"]
    c = compiled["compile_stats"]
    assert (c["scope"], c["compiled"], c["recompiles"]) == ("step", True, 0)
    # the step's own breaks: its backward, and the scaler's eager optimizer step
    assert c["graph_breaks"] > 0 and "Unsupported Tensor.backward() call" in c["break_reasons"]
    assert compiled["loss"] == eager["loss"] and compiled["loss_scale"] == eager["loss_scale"]
    assert compiled["final_metric"] == eager["final_metric"]
    assert "aot_eager, default, step" in (folder / "report.html").read_text()
    verdicts = json.loads((folder / "verdicts.json").read_text())["verdicts"]
    v = next(v for v in verdicts if v["rule"] == "compile.graph_breaks")
    assert v["status"] == "PASS" and "whole step, limit none: recorded" in v["summary"]


def test_the_step_scope_has_its_own_run_id_and_no_eager_fallback():
    suite = {"name": "c", "precisions": ["bf16"], "seeds": [0], "compile": [True],
             "workloads": [{"workload": "digits", "train": {"steps": 4}}]}
    [forward] = plan(suite)
    [step] = plan(suite | {"torch_compile": {"scope": "step"}})
    [named] = plan(suite | {"torch_compile": {"scope": "forward"}})
    assert forward.run_id == named.run_id != step.run_id  # forward-compiled runs keep their ids
    with pytest.raises(UserError, match="`fallback: eager` needs `scope: forward`"):
        plan(suite | {"torch_compile": {"scope": "step", "fallback": "eager"}})


# One compiled run, in fp32: what a failed compilation does is no matter of precision (the
# bf16 autocast under compile is the fixture's), and fp32 spares Inductor the casts to lower.
ONE_COMPILED_FP32_RUN = {"compile": "[true]", "precisions": "[fp32]"}


def test_without_fallback_a_failed_compilation_fails_the_run_with_the_reason():
    import torch

    from ampcert.backends.contract import RunFailed
    from ampcert.backends.torch_compile import CompiledStep
    from ampcert.spec import TorchCompile

    # A backend torch.compile does not have (suites cannot name one: this is the step alone).
    settings = TorchCompile.model_construct(mode="default", backend="no_such_backend", fallback="fail")
    step = CompiledStep(settings, lambda x, y: (x * y).sum())
    with pytest.raises(RunFailed, match=r"torch.compile \(backend no_such_backend, mode default\) failed: "):
        step(torch.ones(2), torch.ones(2))


def test_fallback_eager_goes_on_and_says_it_did_not_compile(tmp_path):
    # Inductor without a working C++ compiler: a real compiler failure, through the whole harness.
    proc, runs, _ = _run(tmp_path, backend="inductor", fallback="eager", env={"CXX": "/nonexistent/c++"},
                         **ONE_COMPILED_FP32_RUN)
    r = runs["digits-compiled/fp32"]
    assert r["status"] == "completed"
    c = r["compile_stats"]
    assert c["compiled"] is False and "InvalidCxxCompiler" in c["fallback_reason"]
    assert c["graph_breaks"] is None  # nothing compiled, nothing counted: never a compiled label on an eager run
    verdicts = json.loads((tmp_path / "out" / "verdicts.json").read_text())["verdicts"]
    v = next(v for v in verdicts if v["rule"] == "compile.graph_breaks" and v["subject"]["precision"] == "fp32")
    assert v["status"] == "FAIL" and "ran eagerly" in v["summary"]


def test_compile_on_the_jax_backend_is_one_line(write_suite, tmp_path):
    suite = write_suite("""\
        name: j
        backend: jax
        amp: ampcert
        compile: [true]
        workloads: [{workload: digits}]
        """)
    assert_one_line_error(warm_cli("run", suite, "--out", tmp_path / "o"), "compile", "JAX")
    assert not (tmp_path / "o").exists()


def _stats(**fields) -> CompileStats:
    return CompileStats(**{"mode": "default", "backend": "inductor", "compiled": True, "graph_breaks": 0,
                           "graphs": 1, "recompiles": 0, "compile_s": 1.0} | fields)


@pytest.mark.parametrize(("stats", "status", "words"), [
    (_stats(), "PASS", "at most 0 graph break"),
    (_stats(graph_breaks=2, break_reasons=["Unsupported Tensor.item() call"]), "FAIL", "item()"),
    (_stats(recompiles=3), "FAIL", "3 recompile(s), limit 1"),
    (_stats(compiled=False, graph_breaks=None, fallback_reason="no compiler"), "FAIL", "ran eagerly"),
])
def test_the_compile_rule(stats, status, words):
    suite = {"name": "c", "precisions": ["bf16"], "seeds": [0], "compile": [True],
             "workloads": [{"workload": "digits", "train": {"steps": 4}}]}
    runs = [completed(spec, final_metric=0.9, compile_stats=stats) for spec in plan(suite)]
    v = next(v for v in evaluate(runs, load_rules("default")).verdicts if v.rule == "compile.graph_breaks")
    assert v.status == status and words in v.summary


@pytest.mark.parametrize(("step_limit", "status", "words"), [
    (None, "PASS", "at most 5 graph break(s) (whole step, limit none: recorded)"),
    (5, "PASS", "(whole step, limit 5)"),
    (4, "FAIL", "5 graph break(s), limit 4 (Unsupported Tensor.backward() call)"),
])
def test_a_whole_step_is_held_to_its_own_limit(tmp_path, step_limit, status, words):
    """A whole step breaks at its backward and around its optimizer step by design: the
    forward's limit (0 in the shipped packs) is not its; a pack's max_step_graph_breaks is."""
    pack = load_rules("default").model_dump(mode="json", exclude_none=True)
    for rule in pack["rules"]:
        if rule["check"] == "compile_health" and step_limit is not None:
            rule["max_step_graph_breaks"] = step_limit
    (tmp_path / "pack.yaml").write_text(json.dumps(pack))
    suite = {"name": "c", "precisions": ["bf16"], "seeds": [0], "compile": [True],
             "torch_compile": {"scope": "step"}, "workloads": [{"workload": "digits", "train": {"steps": 4}}]}
    stats = _stats(scope="step", graph_breaks=5, graphs=3, break_reasons=["Unsupported Tensor.backward() call"])
    runs = [completed(spec, final_metric=0.9, compile_stats=stats) for spec in plan(suite)]
    v = next(v for v in evaluate(runs, load_rules(tmp_path / "pack.yaml")).verdicts
             if v.rule == "compile.graph_breaks")
    assert v.status == status and words in v.summary, v.summary


def test_no_verdict_for_runs_that_were_not_compiled():
    suite = {"name": "c", "precisions": ["bf16"], "seeds": [0], "workloads": [{"workload": "digits",
                                                                                 "train": {"steps": 4}}]}
    runs = [completed(spec, final_metric=0.9) for spec in plan(suite)]
    assert not [v for v in evaluate(runs, load_rules("default")).verdicts if v.rule == "compile.graph_breaks"]
