"""The per-layer FP8 eligibility map: which Linear layers are safe in FP8.

:class:`EligibilityRecorder` hooks every ``nn.Linear`` of a model (converted
to :class:`~ampcert.amp.torch.fp8.Fp8Linear` or not). On the steps it is told
to record, for each layer it takes, per operand (input, weight and the
gradient of the output, as the recipe casts them for the forward and the
grad_input matmuls):

- **amax**: max |x|, the number the scale is made from (a history, one value
  per recorded step);
- **underflow**: the fraction of non-zero values that the cast flushes to
  zero (below the format's smallest subnormal after scaling);
- **saturation**: the fraction clamped to the format's largest value (zero
  under current scaling unless a scale was rounded; MX blocks can);

and the **relative error** of the layer's output against bf16 on the same
input, ``||y_fp8 - y_bf16|| / ||y_bf16||``: the converted layer's real output,
or for a layer the policy keeps in high precision, the emulated FP8 output
it would have (a what-if, so the map also says whether excluded layers could
convert). On every step it counts, for converted layers, the steps where an
operand held inf or NaN (its amax is not finite: the FP8 cast gives NaN).

:func:`verdict` turns a layer's figures into ``safe`` / ``review`` /
``unsafe`` with the reason; the thresholds are this module's constants,
documented in docs/policies.md. Recording costs one extra bf16 and one
emulated FP8 matmul per layer per recorded step, nothing on other steps but
the non-finite count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .fp8_recipes import MAX_FINITE, MX_BLOCK, Cast, Recipe
from .torch.fp8 import (
    Fp8Linear,
    LayerPlan,
    _plain_ops,
    fp8_linear,
    linear_reference,
    mx_quantize,
    quantize,
)

# A layer is `safe` when its output stays this close to bf16's and its casts
# flush at most this fraction of values to zero; `unsafe` beyond the second
# pair. e4m3's 3 mantissa bits give a per-value rounding error of up to 2^-4
# (~3.6% RMS for smooth data); a matmul output of well-scaled operands lands
# near 3-5% (measured on the shipped workloads: docs/policies.md), so 10%
# means outliers or underflow are eating precision and 25% that the layer
# computes something else.
SAFE_REL_ERROR, UNSAFE_REL_ERROR = 0.10, 0.25
SAFE_UNDERFLOW, UNSAFE_UNDERFLOW = 0.01, 0.10
ROLES = ("input", "weight", "grad_output")


@dataclass
class LayerRecord:
    name: str
    in_features: int
    out_features: int
    converted: bool
    reason: str
    steps: list[int] = field(default_factory=list)
    amax: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROLES})
    underflow: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROLES})
    saturation: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROLES})
    rel_error_vs_bf16: list[float] = field(default_factory=list)
    # Steps (converted layers) with a non-finite amax, counted on the device.
    nonfinite: torch.Tensor | None = None

    def as_dict(self) -> dict[str, Any]:
        worst, sat = _worst(self.underflow), _worst(self.saturation)
        rel = max(self.rel_error_vs_bf16) if self.rel_error_vs_bf16 else None
        nonfinite = int(self.nonfinite.item()) if self.nonfinite is not None else None
        status, why = verdict(rel, worst, nonfinite)
        return {"name": self.name, "in_features": self.in_features, "out_features": self.out_features,
                "converted": self.converted, "reason": self.reason, "recorded_steps": list(self.steps),
                "amax": self.amax, "underflow": worst, "saturation": sat,
                "rel_error_vs_bf16": rel, "rel_error_history": list(self.rel_error_vs_bf16),
                "nonfinite_steps": nonfinite, "verdict": status, "why": why}


def _worst(history: dict[str, list[float]]) -> dict[str, float | None]:
    """The largest recorded value per operand (None: never measurable)."""
    return {r: max((v for v in vs if not math.isnan(v)), default=None) for r, vs in history.items()}


def verdict(rel_error: float | None, underflow: dict[str, float | None],
            nonfinite: int | None) -> tuple[str, str]:
    """``safe`` / ``review`` / ``unsafe`` and the reason, from a layer's worst figures."""
    if rel_error is None:
        return "unmeasured", "no recorded step reached this layer"
    worst_role, worst = max(((r, u) for r, u in underflow.items() if u is not None),
                            key=lambda ru: ru[1], default=("", 0.0))
    if nonfinite:
        return "unsafe", f"an operand held inf/NaN in {nonfinite} step(s)"
    if not math.isfinite(rel_error) or rel_error > UNSAFE_REL_ERROR:
        return "unsafe", f"output {rel_error:.3g} from bf16's (> {UNSAFE_REL_ERROR})"
    if worst > UNSAFE_UNDERFLOW:
        return "unsafe", f"{worst:.1%} of {worst_role} values flush to zero (> {UNSAFE_UNDERFLOW:.0%})"
    if rel_error > SAFE_REL_ERROR:
        return "review", f"output {rel_error:.3g} from bf16's (> {SAFE_REL_ERROR})"
    if worst > SAFE_UNDERFLOW:
        return "review", f"{worst:.1%} of {worst_role} values flush to zero (> {SAFE_UNDERFLOW:.0%})"
    return "safe", f"output {rel_error:.3g} from bf16's; underflow <= {worst:.2%}"


@torch.no_grad()
def cast_stats(x: torch.Tensor, cast: Cast, dim: int | None, recipe: Recipe) -> tuple[float, float, float]:
    """(amax, underflow fraction, saturation fraction) of casting ``x`` per ``cast``."""
    x2 = x.reshape(-1, x.shape[-1])
    amax = float(x2.abs().max()) if x2.numel() else 0.0
    if cast.format == "hp" or x2.numel() == 0:
        return amax, 0.0, 0.0
    if not _castable(x2, cast):
        return amax, math.nan, math.nan
    if cast.granularity == "block":
        q = mx_quantize(x2.contiguous())
        blocks = x2.float().reshape(x2.shape[0], -1, MX_BLOCK)
        scaled = blocks / q.scale.unsqueeze(-1)
        data = q.data.reshape(blocks.shape)
        src = blocks
    else:
        q = quantize(x2, cast, dim if cast.granularity == "rowwise" else None, recipe.round_scales_to_power_of_2)
        scaled, data, src = x2.float() * q.scale, q.data, x2
    nonzero = src != 0
    count = max(int(nonzero.sum()), 1)
    underflow = float((nonzero & (data.float() == 0)).sum()) / count
    saturation = float((scaled.abs() > MAX_FINITE[cast.format]).sum()) / x2.numel()
    return amax, underflow, saturation


class EligibilityRecorder:
    """Hooks every Linear layer of ``model``; :meth:`record` turns recording on
    for the next step; :meth:`layers` gives the map."""

    def __init__(self, model: torch.nn.Module, recipe: Recipe, plans: list[LayerPlan],
                 reference: torch.dtype = torch.bfloat16):
        self.recipe, self.reference = recipe, reference
        self.recording = False
        self.step = 0
        by_name = {p.name: p for p in plans}
        self._records: dict[str, LayerRecord] = {}
        self._handles: list[Any] = []
        for name, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear):
                continue
            plan = by_name.get(name)
            converted = isinstance(mod, Fp8Linear) or (plan is not None and plan.convert)
            rec = LayerRecord(name, mod.in_features, mod.out_features, converted,
                              plan.reason if plan else "")
            if converted:
                rec.nonfinite = torch.zeros((), dtype=torch.int64, device=mod.weight.device)
            self._records[name] = rec
            self._handles.append(mod.register_forward_hook(self._hook(rec)))

    def record(self, step: int, on: bool = True) -> None:
        self.step, self.recording = step, on

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def layers(self) -> list[dict[str, Any]]:
        return [rec.as_dict() for rec in self._records.values()]

    def _hook(self, rec: LayerRecord):
        def forward_hook(mod: torch.nn.Linear, inputs: tuple, output: torch.Tensor) -> None:
            x = inputs[0]
            if rec.nonfinite is not None and torch.is_grad_enabled():  # training steps only
                with _plain_ops(x.device.type):
                    bad = ~(torch.isfinite(x).all() & torch.isfinite(mod.weight).all())
                    rec.nonfinite += bad
                    if output.requires_grad:
                        output.register_hook(lambda g: _count_nonfinite(rec, g))
            if not self.recording or not torch.is_grad_enabled():
                return
            with _plain_ops(x.device.type):
                self._forward_stats(rec, mod, x, output)
            if output.requires_grad:
                output.register_hook(lambda g: self._grad_stats(rec, g))

        return forward_hook

    def _forward_stats(self, rec: LayerRecord, mod: torch.nn.Linear, x: torch.Tensor, output: torch.Tensor) -> None:
        recipe = self.recipe
        compute = getattr(mod, "compute_dtype", None)
        x = x.to(compute) if compute is not None else x
        rec.steps.append(self.step)
        for role, tensor, cast, dim in (("input", x, recipe.input, -1), ("weight", mod.weight, recipe.weight, -1)):
            amax, under, sat = cast_stats(tensor.detach(), cast, dim, recipe)
            rec.amax[role].append(amax)
            rec.underflow[role].append(under)
            rec.saturation[role].append(sat)
        ref = linear_reference(x.detach(), mod.weight.detach(), _bias(mod), self.reference).float()
        if rec.converted:
            y = output.detach().float()
        elif _castable(x, recipe.input):
            y = fp8_linear(x.detach(), mod.weight.detach(), _bias(mod), recipe).float()
        else:  # an MX what-if needs whole blocks along in_features
            return
        denom = float(torch.linalg.vector_norm(ref))
        rel = float(torch.linalg.vector_norm(y - ref)) / denom if denom > 0 else 0.0
        rec.rel_error_vs_bf16.append(rel)

    def _grad_stats(self, rec: LayerRecord, g: torch.Tensor) -> None:
        with _plain_ops(g.device.type):
            amax, under, sat = cast_stats(g.detach(), self.recipe.grad_output, -1, self.recipe)
        rec.amax["grad_output"].append(amax)
        rec.underflow["grad_output"].append(under)
        rec.saturation["grad_output"].append(sat)


def _count_nonfinite(rec: LayerRecord, g: torch.Tensor) -> None:
    """A tensor hook: count the step when the gradient reaching the layer holds inf/NaN."""
    assert rec.nonfinite is not None
    with torch._C.DisableTorchFunction():
        rec.nonfinite.add_(~torch.isfinite(g).all())


def _castable(x: torch.Tensor, cast: Cast) -> bool:
    """Whether ``x``'s last dimension fills whole MX blocks (scaled casts take any)."""
    return cast.granularity != "block" or x.shape[-1] % MX_BLOCK == 0


def _bias(mod: torch.nn.Linear) -> torch.Tensor | None:
    return mod.bias.detach() if mod.bias is not None else None
