"""The two FP8 engines emulate the same arithmetic on a CPU: the first fp8 step of
`amp: native` (torchao's Float8Linear, torch.autocast around the rest) and `amp: ampcert`
(ampcert's Fp8Linear, ampcert's autocast), each prepared on the harness's own path
(backends.torch_fp8.prepare, backends.torch_backend.make_amp), agree layer by layer, bit for
bit: every converted layer's output, the loss, and every parameter's gradient."""

from __future__ import annotations

import copy

import pytest
import torch
from factories import plan

from ampcert.backends import torch_fp8
from ampcert.backends.torch_backend import make_amp
from ampcert.workloads import registry

pytest.importorskip("torchao")

GPT = {"size": "tiny", "max_bytes": 20000, "eval_windows": 4}


def _first_step(task, spec, x, y):
    model = copy.deepcopy(task.model)
    fp8 = torch_fp8.prepare(model, spec)
    outputs = {}
    for name in (p.name for p in fp8.plans if p.convert):
        model.get_submodule(name).register_forward_hook(
            lambda _mod, _inp, out, name=name: outputs.__setitem__(name, out.detach()))
    with make_amp(spec).autocast():
        loss = task.loss_fn(model(x), y)
    loss.backward()
    return fp8, outputs, loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize(("precision", "recipe"), [("fp8", "tensorwise"), ("fp8", "rowwise"), ("mxfp8", None)])
def test_the_first_fp8_step_of_both_engines_agrees_layer_by_layer(precision, recipe):
    fp8 = {"recipe": recipe} if recipe else {}
    specs = {amp: next(s for s in plan({"name": "t", "amp": amp, "precisions": [precision], "fp8": fp8,
                                        "workloads": [{"workload": "gpt", "params": GPT}]})
                       if s.precision == precision and s.seed == 0)
             for amp in ("native", "ampcert")}
    workload = registry.get("gpt")
    task = workload.build(workload.Params.model_validate(GPT), 0, "cpu")
    x, y = task.train_x[:4], task.train_y[:4]
    native, ours = (_first_step(task, specs[amp], x, y) for amp in ("native", "ampcert"))
    assert native[0].implementation.startswith("torchao") and ours[0].implementation.startswith("ampcert")
    assert native[1].keys() == ours[1].keys() and len(ours[1]) >= 4, sorted(ours[1])
    for name in ours[1]:
        assert native[1][name].dtype == ours[1][name].dtype == torch.bfloat16, name
        assert torch.equal(native[1][name], ours[1][name]), (name, (native[1][name].float() - ours[1][name].float()).abs().max())
    assert torch.equal(native[2], ours[2])
    for name, grad in ours[3].items():
        assert grad is not None and torch.equal(native[3][name], grad), name
