"""ampcert.amp.torch.autocast.autocast against native torch.autocast, on real CPU tensors.

On this machine bf16/fp16 matmuls are ~100x slower than fp32: every tensor is tiny.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ampcert.amp.policy import FAMILIES, load_policy, shipped_policy, shipped_policy_names
from ampcert.amp.torch.autocast import (
    Family,
    autocast,
    cache_stats,
    canonical_op_name,
    get_autocast_dtype,
    is_autocast_enabled,
)
from ampcert.amp.torch.families import HANDLERS, Region, set_opt_dtype, takes_dtype

BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64


def native(dtype=BF16, **kw):
    return torch.autocast("cpu", dtype=dtype, **kw)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------------------
# basic decisions, cross-checked with native autocast
# ---------------------------------------------------------------------------
CALLS = {
    "F.linear": lambda x, w: F.linear(x, w),
    "nn.Linear": lambda x, w: nn.Linear(8, 8)(x),
    "matmul_op": lambda x, w: x @ w,
    "Tensor.matmul": lambda x, w: x.matmul(w),
    "torch.mm": lambda x, w: torch.mm(x, w),
    "conv2d": lambda x, w: F.conv2d(x.view(1, 2, 4, 4), w.view(4, 2, 2, 4)[..., :2]),
    "nn.Conv1d": lambda x, w: nn.Conv1d(8, 3, 3)(x.t()[None]),
    "einsum": lambda x, w: torch.einsum("ij,jk->ik", x, w),
    "mse_loss": lambda x, w: F.mse_loss(x, w[:4]),
    "cross_entropy": lambda x, w: F.cross_entropy(x, torch.tensor([0, 1, 2, 3])),
    "nll_loss": lambda x, w: F.nll_loss(x, torch.tensor([0, 1, 2, 3])),
    "relu": lambda x, w: torch.relu(x),
    "softmax": lambda x, w: F.softmax(x, -1),
    "layer_norm": lambda x, w: F.layer_norm(x, (8,)),
    "sum": lambda x, w: x.sum(),
    "pow": lambda x, w: x ** 2,
    "pad_reflect": lambda x, w: F.pad(x[None], (1, 1), mode="reflect"),
    "pad_constant": lambda x, w: F.pad(x[None], (1, 1)),
    "interpolate": lambda x, w: F.interpolate(x[None], scale_factor=2),
    "cat_mixed": lambda x, w: torch.cat([x, w[:4].to(BF16)]),
    "fft": lambda x, w: torch.fft.rfft(x),
}


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("in_dtype", [FP32, BF16])
def test_output_dtype_and_values_match_native(name, in_dtype):
    x = torch.randn(4, 8).to(in_dtype)
    w = torch.randn(8, 8).to(in_dtype)
    fn = CALLS[name]
    torch.manual_seed(1)
    with native():
        want = fn(x, w)
    torch.manual_seed(1)
    with autocast("cpu"):
        got = fn(x, w)
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    assert torch.equal(got, want), name


def test_lower_precision_and_fp32_decisions():
    x = torch.randn(4, 8)
    w = torch.randn(6, 8)
    with autocast("cpu"):
        assert F.linear(x, w).dtype == BF16
        assert F.conv2d(torch.randn(1, 3, 5, 5), torch.randn(2, 3, 3, 3)).dtype == BF16
        assert F.mse_loss(x.to(BF16), x.to(BF16)).dtype == FP32
        assert F.cross_entropy(x.to(BF16), torch.tensor([0, 1, 2, 3])).dtype == FP32
        assert torch.relu(x).dtype == FP32  # untouched, like native
        assert torch.relu(x.to(BF16)).dtype == BF16


def test_canonical_names_for_public_entry_points():
    assert canonical_op_name(torch.Tensor.__matmul__) == "matmul"
    assert canonical_op_name(torch.Tensor.__rmatmul__) == "matmul"
    assert canonical_op_name(torch.Tensor.__rpow__) == "pow"
    assert canonical_op_name(F.linear) == "linear"
    assert canonical_op_name(torch.Tensor.softmax) == "softmax"
    assert canonical_op_name(torch.special.expm1) == "expm1"
    assert canonical_op_name(torch.arccos) == "acos"
    assert canonical_op_name(torch.concat) == "cat"
    assert canonical_op_name(torch.linalg.vector_norm) == "linalg_vector_norm"
    assert canonical_op_name(torch.fft.rfft) == "fft_rfft"


# ---------------------------------------------------------------------------
# backward: identical dtype decisions -> identical gradients
# ---------------------------------------------------------------------------
def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ctx):
    model.zero_grad(set_to_none=True)
    with ctx:
        out = model(x)
        loss = F.cross_entropy(out, y)
    loss.backward()
    return out, loss, {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same_training_step(model, x, y):
    out_a, loss_a, g_a = _grads(model, x, y, autocast("cpu"))
    out_n, loss_n, g_n = _grads(model, x, y, native())
    assert out_a.dtype == out_n.dtype == BF16
    assert loss_a.dtype == loss_n.dtype == FP32
    assert torch.equal(out_a, out_n) and torch.equal(loss_a, loss_n)
    for name in g_n:
        assert g_a[name].dtype == FP32
        assert torch.equal(g_a[name], g_n[name]), name


def test_mlp_gradients_equal_native_exactly():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    _assert_same_training_step(model, torch.randn(4, 8), torch.tensor([0, 1, 2, 3]))


def test_conv_net_gradients_equal_native_exactly():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 1), nn.Flatten(), nn.Linear(4 * 3 * 3, 5),
    )
    _assert_same_training_step(model, torch.randn(2, 3, 8, 8), torch.tensor([0, 4]))


def test_python_composites_are_decided_op_by_op_like_native():
    # nn.MultiheadAttention -> F.multi_head_attention_forward (Python) -> linear/bmm/softmax;
    # Upsample -> F.interpolate; ReflectionPad2d -> F.pad -> reflection_pad2d (fp32 on CPU).
    model = nn.Sequential(
        nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
        nn.Unflatten(1, (1, 4)),
        nn.Upsample(scale_factor=2),
        nn.ReflectionPad2d(1),
        nn.Conv2d(1, 1, 3),
        nn.Flatten(),
        nn.Linear(8 * 16, 3),
    )
    _assert_same_training_step(model, torch.randn(2, 4, 8), torch.tensor([0, 2]))


# ---------------------------------------------------------------------------
# eligibility
# ---------------------------------------------------------------------------
def test_float64_int_and_other_device_tensors_are_untouched():
    with autocast("cpu"):
        assert F.linear(torch.randn(2, 4, dtype=FP64), torch.randn(3, 4, dtype=FP64)).dtype == FP64
        ints = torch.mm(torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2, dtype=torch.long))
        assert ints.dtype == torch.long
        meta = F.linear(torch.empty(2, 4, device="meta"), torch.empty(3, 4, device="meta"))
        assert meta.device.type == "meta" and meta.dtype == FP32
        # a mixed float64/fp32 matmul is only cast where eligible: fp32 -> bf16, f64 stays
        a64 = torch.randn(2, 2, dtype=FP64)
        with pytest.raises(RuntimeError):
            torch.mm(a64, torch.randn(2, 2))  # native raises too: f64 @ bf16
    with native():
        with pytest.raises(RuntimeError):
            torch.mm(a64, torch.randn(2, 2))


def test_in_place_and_out_calls_are_not_cast():
    a, b, c = torch.randn(3, 4), torch.randn(4, 3), torch.randn(3, 3)
    expected = torch.addmm(c, a, b)
    with autocast("cpu"):
        c2 = c.clone()
        c2.addmm_(a, b)  # in-place: never cast
        out = torch.empty(3, 3)
        torch.mm(a, b, out=out)  # out=: never cast
        ret = torch.addmm(c, a, b, out=torch.empty(3, 3))
    assert c2.dtype == FP32 and torch.equal(c2, expected)
    assert out.dtype == FP32 and torch.equal(out, a @ b)
    assert ret.dtype == FP32 and torch.equal(ret, expected)


# ---------------------------------------------------------------------------
# regions: nesting, enabled, defaults, exit
# ---------------------------------------------------------------------------
def _nested_dtypes(outer, inner_off, inner_fp16):
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    seen = []
    with outer():
        seen.append(F.linear(x, w).dtype)
        with inner_off():
            seen.append(F.linear(x, w).dtype)
            with inner_fp16():
                seen.append(F.linear(x, w).dtype)
            seen.append(F.linear(x, w).dtype)
        seen.append(F.linear(x, w).dtype)
    seen.append(F.linear(x, w).dtype)
    return seen


def test_nesting_matches_native():
    ours = _nested_dtypes(lambda: autocast("cpu"), lambda: autocast("cpu", enabled=False),
                          lambda: autocast("cpu", dtype=FP16))
    theirs = _nested_dtypes(lambda: native(), lambda: native(enabled=False), lambda: native(FP16))
    assert ours == theirs == [BF16, FP32, FP16, FP32, BF16, FP32]


def test_state_helpers_and_defaults():
    assert not is_autocast_enabled("cpu")
    with autocast("cpu") as ctx:
        assert ctx.fast_dtype == BF16 and ctx.policy is shipped_policy("cpu")
        assert is_autocast_enabled("cpu") and get_autocast_dtype("cpu") == BF16
        with autocast("cpu", enabled=False):
            assert not is_autocast_enabled("cpu")
    assert not is_autocast_enabled("cpu") and get_autocast_dtype("cpu") is None
    cuda = autocast("cuda")  # constructing needs no GPU
    assert cuda.fast_dtype == FP16 and cuda.policy.name == "torch-cuda"
    with pytest.raises(ValueError, match="dtype"):
        autocast("cpu", dtype=FP32)
    with pytest.raises(ValueError, match="device_type"):
        autocast("tpu")


def test_cuda_region_leaves_cpu_tensors_alone():
    with autocast("cuda"):
        assert F.linear(torch.randn(2, 4), torch.randn(3, 4)).dtype == FP32


def test_outputs_keep_dtype_after_exit_and_exit_restores():
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    with autocast("cpu"):
        y = F.linear(x, w)
    assert y.dtype == BF16
    assert (y * 2).dtype == BF16
    assert F.linear(x, w).dtype == FP32
    assert not torch._C._is_torch_function_mode_enabled()


def test_exception_inside_region_closes_it():
    with pytest.raises(KeyError):
        with autocast("cpu"):
            raise KeyError("boom")
    assert not is_autocast_enabled("cpu")
    assert F.linear(torch.randn(2, 4), torch.randn(3, 4)).dtype == FP32


def test_decorator():
    @autocast("cpu")
    def f(x, w):
        return F.linear(x, w)

    assert f(torch.randn(2, 4), torch.randn(3, 4)).dtype == BF16
    assert F.linear(torch.randn(2, 4), torch.randn(3, 4)).dtype == FP32


# ---------------------------------------------------------------------------
# one decision per outermost call, weight cache
# ---------------------------------------------------------------------------
def _weight_cast_node(out: torch.Tensor):
    """The ToCopyBackward node that cast nn.Linear's weight (AddmmBackward -> TBackward -> ToCopy)."""
    t_node = out.grad_fn.next_functions[2][0]
    node = t_node.next_functions[0][0]
    assert type(node).__name__ == "ToCopyBackward0"
    return node


def test_nested_calls_are_not_cast_again(python_engine):
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    cache_stats(reset=True)
    with autocast("cpu"):
        lin(x)  # nn.Linear -> F.linear: one decision: x, weight, bias cast once each
        assert cache_stats()["casts"] == 3
    cache_stats(reset=True)
    with autocast("cpu", policy=shipped_policy("cuda")):
        # fp32_with_dtype: F.softmax gets dtype=float32 (no cast), and the Tensor.softmax
        # it calls inside, given that dtype, is left as called.
        assert F.softmax(x.to(BF16), -1).dtype == torch.float32
        assert cache_stats()["casts"] == 0


def test_weight_cache_casts_once_per_outermost_region(python_engine):
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    cache_stats(reset=True)
    with autocast("cpu"):
        a = lin(x)
        with autocast("cpu", enabled=False):
            lin(x)
        b = lin(x)
        stats = cache_stats()
        assert stats["cached"] == 2  # weight and bias
        assert _weight_cast_node(a) is _weight_cast_node(b)
    assert stats["casts"] == 4 and stats["cache_hits"] == 2  # x twice + weight + bias; w, b hit
    assert cache_stats()["cached"] == 0  # cleared at the outermost exit
    with autocast("cpu"):
        c = lin(x)
    assert _weight_cast_node(c) is not _weight_cast_node(a)


def test_weight_cache_matches_native_sharing():
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with native():
        a, b = lin(x), lin(x)
    assert _weight_cast_node(a) is _weight_cast_node(b)  # the behaviour ampcert mirrors


def test_weight_cache_invalidated_by_in_place_update(python_engine):
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with autocast("cpu"):
        before = lin(x)
        with torch.no_grad():
            lin.weight.add_(1.0)  # e.g. an optimizer step inside the region
        after = lin(x)
        again = lin(x)
    expected = F.linear(x.to(BF16), lin.weight.detach().to(BF16), lin.bias.detach().to(BF16))
    assert torch.equal(after, expected)
    assert not torch.equal(before, after)
    assert _weight_cast_node(after) is not _weight_cast_node(before)
    assert _weight_cast_node(again) is _weight_cast_node(after)


def test_cache_disabled_and_no_grad_entries_do_not_block_gradients(python_engine):
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    cache_stats(reset=True)
    with autocast("cpu", cache_enabled=False):
        lin(x), lin(x)
    assert cache_stats()["cache_hits"] == 0
    with autocast("cpu"):
        with torch.no_grad():
            lin(x)  # cast made without grad
        out = lin(x)
    out.float().sum().backward()
    assert lin.weight.grad is not None and lin.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------------------
# other families (through the CUDA policy, run on CPU tensors) and custom policies
# ---------------------------------------------------------------------------
def test_fp32_with_dtype_and_banned_families():
    cuda_pol = shipped_policy("cuda")
    xb = torch.randn(2, 4).to(BF16)
    with autocast("cpu", policy=cuda_pol):
        assert xb.sum().dtype == FP32
        assert torch.sum(xb, dtype=BF16).dtype == BF16  # explicit dtype wins
        assert F.softmax(xb, -1).dtype == FP32
        assert F.softmax(xb, -1, dtype=FP64).dtype == FP64
        assert torch.randn(3, dtype=FP64).cumsum(0).dtype == FP64  # f64 not eligible
        assert (xb ** 2).dtype == FP32 and torch.exp(xb).dtype == FP32
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(torch.rand(4), torch.rand(4))
        assert F.binary_cross_entropy_with_logits(torch.randn(4), torch.rand(4)).dtype == FP32
    assert F.binary_cross_entropy(torch.rand(4), torch.rand(4)).dtype == FP32  # outside: fine


def test_promote_family():
    a, b = torch.randn(2), torch.randn(2).to(BF16)
    with autocast("cpu"):
        assert torch.cat([a, b]).dtype == FP32
        assert torch.cat([b, b]).dtype == BF16
        assert torch.stack([b, a]).dtype == FP32
        # index_copy needs equal dtypes; under autocast the promote makes it work (as native)
        assert torch.index_copy(b.repeat(2), 0, torch.tensor([0, 1]), a).dtype == FP32
        with pytest.raises(RuntimeError):
            torch.cat([b, torch.randn(2).to(FP16)])  # bf16 + fp16 in a bf16 region: native raises too


def test_uncast_if_mixed_raises_like_native():
    a, b = torch.randn(2, 3), torch.randn(3, 2).to(BF16)
    for ctx in (native(), autocast("cpu")):
        with ctx:
            with pytest.raises(RuntimeError):
                torch.tensordot(a, b, dims=1)
            assert torch.tensordot(a, b.float(), dims=1).dtype == BF16


def test_custom_policy_changes_decisions(tmp_path):
    path = tmp_path / "custom.yaml"
    path.write_text(textwrap.dedent("""
        name: custom
        extends: torch-cpu
        overrides:
          layer_norm: lower_precision
          softmax: fp32
          linear: none
    """))
    pol = load_policy(path)
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    with autocast("cpu"):
        base = (F.layer_norm(x, (4,)).dtype, F.softmax(x.to(BF16), -1).dtype, F.linear(x, w).dtype)
    with autocast("cpu", policy=pol):
        custom = (F.layer_norm(x, (4,)).dtype, F.softmax(x.to(BF16), -1).dtype, F.linear(x, w).dtype)
    with autocast("cpu", policy=str(path)):
        by_path = F.layer_norm(x, (4,)).dtype
    assert base == (FP32, BF16, BF16)
    assert custom == (BF16, FP32, FP32)
    assert by_path == BF16


def test_builtins_that_compare_equal_keep_their_own_names():
    """torch.mm == torch.dsmm (and hspmm == hsmm): a name cache keyed by equality
    gave whichever was seen first's name to both, and torch.mm then ran in fp32."""
    assert torch.dsmm == torch.mm and torch.dsmm is not torch.mm
    assert canonical_op_name(torch.dsmm) == "dsmm"
    assert canonical_op_name(torch.mm) == "mm"
    with autocast("cpu", dtype=BF16):
        assert torch.mm(torch.randn(4, 4), torch.randn(4, 4)).dtype is BF16


# ---------------------------------------------------------------------------
# the dispatch table: Family -> handler
# ---------------------------------------------------------------------------
def test_the_dispatch_table_covers_every_family_and_every_shipped_op():
    assert set(HANDLERS) == set(Family) and len(set(HANDLERS.values())) == len(Family)
    assert {f.value for f in Family} == set(FAMILIES)  # the names policy files use, no more, no less
    for name in shipped_policy_names():
        pol = load_policy(name)
        assert pol.ops and {Family(fam) for fam in pol.ops.values()} <= set(HANDLERS), name
        region = Region(pol.device_type, BF16, pol, True, True)
        assert region.handlers.keys() == pol.ops.keys(), name
        # fp32_with_dtype's ops that take a dtype get it as an argument (set_opt_dtype)
        assert all(region.handlers[op] is (set_opt_dtype if Family(fam) is Family.FP32_WITH_DTYPE and takes_dtype(op)
                                           else HANDLERS[Family(fam)]) for op, fam in pol.ops.items()), name


def test_each_handler_decides_its_familys_dtype():
    region = Region("cpu", BF16, shipped_policy("cpu"), True, True)
    x, xb, ints = torch.randn(2), torch.randn(2).to(BF16), torch.ones(2, dtype=torch.int64)
    castable = [f for f in Family if f is not Family.BANNED]
    assert {f: HANDLERS[f](region, "op", (x, xb), {}) for f in castable} == {
        Family.LOWER_PRECISION: BF16, Family.FP32: FP32, Family.FP32_WITH_DTYPE: FP32, Family.PROMOTE: FP32}
    assert HANDLERS[Family.FP32_WITH_DTYPE](region, "sum", (xb,), {"dtype": BF16}) is None  # a given dtype wins
    assert all(HANDLERS[f](region, "op", (ints, x.double()), {}) is None for f in castable)  # nothing eligible
    assert HANDLERS[Family.BANNED](region, "some_op", (1.0,), {}) is None  # no tensor on the device
    with pytest.raises(RuntimeError, match="some_op is banned"):
        HANDLERS[Family.BANNED](region, "some_op", (ints,), {})


def test_regions_are_kept_per_policy_content_not_per_object():
    # A policy loaded again (per step, per worker) is the same setting: one region for it,
    # so the table of regions stays as small as the policies a process meets.
    from ampcert.amp.policy import OpPolicy
    from ampcert.amp.torch import autocast as torch_autocast

    x = torch.randn(2, 4)
    made = [OpPolicy(name="fresh", device_type="cpu", ops={"linear": "lower_precision", "exp": "fp32"})
            for _ in range(3)]
    before = len(torch_autocast._REGIONS)
    for policy in made:
        with autocast("cpu", BF16, policy=policy):
            assert F.linear(x, x).dtype == BF16 and torch.exp(x.to(BF16)).dtype == torch.float32
    assert len(torch_autocast._REGIONS) == before + 1
