"""FP8 training recipes as data: which 8-bit format each operand of a Linear
layer's three matmuls is cast to, and how its scale is chosen.

A Linear layer runs three matmuls per training step::

    output      = input       @ weight.T       (forward)
    grad_input  = grad_output @ weight         (backward)
    grad_weight = grad_output.T @ input        (backward)

Each operand is cast to an 8-bit float with a *scale*: ``x * scale`` is
rounded to the format (round to nearest even) and the matmul divides it out.
A recipe names, for each of the six operand casts, the format and the
scale's granularity:

- ``tensorwise``: one scale per tensor, ``scale = max_finite / amax(|x|)``
  from the tensor itself ("current" or "dynamic" scaling); activations and
  weights in e4m3 (more mantissa), gradients in e5m2 (more range). torchao's
  ``Float8LinearRecipeName.TENSORWISE``.
- ``rowwise``: one scale per row of the operand along the contracted
  dimension, rounded down to a power of two, every operand in e4m3
  (torchao's ``ROWWISE``).
- ``rowwise_with_gw_hp``: ``rowwise`` for output and grad_input, grad_weight
  in high precision (torchao's ``ROWWISE_WITH_GW_HP``; its grad_input takes the
  weight tensorwise).
- ``mxfp8``: OCP microscaling: one power-of-two (E8M0) scale per block of 32
  consecutive values along the contracted dimension, every operand e4m3,
  scales by NVIDIA's round-up-the-ratio rule ("RCEIL"; torchao's
  ``MXFP8Linear`` default). Every dimension a block runs along must divide
  by 32, tokens included (grad_weight contracts over them).

Delayed scaling (a scale from an amax history of earlier steps, Transformer
Engine's classic recipe) is not offered: torchao dropped it, and with current
scaling no in-range value saturates, so the overflow a loss scaler watches
for cannot happen; what can go wrong is underflow and non-finite amax, which
the eligibility map and the ``fp8_health`` check count.

This module is data only (no torch import): the suite validator and the
docs read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .precision import Precision

Granularity = Literal["tensorwise", "rowwise", "block", "none"]
Format = Literal["e4m3", "e5m2", "hp"]  # "hp": not cast, the matmul runs in high precision

# Largest finite value of each format (torch.finfo(torch.float8_e4m3fn).max, ...).
MAX_FINITE = {"e4m3": 448.0, "e5m2": 57344.0}
TORCH_DTYPE = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
MX_BLOCK = 32


@dataclass(frozen=True)
class Cast:
    format: Format
    granularity: Granularity


_E4M3_T, _E5M2_T = Cast("e4m3", "tensorwise"), Cast("e5m2", "tensorwise")
_E4M3_ROW, _HP = Cast("e4m3", "rowwise"), Cast("hp", "none")
_E4M3_BLOCK = Cast("e4m3", "block")


@dataclass(frozen=True)
class Recipe:
    """The six operand casts of a Linear layer's three matmuls (torchao's names)."""

    name: str
    input: Cast
    weight: Cast
    grad_output: Cast
    weight_for_grad_input: Cast
    grad_output_for_grad_weight: Cast
    input_for_grad_weight: Cast
    round_scales_to_power_of_2: bool
    # Both of a converted layer's dimensions must divide by this: 16 is what
    # FP8 tensor cores (torch._scaled_mm) take, 32 is the MX block.
    multiple: int
    # The precision a suite names to get this recipe.
    precision: Literal["fp8", "mxfp8"]

    def casts(self) -> dict[str, Cast]:
        return {"input": self.input, "weight": self.weight, "grad_output": self.grad_output,
                "weight_for_grad_input": self.weight_for_grad_input,
                "grad_output_for_grad_weight": self.grad_output_for_grad_weight,
                "input_for_grad_weight": self.input_for_grad_weight}


RECIPES: dict[str, Recipe] = {
    "tensorwise": Recipe("tensorwise", _E4M3_T, _E4M3_T, _E5M2_T, _E4M3_T, _E5M2_T, _E4M3_T,
                         round_scales_to_power_of_2=False, multiple=16, precision="fp8"),
    "rowwise": Recipe("rowwise", _E4M3_ROW, _E4M3_ROW, _E4M3_ROW, _E4M3_ROW, _E4M3_ROW, _E4M3_ROW,
                      round_scales_to_power_of_2=True, multiple=16, precision="fp8"),
    "rowwise_with_gw_hp": Recipe("rowwise_with_gw_hp", _E4M3_ROW, _E4M3_ROW, _E4M3_ROW, _E4M3_T, _HP, _HP,
                                 round_scales_to_power_of_2=True, multiple=16, precision="fp8"),
    "mxfp8": Recipe("mxfp8", _E4M3_BLOCK, _E4M3_BLOCK, _E4M3_BLOCK, _E4M3_BLOCK, _E4M3_BLOCK, _E4M3_BLOCK,
                    round_scales_to_power_of_2=True, multiple=MX_BLOCK, precision="mxfp8"),
}


def recipe_for(precision: Precision, fp8_recipe: str = "tensorwise") -> Recipe:
    """The recipe a run of ``precision`` trains with: ``mxfp8`` has one, ``fp8``
    the suite's ``fp8.recipe``."""
    if precision == "mxfp8":
        return RECIPES["mxfp8"]
    if precision != "fp8":
        raise ValueError(f"precision {precision!r} has no FP8 recipe")
    try:
        return RECIPES[fp8_recipe]
    except KeyError:
        raise ValueError(f"unknown fp8 recipe {fp8_recipe!r}: expected one of "
                         f"{[n for n, r in RECIPES.items() if r.precision == 'fp8']}") from None
