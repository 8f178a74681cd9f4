"""Workloads built to break fp16, so certification has something to catch.

Both are small MLPs on scikit-learn's digits (flattened 8x8 images), trained
with SGD; each hides one classic fp16 failure behind a model that trains
normally in fp32 and bf16:

``underflow``
    The loss is multiplied by ``loss_gain`` (default ``2**-20``) and the
    learning rate divided by it, so in exact arithmetic training is unchanged.
    The gradients reaching the low-precision matmuls are then at most
    1/batch x 2**-20 = 1.5e-8, below half of fp16's smallest subnormal (6e-8):
    without loss scaling they round to zero and the model never learns;
    dynamic loss scaling (x 2**16) lifts them back into range. bf16 has fp32's exponent range and learns without a scaler.
``overflow``
    The raw pixels are multiplied by ``input_gain`` (16384, still an fp16
    number) and the first layer's initial weights by ``weight_gain`` (8); its
    output goes through a LayerNorm, so fp32 and bf16 train normally while
    ~7% of the first matmul's outputs (up to ~1.3e5) exceed fp16's largest
    value (65504): the forward pass turns to inf/NaN. Loss scaling cannot help
    an overflow in the forward pass: fp16 fails with or without it.

``stagnation``
    Built to break ``bf16-true`` (weights held in bf16, amp/recipes.py), as the
    two above break fp16. Each Linear layer's weights are stored with an offset
    (``weight_offset``, default 4) that its forward subtracts again, so in exact
    arithmetic the model is the plain MLP. A stored weight then sits near 4,
    where one bf16 step is 2**-5 = 0.031 while an SGD update is about 1e-4: held
    in bf16 and rounded to the nearest, every update is lost and the model never
    learns. fp32 (one step at 4 is 4.8e-7) and bf16 AMP (fp32 master weights)
    train normally, and so does ``bf16-true-sr``: stochastic rounding keeps each
    update in expectation. LayerNorm gains, which sit near 1 in every
    transformer, meet the same rounding at a quarter of this offset.

``suites/numerics.yaml`` runs the first two with the default rule pack, with and
without loss scaling, and shows the verdicts; ``suites/recipes.yaml`` the third.

The models' starting weights are torch's default initialisation drawn with
numpy (:mod:`ampcert.workloads.init`); ``build`` imports torch only to make
the task, so listing these workloads needs no framework.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from ampcert.workloads.base import Budget, Prepared, TorchTask
from ampcert.workloads.images import fixed_split, load_digits_arrays
from ampcert.workloads.init import Initialiser, Weights


class UnderflowParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hidden: PositiveInt = 64
    batch_size: PositiveInt = 64
    lr: float = Field(0.05, gt=0, description="the effective learning rate (before dividing by loss_gain)")
    momentum: float = Field(0.9, ge=0, lt=1)
    loss_gain: float = Field(2.0**-20, gt=0, le=1)
    max_steps: PositiveInt = 300
    target: float = Field(0.9, ge=0, le=1)


class OverflowParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hidden: PositiveInt = 64
    batch_size: PositiveInt = 64
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    input_gain: float = Field(16384.0, gt=0, description="raw pixels x this (fp16 holds it: < 65504)")
    weight_gain: float = Field(8.0, gt=0, description="first layer's initial weights x this")
    max_steps: PositiveInt = 300
    target: float = Field(0.9, ge=0, le=1)


class StagnationParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hidden: PositiveInt = 64
    batch_size: PositiveInt = 64
    lr: float = Field(0.02, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_offset: float = Field(4.0, ge=0, description="stored weights = the model's + this (its forward "
                                 "subtracts it): bf16's step there is what decides whether an update survives")
    max_steps: PositiveInt = 300
    target: float = Field(0.85, ge=0, le=1)


def underflow_weights(params: UnderflowParams | StagnationParams, seed: int) -> Weights:
    """``Sequential(Linear(64, hidden), ReLU, Linear(hidden, 10))``, torch's defaults."""
    init = Initialiser(seed)
    init.linear("0", 64, params.hidden)
    init.linear("2", params.hidden, 10)
    return init.weights


def overflow_weights(params: OverflowParams, seed: int) -> Weights:
    """``Sequential(Linear(64, hidden), LayerNorm, ReLU, Linear(hidden, 10))``,
    torch's defaults, the first layer's weights times ``weight_gain``."""
    init = Initialiser(seed)
    init.linear("0", 64, params.hidden)
    init.weights.params["0.weight"] *= np.float32(params.weight_gain)
    init.layer_norm("1", params.hidden)
    init.linear("3", params.hidden, 10)
    return init.weights


def stagnation_weights(params: StagnationParams, seed: int) -> Weights:
    """The underflow MLP's weights, each Linear layer's stored plus ``weight_offset``."""
    weights = underflow_weights(params, seed)
    for name in ("0.weight", "2.weight"):
        weights.params[name] += np.float32(params.weight_offset)
    return weights


class _Numerics:
    metric = "accuracy"
    higher_is_better = True

    def default_budget(self, params) -> Budget:
        return Budget(target=params.target, max_steps=params.max_steps, eval_every=25)

    def _prepare(self, params, weights: Weights, note: str, scale_x: float = 1.0) -> Prepared:
        x, y = load_digits_arrays()
        x = x.reshape(len(x), -1) * np.float32(scale_x)  # raw pixels in [0, 1] (times the gain), flattened
        tx, ty, ex, ey = fixed_split(x, y)
        return Prepared(params=params, weights=weights, train_x=tx, train_y=ty, eval_x=ex, eval_y=ey,
                        batch_size=params.batch_size,
                        data_note=f"sklearn load_digits, flattened: {len(tx)} train / {len(ex)} eval; {note}")


class UnderflowWorkload(_Numerics):
    name = "underflow"
    summary = "digits MLP whose gradients underflow fp16 without loss scaling (loss x 2**-20, lr / 2**-20)"
    Params = UnderflowParams

    def prepare(self, params: UnderflowParams, seed: int) -> Prepared:
        gain = params.loss_gain
        return self._prepare(params, underflow_weights(params, seed), f"loss x {gain:g}, learning rate / {gain:g}")

    def build(self, params: UnderflowParams, seed: int, device: str) -> TorchTask:
        from ampcert.workloads import torch_models

        return torch_models.underflow_task(self.prepare(params, seed), device)


class OverflowWorkload(_Numerics):
    name = "overflow"
    summary = "digits MLP whose first-layer activations overflow fp16 (large inputs and weights, then LayerNorm)"
    Params = OverflowParams

    def prepare(self, params: OverflowParams, seed: int) -> Prepared:
        return self._prepare(params, overflow_weights(params, seed),
                             f"inputs x {params.input_gain:g}, first-layer weights x {params.weight_gain:g}",
                             scale_x=params.input_gain)

    def build(self, params: OverflowParams, seed: int, device: str) -> TorchTask:
        from ampcert.workloads import torch_models

        return torch_models.overflow_task(self.prepare(params, seed), device)


class StagnationWorkload(_Numerics):
    name = "stagnation"
    summary = "digits MLP whose weights are stored near 4, where bf16's step swallows every update (bf16-true)"
    Params = StagnationParams

    def prepare(self, params: StagnationParams, seed: int) -> Prepared:
        return self._prepare(params, stagnation_weights(params, seed),
                             f"weights stored + {params.weight_offset:g}, subtracted in the forward")

    def build(self, params: StagnationParams, seed: int, device: str) -> TorchTask:
        from ampcert.workloads import torch_models

        return torch_models.stagnation_task(self.prepare(params, seed), device)


UNDERFLOW = UnderflowWorkload()
STAGNATION = StagnationWorkload()
OVERFLOW = OverflowWorkload()
