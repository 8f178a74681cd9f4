"""The precisions ampcert trains in, by name, and the dtype each one means.

One table for both frameworks: a torch caller takes ``getattr(torch,
dtype_name(p))``, a JAX caller ``jnp.dtype(dtype_name(p))``. Nothing here
imports either framework, so the harness, the suite parser and ``amp.jax``
can all read it.
"""

from __future__ import annotations

from typing import Literal, get_args

Precision = Literal["fp32", "fp16", "bf16"]
# In the order suites, tables and reports list them: the reference first.
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
LOW_PRECISIONS: tuple[Precision, ...] = tuple(p for p in PRECISIONS if p != "fp32")
REFERENCE: Precision = "fp32"

# The dtype's name, the same in torch (``torch.bfloat16``), numpy/JAX
# (``jnp.bfloat16``) and in the dtype strings both frameworks print.
DTYPE_NAMES: dict[str, str] = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
SHORT_NAMES: dict[str, str] = {name: short for short, name in DTYPE_NAMES.items()}


def dtype_name(precision: str) -> str:
    """``"bfloat16"`` for ``"bf16"``: the framework-neutral name of the dtype.

    Raises ValueError naming the known precisions for anything else."""
    try:
        return DTYPE_NAMES[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}: expected one of {list(PRECISIONS)}") from None


def precision_of(dtype: object) -> Precision | None:
    """``"bf16"`` for ``torch.bfloat16``, ``jnp.bfloat16`` or ``"bfloat16"``; None for other dtypes."""
    inner = getattr(dtype, "dtype", None)  # jnp.bfloat16 is a scalar type; its .dtype is the dtype
    name = str(getattr(dtype, "name", None) or getattr(inner, "name", None) or dtype).removeprefix("torch.")
    return SHORT_NAMES.get(name)  # type: ignore[return-value]
