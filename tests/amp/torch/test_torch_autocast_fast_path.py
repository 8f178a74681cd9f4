"""The autocast mode's fast path (a plan per callable) decides every call as its general
path does: same output dtypes, same values, same casts and weight-cache hits.

The fast path is what eager code meets (benchmarks/dispatch_overhead.py measures its
cost); the general path (``_AmpcertMode._decide``) is what the audit was built on and what
torch.compile traces. Each call below runs twice in a region of the shipped CPU policy:
once as users call it, once with the plans switched off, so only the general path decides.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ampcert.amp.torch import autocast as torch_autocast
from ampcert.amp.torch.autocast import autocast, cache_stats

#: The fast path is the Python engine's (eager regions are the dispatcher's otherwise).
pytestmark = pytest.mark.usefixtures("python_engine")


@pytest.fixture
def general_path_only(monkeypatch):
    """Every call decided by the general path: no plan is made, none cached is read."""
    def clear() -> None:
        for region in torch_autocast._REGIONS.values():
            region.plans.clear()

    clear()
    monkeypatch.setattr(torch_autocast, "_plan", lambda region, func: None)
    yield
    clear()


def _tensors():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 5, generator=g, requires_grad=True)
    return {
        "x": torch.randn(4, 5, generator=g),
        "w": w,
        "b": torch.randn(6, generator=g, requires_grad=True),
        "x64": torch.randn(4, 5, generator=g, dtype=torch.float64),
        "xi": torch.randint(0, 5, (4, 5), generator=g),
        "img": torch.randn(1, 2, 6, 6, generator=g),
        "k": torch.randn(3, 2, 3, 3, generator=g, requires_grad=True),
        "wt": w.t(),  # a view of a weight: cast, never cached
    }


# Each: a call of the shipped torch-cpu policy's families and of the paths around them.
CALLS = {
    "lower_precision, positional": lambda t: F.linear(t["x"], t["w"], t["b"]),
    "lower_precision, twice (weight cache)": lambda t: F.linear(F.linear(t["x"], t["w"]).t()[:5].t(), t["w"][:, :6]),
    "lower_precision, keyword tensor": lambda t: F.linear(t["x"], weight=t["w"]),
    "lower_precision, method and operator": lambda t: (t["x"] @ t["wt"], t["x"].matmul(t["wt"])),
    "lower_precision, conv with a stride tuple": lambda t: F.conv2d(t["img"], t["k"], None, (1, 1)),
    "lower_precision, float64 not eligible": lambda t: F.linear(t["x64"], t["w"].double()),
    "lower_precision, out=": lambda t: torch.mm(t["x"], t["wt"].detach(), out=torch.empty(4, 6)),
    "fp32 family": lambda t: F.binary_cross_entropy_with_logits(F.linear(t["x"], t["w"]), t["x"][:, :1].expand(4, 6).sigmoid()),
    "fp32 family, from bf16": lambda t: torch.cdist(t["x"].bfloat16(), t["x"].bfloat16()),
    "fp32 family, a C builtin": lambda t: torch.binary_cross_entropy_with_logits(
        F.linear(t["x"], t["w"]), t["x"][:, :1].expand(4, 6).sigmoid().bfloat16()),
    "fp32 family, a C builtin, bf16 only": lambda t: torch.kl_div(t["x"].bfloat16(), t["x"].bfloat16()),
    "promote, a list": lambda t: torch.cat([t["x"], t["x"].bfloat16()]),
    "no family": lambda t: torch.relu(F.linear(t["x"], t["w"])) + 1,
    "integers": lambda t: t["xi"] * 2 + t["xi"].sum(),
    "composite (clone)": lambda t: F.cross_entropy(F.linear(t["x"], t["w"]), torch.tensor([0, 1, 2, 3])),
    "argument-dependent (pad)": lambda t: F.pad(t["img"], (1, 1, 1, 1), mode="reflect"),
}


def _run(call) -> tuple[list[tuple[torch.dtype, torch.Tensor]], dict[str, int]]:
    tensors = _tensors()
    cache_stats(reset=True)
    with autocast("cpu", torch.bfloat16):
        out = call(tensors)
        stats = cache_stats()
    outs = out if isinstance(out, tuple) else (out,)
    return [(o.dtype, o.detach().float()) for o in outs], stats


@pytest.mark.parametrize("name", list(CALLS))
def test_fast_path_decides_as_the_general_path(name, request):
    fast = _run(CALLS[name])
    request.getfixturevalue("general_path_only")
    general = _run(CALLS[name])
    assert [d for d, _ in fast[0]] == [d for d, _ in general[0]]
    for (_, a), (_, b) in zip(fast[0], general[0], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert {k: fast[1][k] for k in ("casts", "cache_hits")} == {k: general[1][k] for k in ("casts", "cache_hits")}


def test_the_fast_path_takes_the_common_calls():
    """The calls eager models make most (a cast op with positional tensors, an op in no
    family) are planned, so they do not reach the general path."""
    seen: list[str] = []
    decide = torch_autocast._AmpcertMode._decide

    def spy(self, func, args, kwargs):
        seen.append(getattr(func, "__name__", repr(func)))
        return decide(self, func, args, kwargs)

    t = _tensors()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch_autocast._AmpcertMode, "_decide", spy)
        with autocast("cpu", torch.bfloat16):
            y = torch.relu(F.linear(t["x"], t["w"], t["b"]))
            y = F.conv2d(t["img"], t["k"], None, (1, 1))
            F.linear(t["x"], weight=t["w"])  # a keyword tensor: the general path
    assert y.dtype is torch.bfloat16
    assert seen == ["linear"]
