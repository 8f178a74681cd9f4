"""The precision a JAX run actually computes in, read from its training
step's jaxpr, for MLPerf's ``lowest_numerical_precision_in_*`` disclosure
(the torch backend measures the same in :mod:`.torch_precision`).

The jaxpr of the whole step (forward, backward, optimizer update) after the
autocast rewrite is what XLA compiles, so its operand dtypes are what the
step computes in: no guess from the run's precision. Recorded:

- linear: the lowest floating operand dtype of ``dot_general`` and
  ``conv_general_dilated``, anywhere in the step (nested jaxprs included);
- attn: the lowest operand dtype of any equation whose name stack holds
  ``attention`` (the built-in GPT wraps its attention in
  ``jax.named_scope("attention")``; JAX carries the name through autodiff, so
  the backward equations hold it too);
- comm: ``fp32``: a JAX run is one process, no gradient collective runs.

An fp32 product on a GPU with JAX's default matmul precision runs as TF32,
and is recorded as ``tf32``. A model without attention equations logs the
linear value with ``observed: false`` (see :mod:`.torch_precision`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

_NAMES = {jnp.dtype("float64"): "fp64", jnp.dtype("float32"): "fp32", jnp.dtype("bfloat16"): "bfloat16",
          jnp.dtype("float16"): "fp16"}
_BITS = {"fp64": 64, "fp32": 32, "tf32": 19, "bfloat16": 16, "fp16": 16}
_LINEAR = ("dot_general", "conv_general_dilated")


def _lower(a: str | None, b: str | None) -> str | None:
    if a is None or (b is not None and _BITS[b] < _BITS[a]):
        return b
    return a


def _sub_jaxprs(eqn: Any) -> list[Any]:
    out = []
    for value in eqn.params.values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                out.append(item.jaxpr)
            elif isinstance(item, jax.extend.core.Jaxpr):
                out.append(item)
    return out


def _tf32(eqn: Any) -> bool:
    """Whether an fp32 product runs as TF32 on a GPU: JAX's default precision does."""
    precision = eqn.params.get("precision")
    if precision is not None and any(p is not None and "HIGHEST" in str(p) for p in
                                     (precision if isinstance(precision, tuple) else (precision,))):
        return False
    return str(jax.config.jax_default_matmul_precision or "default").lower() not in ("highest", "float32")


def observe(step_fn: Any, args: tuple, device: str) -> dict[str, dict[str, Any]]:
    """Trace ``step_fn(*args)`` (no compile, no run) and return the disclosure
    ({"linear"|"attn"|"comm": {"value": ..., metadata...}})."""
    closed = jax.make_jaxpr(step_fn)(*args)
    found: dict[str, str | None] = {"linear": None, "attn": None}
    ops: dict[str, set[str]] = {"linear": set(), "attn": set()}

    def walk(jaxpr: Any, in_attention: bool) -> None:
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            attention = in_attention or "attention" in str(getattr(eqn.source_info, "name_stack", ""))
            lowest = None
            for var in eqn.invars:
                dtype = getattr(getattr(var, "aval", None), "dtype", None)
                if dtype in _NAMES:
                    lowest = _lower(lowest, _NAMES[dtype])
            if lowest == "fp32" and name in _LINEAR and device == "cuda" and _tf32(eqn):
                lowest = "tf32"
            if lowest is not None:
                if name in _LINEAR:
                    found["linear"] = _lower(found["linear"], lowest)
                    ops["linear"].add(name)
                if attention:
                    found["attn"] = _lower(found["attn"], lowest)
                    ops["attn"].add(name)
            for sub in _sub_jaxprs(eqn):
                walk(sub, attention)

    walk(closed.jaxpr, False)
    out: dict[str, dict[str, Any]] = {}
    out["linear"] = ({"value": found["linear"], "observed": True, "ops": sorted(ops["linear"])} if found["linear"]
                     else {"value": "fp32", "observed": False, "reason": "no linear or convolution ops"})
    out["attn"] = ({"value": found["attn"], "observed": True, "ops": sorted(ops["attn"])} if found["attn"]
                   else {"value": out["linear"]["value"], "observed": False, "reason": "no attention ops"})
    out["comm"] = {"value": "fp32", "observed": True, "what": "one process: no gradient collective"}
    return out
