"""ampcert's FP8/MXFP8 Linear against torchao's, bit for bit; the casts'
overflow semantics against ml_dtypes'; the layer policy; the eligibility map."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch

from ampcert.amp import autocast
from ampcert.amp.fp8_recipes import RECIPES, recipe_for
from ampcert.amp.fp8_screen import EligibilityRecorder, verdict
from ampcert.amp.torch.fp8 import (
    Fp8Linear,
    LayerPolicy,
    LayerPolicyError,
    convert,
    mx_quantize,
    plan_layers,
    quantize,
    saturating_cast,
)
from ampcert.amp.torch.op_names import torch_version

logging.getLogger("torchao").setLevel(logging.ERROR)
torchao = pytest.importorskip("torchao", reason="the dev extra installs torchao (ampcert[fp8])")


def _torchao_layer(linear: torch.nn.Linear, recipe: str, device: str = "cpu", emulate: bool = True) -> torch.nn.Module:
    """torchao's own FP8 Linear for ``recipe`` with ``linear``'s weights (its emulation by default)."""
    if recipe == "mxfp8":
        from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

        layer = MXFP8Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                            kernel_preference=KernelPreference.EMULATED,
                            scale_calculation_mode=ScaleCalculationMode.RCEIL)
        layer.load_state_dict(linear.state_dict())
        return layer.to(device=device, dtype=linear.weight.dtype)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.config import Float8LinearRecipeName

    config = Float8LinearConfig.from_recipe_name(Float8LinearRecipeName(recipe))
    config = Float8LinearConfig(**{**config.__dict__, "emulate": emulate})
    return convert_to_float8_training(torch.nn.Sequential(copy.deepcopy(linear)), config=config)[0]


def _step(layer: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor | None = None):
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(grad if grad is not None else torch.ones_like(y))
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_emulation_is_torchaos_bit_for_bit(recipe, dtype):
    """Forward output, input gradient, weight and bias gradients of one Linear,
    on a 3-D (batch, tokens, features) input with outliers, for each recipe."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96).to(dtype)
    x = (torch.randn(2, 32, 64) * torch.logspace(-3, 2, 64)).to(dtype)  # columns from 1e-3 to 1e2
    grad = (torch.randn(2, 32, 96) * 1e-3).to(dtype)
    theirs = _step(_torchao_layer(linear, recipe), x, grad)
    ours = _step(Fp8Linear.from_linear(copy.deepcopy(linear), RECIPES[recipe]), x, grad)
    for name, a, b in zip(("output", "grad_input", "grad_weight", "grad_bias"), ours, theirs, strict=True):
        assert a.dtype == b.dtype, name
        assert torch.equal(a, b), f"{recipe} {dtype} {name}: max |diff| {(a.float() - b.float()).abs().max()}"


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_bf16_compute_with_fp32_master_weights_matches_torchao(recipe):
    """An fp8 run's layer: fp32 weight, input cast to bf16 (torchao does the same under autocast)."""
    torch.manual_seed(1)
    linear = torch.nn.Linear(48, 32)
    x = torch.randn(64, 48)
    theirs = _step(_torchao_layer(linear, recipe), x.to(torch.bfloat16))
    ours = _step(Fp8Linear.from_linear(copy.deepcopy(linear), RECIPES[recipe], compute_dtype=torch.bfloat16), x)
    assert ours[0].dtype == torch.bfloat16
    assert all(torch.equal(a.to(b.dtype), b) for a, b in zip(ours, theirs, strict=True))


def test_mxfp8_under_bf16_compute_scales_the_weight_in_bf16():
    """An mxfp8 run's layer: fp32 master weight, input cast to bf16, and the MX blocks scaled
    from the weight in bf16, as torchao's MXFP8Linear scales the bf16 weights torchtitan's
    FSDP mixed precision gives it (scaled from the fp32 weight instead, gpt tiny's layers
    differed from torchao's by up to 0.043)."""
    torch.manual_seed(1)
    linear = torch.nn.Linear(64, 32)
    x = torch.randn(64, 64)
    theirs = _step(_torchao_layer(copy.deepcopy(linear).to(torch.bfloat16), "mxfp8"), x.to(torch.bfloat16))
    ours = _step(Fp8Linear.from_linear(copy.deepcopy(linear), RECIPES["mxfp8"], compute_dtype=torch.bfloat16), x)
    assert ours[0].dtype == torch.bfloat16
    for name, a, b in zip(("output", "grad_input", "grad_weight", "grad_bias"), ours, theirs, strict=True):
        assert torch.equal(a.to(b.dtype), b), f"{name}: max |diff| {(a.float() - b.float()).abs().max()}"


def test_a_different_rounding_is_caught():
    """The comparison can fail: truncating instead of rounding to nearest even differs."""
    torch.manual_seed(2)
    x = torch.randn(64, 64)
    q = quantize(x, RECIPES["tensorwise"].input, None, False)
    truncated = (x * q.scale).clamp(-448, 448).to(torch.float8_e5m2).float()
    assert not torch.equal(q.data.float(), truncated)


def test_ampcert_autocast_does_not_lower_the_emulated_matmul():
    torch.manual_seed(3)
    layer = Fp8Linear.from_linear(torch.nn.Linear(32, 32), RECIPES["tensorwise"], compute_dtype=torch.bfloat16)
    x = torch.randn(16, 32)
    plain = layer(x)
    with autocast("cpu", dtype=torch.bfloat16):
        inside = layer(x)
    assert inside.dtype == torch.bfloat16 and torch.equal(plain, inside)


def test_mx_cast_matches_torchaos_to_mx():
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    torch.manual_seed(4)
    x = torch.randn(8, 128) * torch.logspace(-6, 4, 128)
    x[0, :32] = 0.0  # an all-zero block
    x[1, 5] = float("inf")
    x[2, 40] = float("nan")
    exponent, data = to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
    ours = mx_quantize(x)
    assert torch.equal(ours.data.view(torch.uint8), data.view(torch.uint8))
    expected = torch.pow(2.0, exponent.view(torch.uint8).to(torch.float32) - 127)
    expected = torch.where(exponent.view(torch.uint8) == 255, float("nan"), expected)
    assert torch.equal(ours.scale, expected) or torch.allclose(ours.scale, expected, equal_nan=True)


# ----------------------------------------------------------------------------- overflow semantics

def test_casts_saturate_where_ml_dtypes_gives_nan_or_inf():
    """docs/policies.md, "Overflow": ampcert clamps before converting (as torchao
    does, and torch's own eager float8 conversion since 2.12); ml_dtypes, JAX's
    float8 types, turn the same finite overflow into NaN (e4m3fn has no inf)
    and inf (e5m2)."""
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes comes with JAX (the dev extra)")
    big = torch.tensor([1e6, -1e6, 500.0])
    assert saturating_cast(big, "e4m3").float().tolist() == [448.0, -448.0, 448.0]
    assert saturating_cast(big * 200, "e5m2").float().tolist() == [57344.0, -57344.0, 57344.0]
    # torch's own eager conversion saturates too since 2.12; torch 2.11 gives NaN (e4m3fn has
    # no inf), which ampcert's clamp before converting does not depend on.
    native = big.to(torch.float8_e4m3fn).float()
    if torch_version() >= (2, 12):
        assert native.tolist() == [448.0, -448.0, 448.0]
    else:
        assert torch.isnan(native).all()
    # 500 is past 464, the midpoint to the next e4m3 step: it cannot round back to 448.
    e4m3 = np.array([1e6, 500.0], dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    e5m2 = np.array([1e6], dtype=np.float32).astype(ml_dtypes.float8_e5m2).astype(np.float32)
    assert np.isnan(e4m3).all()
    assert np.isposinf(e5m2).all()
    # NaN stays NaN either way: a saturating cast must not hide it.
    assert torch.isnan(saturating_cast(torch.tensor([float("nan")]), "e4m3").float()).all()


def test_a_non_finite_operand_makes_the_output_nan_not_a_clamped_number():
    layer = Fp8Linear.from_linear(torch.nn.Linear(16, 16), RECIPES["tensorwise"])
    x = torch.randn(4, 16)
    x[0, 0] = float("inf")
    assert torch.isnan(layer(x)).all()


def test_in_range_values_never_saturate_under_current_scaling():
    x = torch.randn(256, 256) * 1e4
    for recipe in ("tensorwise", "rowwise"):
        cast = RECIPES[recipe].input
        q = quantize(x, cast, -1 if cast.granularity == "rowwise" else None, RECIPES[recipe].round_scales_to_power_of_2)
        assert (x * q.scale).abs().max() <= 448.0


# ----------------------------------------------------------------------------- layer policy

class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(32, 64)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(64, 64), torch.nn.Linear(64, 48)])
        self.odd = torch.nn.Linear(48, 40)  # 40: not a multiple of 16
        self.head = torch.nn.Linear(40, 10)

    def forward(self, x):
        for layer in (self.embed, *self.blocks, self.odd, self.head):
            x = torch.relu(layer(x))
        return x


def test_default_policy_skips_first_last_and_odd_dimensions():
    plans = {p.name: p for p in plan_layers(_Net(), RECIPES["tensorwise"], LayerPolicy())}
    assert [n for n, p in plans.items() if p.convert] == ["blocks.0", "blocks.1"]
    assert "first or last" in plans["embed"].reason and "not a multiple of 16" in plans["head"].reason
    assert "not a multiple of 16" in plans["odd"].reason
    # mxfp8's blocks need 32: 48 is out.
    mx = {p.name: p.convert for p in plan_layers(_Net(), RECIPES["mxfp8"], LayerPolicy())}
    assert mx["blocks.0"] and not mx["blocks.1"]


def test_include_and_exclude_patterns():
    policy = LayerPolicy(include=("embed",), exclude=("blocks.*",))
    converted = [p.name for p in plan_layers(_Net(), RECIPES["tensorwise"], policy) if p.convert]
    assert converted == ["embed"]
    assert [p.name for p in plan_layers(_Net(), RECIPES["tensorwise"], LayerPolicy(first_last=True))
            if p.convert] == ["embed", "blocks.0", "blocks.1"]


def test_an_included_layer_the_recipe_cannot_take_is_named():
    with pytest.raises(LayerPolicyError, match=r"layer 'blocks.1' \(64x48\): mxfp8 needs both dimensions to divide by 32"):
        plan_layers(_Net(), RECIPES["mxfp8"], LayerPolicy(include=("blocks.1",)))
    with pytest.raises(LayerPolicyError, match="matches no Linear layer"):
        plan_layers(_Net(), RECIPES["tensorwise"], LayerPolicy(include=("block.*",)))


def test_mxfp8_names_the_layer_when_a_batch_does_not_fill_its_blocks():
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    convert(net, RECIPES["mxfp8"], LayerPolicy())
    net(torch.randn(64, 64))
    with torch.no_grad():
        net(torch.randn(40, 64))  # evaluation has no grad_weight, so no blocks along tokens
    with pytest.raises(LayerPolicyError, match=r"layer '1': mxfp8 needs the tokens of a batch \(40\) to divide by 32"):
        net(torch.randn(40, 64))


def test_convert_keeps_the_parameters():
    net = _Net()
    before = [id(p) for p in net.parameters()]
    convert(net, RECIPES["rowwise"], LayerPolicy(), compute_dtype=torch.bfloat16)
    assert isinstance(net.blocks[0], Fp8Linear) and not isinstance(net.embed, Fp8Linear)
    assert [id(p) for p in net.parameters()] == before
    with autocast("cpu", dtype=torch.bfloat16):  # the bf16 output of an FP8 layer feeds fp32 ones
        out = net(torch.randn(8, 32))
    out.float().sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_recipe_for_names_the_known_recipes():
    assert recipe_for("mxfp8").name == "mxfp8" and recipe_for("fp8", "rowwise").name == "rowwise"
    with pytest.raises(ValueError, match="unknown fp8 recipe"):
        recipe_for("fp8", "delayed")


# ----------------------------------------------------------------------------- eligibility map

def _map(net: torch.nn.Module, x: torch.Tensor, recipe: str = "tensorwise") -> dict[str, dict]:
    plans = convert(net, RECIPES[recipe], LayerPolicy(), compute_dtype=torch.bfloat16)
    recorder = EligibilityRecorder(net, RECIPES[recipe], plans)
    recorder.record(1)
    with autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
    out.float().sum().backward()
    return {layer["name"]: layer for layer in recorder.layers()}


def test_map_measures_every_linear_layer_and_what_ifs_the_excluded():
    torch.manual_seed(5)
    layers = _map(_Net(), torch.randn(32, 32))
    assert set(layers) == {"embed", "blocks.0", "blocks.1", "odd", "head"}
    for name in ("blocks.0", "blocks.1"):
        layer = layers[name]
        assert layer["converted"] and layer["verdict"] == "safe", layer
        assert 0.005 < layer["rel_error_vs_bf16"] < 0.1  # e4m3 rounding, measured, not zero
        assert layer["nonfinite_steps"] == 0 and len(layer["amax"]["grad_output"]) == 1
    assert not layers["embed"]["converted"] and layers["embed"]["rel_error_vs_bf16"] is not None  # what-if
    assert layers["embed"]["nonfinite_steps"] is None


def test_a_layer_whose_values_underflow_is_unsafe():
    """Inputs spanning 12 decades: tensorwise e4m3 scales to the largest and
    flushes the small ones to zero, which the map must call out."""
    torch.manual_seed(6)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    with torch.no_grad():
        net[0].weight.copy_(torch.eye(64))
        net[0].bias.zero_()
    x = torch.randn(32, 64) * torch.logspace(-8, 4, 64)
    layer = _map(net, x)["1"]
    assert layer["converted"] and layer["underflow"]["input"] > 0.1
    assert layer["verdict"] == "unsafe" and "flush to zero" in layer["why"]


def test_non_finite_operands_are_counted_as_fp8_overflow():
    torch.manual_seed(7)
    net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 32))
    x = torch.randn(8, 32)
    x[0, 0] = float("inf")
    layer = _map(net, x)["1"]
    assert layer["nonfinite_steps"] >= 1 and layer["verdict"] == "unsafe"


def test_verdict_thresholds():
    assert verdict(0.04, {"input": 0.0}, 0)[0] == "safe"
    assert verdict(0.15, {"input": 0.0}, 0)[0] == "review"
    assert verdict(0.04, {"input": 0.05}, 0)[0] == "review"
    assert verdict(0.30, {"input": 0.0}, 0)[0] == "unsafe"
    assert verdict(None, {}, None)[0] == "unmeasured"


# ----------------------------------------------------------------------------- real FP8 (GPU)

@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_real_fp8_on_the_gpu_runs_scaled_mm_and_agrees_with_torchao(recipe, monkeypatch):
    """Where the GPU has FP8 tensor cores: all three matmuls go to torch._scaled_mm,
    the results agree with torchao's real Float8Linear (same casts, same kernel; the
    tolerance allows for a different cuBLAS algorithm choice), and with the emulation
    within FP8's rounding."""
    from ampcert.amp.torch.fp8 import has_fp8_tensor_cores

    real, why = has_fp8_tensor_cores("fp8")
    if not real:
        pytest.skip(why)
    calls = []
    scaled_mm = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: calls.append(a[0].dtype) or scaled_mm(*a, **k))
    torch.manual_seed(8)
    linear = torch.nn.Linear(256, 512, device="cuda")
    x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16)
    ours = _step(Fp8Linear.from_linear(copy.deepcopy(linear), RECIPES[recipe], real=True), x)
    assert len(calls) == (2 if recipe == "rowwise_with_gw_hp" else 3)  # gw_hp: grad_weight in bf16
    assert all(dtype in (torch.float8_e4m3fn, torch.float8_e5m2) for dtype in calls)
    monkeypatch.setattr(torch, "_scaled_mm", scaled_mm)
    theirs = _step(_torchao_layer(linear, recipe, "cuda", emulate=False), x)
    emulated = _step(Fp8Linear.from_linear(copy.deepcopy(linear), RECIPES[recipe]), x)
    for a, b, e in zip(ours, theirs, emulated, strict=True):
        scale = e.float().abs().max().item()
        assert torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-3 * scale)
        assert torch.allclose(a.float(), e.float(), rtol=0.1, atol=1e-2 * scale)
