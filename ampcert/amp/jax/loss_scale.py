"""Dynamic loss scaling for JAX, as a pytree: the torch scaler's state machine, functionally.

Why: fp16 gradients underflow; multiplying the loss by a scale ``S`` lifts
them, and dividing the gradients by ``S`` in fp32 before the update undoes
it (see :mod:`ampcert.amp.torch_scaler` for the whole story). The scale is
searched online:

- a step whose gradients hold an inf or NaN is skipped and ``S *= backoff``;
  the count of clean steps restarts;
- after ``period`` consecutive clean steps, ``S *= factor`` if the result is
  finite, and the count restarts;
- ``S`` is clamped to ``[min_loss_scale, max_loss_scale]`` after every update.

With ``min_loss_scale=0`` and ``max_loss_scale=inf`` this is
``torch.amp.GradScaler``'s ``_amp_update_scale_`` exactly, so given the same
gradients, ``DynamicLossScale`` and :class:`~ampcert.amp.DynamicLossScaler`
go through the same scales and skip the same steps (a test checks this).

Unlike ``jmp.DynamicLossScale``, whose flatten drops ``min_loss_scale`` (so
it silently becomes the default after ``jax.jit`` or ``tree_map``), every
field here survives flatten/unflatten: ``loss_scale`` and ``counter`` are the
leaves, the hyper-parameters are static pytree metadata. Nothing here syncs
with the host: whether to apply a step is a ``jnp.where`` inside ``jit``::

    loss_scale = DynamicLossScale()
    def train_step(params, opt_state, loss_scale, batch):
        grads = jax.grad(lambda p: loss_scale.scale(loss_fn(p, batch)))(params)
        grads = loss_scale.unscale(grads)
        finite = all_finite(grads)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        params, opt_state = select_tree(finite, (new_params, new_opt_state), (params, opt_state))
        return params, opt_state, loss_scale.adjust(finite)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DynamicLossScale", "all_finite", "select_tree"]


@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
    """Loss-scale state. ``loss_scale`` (float32) and ``counter`` (int32,
    clean steps since the last change) are arrays; the rest is configuration.

    Defaults are torch's GradScaler's (``2**16``, x2 every 2000 clean steps,
    x0.5 on overflow) with ampcert's bounds ``[1, 2**24]``.
    """

    loss_scale: jax.Array = dataclasses.field(default_factory=lambda: jnp.asarray(2.0**16, jnp.float32))
    counter: jax.Array = dataclasses.field(default_factory=lambda: jnp.zeros((), jnp.int32))
    period: int = dataclasses.field(default=2000, metadata={"static": True})
    factor: float = dataclasses.field(default=2.0, metadata={"static": True})
    backoff: float = dataclasses.field(default=0.5, metadata={"static": True})
    min_loss_scale: float = dataclasses.field(default=1.0, metadata={"static": True})
    max_loss_scale: float = dataclasses.field(default=2.0**24, metadata={"static": True})

    def __post_init__(self) -> None:
        if not isinstance(self.period, (int, np.integer)) or self.period < 1:
            raise ValueError(f"period must be a positive integer, got {self.period!r}")
        if not self.factor > 1.0:
            raise ValueError(f"factor must be > 1, got {self.factor}")
        if not 0.0 < self.backoff < 1.0:
            raise ValueError(f"backoff must be in (0, 1), got {self.backoff}")
        if not self.min_loss_scale >= 0.0:
            raise ValueError(f"min_loss_scale must be >= 0, got {self.min_loss_scale}")
        if not self.max_loss_scale >= self.min_loss_scale:
            raise ValueError(f"max_loss_scale ({self.max_loss_scale}) must be >= "
                             f"min_loss_scale ({self.min_loss_scale})")

    @classmethod
    def create(cls, initial: float = 2.0**16, **config: Any) -> DynamicLossScale:
        """A fresh state with scale ``initial`` (clamped into the bounds)."""
        lo, hi = config.get("min_loss_scale", 1.0), config.get("max_loss_scale", 2.0**24)
        start = min(max(float(initial), lo), hi)
        return cls(loss_scale=jnp.asarray(start, jnp.float32), counter=jnp.zeros((), jnp.int32), **config)

    # -- applying the scale -------------------------------------------------------
    def scale(self, tree: Any) -> Any:
        """``tree * loss_scale`` (each leaf keeps its dtype): apply to the loss."""
        return jax.tree_util.tree_map(lambda x: x * self.loss_scale.astype(x.dtype), tree)

    def unscale(self, tree: Any) -> Any:
        """``tree / loss_scale``, computed in float32 (a 16-bit reciprocal of a
        large scale would underflow) and returned in each leaf's dtype."""
        inv = 1.0 / self.loss_scale

        def one(g):
            return (g.astype(jnp.float32) * inv).astype(g.dtype)

        return jax.tree_util.tree_map(one, tree)

    # -- the state machine --------------------------------------------------------
    def adjust(self, grads_finite: jax.Array) -> DynamicLossScale:
        """The state after a step whose unscaled gradients were (or were not)
        all finite. Pure and jit-friendly: no Python branching on values."""
        grads_finite = jnp.asarray(grads_finite, jnp.bool_)
        scale, counter = self.loss_scale, self.counter
        clean = counter + 1
        at_period = clean >= self.period
        grown = scale * jnp.float32(self.factor)
        grown = jnp.where(jnp.isfinite(grown), grown, scale)
        new_scale = jnp.where(grads_finite, jnp.where(at_period, grown, scale), scale * jnp.float32(self.backoff))
        new_counter = jnp.where(grads_finite & ~at_period, clean, 0).astype(jnp.int32)
        hi = jnp.float32(self.max_loss_scale) if math.isfinite(self.max_loss_scale) else jnp.float32(np.inf)
        new_scale = jnp.clip(new_scale, jnp.float32(self.min_loss_scale), hi).astype(jnp.float32)
        return dataclasses.replace(self, loss_scale=new_scale, counter=new_counter)


jax.tree_util.register_dataclass(DynamicLossScale)


def all_finite(tree: Any) -> jax.Array:
    """True when no leaf of ``tree`` holds an inf or NaN (a device scalar)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]
    if not leaves:
        return jnp.asarray(True)
    return jnp.stack(leaves).all()


def select_tree(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
    """Leaf-wise ``pred ? on_true : on_false`` for two trees of one structure:
    how a non-finite step is skipped inside ``jit`` without a host round-trip."""
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)
