"""The dispatcher engine (amp/torch/kernels.py): native's C++ kernels where the
policy agrees with native's lists, ampcert's kernels at the Autocast key where it differs.

Each call below runs on both engines and under torch.autocast: the dispatcher engine
decides as the Python engine does (dtypes and values, bit for bit), no torch function
mode is pushed, and native autocast is left as it was: an op ampcert's kernel replaced
is native's again after the region, and one ampcert added falls through outside it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import torch
import torch.nn.functional as F

from ampcert.amp.policy import shipped_policy
from ampcert.amp.torch import autocast as torch_autocast
from ampcert.amp.torch import kernels as torch_autocast_kernels
from ampcert.amp.torch.autocast import autocast, cache_stats

BF16 = torch.bfloat16


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(4, 5, generator=g),
        "w": torch.randn(6, 5, generator=g, requires_grad=True),
        "b": torch.randn(6, generator=g, requires_grad=True),
        "m": torch.randn(5, 3, generator=g),
        "img": torch.randn(1, 2, 6, 6, generator=g),
        "k": torch.randn(3, 2, 3, 3, generator=g, requires_grad=True),
    }


# Calls of the shipped CPU policy: ops native's kernels decide, ops ampcert's kernels
# decide (einsum, tensordot, chain_matmul: in the policy, not in native's list), an
# uncast_if_mixed op with mixed inputs, and a composite in neither list.
CALLS = {
    "linear (native's kernel)": lambda t: F.linear(t["x"], t["w"], t["b"]),
    "conv2d (native's kernel)": lambda t: F.conv2d(t["img"], t["k"]),
    "softmax, mse_loss (native's)": lambda t: F.mse_loss(F.linear(t["x"], t["w"]).softmax(-1), t["x"][:, :1].expand(4, 6)),
    "einsum (ampcert's kernel)": lambda t: torch.einsum("ij,jk->ik", t["x"], t["m"]),
    "tensordot, same dtypes (ampcert's)": lambda t: torch.tensordot(t["x"], t["m"], 1),
    "tensordot, mixed dtypes: uncast": lambda t: torch.tensordot(t["x"].to(BF16), t["m"], 1),
    "chain_matmul (ampcert's)": lambda t: torch.linalg.multi_dot([t["x"], t["m"], t["m"].t()]),
    "bilinear (in neither list: native's composite)": lambda t: F.bilinear(t["x"], t["x"], t["w"][:2, :5, None].expand(2, 5, 5)),
}


#: Where the engines differ, by design: a composite in neither list is native's on the
#: dispatcher engine (its inner bmm in bf16) and run untouched on the Python engine (the
#: audit's known divergence).
NATIVES = {"bilinear (in neither list: native's composite)"}


def _run(call, ctx):
    t = _tensors()
    try:
        with ctx:
            out = call(t)
    except RuntimeError as exc:
        return type(exc).__name__
    out = out if isinstance(out, tuple) else (out,)
    return [o.detach() for o in out]


def _same(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return [o.dtype for o in a] == [o.dtype for o in b] and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", list(CALLS))
def test_the_dispatcher_engine_decides_as_the_python_engine(name, monkeypatch):
    on_kernels = _run(CALLS[name], autocast("cpu", BF16))
    with monkeypatch.context() as mp:
        mp.setattr(torch_autocast, "_dispatcher_serial", lambda key: -1)
        on_python = _run(CALLS[name], autocast("cpu", BF16))
    natively = _run(CALLS[name], torch.autocast("cpu", dtype=BF16))
    if name in NATIVES:
        assert _same(on_kernels, natively) and not _same(on_python, natively)
    else:
        assert _same(on_kernels, on_python), name


def test_a_region_of_the_shipped_policy_pushes_no_mode_and_turns_native_autocast_on():
    with autocast("cpu", BF16):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") is BF16
        assert not torch._C._is_torch_function_mode_enabled()
        assert torch_autocast.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled("cpu")
    region = next(r for r in torch_autocast._REGIONS.values() if r.policy is shipped_policy("cpu"))
    overrides = region.kernel_ops
    assert isinstance(overrides, torch_autocast_kernels.Overrides)
    assert {"einsum", "tensordot", "chain_matmul"} <= overrides.added and overrides.shadowed == frozenset()


def _weight_cast_node(out):
    node = out.grad_fn
    while type(node).__name__ != "ToCopyBackward0":
        node = next(n for n, _ in node.next_functions if n is not None and "AccumulateGrad" not in type(n).__name__)
    return node


def test_a_policy_that_differs_on_a_native_op_replaces_its_kernel_only_while_its_region_is_open():
    policy = shipped_policy("cpu").with_overrides({"linear": "fp32", "mse_loss": "none"})
    t = _tensors()
    cache_stats(reset=True)
    with autocast("cpu", BF16, policy=policy):
        assert F.linear(t["x"].to(BF16), t["w"]).dtype is torch.float32  # ampcert's kernel: fp32
        assert F.mse_loss(t["x"].to(BF16), t["x"].to(BF16)).dtype is BF16  # none: untouched
        assert cache_stats()["casts"] == 1  # x to fp32, by ampcert's kernel
    with torch.autocast("cpu", dtype=BF16):  # native's kernels again, with native's weight cache
        a, b = F.linear(t["x"], t["w"]), F.linear(t["x"], t["w"])
        assert a.dtype is BF16 and F.mse_loss(t["x"].to(BF16), t["x"].to(BF16)).dtype is torch.float32
    assert _weight_cast_node(a) is _weight_cast_node(b)
    assert "torch_autocast_kernels" not in next(
        line for line in torch._C._dispatch_dump("aten::linear").splitlines() if line.startswith("AutocastCPU:"))


def test_another_threads_torch_autocast_gets_natives_decisions_while_a_region_replaces_them():
    policy = shipped_policy("cpu").with_overrides({"linear": "fp32"})
    t = _tensors()
    entered, done, seen = threading.Event(), threading.Event(), []

    def native_thread():
        entered.wait()
        with torch.autocast("cpu", dtype=BF16):
            seen.append(F.linear(t["x"], t["w"]).dtype)
        done.set()

    thread = threading.Thread(target=native_thread)
    thread.start()
    with autocast("cpu", BF16, policy=policy):
        entered.set()
        done.wait(30)
        mine = F.linear(t["x"], t["w"]).dtype
    thread.join()
    assert seen == [BF16] and mine is torch.float32


def test_nested_regions_disable_and_change_the_policy_as_native_nesting_does():
    t = _tensors()
    fp32_linear = shipped_policy("cpu").with_overrides({"linear": "fp32"})
    with autocast("cpu", BF16):
        assert F.linear(t["x"], t["w"]).dtype is BF16
        with autocast("cpu", enabled=False):
            assert F.linear(t["x"], t["w"]).dtype is torch.float32 and not torch.is_autocast_enabled("cpu")
            assert torch.einsum("ij,jk->ik", t["x"], t["m"]).dtype is torch.float32
        with autocast("cpu", BF16, policy=fp32_linear):
            assert F.linear(t["x"].to(BF16), t["w"]).dtype is torch.float32
        assert F.linear(t["x"], t["w"]).dtype is BF16 and torch.einsum("ij,jk->ik", t["x"], t["m"]).dtype is BF16
    assert not torch.is_autocast_enabled("cpu")


def test_a_policy_naming_a_python_function_runs_on_the_python_engine():
    policy = shipped_policy("cpu").with_overrides({"multi_head_attention_forward": "fp32"})
    with autocast("cpu", BF16, policy=policy):
        assert torch._C._is_torch_function_mode_enabled() and not torch.is_autocast_enabled("cpu")
    assert not torch._C._is_torch_function_mode_enabled()


def test_native_autocast_outside_ampcerts_regions_is_natives_op_for_op():
    """In a fresh process: the ATen ops (and their dtypes) torch.autocast runs for calls
    ampcert's kernels touch (added: einsum, tensordot; replaced while open: linear,
    mse_loss) are the same before any ampcert region and after regions that registered
    and replaced kernels."""
    script = textwrap.dedent("""
        import torch, torch.nn.functional as F
        from torch.utils._python_dispatch import TorchDispatchMode
        from ampcert.amp import autocast
        from ampcert.amp.policy import shipped_policy

        class Ops(TorchDispatchMode):
            def __init__(self):
                super().__init__(); self.ops = []
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                self.ops.append((str(func), str(getattr(out, "dtype", None))))
                return out

        def native():
            g = torch.Generator().manual_seed(0)
            x, m = torch.randn(4, 5, generator=g), torch.randn(5, 3, generator=g)
            w = torch.randn(6, 5, generator=g, requires_grad=True)
            with Ops() as rec, torch.autocast("cpu", dtype=torch.bfloat16):
                torch.einsum("ij,jk->ik", x, m); torch.tensordot(x, m, 1)
                F.linear(x, w); F.linear(x, w); F.mse_loss(x, x)
            return rec.ops

        before = native()
        with autocast("cpu"):
            torch.einsum("ij,jk->ik", torch.ones(2, 2), torch.ones(2, 2))
        with autocast("cpu", policy=shipped_policy("cpu").with_overrides({"linear": "fp32", "mse_loss": "none"})):
            F.linear(torch.ones(2, 2), torch.ones(2, 2))
        after = native()
        assert before == after, (before, after)
        print("same", len(before))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("same")


def test_one_autocast_object_entered_on_two_threads_keeps_each_threads_regions():
    """Entries are per thread: a decorator's object shared by threads, each thread on its
    own engine (the main thread inside a Python-engine region), the first in leaving first,
    exits what it entered."""
    shared = autocast("cpu", BF16)
    python_policy = shipped_policy("cpu").with_overrides({"multi_head_attention_forward": "fp32"})
    inside, main_in, other_out, seen = threading.Event(), threading.Event(), threading.Event(), []

    def other():
        with shared:
            inside.set()
            main_in.wait(30)
            seen.append(torch.is_autocast_enabled("cpu"))
        seen.append((torch.is_autocast_enabled("cpu"), len(torch_autocast._STATE.stack)))
        other_out.set()

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(30)
    with autocast("cpu", BF16, policy=python_policy):
        with shared:  # the Python engine here: inside one of its regions
            main_in.set()
            other_out.wait(30)
            assert torch._C._is_torch_function_mode_enabled()
        assert torch._C._is_torch_function_mode_enabled()  # its own region still open
    thread.join()
    assert seen == [True, (False, 0)]
    assert torch_autocast._STATE.stack == [] and not torch._C._is_torch_function_mode_enabled()
    assert not torch.is_autocast_enabled("cpu")


def test_a_run_can_say_which_engine_decides():
    shipped = torch_autocast.engine_of("cpu", BF16)
    assert shipped["engine"] == "dispatcher"
    assert {"einsum", "tensordot"} <= set(shipped["ampcert_kernels"]) and "linear" not in shipped["ampcert_kernels"]
    fp32_linear = shipped_policy("cpu").with_overrides({"linear": "fp32"})
    assert "linear" in torch_autocast.engine_of("cpu", BF16, fp32_linear)["ampcert_kernels"]
    python_policy = shipped_policy("cpu").with_overrides({"multi_head_attention_forward": "fp32"})
    assert torch_autocast.engine_of("cpu", BF16, python_policy) == {"engine": "python"}



# fp32_with_dtype is native's fp32_set_opt_dtype: the op gets dtype=float32 and computes
# in fp32 from its inputs as given (no cast before it), unless the call passes a dtype.
# softmax.int takes dtype positionally in its schema, sum.dim_IntList as a keyword.
WITH_DTYPE = {
    "torch.softmax": (lambda x: torch.softmax(x, 1), lambda x: torch.softmax(x, 1, dtype=torch.float32)),
    "F.log_softmax": (lambda x: F.log_softmax(x, -1), lambda x: F.log_softmax(x, -1, dtype=torch.float32)),
    "Tensor.sum": (lambda x: x.sum(1), lambda x: x.sum(1, dtype=torch.float32)),
    "linalg.vector_norm": (lambda x: torch.linalg.vector_norm(x, dim=1),
                           lambda x: torch.linalg.vector_norm(x, dim=1, dtype=torch.float32)),
    "cumsum": (lambda x: torch.cumsum(x, 1), lambda x: torch.cumsum(x, 1, dtype=torch.float32)),
}


@pytest.mark.parametrize("engine", ["dispatcher", "python"])
@pytest.mark.parametrize("name", list(WITH_DTYPE))
def test_fp32_with_dtype_passes_dtype_to_the_op_as_native_does(name, engine, monkeypatch):
    from ampcert.amp.audit import _AtenOps
    from ampcert.amp.policy import OpPolicy

    if engine == "python":
        monkeypatch.setattr(torch_autocast, "_dispatcher_serial", lambda key: -1)
    policy = OpPolicy(name="with-dtype", device_type="cpu", ops={
        op: "fp32_with_dtype" for op in ("softmax", "log_softmax", "sum", "linalg_vector_norm", "cumsum")})
    assert torch_autocast.engine_of("cpu", BF16, policy)["engine"] == engine
    call, reference = WITH_DTYPE[name]
    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(0)).to(BF16)
    trace, natively = _AtenOps(), _AtenOps()
    with trace, autocast("cpu", BF16, policy=policy):
        out = call(x)
    with natively:
        expected = reference(x)
    assert out.dtype == torch.float32 and torch.equal(out, expected), name
    assert trace.ops == natively.ops  # the op's own kernel made any fp32 copy, as asked
    # A dtype the caller passes wins.
    with autocast("cpu", BF16, policy=policy):
        assert torch.softmax(x, 1, dtype=BF16).dtype == BF16 and x.sum(1, dtype=BF16).dtype == BF16


@pytest.mark.parametrize("engine", ["dispatcher", "python"])
def test_an_op_with_no_dtype_argument_in_fp32_with_dtype_is_cast(engine, monkeypatch):
    # Native's set_opt_dtype only applies to ops that take a dtype; a user's policy may list
    # another there (var, exp): its tensors are cast to fp32 instead.
    from ampcert.amp.policy import OpPolicy

    if engine == "python":
        monkeypatch.setattr(torch_autocast, "_dispatcher_serial", lambda key: -1)
    policy = OpPolicy(name="no-dtype", device_type="cpu", ops={"var": "fp32_with_dtype", "exp": "fp32_with_dtype"})
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0)).to(BF16)
    with autocast("cpu", BF16, policy=policy):
        out = (torch.var(x), x.var(0), torch.exp(x))
    assert [o.dtype for o in out] == [torch.float32] * 3
    assert torch.equal(out[2], torch.exp(x.float())) and torch.equal(out[1], x.float().var(0))
