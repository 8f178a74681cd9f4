"""Precision recipes (``recipes: [bf16-true, ...]``, torch; amp/recipes.py): what each
changes in training, read from its row of the table and nothing else.

- :class:`RecipeWeights`, before torchrun wraps the model: a true recipe's model into
  its dtype, floating inputs cast to it at the model's door (in training and in
  evaluation, as Lightning's bf16-true does); the workload's optimizer remade where
  the recipe keeps the optimizer's state in a dtype of its own or rounds its update
  stochastically (:mod:`ampcert.amp.torch.recipe_optim`).
- :class:`RecipeReduction`, after torchrun wraps it: gradients reduced across ranks in
  the recipe's dtype, as the adapter's communication hook (DDP's bf16 compression
  hook's computation, which torch refuses to register off NCCL).
"""

# No `from __future__ import annotations`: DDP checks a communication hook's annotations
# as objects (dist.GradBucket, Future[Tensor]).
from typing import Any

import torch

from ampcert.amp.precision import dtype_name
from ampcert.amp.recipes import RECIPES, Recipe
from ampcert.backends.contract import Unsupported
from ampcert.backends.training_loop import Feature, Run


def _dtype(precision: str) -> torch.dtype:
    return getattr(torch, dtype_name(precision))


def _recipe(run: Run) -> Recipe:
    return RECIPES[run.spec.precision]


def _inputs_to(dtype: torch.dtype) -> Any:
    def cast(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    return cast


class RecipeWeights(Feature):
    def model_ready(self, run: Run) -> None:
        recipe, fw = _recipe(run), run.framework
        model: torch.nn.Module = fw.model  # type: ignore[attr-defined]
        dtype = _dtype(recipe.weights)
        if dtype != torch.float32:
            model.to(dtype)
            model.register_forward_pre_hook(_inputs_to(dtype))
        if recipe.own_optimizer:
            fw.optimizer_for = lambda optimizer: _remade(optimizer, recipe)  # type: ignore[attr-defined]
        if recipe.shard:
            fw.data_parallel = _FullyShard(recipe)  # type: ignore[attr-defined]


class _FullyShard:
    """FSDP2 for torchrun's ranks: each stacked block (:func:`_shard_units`), then the model,
    sharded (``fully_shard``) with the recipe's MixedPrecisionPolicy; the forward gathers
    from every rank, so every rank evaluates."""

    collective_forward = True

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe
        self.wire_dtype = _dtype(recipe.reduce)  # what the precision probe reports as its communication

    def __call__(self, model: torch.nn.Module, device: str) -> torch.nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=_dtype(self.recipe.base), reduce_dtype=_dtype(self.recipe.reduce))
        for unit in _shard_units(model):
            fully_shard(unit, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model


def _shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks each sharded on their own, as FSDP2's users shard a transformer: the members
    of the model's containers (ModuleList, ModuleDict: the stacked layers). The rest stays in
    the root's group, tied weights included (an embedding and the head share one)."""
    return [member for child in model.children() if isinstance(child, torch.nn.ModuleList | torch.nn.ModuleDict)
            for member in child.children() if any(True for _ in member.parameters())]


def _remade(optimizer: torch.optim.Optimizer, recipe: Recipe) -> torch.optim.Optimizer:
    from ampcert.amp.torch.recipe_optim import recipe_optimizer

    try:
        return recipe_optimizer(optimizer, state_dtype=recipe.optimizer_state,
                                stochastic_round=recipe.rounding == "stochastic")
    except ValueError as exc:
        raise Unsupported(f"recipe {recipe.name}: {exc}") from None
    except ImportError as exc:  # torchao's AdamW8bit
        raise Unsupported(f"recipe {recipe.name} needs torchao ({exc}): pip install 'ampcert[fp8]'") from None


class RecipeReduction(Feature):
    def model_ready(self, run: Run) -> None:
        recipe, fw = _recipe(run), run.framework
        if not isinstance(fw.train_model, torch.nn.parallel.DistributedDataParallel):  # type: ignore[attr-defined]
            raise Unsupported(f"recipe {recipe.name} reduces gradients across ranks: run it under "
                              "`launcher: torchrun` with two or more ranks")
        fw.comm_hook = _bf16_allreduce  # type: ignore[attr-defined]


def _bf16_allreduce(state: Any, bucket: torch.distributed.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's ``default_hooks.bf16_compress_hook``, which torch refuses off NCCL while gloo
    reduces bf16 all the same: the bucket divided by the world size, reduced in bf16,
    written back into the bucket's own dtype."""
    group = torch.distributed.group.WORLD
    compressed = bucket.buffer().to(torch.bfloat16).div_(torch.distributed.get_world_size(group))
    future = torch.distributed.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut: Any) -> torch.Tensor:
        buffer = bucket.buffer()
        buffer.copy_(fut.value()[0])
        return buffer

    return future.then(decompress)


_bf16_allreduce.wire_dtype = torch.bfloat16  # type: ignore[attr-defined]  # what the precision probe reports
