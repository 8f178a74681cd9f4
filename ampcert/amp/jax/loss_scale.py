"""Dynamic loss scaling for JAX, as a pytree: the torch scaler's state machine, functionally.

Why: fp16 gradients underflow; multiplying the loss by a scale ``S`` lifts
them, and dividing the gradients by ``S`` in fp32 before the update undoes
it (see :mod:`ampcert.amp.torch.scaler` for the whole story). The scale is
searched online:

- a step whose gradients hold an inf or NaN is skipped and
  ``S *= backoff_factor``; the count of clean steps restarts;
- after ``growth_interval`` consecutive clean steps, ``S *= growth_factor``
  if the result is finite, and the count restarts;
- ``S`` is clamped to ``[min_scale, max_scale]`` after every update.

The knobs have the names of :class:`~ampcert.amp.DynamicLossScaler`'s (which
are ``torch.amp.GradScaler``'s, plus the bounds): ``init_scale``,
``growth_factor``, ``backoff_factor``, ``growth_interval``, ``min_scale``,
``max_scale``. The ``jmp``-style names this class had before (``period``,
``factor``, ``backoff``, ``min_loss_scale``, ``max_loss_scale``, and
``create(initial=...)``) are still accepted, with a ``DeprecationWarning``
naming the new one.

With ``min_scale=0`` and ``max_scale=inf`` this is
``torch.amp.GradScaler``'s ``_amp_update_scale_`` exactly, so given the same
gradients, ``DynamicLossScale`` and :class:`~ampcert.amp.DynamicLossScaler`
go through the same scales and skip the same steps (a test checks this).

Unlike ``jmp.DynamicLossScale``, whose flatten drops ``min_loss_scale`` (so
it silently becomes the default after ``jax.jit`` or ``tree_map``), every
field here survives flatten/unflatten: ``loss_scale`` (the current scale) and
``counter`` (clean steps since the last change) are the leaves, the knobs are
static pytree metadata. Nothing here syncs with the host: whether to apply a
step is a ``jnp.where`` inside ``jit``::

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
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["RENAMED", "DynamicLossScale", "all_finite", "select_tree"]


#: Old (jmp-style) knob name -> the torch scaler's name it now has.
RENAMED: dict[str, str] = {
    "period": "growth_interval",
    "factor": "growth_factor",
    "backoff": "backoff_factor",
    "min_loss_scale": "min_scale",
    "max_loss_scale": "max_scale",
}

_STATIC = {"static": True}


class _Fresh:
    """The default of a state field: a fresh state (``None`` is kept as given, like any
    value a pytree is rebuilt with)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}>"


_FRESH_SCALE, _FRESH_COUNTER = _Fresh("init_scale"), _Fresh("0")


def _renamed(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(f"DynamicLossScale: {old!r} is deprecated, use {new!r} (the torch DynamicLossScaler's "
                  "name for the same knob)", DeprecationWarning, stacklevel=stacklevel + 1)


def _new_names(config: dict[str, Any], stacklevel: int) -> dict[str, Any]:
    """``config`` with the old knob names replaced by the new ones (warning once per old name)."""
    out = dict(config)
    for old, new in RENAMED.items():
        if old in out:
            if new in out:
                raise TypeError(f"DynamicLossScale: got both {old!r} and its new name {new!r}: pass only {new!r}")
            _renamed(old, new, stacklevel + 1)
            out[new] = out.pop(old)
    return out


@dataclasses.dataclass(frozen=True, init=False)
class DynamicLossScale:
    """Loss-scale state. ``loss_scale`` (float32, the current scale) and
    ``counter`` (int32, clean steps since the last change) are arrays; the
    rest is configuration, named as in :class:`~ampcert.amp.DynamicLossScaler`.

    Defaults are torch's GradScaler's (``init_scale=2**16``, x2 every 2000
    clean steps, x0.5 on overflow) with ampcert's bounds ``[1, 2**24]``.

    Args:
        loss_scale: the current scale (an array); default: ``init_scale``.
        counter: clean steps since the last change (an array); default 0.
        growth_interval: clean steps needed before the scale grows.
        growth_factor: multiplier (``> 1``) applied after ``growth_interval``
            clean steps.
        backoff_factor: multiplier (in ``(0, 1)``) applied on every
            overflowing step.
        min_scale: floor of the scale (``>= 0``).
        max_scale: ceiling of the scale (``>= min_scale``).
        init_scale: the first scale, clamped into ``[min_scale, max_scale]``
            (like the torch scaler's); only without ``loss_scale``.
    """

    loss_scale: jax.Array
    counter: jax.Array
    growth_interval: int = dataclasses.field(default=2000, metadata=_STATIC)
    growth_factor: float = dataclasses.field(default=2.0, metadata=_STATIC)
    backoff_factor: float = dataclasses.field(default=0.5, metadata=_STATIC)
    min_scale: float = dataclasses.field(default=1.0, metadata=_STATIC)
    max_scale: float = dataclasses.field(default=2.0**24, metadata=_STATIC)

    def __init__(
        self,
        loss_scale: Any = _FRESH_SCALE,
        counter: Any = _FRESH_COUNTER,
        growth_interval: int = 2000,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
        *,
        init_scale: float | None = None,
        **deprecated: Any,
    ) -> None:
        # Positional order is the old one (loss_scale, counter, period, factor, backoff,
        # min_loss_scale, max_loss_scale), under the new names.
        if deprecated:
            unknown = sorted(set(deprecated) - set(RENAMED))
            if unknown:
                raise TypeError(f"DynamicLossScale() got an unexpected keyword argument {unknown[0]!r}")
            knobs: dict[str, Any] = {"growth_interval": growth_interval, "growth_factor": growth_factor,
                                     "backoff_factor": backoff_factor, "min_scale": min_scale, "max_scale": max_scale}
            for old, value in deprecated.items():
                new = RENAMED[old]
                if knobs[new] != _DEFAULTS[new]:  # the new name was given too
                    raise TypeError(f"DynamicLossScale: got both {old!r} and its new name {new!r}: pass only {new!r}")
                _renamed(old, new, 2)
                knobs[new] = value
            growth_interval, growth_factor = knobs["growth_interval"], knobs["growth_factor"]
            backoff_factor, min_scale, max_scale = knobs["backoff_factor"], knobs["min_scale"], knobs["max_scale"]
        if not isinstance(growth_interval, (int, np.integer)) or growth_interval < 1:
            raise ValueError(f"growth_interval must be a positive integer, got {growth_interval!r}")
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if not min_scale >= 0.0:
            raise ValueError(f"min_scale must be >= 0, got {min_scale}")
        if not max_scale >= min_scale:
            raise ValueError(f"max_scale ({max_scale}) must be >= min_scale ({min_scale})")
        if loss_scale is _FRESH_SCALE:
            start = 2.0**16 if init_scale is None else float(init_scale)
            loss_scale = jnp.asarray(min(max(start, min_scale), max_scale), jnp.float32)
        elif init_scale is not None:
            raise TypeError("DynamicLossScale: got both loss_scale (the current scale) and init_scale: pass one")
        if counter is _FRESH_COUNTER:
            counter = jnp.zeros((), jnp.int32)
        for name, value in (("loss_scale", loss_scale), ("counter", counter),
                            ("growth_interval", growth_interval), ("growth_factor", growth_factor),
                            ("backoff_factor", backoff_factor), ("min_scale", min_scale),
                            ("max_scale", max_scale)):
            object.__setattr__(self, name, value)

    @classmethod
    def create(cls, init_scale: float = 2.0**16, **config: Any) -> DynamicLossScale:
        """A fresh state with scale ``init_scale`` (clamped into the bounds);
        ``config`` holds the other knobs."""
        if "initial" in config:
            if init_scale != 2.0**16:
                raise TypeError("DynamicLossScale.create: got both 'initial' and its new name 'init_scale': "
                                "pass only 'init_scale'")
            _renamed("initial", "init_scale", 2)
            init_scale = config.pop("initial")
        return cls(init_scale=init_scale, **_new_names(config, 2))

    # -- the old (jmp-style) names, read-only ---------------------------------------
    @property
    def period(self) -> int:
        """Deprecated: :attr:`growth_interval`."""
        _renamed("period", "growth_interval", 2)
        return self.growth_interval

    @property
    def factor(self) -> float:
        """Deprecated: :attr:`growth_factor`."""
        _renamed("factor", "growth_factor", 2)
        return self.growth_factor

    @property
    def backoff(self) -> float:
        """Deprecated: :attr:`backoff_factor`."""
        _renamed("backoff", "backoff_factor", 2)
        return self.backoff_factor

    @property
    def min_loss_scale(self) -> float:
        """Deprecated: :attr:`min_scale`."""
        _renamed("min_loss_scale", "min_scale", 2)
        return self.min_scale

    @property
    def max_loss_scale(self) -> float:
        """Deprecated: :attr:`max_scale`."""
        _renamed("max_loss_scale", "max_scale", 2)
        return self.max_scale

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
        at_interval = clean >= self.growth_interval
        grown = scale * jnp.float32(self.growth_factor)
        grown = jnp.where(jnp.isfinite(grown), grown, scale)
        new_scale = jnp.where(grads_finite, jnp.where(at_interval, grown, scale),
                              scale * jnp.float32(self.backoff_factor))
        new_counter = jnp.where(grads_finite & ~at_interval, clean, 0).astype(jnp.int32)
        hi = jnp.float32(self.max_scale) if math.isfinite(self.max_scale) else jnp.float32(np.inf)
        new_scale = jnp.clip(new_scale, jnp.float32(self.min_scale), hi).astype(jnp.float32)
        return dataclasses.replace(self, loss_scale=new_scale, counter=new_counter)


jax.tree_util.register_dataclass(DynamicLossScale)

#: The knobs' defaults (the torch scaler's), by their names.
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(DynamicLossScale)
                             if f.default is not dataclasses.MISSING}


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
