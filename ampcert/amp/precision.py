"""The precisions ampcert trains in, by name, and the dtype each one means.

One table for both frameworks: a torch caller takes ``getattr(torch,
dtype_name(p))``, a JAX caller ``jnp.dtype(dtype_name(p))``. Nothing here
imports either framework, so the harness, the suite parser and ``amp.jax``
can all read it.
"""

from __future__ import annotations

from typing import Literal, get_args

from ampcert.amp.recipes import RECIPES

# The precision recipes (amp/recipes.py) are precisions too, each named once there: a test
# holds this list equal to RECIPES.
Precision = Literal["fp32", "fp16", "bf16", "fp8", "mxfp8",
                    "bf16-true", "bf16-true-sr", "bf16-state", "bf16-adamw8bit", "bf16-reduce",
                    "bf16-fsdp", "bf16-fsdp-reduce"]
# In the order suites, tables and reports list them: the reference first.
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
REFERENCE: Precision = "fp32"
# The autocast precisions: one dtype for every op a policy lowers. A suite
# that names no precisions runs these (FP8 is asked for by name).
AUTOCAST_PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "bf16")
LOW_PRECISIONS: tuple[Precision, ...] = ("fp16", "bf16")
# FP8 precisions are not one dtype: eligible Linear layers multiply in 8-bit
# floats with scales (amp/torch/fp8.py), everything else runs bf16 autocast.
FP8_PRECISIONS: tuple[Precision, ...] = ("fp8", "mxfp8")
FP8_BASE: Precision = "bf16"
# The recipes: a low precision's weights, optimizer state or reduction chosen apart.
RECIPE_PRECISIONS: tuple[Precision, ...] = tuple(p for p in PRECISIONS if p in RECIPES)

# The dtype's name, the same in torch (``torch.bfloat16``), numpy/JAX
# (``jnp.bfloat16``) and in the dtype strings both frameworks print.
DTYPE_NAMES: dict[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
SHORT_NAMES: dict[str, str] = {name: short for short, name in DTYPE_NAMES.items()}


def dtype_name(precision: str) -> str:
    """``"bfloat16"`` for ``"bf16"``: the framework-neutral name of the dtype.

    Raises ValueError naming the known precisions for anything else (the FP8
    precisions included: ask :func:`autocast_precision` for their autocast dtype)."""
    try:
        return DTYPE_NAMES[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}: expected one of {list(DTYPE_NAMES)}") from None


def autocast_precision(precision: str) -> str:
    """The precision autocast runs in for ``precision``: itself, or bf16 for the
    FP8 precisions (their non-FP8 ops run in bf16, as torchao and Transformer
    Engine recipes do); for a recipe, its base where it runs autocast, else fp32
    (a true recipe runs no autocast: its model is in the low precision itself)."""
    if precision in FP8_PRECISIONS:
        return FP8_BASE
    recipe = RECIPES.get(precision)
    if recipe is not None:
        return recipe.base if recipe.autocast else REFERENCE
    return precision


def base_precision(precision: str) -> str:
    """The plain precision ``precision`` is built on: a recipe's base (bf16 for bf16-true),
    else itself. The device's capability, and a rule that names it, are the base's."""
    recipe = RECIPES.get(precision)
    return recipe.base if recipe is not None else precision


def precision_of(dtype: object) -> Precision | None:
    """``"bf16"`` for ``torch.bfloat16``, ``jnp.bfloat16`` or ``"bfloat16"``; None for other dtypes."""
    inner = getattr(dtype, "dtype", None)  # jnp.bfloat16 is a scalar type; its .dtype is the dtype
    name = str(getattr(dtype, "name", None) or getattr(inner, "name", None) or dtype).removeprefix("torch.")
    return SHORT_NAMES.get(name)  # type: ignore[return-value]
