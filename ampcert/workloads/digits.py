"""Handwritten digits: a small convolutional classifier on real data.

The data is scikit-learn's bundled copy of the UCI optical-digits test set
(1,797 greyscale 8x8 images, 10 classes), so it needs no download. The
train/eval split is fixed (it does not move with the seed), so every seed and
precision is scored on the same 359 images; the seed moves the weights and
the batch order.

This module is framework-free (numpy): the data, the fixed split and the
initial weights are made here, and ``build`` imports torch only to turn them
into a :class:`~ampcert.workloads.base.TorchTask`
(:mod:`ampcert.workloads.torch_models` holds the network). The resnet and
numerics workloads read their digits through :func:`fixed_split` too.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from ampcert.workloads.base import Budget, Prepared, TorchTask
from ampcert.workloads.init import Initialiser, Weights

EVAL_FRACTION = 0.2
SPLIT_SEED = 1234


class DigitsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    width: PositiveInt = 16
    hidden: PositiveInt = 64
    batch_size: PositiveInt = 64
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)


def digits_file() -> Path:
    """scikit-learn's bundled copy of the data (a gzipped CSV: 64 pixels, then
    the label). Found without importing sklearn, which costs ~2 s per process."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the digits workload needs scikit-learn (it ships the data set)")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.exists():
        raise RuntimeError(f"scikit-learn's digits data is missing: {path}")
    return path


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 images as float32 (N, 1, 8, 8) in [0, 1], and int64 labels."""
    data = np.loadtxt(digits_file(), delimiter=",", dtype=np.float32)
    x = np.ascontiguousarray(data[:, :-1].reshape(-1, 1, 8, 8) / np.float32(16.0))
    return x, data[:, -1].astype(np.int64)


def fixed_split(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_x, train_y, eval_x, eval_y): the first ``EVAL_FRACTION`` of a
    permutation seeded by ``SPLIT_SEED`` evaluates, the rest trains; the same
    on every machine and for every run seed."""
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_eval = int(len(x) * EVAL_FRACTION)
    eval_idx, train_idx = order[:n_eval], order[n_eval:]
    return x[train_idx], y[train_idx], x[eval_idx], y[eval_idx]


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
        return Budget(target=0.95, max_steps=300, eval_every=25)

    def prepare(self, params: DigitsParams, seed: int) -> Prepared:
        train_x, train_y, eval_x, eval_y = fixed_split(*load_digits_arrays())
        return Prepared(
            params=params, weights=initial_weights(params, seed),
            train_x=train_x, train_y=train_y, eval_x=eval_x, eval_y=eval_y, batch_size=params.batch_size,
            data_note=f"sklearn load_digits: {len(train_x)} train / {len(eval_x)} eval, fixed split",
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
