"""The jaxpr primitives a JAX policy may name, and how the rewriter groups them.

Names come from :mod:`jax.extend.core.primitives` (JAX's public list of its
primitives), so a policy naming a primitive this JAX does not have fails to
load with one line instead of silently doing nothing.
"""

from __future__ import annotations

import functools

# Primitives whose floating inputs must share one dtype (lax raises otherwise).
# When autocast has changed one input's dtype (a bf16 matmul output meeting an
# fp32 bias), the rewriter casts them to the widest of the strongly-typed ones.
SAME_DTYPE = frozenset({
    "add", "add_any", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "nextafter",
    "eq", "ne", "lt", "le", "gt", "ge", "select_n", "clamp", "concatenate", "pad",
    "dynamic_update_slice", "complex", "igamma", "igammac", "igamma_grad_a", "polygamma",
    "zeta", "regularized_incomplete_beta", "random_gamma_grad", "triangular_solve",
    "scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter-min",
    "scatter_min", "scatter-max", "scatter_max", "select_and_scatter_add",
})

#: Region kinds, as reported by the rewriter and the audit. Which primitive
#: is which kind on which JAX release is in :data:`.compat.REGIONS`.
REGION_KINDS = ("jit", "scan", "while", "cond", "custom_jvp", "custom_vjp", "remat")


@functools.cache
def known_primitive_names() -> frozenset[str]:
    """Every primitive name the installed JAX exposes publicly."""
    from jax.extend.core import Primitive
    from jax.extend.core import primitives as prims

    return frozenset(v.name for v in vars(prims).values() if isinstance(v, Primitive))
