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

``suites/numerics.yaml`` runs both with the default rule pack, with and
without loss scaling, and shows the verdicts.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from ampcert.workloads.base import Budget, TorchTask
from ampcert.workloads.digits import EVAL_FRACTION, SPLIT_SEED, accuracy, load_digits_tensors


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


def _split():
    x, y = load_digits_tensors()
    x = x.reshape(len(x), -1)  # raw pixels in [0, 1], flattened
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_eval = int(len(x) * EVAL_FRACTION)
    return x[order[n_eval:]], y[order[n_eval:]], x[order[:n_eval]], y[order[:n_eval]]


class _Numerics:
    metric = "accuracy"
    higher_is_better = True

    def default_budget(self, params) -> Budget:
        return Budget(target=params.target, max_steps=params.max_steps, eval_every=25)

    def _task(self, model, params, device, loss_fn, lr, note, scale_x: float = 1.0) -> TorchTask:
        tx, ty, ex, ey = _split()

        def make_optimizer(parameters):
            return torch.optim.SGD(parameters, lr=lr, momentum=params.momentum)

        return TorchTask(
            model=model.to(device), train_x=(tx * scale_x).to(device), train_y=ty.to(device),
            eval_x=(ex * scale_x).to(device), eval_y=ey.to(device), batch_size=params.batch_size,
            loss_fn=loss_fn, make_optimizer=make_optimizer, evaluate=accuracy,
            data_note=f"sklearn load_digits, flattened: {len(tx)} train / {len(ex)} eval; {note}",
        )


class UnderflowWorkload(_Numerics):
    name = "underflow"
    summary = "digits MLP whose gradients underflow fp16 without loss scaling (loss x 2**-20, lr / 2**-20)"
    Params = UnderflowParams

    def build(self, params: UnderflowParams, seed: int, device: str) -> TorchTask:
        model = nn.Sequential(nn.Linear(64, params.hidden), nn.ReLU(), nn.Linear(params.hidden, 10))
        gain = params.loss_gain

        def loss_fn(logits, y):
            return nn.functional.cross_entropy(logits, y) * gain

        return self._task(model, params, device, loss_fn, params.lr / gain,
                          f"loss x {gain:g}, learning rate / {gain:g}")


class OverflowWorkload(_Numerics):
    name = "overflow"
    summary = "digits MLP whose first-layer activations overflow fp16 (large inputs and weights, then LayerNorm)"
    Params = OverflowParams

    def build(self, params: OverflowParams, seed: int, device: str) -> TorchTask:
        model = nn.Sequential(nn.Linear(64, params.hidden), nn.LayerNorm(params.hidden), nn.ReLU(),
                              nn.Linear(params.hidden, 10))
        with torch.no_grad():
            model[0].weight.mul_(params.weight_gain)
        return self._task(model, params, device, nn.functional.cross_entropy, params.lr,
                          f"inputs x {params.input_gain:g}, first-layer weights x {params.weight_gain:g}",
                          scale_x=params.input_gain)


UNDERFLOW = UnderflowWorkload()
OVERFLOW = OverflowWorkload()
