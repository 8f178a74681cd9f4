"""CUDA regions decided on a machine without a GPU: every ATen op and its dtypes.

CI has no GPU, yet every CUDA run of ampcert goes through its dispatcher engine, whose
kernels sit at the ``AutocastCUDA`` key beside native's. These tests run ampcert's
autocast and ``torch.autocast("cuda")`` on CUDA tensors of torch's
:class:`~torch._subclasses.fake_tensor.FakeTensorMode`: tensors with shapes, dtypes and
the CUDA dispatch keys (``AutocastCUDA`` included) but no storage. The decisions are the
real ones, made by native's C++ kernels at ``AutocastCUDA``, ampcert's kernels and the
Python engine; only the arithmetic is skipped. Two CUDA checks stand in for the
framework, named here: ``torch.cuda.is_available`` and ``is_bf16_supported`` answer True,
so that both autocasts turn on.

Each call is compared by its trace: the ATen ops below autocast, in order, with the
dtypes of their tensors in and out. Two calls whose traces agree run the same kernels on
the same dtypes, so the values match too. (Values are the GPU audit's:
``pytest -m gpu tests/amp``, ``ampcert audit --device cuda``.) This found that the
shipped CUDA policy cast ``cross_entropy`` to fp32 at its entry, where native runs its
``log_softmax`` in fp16 (the composite passes the input's dtype on) and only ``nll_loss``
in fp32.
"""

from __future__ import annotations

import logging

import pytest
import torch

from ampcert.amp import audit
from ampcert.amp.audit import SAMPLES, _AtenOps
from ampcert.amp.audit_samples import Inputs
from ampcert.amp.policy import shipped_policy
from ampcert.amp.torch import autocast as torch_autocast
from ampcert.amp.torch import kernels as torch_autocast_kernels
from ampcert.amp.torch.autocast import autocast, engine_of
from ampcert.amp.torch.kernels import KNOWN_DIVERGENCES

pytestmark = pytest.mark.filterwarnings("ignore")

CUDA = torch.device("cuda")
LOW_DTYPES = [torch.float16, torch.bfloat16]
#: ops that query a tensor's device and decide nothing
QUERIES = {"device"}


class FakeCudaInputs(Inputs):
    """The audit's sample inputs as fake CUDA tensors: the shapes and dtypes the audit
    gives them (a fake tensor has no values to carry). Made with ``torch.empty``, the one
    way to a fake CUDA tensor that asks nothing of the CUDA runtime in every supported
    build (``Tensor.to("cuda")`` initialises it; a CPU build has none)."""

    def __call__(self, *shape: int, kind: str = "randn") -> torch.Tensor:
        return torch.empty(self.base(shape, kind).shape, dtype=self._next_dtype(), device=CUDA)

    def of(self, value: torch.Tensor) -> torch.Tensor:
        return torch.empty(value.shape, dtype=self._next_dtype(), device=CUDA)

    def long(self, data) -> torch.Tensor:
        return torch.empty(torch.tensor(data).shape, dtype=torch.long, device=CUDA)

    def int32(self, data) -> torch.Tensor:
        return torch.empty(torch.tensor(data).shape, dtype=torch.int32, device=CUDA)


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA tensors without a GPU; the engine's per-setting caches fresh for the test
    (a CUDA setting seen before it, without a GPU, was given to the Python engine)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        # The first fake CUDA tensor of a process makes a real one where CUDA is
        # available (once per device: so that a backward can run); made before the
        # answer below, it makes none.
        torch.empty(1, device=CUDA)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch_autocast, "_REGIONS", {})
    monkeypatch.setattr(torch_autocast_kernels, "SERIAL_OF", {})
    # Fake tensors log every meta kernel that raises; the audit's error scenarios are expected.
    monkeypatch.setattr(logging.getLogger("torch._subclasses.fake_tensor"), "disabled", True)
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield


def _trace(thunk, ctx) -> tuple[str, list[tuple[str, tuple[str, ...]]], frozenset]:
    """(the output dtypes or the error, the compute ops with their dtypes in order, the
    kinds of cast made). How often a cast is made does not count: native casts a matmul's
    fp32 operand at each mm of matrix_power, ampcert once at its entry; same values."""
    rec = _AtenOps()
    with rec:
        out, _ = audit._run(thunk, ctx)
    ops = [op for op in rec.ops if op[0] not in QUERIES]
    return out, [op for op in ops if op[0] != "_to_copy"], frozenset(op for op in ops if op[0] == "_to_copy")


def _compare_every_sample(low: torch.dtype):
    """{op: [(scenario, ampcert's trace, native's trace)]} where the traces differ, and how
    many scenarios ran without an error on both sides."""
    policy = shipped_policy("cuda")
    differ: dict[str, list] = {}
    ran = 0
    for op in sorted(SAMPLES):
        for builder in SAMPLES[op]:
            try:
                scenarios = audit._scenarios_for(builder, low, "cuda", FakeCudaInputs)
            except Exception:  # noqa: BLE001 - an op this torch lacks (linalg_matrix_sqrth)
                continue
            for scenario, thunk in scenarios:
                amp = _trace(thunk, autocast("cuda", low, policy=policy))
                native = _trace(thunk, torch.autocast("cuda", low))
                if amp != native:
                    differ.setdefault(op, []).append((scenario, amp, native))
                elif not amp[0].startswith("err"):
                    ran += 1
    return differ, ran


@pytest.mark.parametrize("low", LOW_DTYPES, ids=["fp16", "bf16"])
def test_the_dispatcher_engine_decides_every_sampled_op_on_cuda_as_native(fake_cuda, low):
    # The setting is real: ampcert's dispatcher engine decides it, and native CUDA
    # autocast casts (a linear in the low dtype, a softmax in fp32).
    assert engine_of("cuda", low)["engine"] == "dispatcher"
    x = FakeCudaInputs("f32", low, "cuda")(4, 8)
    with torch.autocast("cuda", low):
        assert torch.nn.functional.linear(x, x).dtype == low
        assert torch.softmax(x.to(low), -1).dtype == torch.float32

    differ, ran = _compare_every_sample(low)
    assert ran > 300, ran  # listed and unlisted ops, each scenario that runs on fake tensors
    assert not differ, {op: cases[0] for op, cases in differ.items()}


@pytest.mark.parametrize("low", LOW_DTYPES, ids=["fp16", "bf16"])
def test_the_python_engine_on_cuda_differs_only_where_the_reference_says(fake_cuda, python_engine, low):
    assert engine_of("cuda", low)["engine"] == "python"
    differ, _ = _compare_every_sample(low)
    # The reference's known divergences: composites native casts halfway, and rms_norm
    # (fp32 natively since torch 2.12). The dispatcher engine leaves them to native.
    assert set(differ) <= set(KNOWN_DIVERGENCES["cuda"]), {op: differ[op][0] for op in differ}
    assert "cross_entropy_loss" in differ


def _classifier_forward(low: torch.dtype, ctx) -> list:
    """A classifier's forward and loss (LayerNorm, Linear, GELU, cross_entropy) on fake CUDA."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # made on meta; its fake CUDA copy made below
        body = torch.nn.Sequential(
            torch.nn.LayerNorm(32), torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32),
            torch.nn.LayerNorm(32), torch.nn.Linear(32, 10)).to("meta")
    # Autograd needs the CUDA runtime (a device guard) that a CPU build lacks: forward only.
    body = body.to_empty(device=CUDA).requires_grad_(False)
    x = FakeCudaInputs("f32", low, "cuda")(8, 32)
    y = FakeCudaInputs("f32", low, "cuda").long(list(range(8)))
    rec = _AtenOps()
    with rec, ctx:
        torch.nn.functional.cross_entropy(body(x), y)
    return [op for op in rec.ops if op[0] not in QUERIES]


@pytest.mark.parametrize("low", LOW_DTYPES, ids=["fp16", "bf16"])
def test_a_classifier_forward_on_cuda_runs_natives_kernels_on_natives_dtypes(fake_cuda, low):
    amp = _classifier_forward(low, autocast("cuda", low))
    native = _classifier_forward(low, torch.autocast("cuda", low))
    assert amp == native
    short = audit._short(low)
    # cross_entropy: log_softmax in the low dtype, nll_loss in fp32, as native does.
    assert ("_log_softmax", (short, short)) in amp
    assert any(op == "nll_loss_forward" and dts[0] == "f32" for op, dts in amp)
