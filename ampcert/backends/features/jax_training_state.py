"""The bytes a JAX run holds for its parameters (results.TrainingState): the parameters
and the optimizer's state from their leaves; the gradients, which a jitted step keeps
only inside itself, as one per parameter in the parameter's own dtype (what
``jax.grad`` returns)."""

from __future__ import annotations

from typing import Any

from ampcert.backends.features.training_state import TrainingStateReader
from ampcert.results import TrainingState


class JaxTrainingState(TrainingStateReader):
    def read(self, fw: Any) -> TrainingState:
        import jax
        import jax.numpy as jnp

        params = [leaf for leaf in jax.tree_util.tree_leaves(fw.params) if jnp.issubdtype(leaf.dtype, jnp.floating)]
        opt = [leaf for leaf in jax.tree_util.tree_leaves(fw.opt_state) if hasattr(leaf, "nbytes")]
        weights = sum(int(leaf.nbytes) for leaf in params)
        optimizer = fw.task.optimizer
        return TrainingState(
            parameters=sum(int(leaf.size) for leaf in params),
            weights_dtype="+".join(sorted({str(leaf.dtype) for leaf in params})),
            optimizer=f"{type(optimizer).__module__}.{type(optimizer).__qualname__}",
            weights_bytes=weights, gradients_bytes=weights,
            optimizer_state_bytes=sum(int(leaf.nbytes) for leaf in opt))
