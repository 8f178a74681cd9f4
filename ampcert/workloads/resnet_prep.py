"""The resnet workload without a framework: what its torch and JAX networks are built from.

Params and their size defaults, budgets, the network's :class:`Layout`, its
initial weights, the seeded augmentation and the data: everything
:mod:`~ampcert.workloads.torch_models` and :mod:`~ampcert.workloads.jax_models`
need, so that they import this module and never the workload object
(:mod:`~ampcert.workloads.resnet`), which imports them lazily, one way.
See :mod:`ampcert.workloads.resnet` for the workload itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from ampcert.workloads import images, rng
from ampcert.workloads.base import Prepared
from ampcert.workloads.init import Initialiser, Weights

Size = Literal["tiny", "small", "base"]

# Architecture and optimisation defaults per size.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"blocks": [1, 1], "width": 16, "batch_size": 64, "sgd_lr": 0.2},
    "small": {"blocks": [2, 2, 2], "width": 32, "batch_size": 128, "sgd_lr": 0.1},
    "base": {"blocks": [2, 2, 2, 2], "width": 64, "batch_size": 128, "sgd_lr": 0.1},
}
# Learning rate (SGD's comes from the size) and weight decay per optimizer.
OPTIMIZERS: dict[str, dict[str, float]] = {
    "sgd": {"weight_decay": 5e-4},
    "adamw": {"lr": 2e-3, "weight_decay": 0.05},
}
# Budgets per (size, data family): target accuracy, max_steps, eval_every, warmup_steps.
# Digits: measured (see the module docstring). Natural images: from published
# CIFAR-10 results for these models, with margin; for an image folder, placeholders.
BUDGETS: dict[tuple[str, str], tuple[float, int, int, int]] = {
    ("tiny", "digits"): (0.93, 300, 25, 20),
    ("small", "digits"): (0.96, 400, 25, 20),
    ("base", "digits"): (0.96, 400, 25, 20),
    ("tiny", "natural"): (0.50, 2000, 250, 100),
    ("small", "natural"): (0.85, 6000, 500, 200),
    ("base", "natural"): (0.92, 15600, 780, 390),
}
LARGE_INPUT = 64  # above this many pixels a side, use the ImageNet stem
EVAL_CHUNK = 1024  # evaluate in chunks to bound activation memory


def _family(data: str) -> str:
    return "digits" if data == "digits" else "natural"


class ResNetParams(BaseModel):
    """Knobs of the resnet workload. ``None`` means "the size's default"; the
    validator fills every such field in, so the resolved params are explicit."""

    model_config = ConfigDict(extra="forbid")

    size: Size = "tiny"
    data: Literal["digits", "cifar10", "imagefolder"] = "digits"
    path: str | None = None
    image_size: PositiveInt | None = Field(None, description="imagefolder only; default 32")
    max_train: PositiveInt | None = None
    max_eval: PositiveInt | None = None
    blocks: list[PositiveInt] | None = Field(None, min_length=1, max_length=6)
    width: PositiveInt | None = None
    batch_size: PositiveInt | None = None
    optimizer: Literal["sgd", "adamw"] = "sgd"
    lr: float | None = Field(None, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float | None = Field(None, ge=0)
    warmup_steps: int | None = Field(None, ge=0)
    max_steps: PositiveInt | None = None
    eval_every: PositiveInt | None = None
    target: float | None = Field(None, ge=0, le=1)
    augment: bool = True

    @model_validator(mode="after")
    def _resolve(self) -> ResNetParams:
        if self.data in ("cifar10", "imagefolder"):
            if not self.path:
                raise ValueError(f"`data: {self.data}` needs `path` (the folder holding the "
                                 + ("CIFAR-10 python batches)" if self.data == "cifar10"
                                    else "class sub-folders)"))
        elif self.path is not None:
            raise ValueError("`path` is only for `data: cifar10` or `data: imagefolder`; "
                             "digits ships with scikit-learn")
        if self.data == "imagefolder":
            if self.image_size is None:
                self.image_size = 32
        elif self.image_size is not None:
            raise ValueError(f"`image_size` is only for `data: imagefolder` "
                             f"({self.data} images have a fixed size)")
        size = SIZES[self.size]
        opt = OPTIMIZERS[self.optimizer]
        target, max_steps, eval_every, warmup = BUDGETS[(self.size, _family(self.data))]
        for name, default in [("blocks", list(size["blocks"])), ("width", size["width"]),
                              ("batch_size", size["batch_size"]),
                              ("lr", opt.get("lr", size["sgd_lr"])),
                              ("weight_decay", opt["weight_decay"]), ("max_steps", max_steps),
                              ("eval_every", eval_every), ("target", target)]:
            if getattr(self, name) is None:
                setattr(self, name, default)
        if self.warmup_steps is None:
            self.warmup_steps = min(warmup, self.max_steps // 4)
        if self.warmup_steps >= self.max_steps:
            raise ValueError(f"`warmup_steps` ({self.warmup_steps}) must be below "
                             f"`max_steps` ({self.max_steps})")
        return self


# -- the network, framework-free ------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One BasicBlock: two 3x3 conv-BN layers with ReLU and a shortcut, an
    identity or (when the shape changes) a strided 1x1 conv-BN projection."""

    name: str  # "stages.<i>", as torch names it
    cin: int
    cout: int
    stride: int

    @property
    def projected(self) -> bool:
        return self.stride != 1 or self.cin != self.cout


@dataclass(frozen=True)
class Layout:
    """The network's shape, which both frameworks build from: the stem,
    ``len(blocks)`` BasicBlocks (``width * 2**i`` channels per stage,
    stride 2 from the second stage on), global mean pool, linear head."""

    in_channels: int
    classes: int
    width: int
    imagenet_stem: bool  # 7x7 stride-2 convolution and a 3x3 stride-2 max-pool
    blocks: tuple[Block, ...]

    @property
    def stem_kernel(self) -> int:
        return 7 if self.imagenet_stem else 3

    @property
    def stem_stride(self) -> int:
        return 2 if self.imagenet_stem else 1

    @property
    def stem_padding(self) -> int:
        return self.stem_kernel // 2

    @property
    def features(self) -> int:
        """Channels reaching the head."""
        return self.blocks[-1].cout if self.blocks else self.width


def layout(params: ResNetParams, classes: int, in_channels: int, image_size: int) -> Layout:
    blocks: list[Block] = []
    cin = params.width
    for i, n in enumerate(params.blocks):  # type: ignore[arg-type]
        cout = params.width * 2**i  # type: ignore[operator]
        for j in range(n):
            blocks.append(Block(f"stages.{len(blocks)}", cin, cout, 2 if (i > 0 and j == 0) else 1))
            cin = cout
    return Layout(in_channels, classes, params.width, image_size > LARGE_INPUT, tuple(blocks))  # type: ignore[arg-type]


def initial_weights(net: Layout, seed: int) -> Weights:
    """The network's starting point, keyed by torch name (see the module doc)."""
    init = Initialiser(seed)
    init.conv("stem.0", net.in_channels, net.width, net.stem_kernel, bias=False, he_fan_out=True)
    init.batch_norm("stem.1", net.width)
    for b in net.blocks:
        init.conv(f"{b.name}.conv1", b.cin, b.cout, 3, bias=False, he_fan_out=True)
        init.batch_norm(f"{b.name}.bn1", b.cout)
        init.conv(f"{b.name}.conv2", b.cout, b.cout, 3, bias=False, he_fan_out=True)
        init.batch_norm(f"{b.name}.bn2", b.cout, gain=0.0)  # each block starts as the identity
        if b.projected:
            init.conv(f"{b.name}.shortcut.0", b.cin, b.cout, 1, bias=False, he_fan_out=True)
            init.batch_norm(f"{b.name}.shortcut.1", b.cout)
    init.linear("head", net.features, net.classes)
    return init.weights


# -- augmentation ----------------------------------------------------------------------


@dataclass(frozen=True)
class CropFlip:
    """``augment(x, y, step)``: a random crop of each zero-padded image
    (offsets 0..2*pad on each axis) and, with ``flip``, a horizontal flip with
    probability 1/2. The offsets and flips are :meth:`draws`, from
    ``rng.stream(seed, "augment", step)``, so the result depends only on the
    inputs, the seed and the step. Calling it works on numpy batches; the torch
    backend applies the same draws with torch ops on its device
    (``torch_models.TorchCropFlip``)."""

    seed: int
    pad: int
    flip: bool

    def draws(self, step: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row offsets, column offsets (int64, 0..2*pad) and flips (bool) for n images."""
        gen = rng.stream(self.seed, "augment", step)
        span = 2 * self.pad + 1
        return gen.integers(0, span, n), gen.integers(0, span, n), gen.random(n) < 0.5

    def __call__(self, x: np.ndarray, y: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        n, c, h, w = x.shape
        oy, ox, flips = self.draws(step, n)
        if self.pad > 0:
            p = self.pad
            xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
            rows = oy[:, None] + np.arange(h)  # (n, h)
            cols = ox[:, None] + np.arange(w)  # (n, w)
            x = xp[np.arange(n)[:, None, None, None], np.arange(c)[None, :, None, None],
                   rows[:, None, :, None], cols[:, None, None, :]]
        if self.flip:
            x = np.where(flips[:, None, None, None], x[..., ::-1], x)
        return x, y


def make_augment(seed: int, pad: int, flip: bool) -> CropFlip:
    return CropFlip(seed, pad, flip)


# -- data ---------------------------------------------------------------------------------


def load_data(params: ResNetParams) -> images.ImageData:
    if params.data == "cifar10":
        return images.load_cifar10(params.path, params.max_train, params.max_eval)  # type: ignore[arg-type]
    if params.data == "imagefolder":
        return images.load_image_folder(params.path, params.image_size,  # type: ignore[arg-type]
                                        params.max_train, params.max_eval)
    return images.load_digits(params.max_train, params.max_eval)


def normaliser(train_x: np.ndarray):
    """``f(x)``: per-channel standardisation with the training split's mean and
    (unbiased) standard deviation, computed in float64, floored at 1e-3."""
    mean = train_x.mean(axis=(0, 2, 3), keepdims=True, dtype=np.float64)
    std = np.maximum(train_x.std(axis=(0, 2, 3), keepdims=True, ddof=1, dtype=np.float64), 1e-3)
    return lambda x: ((x - mean) / std).astype(np.float32)



@dataclass
class ResNetPrepared(Prepared):
    layout: Layout | None = None

