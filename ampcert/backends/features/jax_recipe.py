"""Precision recipes on JAX (amp/recipes.py; the recipes whose ``frameworks`` name jax):
the parameters in the recipe's dtype before the optimizer's state is made from them,
so optax keeps its moments in that dtype and ``optax.apply_updates`` writes each
update back to the nearest value of it, as torch's optimizer does on bf16 weights;
floating inputs reach the model in that dtype (JAX would promote bf16 weights times
fp32 inputs to fp32). No autocast runs (the adapter's ``autocast_precision``)."""

from __future__ import annotations

from typing import Any

from ampcert.amp.precision import dtype_name
from ampcert.amp.recipes import RECIPES
from ampcert.backends.contract import Unsupported
from ampcert.backends.training_loop import Feature, Run


class JaxRecipeWeights(Feature):
    def model_ready(self, run: Run) -> None:
        import jax
        import jax.numpy as jnp

        recipe, fw = RECIPES[run.spec.precision], run.framework
        if recipe.own_optimizer or recipe.needs_ranks:  # the suite refuses these for JAX; said again here
            raise Unsupported(f"recipe {recipe.name} trains with torch only")
        dtype = jnp.dtype(dtype_name(recipe.weights))
        fw_: Any = fw
        fw_.params = jax.tree_util.tree_map(
            lambda leaf: leaf.astype(dtype) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf, fw_.params)
        fw_.opt_state = fw_.task.optimizer.init(fw_.params)
        fw_.input_dtype = dtype
