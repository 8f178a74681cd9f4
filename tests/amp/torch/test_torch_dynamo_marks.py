"""An eager region imports no compiler stack; torch.compile, imported later, finds the marks
(issue 51). Run in a fresh interpreter: in the test session torch._dynamo is loaded already."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from ampcert.amp.torch.support import REGION_IN_TRACE_MIN, release  # noqa: E402

PROBE = textwrap.dedent("""
    import json, sys
    import torch
    import ampcert.amp as amp
    from ampcert.amp.torch import autocast as torch_autocast
    from ampcert.amp.torch.scaler import DynamicLossScaler

    model = torch.nn.Linear(8, 8)
    with amp.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randn(4, 8)).float().sum()
    loss.backward()
    eager = [m for m in ("torch._dynamo", "torch._inductor", "sympy") if m in sys.modules]

    step = DynamicLossScaler.step
    import torch._dynamo  # what torch.compile imports: the marks follow now

    marks = {"constant": getattr(torch_autocast._region_key, "_dynamo_marked_constant", False),
             "eager_step": DynamicLossScaler.step is not step}
    dtypes = []
    if sys.argv[1] == "compile":
        @torch.compile(backend="eager", fullgraph=True)  # fullgraph: a graph break is an error
        def forward(x):
            with amp.autocast("cpu", dtype=torch.bfloat16):
                return model(x)
        dtypes = [str(forward(torch.randn(4, 8)).dtype) for _ in range(2)]
    print(json.dumps({"eager": eager, "marks": marks, "dtypes": dtypes}))
""")


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_eager_region_and_its_backward_import_no_compiler_stack():
    got = _probe("eager")
    assert got["eager"] == []
    assert got["marks"] == {"constant": True, "eager_step": True}  # applied once Dynamo came


@pytest.mark.skipif(release(torch.__version__) < REGION_IN_TRACE_MIN, reason="a region in a trace is refused before torch 2.13")
def test_a_region_compiled_after_an_eager_one_traces_whole():
    got = _probe("compile")
    assert got["eager"] == [] and got["dtypes"] == ["torch.bfloat16", "torch.bfloat16"]
