"""nn.RNN and nn.GRU under ampcert's autocast run the ops native autocast runs,
in the same dtypes, with the same values and gradients (CPU; torch_rnn)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ampcert.amp.torch.autocast import autocast


class _Ops(TorchDispatchMode):
    """Every ATen op with its input and output dtypes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = out if isinstance(out, (tuple, list)) else (out,)
        self.ops.append((func.overloadpacket.__name__,
                         tuple(a.dtype for a in args if isinstance(a, torch.Tensor)),
                         tuple(o.dtype for o in flat if isinstance(o, torch.Tensor))))
        return out


def _run(module: torch.nn.Module, x: torch.Tensor, ctx) -> tuple[list, torch.Tensor, torch.Tensor, list]:
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    torch.manual_seed(1)  # the same dropout masks on both sides
    with _Ops() as recorder, ctx:
        out, h = module(x)
    (out.float().sum() + h.float().sum()).backward()
    return recorder.ops, out, h, [x.grad] + [p.grad for p in module.parameters()]


CASES = {
    "rnn-tanh": dict(kind=torch.nn.RNN, num_layers=2),
    "rnn-relu-no-bias": dict(kind=torch.nn.RNN, nonlinearity="relu", bias=False),
    "rnn-bidirectional-batch-first": dict(kind=torch.nn.RNN, bidirectional=True, batch_first=True),
    "gru": dict(kind=torch.nn.GRU, num_layers=2),
    "gru-bidirectional-dropout": dict(kind=torch.nn.GRU, num_layers=2, bidirectional=True, dropout=0.3),
}


@pytest.mark.parametrize("engine", ["dispatcher", "python"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_ops_in_the_same_dtypes_as_native(case, dtype, engine, request):
    if engine == "python":  # the decomposition (torch_rnn); the dispatcher's engine is native's C++ here
        request.getfixturevalue("python_engine")
    options = dict(CASES[case])
    kind = options.pop("kind")
    torch.manual_seed(0)
    module = kind(6, 8, **options).train()
    x = torch.randn(3, 5, 6)
    native = _run(module, x, torch.autocast("cpu", dtype=dtype))
    ours = _run(module, x, autocast("cpu", dtype=dtype))
    assert ours[0] == native[0]  # op by op: name, input dtypes, output dtypes
    assert ours[1].dtype == native[1].dtype and ours[2].dtype == native[2].dtype
    assert torch.equal(ours[1], native[1]) and torch.equal(ours[2], native[2])
    for a, b in zip(ours[3], native[3], strict=True):
        assert torch.equal(a, b)


def test_without_the_decomposition_the_comparison_fails(monkeypatch, python_engine):
    """The test above can fail: the builtin run untouched computes in fp32."""
    from ampcert.amp.torch import rnn as torch_rnn

    monkeypatch.setattr(torch_rnn, "decompose", lambda *a: None)
    monkeypatch.setattr("ampcert.amp.torch.autocast.decompose_rnn", lambda *a: None)
    torch.manual_seed(0)
    module = torch.nn.GRU(6, 8)
    x = torch.randn(3, 5, 6)
    native = _run(module, x, torch.autocast("cpu", dtype=torch.bfloat16))
    ours = _run(module, x, autocast("cpu", dtype=torch.bfloat16))
    assert ours[0] != native[0]


def test_a_packed_sequence_runs_the_builtin_untouched():
    gru = torch.nn.GRU(6, 8)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(5, 3, 6), [5, 4, 2])
    with autocast("cpu", dtype=torch.bfloat16):
        out, h = gru(packed)
    assert out.data.dtype is torch.float32 and h.dtype is torch.float32


def test_the_audit_command_covers_them(monkeypatch, python_engine):
    from ampcert.amp.audit import audit_modules

    rows = audit_modules("cpu", torch.float16)
    assert [r.op for r in rows] == ["nn.RNN", "nn.RNN(relu)", "nn.GRU"] and all(r.agree for r in rows)
    monkeypatch.setattr("ampcert.amp.torch.autocast.decompose_rnn", lambda *a: None)
    assert not any(r.agree for r in audit_modules("cpu", torch.float16))  # it can fail
    assert audit_modules("cuda") == []  # cuDNN's kernels: not mirrored, and said so in the docs
