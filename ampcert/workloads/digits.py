"""Handwritten digits: a small convolutional classifier on real data.

The data is scikit-learn's bundled copy of the UCI optical-digits test set
(1,797 greyscale 8x8 images, 10 classes), so it needs no download. The
train/eval split is fixed (it does not move with the seed), so every seed and
precision is scored on the same 359 images; the seed moves the weights and
the batch order.

This module is framework-free (numpy): the data, the fixed split and the
initial weights are made here, and ``build`` imports torch only to turn them
into a :class:`~ampcert.workloads.base.TorchTask`
(:mod:`ampcert.workloads.torch_models` holds the network). The data and its
fixed split live in :mod:`ampcert.workloads.images` (:func:`fixed_split`),
where the resnet and numerics workloads read their digits too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from ampcert.workloads.base import Budget, Prepared, TorchTask, warmup_cosine
from ampcert.workloads.images import (  # noqa: F401 - the digits data, re-exported from where it lives
    EVAL_FRACTION,
    SPLIT_SEED,
    digits_file,
    fixed_split,
    load_digits_arrays,
)
from ampcert.workloads.init import Initialiser, Weights


class DigitsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    width: PositiveInt = 16
    hidden: PositiveInt = 64
    batch_size: PositiveInt = 64
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    # The cosine learning-rate schedule's length (base.warmup_cosine, down to 0.1 x lr at
    # this step, as resnet's; the budget stops there by default), so the final accuracy has
    # settled rather than caught mid-oscillation, as at a constant rate. None: a constant
    # rate, and left out of the dump, so runs that predate the field keep their ids (a
    # run's id hashes its resolved params).
    max_steps: PositiveInt | None = Field(default=None, exclude_if=lambda v: v is None)


def load_digits_tensors():
    """:func:`load_digits_arrays` as torch tensors (imports torch)."""
    import torch

    x, y = load_digits_arrays()
    return torch.from_numpy(x), torch.from_numpy(y)


def initial_weights(params: DigitsParams, seed: int, classes: int = 10) -> Weights:
    """The CNN's starting point (names as in ``torch_models.DigitsCNN``):
    two 3x3 convolutions and two linear layers, torch's default initialisation."""
    w, h = params.width, params.hidden
    init = Initialiser(seed)
    init.conv("features.0", 1, w, 3)
    init.conv("features.2", w, 2 * w, 3)
    init.linear("head.1", 2 * w * 4 * 4, h)
    init.linear("head.3", h, classes)
    return init.weights


class DigitsWorkload:
    name = "digits"
    summary = "small CNN on scikit-learn's bundled 8x8 handwritten digits (real data, offline)"
    metric = "accuracy"
    higher_is_better = True
    Params = DigitsParams

    def default_budget(self, params: DigitsParams) -> Budget:
        # fp32 reaches 0.95 in 100-125 steps at the default width on seeds 0-3.
        return Budget(target=0.95, max_steps=params.max_steps or 300, eval_every=25)

    def prepare(self, params: DigitsParams, seed: int) -> Prepared:
        train_x, train_y, eval_x, eval_y = fixed_split(*load_digits_arrays())
        return Prepared(
            params=params, weights=initial_weights(params, seed),
            train_x=train_x, train_y=train_y, eval_x=eval_x, eval_y=eval_y, batch_size=params.batch_size,
            data_note=f"sklearn load_digits: {len(train_x)} train / {len(eval_x)} eval, fixed split",
            lr_lambda=warmup_cosine(0, params.max_steps) if params.max_steps else None,
        )

    def build(self, params: DigitsParams, seed: int, device: str) -> TorchTask:
        from ampcert.workloads import torch_models

        return torch_models.digits_task(self.prepare(params, seed), device)


WORKLOAD = DigitsWorkload()


def __getattr__(name: str) -> Any:
    """``DigitsCNN`` and ``accuracy`` (torch) lived here; they load on first use."""
    if name in ("DigitsCNN", "accuracy"):
        from ampcert.workloads import torch_models

        return getattr(torch_models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
