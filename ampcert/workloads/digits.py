"""Handwritten digits: a small convolutional classifier on real data.

The data is scikit-learn's bundled copy of the UCI optical-digits test set
(1,797 greyscale 8x8 images, 10 classes), so it needs no download. The
train/eval split is fixed (it does not move with the seed), so every seed and
precision is scored on the same 360 images; the seed moves the weights and
the batch order.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from torch import nn

from ampcert.workloads.base import Budget, TorchTask

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


class DigitsCNN(nn.Module):
    def __init__(self, width: int, hidden: int, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(2 * width * 4 * 4, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


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


def load_digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 images as float32 (N, 1, 8, 8) in [0, 1], and int64 labels."""
    data = np.loadtxt(digits_file(), delimiter=",", dtype=np.float32)
    x = torch.from_numpy(data[:, :-1].copy()).reshape(-1, 1, 8, 8) / 16.0
    y = torch.from_numpy(data[:, -1].astype(np.int64))
    return x, y


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    logits = model(x)
    return (logits.argmax(dim=1) == y).float().mean().item()


class DigitsWorkload:
    name = "digits"
    summary = "small CNN on scikit-learn's bundled 8x8 handwritten digits (real data, offline)"
    metric = "accuracy"
    higher_is_better = True
    Params = DigitsParams

    def default_budget(self, params: DigitsParams) -> Budget:
        # fp32 reaches 0.95 in 150-175 steps at the default width on seeds 0-3.
        return Budget(target=0.95, max_steps=300, eval_every=25)

    def build(self, params: DigitsParams, seed: int, device: str) -> TorchTask:
        x, y = load_digits_tensors()
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
        n_eval = int(len(x) * EVAL_FRACTION)
        eval_idx, train_idx = order[:n_eval], order[n_eval:]
        # The caller seeds torch before build(), so initial weights follow the seed.
        model = DigitsCNN(params.width, params.hidden)

        def make_optimizer(parameters):
            if params.optimizer == "adamw":
                return torch.optim.AdamW(parameters, lr=params.lr, weight_decay=params.weight_decay)
            return torch.optim.SGD(
                parameters, lr=params.lr, momentum=params.momentum, weight_decay=params.weight_decay
            )

        return TorchTask(
            model=model.to(device),
            train_x=x[train_idx].to(device),
            train_y=y[train_idx].to(device),
            eval_x=x[eval_idx].to(device),
            eval_y=y[eval_idx].to(device),
            batch_size=params.batch_size,
            loss_fn=nn.functional.cross_entropy,
            make_optimizer=make_optimizer,
            evaluate=accuracy,
            data_note=f"sklearn load_digits: {len(train_idx)} train / {n_eval} eval, fixed split",
        )


WORKLOAD = DigitsWorkload()
