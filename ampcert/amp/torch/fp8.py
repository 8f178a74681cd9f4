"""FP8 and MXFP8 matmuls for ``torch.nn.Linear``: casts, the layer, the swap.

    from ampcert.amp.torch.fp8 import convert, LayerPolicy
    from ampcert.amp.fp8_recipes import RECIPES

    plans = convert(model, RECIPES["tensorwise"], LayerPolicy(), compute_dtype=torch.bfloat16)
    with ampcert.amp.autocast("cpu", torch.bfloat16):   # everything else in bf16
        loss = loss_fn(model(x), y)

:func:`convert` swaps the Linear layers a :class:`LayerPolicy` makes eligible
for :class:`Fp8Linear`, which keeps the same parameters (the optimizer built
before or after sees the same tensors) and runs its three matmuls through
:class:`_Fp8Matmul` as the recipe says (:mod:`ampcert.amp.fp8_recipes`).

Two paths, the same casts:

- **emulated** (CPU, and GPUs without FP8 tensor cores): each operand is cast
  to FP8 exactly as on hardware (scale, round to nearest even, saturate) and
  the matmul runs on the FP8 values dequantised to fp32 (MX: to the operand's
  own dtype). The operations, their order and their dtypes are torchao's
  emulated ``Float8Linear`` / ``MXFP8Linear``, so the results are bit for bit
  theirs (tests/amp/torch/test_torch_fp8.py). Speed figures of an emulated run say
  nothing about FP8 hardware.
- **real** (compute capability >= 8.9, ``fp8`` recipes): the cast operands go
  to ``torch._scaled_mm`` with the inverse scales, as torchao does.

Overflow semantics (docs/policies.md). The casts clamp to the format's
largest finite value before converting, so a finite value never becomes inf
or NaN (torch's float8 conversion saturates too since 2.12; ml_dtypes, which
JAX uses, gives NaN for e4m3fn and inf for e5m2). A non-finite amax (the
tensor already held inf or NaN) makes the scale 0 and the cast NaN: that
step's output is NaN, as in torchao. With current scaling nothing in range
saturates, so there is nothing for a loss scaler to skip; :mod:`ampcert.amp.
fp8_screen` counts non-finite amaxes instead.
"""

from __future__ import annotations

import contextlib
import fnmatch
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ..fp8_recipes import MAX_FINITE, MX_BLOCK, TORCH_DTYPE, Cast, Recipe
from ..precision import Precision

# torchao's guard against a zero amax (an all-zero tensor keeps a finite scale).
EPS = 1e-12
# E8M0 (MX scale) exponent bias and the float32 mantissa width.
_E8M0_BIAS = 127
_F32_MIN_NORMAL = 2.0**-126


def fp8_dtype(fmt: str) -> torch.dtype:
    return getattr(torch, TORCH_DTYPE[fmt])


# ----------------------------------------------------------------------------- casts
@dataclass
class Quantized:
    """An operand cast to FP8: ``data`` (float8) and its scale.

    Scaled casts: ``scale`` multiplies (``data ~= x * scale``; a scalar, or one
    per row or column, broadcastable to ``data``); dequantising divides it out.
    MX casts (``mx``): ``scale`` is each block's power of two (E8M0 decoded to
    fp32, ``x ~= data * scale``), one per block of the last dimension of the
    row-major data, shaped ``[rows, cols // 32]``."""

    data: torch.Tensor
    scale: torch.Tensor
    orig_dtype: torch.dtype
    mx: bool = False

    def t(self) -> Quantized:
        scale = self.scale.t() if self.scale.dim() == 2 else self.scale
        return Quantized(self.data.t(), scale, self.orig_dtype, self.mx)

    def dequantize_fp32(self) -> torch.Tensor:
        return self.data.float() / self.scale


@torch.no_grad()
def amax_of(x: torch.Tensor, granularity: str, dim: int | None) -> torch.Tensor:
    """max |x|: over the tensor, or along ``dim`` (kept) for rowwise scales."""
    if granularity == "tensorwise" or dim is None:
        return torch.max(torch.abs(x))
    return torch.amax(torch.abs(x), dim=dim, keepdim=True)


@torch.no_grad()
def scale_from_amax(amax: torch.Tensor, fmt: str, power_of_2: bool) -> torch.Tensor:
    """``max_finite / amax`` in float64, stored as fp32 (torchao: the division in
    fp64 so compiled and eager agree), optionally rounded down to a power of two."""
    scale = (MAX_FINITE[fmt] / torch.clamp(amax.to(torch.float64), min=EPS)).to(torch.float32)
    if power_of_2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return scale


def saturating_cast(x_scaled: torch.Tensor, fmt: str) -> torch.Tensor:
    """Clamp to +-max_finite, then convert (round to nearest even): no finite
    value becomes inf or NaN; NaN stays NaN."""
    top = MAX_FINITE[fmt]
    return x_scaled.clamp(min=-top, max=top).to(fp8_dtype(fmt))


def quantize(x: torch.Tensor, cast: Cast, dim: int | None, power_of_2: bool) -> Quantized:
    """Cast ``x`` per ``cast`` (tensorwise or rowwise along ``dim``)."""
    amax = amax_of(x, cast.granularity, dim)
    scale = scale_from_amax(amax, cast.format, power_of_2)
    data = saturating_cast(x.to(torch.float32) * scale, cast.format)
    return Quantized(data, scale, x.dtype)


def mx_scale_exponent(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    """The biased E8M0 exponent of each block's scale, NVIDIA's RCEIL rule:
    ``ceil(log2(amax / max_finite))``, so the block's largest value lands at or
    below the format's largest; 255 marks a NaN amax, 254 an infinite one."""
    descale = amax / MAX_FINITE[fmt]
    exponent = torch.clamp(torch.ceil(torch.log2(descale)), min=-_E8M0_BIAS, max=_E8M0_BIAS) + _E8M0_BIAS
    exponent = torch.where(torch.isinf(descale), 254, exponent.to(torch.uint8))
    return torch.where(torch.isnan(descale), 255, exponent).to(torch.uint8)


def mx_quantize(x: torch.Tensor, fmt: str = "e4m3", block: int = MX_BLOCK) -> Quantized:
    """MX cast along the last dimension of a contiguous 2-D ``x``: blocks of
    ``block`` values share a power-of-two scale (torchao's ``to_mx`` with
    ``ScaleCalculationMode.RCEIL``)."""
    rows, cols = x.shape
    blocks = x.reshape(rows, cols // block, block)
    amax = torch.amax(torch.abs(blocks), -1).unsqueeze(-1).to(torch.float32)
    data_hp = blocks.to(torch.float32)
    exponent = mx_scale_exponent(amax, fmt)
    reciprocal = torch.where(
        exponent == 255, amax / MAX_FINITE[fmt],
        torch.where(exponent == 254, 2.0**-127,
                    torch.where(exponent == 0, 1.0, torch.exp2(_E8M0_BIAS - exponent.to(torch.float32)))))
    scaled = torch.clamp(data_hp * reciprocal, min=-MAX_FINITE[fmt], max=MAX_FINITE[fmt])
    data = scaled.to(fp8_dtype(fmt)).reshape(rows, cols)
    return Quantized(data, mx_block_scale(exponent.squeeze(-1)), x.dtype, mx=True)


def mx_block_scale(exponent: torch.Tensor) -> torch.Tensor:
    """2^(e - 127) per block (torchao's ``get_fp_scale``): NaN for e = 255."""
    scale = torch.pow(torch.full_like(exponent, 2.0, dtype=torch.float32),
                      exponent.to(torch.int16) - _E8M0_BIAS)
    return torch.where(exponent != 255, scale, float("nan"))


def mx_dequantize(q: Quantized, dtype: torch.dtype, block: int = MX_BLOCK) -> torch.Tensor:
    """The MX operand back in ``dtype`` (torchao's ``to_dtype``: the values in
    ``dtype``, times the block scale in ``dtype``), keeping ``q``'s layout."""
    transposed = not q.data.is_contiguous()
    data, scale = (q.data.t(), q.scale.t()) if transposed else (q.data, q.scale)
    out = (data.to(dtype).reshape(-1, block) * scale.reshape(-1, 1).to(dtype)).reshape(data.shape)
    return out.t() if transposed else out


# ----------------------------------------------------------------------------- matmuls
def _fp8_matmul(a: Quantized, b: Quantized, out_dtype: torch.dtype, real: bool, fast_accum: bool) -> torch.Tensor:
    if not real:
        # torchao's emulation: dequantise to fp32, multiply, convert to the output dtype.
        return torch.mm(a.dequantize_fp32(), b.dequantize_fp32()).to(out_dtype)
    return _scaled_mm(a, b, out_dtype, fast_accum)


def _scaled_mm(a: Quantized, b: Quantized, out_dtype: torch.dtype, fast_accum: bool) -> torch.Tensor:
    """FP8 tensor cores through ``torch._scaled_mm`` (torchao's
    ``addmm_float8_unwrapped``): a row-major, b column-major, inverse scales."""
    a_inv, b_inv = a.scale.reciprocal(), b.scale.reciprocal()
    a_data = a.data.contiguous()
    b_data = b.data.t().contiguous().t()
    # One operand tensorwise, the other rowwise: _scaled_mm takes one granularity.
    if a_inv.dim() == 0 and b_inv.dim() == 2:
        a_inv = a_inv.repeat(a_data.shape[0]).reshape(-1, 1)
    elif b_inv.dim() == 0 and a_inv.dim() == 2:
        b_inv = b_inv.repeat(b_data.shape[1]).reshape(1, -1)
    rowwise = a_inv.dim() == 2
    post = None
    if rowwise and not fast_accum:  # the rowwise kernel is slow without fast accumulation
        post, a_inv, b_inv = a_inv * b_inv, a_inv.new_ones(()), a_inv.new_ones(())
    dtype = torch.bfloat16 if rowwise and out_dtype in (torch.float16, torch.float32) else out_dtype
    out = torch._scaled_mm(a_data, b_data, scale_a=a_inv, scale_b=b_inv, out_dtype=dtype,
                           use_fast_accum=fast_accum)
    if post is not None:
        out = out * post
    return out.to(out_dtype)


def _mx_matmul(a: Quantized, b: Quantized) -> torch.Tensor:
    """torchao's emulated MX gemm: both operands dequantised, then mm, in the
    first operand's dtype (an fp32 master weight under bf16 compute
    dequantises to bf16 exactly: e4m3 values times powers of two fit bf16)."""
    return torch.mm(mx_dequantize(a, a.orig_dtype), mx_dequantize(b, a.orig_dtype))


def _rowwise_dim(cast: Cast, dim: int) -> int | None:
    return dim if cast.granularity == "rowwise" else None


@contextlib.contextmanager
def _plain_ops(device_type: str):
    """Run the cast arithmetic as written: outside any autocast (ampcert's is a
    TorchFunctionMode, torch's a dispatch key), which would lower the fp32
    dequantised matmul to the autocast dtype."""
    native = torch.is_autocast_enabled(device_type)
    with torch._C.DisableTorchFunction(), (torch.autocast(device_type, enabled=False) if native
                                           else contextlib.nullcontext()):
        yield


class _Fp8Matmul(torch.autograd.Function):
    """``input @ weight_t`` with FP8 operands in all three matmuls (torchao's
    ``matmul_with_hp_or_float8_args``; MX: its ``mx_mm``)."""

    @staticmethod
    def forward(ctx: Any, input_hp: torch.Tensor, weight_hp_t: torch.Tensor, recipe: Recipe, real: bool) -> torch.Tensor:
        ctx.save_for_backward(input_hp, weight_hp_t)
        ctx.recipe, ctx.real = recipe, real
        with _plain_ops(input_hp.device.type):
            if recipe.input.granularity == "block":
                shape = input_hp.shape
                a = mx_quantize(input_hp.reshape(-1, shape[-1]))
                b = mx_quantize(weight_hp_t.t().contiguous()).t()  # blocks along in_features
                out = _mx_matmul(a, b)
                return out.reshape(*shape[:-1], out.shape[-1])
            pow2 = recipe.round_scales_to_power_of_2
            a = quantize(input_hp, recipe.input, _rowwise_dim(recipe.input, -1), pow2)
            b = quantize(weight_hp_t, recipe.weight, _rowwise_dim(recipe.weight, 0), pow2)
            shape = input_hp.shape
            a = Quantized(a.data.reshape(-1, shape[-1]),
                          a.scale.reshape(-1, 1) if a.scale.dim() else a.scale, a.orig_dtype)
            out = _fp8_matmul(a, b, input_hp.dtype, real, fast_accum=True)
            return out.reshape(*shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input_hp, weight_hp_t = ctx.saved_tensors
        recipe, real = ctx.recipe, ctx.real
        with _plain_ops(grad_output.device.type):
            go_shape = grad_output.shape
            in_shape = input_hp.shape
            if recipe.input.granularity == "block":
                go = grad_output.contiguous().reshape(-1, go_shape[-1])
                x = input_hp.reshape(-1, in_shape[-1])
                w = weight_hp_t.t()
                grad_input = _mx_matmul(mx_quantize(go), mx_quantize(w.t().contiguous()).t())
                # grad_weight contracts over tokens: blocks along them.
                go_t = mx_quantize(go.t().contiguous())
                x_t = mx_quantize(x.t().contiguous()).t()
                grad_weight = _mx_matmul(go_t, x_t)
            else:
                pow2 = recipe.round_scales_to_power_of_2
                go = grad_output.reshape(-1, go_shape[-1])
                go_q = quantize(go, recipe.grad_output, _rowwise_dim(recipe.grad_output, -1), pow2)
                w_q = quantize(weight_hp_t, recipe.weight_for_grad_input,
                               _rowwise_dim(recipe.weight_for_grad_input, -1), pow2)
                grad_input = _fp8_matmul(go_q, w_q.t(), grad_output.dtype, real, fast_accum=False)
                x = input_hp.reshape(-1, in_shape[-1])
                if recipe.grad_output_for_grad_weight.format == "hp":
                    grad_weight = torch.mm(go.t(), x)
                else:
                    go_q = quantize(go, recipe.grad_output_for_grad_weight,
                                    _rowwise_dim(recipe.grad_output_for_grad_weight, 0), pow2)
                    x_q = quantize(x, recipe.input_for_grad_weight, _rowwise_dim(recipe.input_for_grad_weight, 0), pow2)
                    grad_weight = _fp8_matmul(go_q.t(), x_q, grad_output.dtype, real, fast_accum=False)
        grad_input = grad_input.reshape(*go_shape[:-1], grad_input.shape[-1])
        return grad_input, grad_weight.t(), None, None


class LayerPolicyError(ValueError):
    """A layer the policy names cannot be converted (its message names it)."""


class Fp8Linear(torch.nn.Linear):
    """A ``torch.nn.Linear`` whose matmuls run in FP8 per ``recipe``; the bias is
    added in the output's dtype. ``compute_dtype`` (bf16 in ampcert's fp8
    runs) is what the input is cast to first, as torchao's Float8Linear does
    under autocast, so the output and its gradient are in that dtype; MX
    scales its blocks from the weight in that dtype too."""

    recipe: Recipe
    real: bool
    compute_dtype: torch.dtype | None
    layer_name: str

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, recipe: Recipe, *, real: bool = False,
                    compute_dtype: torch.dtype | None = None, name: str = "") -> Fp8Linear:
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=False)
        new.weight, new.bias = linear.weight, linear.bias  # the same Parameters
        new.recipe, new.real, new.compute_dtype, new.layer_name = recipe, real, compute_dtype, name
        new.train(linear.training)
        return new

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        tokens = input.numel() // max(input.shape[-1], 1)
        if self.recipe.input.granularity == "block" and torch.is_grad_enabled() and tokens % MX_BLOCK:
            # grad_weight's MX blocks run along the tokens: a batch that does not fill them cannot train.
            raise LayerPolicyError(f"layer {self.layer_name or 'Linear'!r}: mxfp8 needs the tokens of a batch "
                                   f"({tokens}) to divide by {MX_BLOCK}")
        weight = self.weight
        if self.compute_dtype is not None:
            input = input.to(self.compute_dtype)
            if self.recipe.input.granularity == "block":
                # MX blocks are scaled from the weight in the compute dtype, as torchtitan's
                # MXFP8 layers get it from FSDP's mixed precision (and the harness's torchao
                # layer takes it): an fp32 master weight rounds to bf16 first.
                weight = weight.to(self.compute_dtype)
        output = _Fp8Matmul.apply(input, weight.t(), self.recipe, self.real)
        if self.bias is not None:
            output = output + self.bias.to(output.dtype)
        return output

    def extra_repr(self) -> str:
        mode = "real" if self.real else "emulated"
        return f"{super().extra_repr()}, recipe={self.recipe.name}, {mode}"


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, recipe: Recipe) -> torch.Tensor:
    """The emulated FP8 forward of one Linear on ``x`` (no autograd): what the
    layer would output if converted (the eligibility map's what-if)."""
    with torch.no_grad():
        out = _Fp8Matmul.apply(x, weight.t(), recipe, False)
        return out + bias.to(out.dtype) if bias is not None else out


# ----------------------------------------------------------------------------- which layers
@dataclass(frozen=True)
class LayerPolicy:
    """Which Linear layers convert: by default those whose dimensions divide
    by the recipe's multiple, except the first and last Linear of the model
    (embeddings' neighbours and the classifier head are where FP8 loses
    accuracy first); ``include`` / ``exclude`` are fnmatch patterns on module
    names, and ``exclude`` wins."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    first_last: bool = False


@dataclass
class LayerPlan:
    """One Linear layer and the policy's decision for it."""

    name: str
    in_features: int
    out_features: int
    convert: bool
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def plan_layers(model: torch.nn.Module, recipe: Recipe, policy: LayerPolicy) -> list[LayerPlan]:
    """The decision for every ``nn.Linear`` in ``model`` (module order).

    Raises :class:`LayerPolicyError` naming the layer when ``include`` names a
    layer whose dimensions the recipe cannot take, or a pattern that matches
    no Linear layer (a typo would otherwise convert nothing, silently)."""
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    edges = {linears[0][0], linears[-1][0]} if linears else set()
    plans = []
    for name, mod in linears:
        divisible = mod.in_features % recipe.multiple == 0 and mod.out_features % recipe.multiple == 0
        dims = f"{mod.in_features}x{mod.out_features}"
        if _matches(name, policy.exclude):
            plan = LayerPlan(name, mod.in_features, mod.out_features, False, "excluded by the policy")
        elif _matches(name, policy.include):
            if not divisible:
                raise LayerPolicyError(
                    f"layer {name!r} ({dims}): {recipe.name} needs both dimensions to divide by "
                    f"{recipe.multiple}, and `fp8.include` names it")
            plan = LayerPlan(name, mod.in_features, mod.out_features, True, "included by the policy")
        elif not divisible:
            plan = LayerPlan(name, mod.in_features, mod.out_features, False,
                             f"{dims}: not a multiple of {recipe.multiple}")
        elif name in edges and not policy.first_last:
            plan = LayerPlan(name, mod.in_features, mod.out_features, False,
                             "first or last Linear layer (kept in high precision by default)")
        else:
            plan = LayerPlan(name, mod.in_features, mod.out_features, True, "eligible")
        plans.append(plan)
    for pattern in policy.include:
        if not any(fnmatch.fnmatchcase(n, pattern) for n, _ in linears):
            raise LayerPolicyError(f"`fp8.include` pattern {pattern!r} matches no Linear layer "
                                   f"(the model has: {', '.join(n for n, _ in linears) or 'none'})")
    return plans


def convert(model: torch.nn.Module, recipe: Recipe, policy: LayerPolicy, *, real: bool = False,
            compute_dtype: torch.dtype | None = None) -> list[LayerPlan]:
    """Swap the layers :func:`plan_layers` converts for :class:`Fp8Linear`, in
    place; returns the plan. Parameters are kept, not copied."""
    plans = plan_layers(model, recipe, policy)
    for plan in plans:
        if plan.convert:
            parent_name, _, child = plan.name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, Fp8Linear.from_linear(getattr(parent, child), recipe, real=real,
                                                         compute_dtype=compute_dtype, name=plan.name))
    return plans


def has_fp8_tensor_cores(precision: Precision) -> tuple[bool, str]:
    """Whether this process's CUDA device runs ``precision``'s matmuls in real
    FP8 through ampcert, and why (or why not)."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    cc = f"compute capability {major}.{minor}"
    if precision == "mxfp8":
        return False, f"{cc}: ampcert's mxfp8 is emulated on every device (amp: native runs torchao's MXFP8Linear)"
    if (major, minor) < (8, 9):
        return False, f"{cc}: FP8 tensor cores need 8.9 (Ada) or later"
    return True, f"{cc}: FP8 tensor cores through torch._scaled_mm"


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     dtype: torch.dtype) -> torch.Tensor:
    """The same Linear in plain ``dtype`` (bf16 for the map's relative error)."""
    with torch.no_grad(), _plain_ops(x.device.type):
        return F.linear(x.to(dtype), weight.to(dtype), bias.to(dtype) if bias is not None else None)
