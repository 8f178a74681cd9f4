"""ampcert's AMP engine for JAX, usable without the harness (like jmp).

    from ampcert.amp.jax import autocast, DynamicLossScale, all_finite, select_tree

    loss_fp16 = autocast(loss_fn, dtype=jnp.float16)      # policy: configs/policies/jax.yaml
    scale = DynamicLossScale()
    grads = jax.grad(lambda p: scale.scale(loss_fp16(p, batch)))(params)
    grads = scale.unscale(grads)
    finite = all_finite(grads)
    ...
    scale = scale.adjust(finite)

- :func:`autocast` traces a function to a jaxpr and re-evaluates it with a
  per-primitive dtype from a policy file, recursing into jit, scan, while,
  cond, custom_jvp, custom_vjp and remat regions.
- :class:`DynamicLossScale` is the torch scaler's state machine as a pytree
  that keeps all its fields through jit and tree_map.

Nothing in this package imports the rest of ampcert (only ampcert.amp.policy and
ampcert.amp.precision), nor torch.
"""

from ampcert.amp.jax.autocast import (
           AutocastFunction,
           RewriteReport,
           autocast,
           iter_eqns,
           jax_policy,
)
from ampcert.amp.jax.loss_scale import DynamicLossScale, all_finite, select_tree

__all__ = ["AutocastFunction", "DynamicLossScale", "RewriteReport", "all_finite", "autocast",
           "iter_eqns", "jax_policy", "select_tree"]
