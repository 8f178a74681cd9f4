"""Loss scaling in the JAX training loop: the state that goes through the
jitted step, and the host's record of it.

A run holds one of two objects, both with the loop's bookkeeping
(:class:`~ampcert.backends.loop.NoLossScaling`): ``state`` is the pytree the
jitted step takes and returns, ``guard(state, grads, new, old)`` (called
inside the step) decides what the step keeps, and ``observe`` records each
step's outcome on the host. Without loss scaling the state is
:class:`NoLossScale`, a pytree without leaves whose methods return their
input, so the step computes exactly what it would without it.

Imports JAX: :mod:`ampcert.backends.jax_backend` imports this module only
once it has configured XLA.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ampcert.amp.jax import DynamicLossScale, all_finite, select_tree
from ampcert.amp.precision import Precision
from ampcert.backends import loop


@dataclasses.dataclass(frozen=True)
class NoLossScale:
    """:class:`~ampcert.amp.jax.DynamicLossScale`'s interface for a run that
    does not scale its loss: ``scale`` and ``unscale`` return their input,
    ``adjust`` returns the state unchanged."""

    def scale(self, tree: Any) -> Any:
        return tree

    def unscale(self, tree: Any) -> Any:
        return tree

    def adjust(self, grads_finite: Any) -> NoLossScale:
        return self


jax.tree_util.register_dataclass(NoLossScale)


class NoScaling(loop.NoLossScaling):
    """A JAX run without loss scaling: every step is applied as computed."""

    def __init__(self) -> None:
        self.state: Any = NoLossScale()

    @staticmethod
    def guard(state: Any, grads: Any, new: Any, old: Any) -> tuple[Any, Any, Any]:
        """(what the step keeps, the next state, whether the gradients were
        finite): here ``new`` and the unchanged state, and no finiteness
        check (None), so the step adds no operation."""
        return new, state, None

    def observe(self, state: Any, grads_finite: Any, step: int) -> None:
        self.state = state


class DynamicScaling(loop.DynamicLossScaling):
    """A JAX run with :class:`~ampcert.amp.jax.DynamicLossScale`: a step with
    non-finite gradients is skipped inside the jitted step (``select_tree``,
    no host round trip) and the scale backs off. The scales and the skip
    flags stay on the device until :meth:`trajectory` reads them."""

    def __init__(self) -> None:
        self.state: Any = DynamicLossScale()
        self._pending: list[tuple[Any, Any, int]] = []
        self._scales: list[float] = []
        self._skipped: list[int] = []

    @staticmethod
    def guard(state: Any, grads: Any, new: Any, old: Any) -> tuple[Any, Any, Any]:
        finite = all_finite(grads)
        return select_tree(finite, new, old), state.adjust(finite), finite

    def observe(self, state: Any, grads_finite: Any, step: int) -> None:
        self.state = state
        self._pending.append((state.loss_scale, grads_finite, step))

    def trajectory(self) -> tuple[list[float], list[int]]:
        for scale_after, finite, step in self._pending:
            self._scales.append(float(scale_after))
            if not bool(finite):
                self._skipped.append(step)
        self._pending.clear()
        return self._scales, self._skipped


def for_run(precision: Precision, loss_scaling: bool) -> NoScaling | DynamicScaling:
    """Dynamic loss scaling for fp16 (unless the entry turned it off), none otherwise."""
    return DynamicScaling() if precision == "fp16" and loss_scaling else NoScaling()
