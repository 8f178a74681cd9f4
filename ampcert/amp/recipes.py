"""Precision recipes: what a team chooses beyond autocast's dtype, by name.

AMP (autocast, fp32 master weights, fp32 optimizer state) is one recipe; the
memory AMP users hope for comes from the others, which the frameworks offer
by name: Lightning's ``"bf16-true"`` (weights, activations and gradients in
bf16, no fp32 copy), torchao's optimizers with bf16 stochastic rounding or
8-bit state, DDP's and FSDP2's gradient reduction in bf16, jmp's (param,
compute, output) policy.

A recipe is data, one row of :data:`RECIPES`: the low precision it is built
on, whether the forward runs under autocast, the dtype the weights (and so
their gradients) are held in, the optimizer state's, how the update is
rounded into bf16 weights, the dtype gradients are reduced in across ranks.
A recipe's name is a precision (:data:`ampcert.amp.precision.Precision`): it
enters the run id, the results, the tables, the history, the gate and the
plan as a precision does, and a rule that names its base precision judges it
too. What a recipe changes in training is the harness's recipe feature
(``ampcert/backends/features/recipe.py``); ampcert's own bf16 optimizers are
:mod:`ampcert.amp.torch.recipe_optim`.

Nothing here imports a framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Where a recipe's tensors are held: the weights (and their gradients), the optimizer's state.
WeightsDtype = Literal["fp32", "bf16"]
StateDtype = Literal["fp32", "bf16", "int8"]
# How an update computed in fp32 is written into bf16: to the nearest bf16 (an update
# below half a bf16 step is lost), or up or down with the probability of its distance
# (stochastic rounding: the expected weight is the fp32 one).
Rounding = Literal["nearest", "stochastic"]


@dataclass(frozen=True)
class Recipe:
    """One precision recipe (see the module docstring)."""

    name: str
    summary: str
    # The low precision it is built on: its capability is the device's for this precision,
    # and a rule that names this precision judges the recipe too.
    base: Literal["bf16"]
    # True: the forward runs under autocast at ``base`` with fp32 weights (mixed); False:
    # the model itself is in ``weights`` and no autocast runs (true).
    autocast: bool
    weights: WeightsDtype
    optimizer_state: StateDtype
    rounding: Rounding = "nearest"
    # The dtype gradients are reduced in across data-parallel ranks (DDP's communication,
    # or FSDP2's reduce_dtype).
    reduce: WeightsDtype = "fp32"
    # FSDP2 (fully_shard): the weights, gradients and optimizer state sharded over the
    # ranks, each layer's parameters gathered in ``base`` for its compute
    # (MixedPrecisionPolicy(param_dtype=base, reduce_dtype=reduce)).
    shard: bool = False
    frameworks: tuple[str, ...] = ("torch",)
    # Lightning's name for the same recipe, where Lightning has one.
    lightning: str | None = None

    @property
    def needs_ranks(self) -> bool:
        """Whether it only means something on more than one rank: a reduction's dtype, a
        sharding."""
        return self.shard or self.reduce != self.weights

    @property
    def reduces_by_hook(self) -> bool:
        """Whether DDP's communication hook reduces in another dtype (FSDP2 reduces by its policy)."""
        return not self.shard and self.reduce != self.weights

    @property
    def own_optimizer(self) -> bool:
        """Whether the workload's optimizer is replaced: its state or its rounding is the
        recipe's, not what torch's optimizer keeps for weights of that dtype."""
        return self.rounding == "stochastic" or self.optimizer_state != self.weights


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("bf16-true", "weights, gradients and optimizer state in bf16, no fp32 copy; no autocast "
           "(Lightning's bf16-true); the update rounds to the nearest bf16",
           base="bf16", autocast=False, weights="bf16", optimizer_state="bf16", reduce="bf16",
           frameworks=("torch", "jax"), lightning="bf16-true"),
    Recipe("bf16-true-sr", "bf16-true with the update computed in fp32 and rounded stochastically into the "
           "bf16 weights (torchao's bf16_stochastic_round)",
           base="bf16", autocast=False, weights="bf16", optimizer_state="bf16", rounding="stochastic",
           reduce="bf16"),
    Recipe("bf16-state", "bf16 autocast with fp32 master weights and the optimizer's state in bf16",
           base="bf16", autocast=True, weights="fp32", optimizer_state="bf16"),
    Recipe("bf16-adamw8bit", "bf16 autocast with fp32 master weights and AdamW's state in 8 bits, blockwise "
           "(torchao's AdamW8bit)",
           base="bf16", autocast=True, weights="fp32", optimizer_state="int8"),
    Recipe("bf16-reduce", "bf16 autocast with fp32 master weights and the gradients reduced across ranks in "
           "bf16 (DDP's bf16 compression hook)",
           base="bf16", autocast=True, weights="fp32", optimizer_state="fp32", reduce="bf16"),
    Recipe("bf16-fsdp", "FSDP2 (fully_shard): fp32 weights, gradients and optimizer state sharded over the ranks, "
           "each layer gathered in bf16 for its compute, gradients reduced in fp32 "
           "(MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32))",
           base="bf16", autocast=False, weights="fp32", optimizer_state="fp32", reduce="fp32", shard=True),
    Recipe("bf16-fsdp-reduce", "bf16-fsdp with the gradients reduced in bf16 "
           "(MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16))",
           base="bf16", autocast=False, weights="fp32", optimizer_state="fp32", reduce="bf16", shard=True),
)}
