"""ResNet image classification: the vision workload.

The model is a residual network in the style of He et al. (2016): a stem
convolution, stages of BasicBlocks (two 3x3 convolutions, each followed by
BatchNorm, with ReLU, and an identity or 1x1-projection shortcut), global
average pooling and a linear head. Each stage after the first halves the
resolution and doubles the width. Images of 64 px or less get the CIFAR
stem (one 3x3 stride-1 convolution); larger ones get the ImageNet stem
(7x7 stride-2 convolution and a 3x3 max-pool). Global pooling is a mean
(``AdaptiveAvgPool2d``'s CUDA backward has no deterministic kernel, and the
harness trains with deterministic algorithms). Convolutions start from He
initialisation (kaiming_normal, fan_out, ReLU gain), the head from torch's
Linear default, BatchNorm at gain 1 and shift 0 except the last BatchNorm of
each block, which starts at zero so every block starts as the identity: all
drawn with numpy by :func:`initial_weights`, identical in torch and JAX for
a seed. BatchNorm, the softmax in the loss and the reductions are where
reduced precision tends to hurt, which makes this a useful certification
workload.

Data (see :mod:`ampcert.workloads.images`), chosen with ``data``:

- ``digits`` (default): scikit-learn's bundled 8x8 greyscale digits, offline;
- ``cifar10``: the CIFAR-10 python batches in the local folder ``path``;
- ``imagefolder``: one sub-folder per class under ``path``, resized to
  ``image_size``.

Images are normalised per channel with the mean and standard deviation of
the training split. With ``augment`` (default on), each training batch gets
a random crop from a zero-padded image (padding ``image_size // 8``: 4 px
for CIFAR, 1 px for digits) and, except for digits (a flipped digit is a
different symbol, or none), a random horizontal flip. The random offsets and
flips come from ``rng.stream(seed, "augment", step)`` (numpy), so a step's
batch is identical in every precision, on every rerun and in both backends
(torch moves the pixels on its device, JAX's loop in numpy: the same crop);
no global generator is touched.

Sizes pick defaults; any explicit param overrides them, and the filled-in
values are what the run records (and what its run id hashes). Budgets are
target accuracy / max_steps:

=====  ============  =========  ==============  =====  ======  ==========  ==========
size   blocks/stage  widths     parameters      batch  SGD lr  digits      cifar10
=====  ============  =========  ==============  =====  ======  ==========  ==========
tiny   1, 1          16, 32     19.7k (20.0k)   64     0.2     0.93 / 300  0.50 / 2000
small  2, 2, 2       32..128    0.70M           128    0.1     0.96 / 400  0.85 / 6000
base   2, 2, 2, 2    64..512    11.17M          128    0.1     0.96 / 400  0.92 / 15600
=====  ============  =========  ==============  =====  ======  ==========  ==========

(parameters for 1-channel digits; in brackets, or identical, for RGB.)

``tiny`` is the CPU workload. Measured in fp32 on a 2-core AVX2 CPU with one
torch thread: 11-12 ms a step, ~4,500-5,000 samples/s; it first reaches
0.93 at step 150-175 for seeds 0-4 (about 2 s of training) and plateaus
at 0.97-0.98, so the target has 4 points and 125 steps of margin. Two
OpenMP threads on a busy 2-core machine can be 10-30x slower than one.
On CIFAR-sized inputs tiny costs ~110 ms a step on that CPU.

``small`` (a wide ResNet-20) and ``base`` (ResNet-18 widths, the usual
CIFAR-10 benchmark model) are meant for GPUs and CIFAR-10; on that CPU a
step costs 1.8 s and 10 s on CIFAR inputs (0.15 s and 1.05 s on digits).
On digits (seed 0, fp32) small first passed 0.96 at step
200 and base at step 150; both plateau at 0.97-0.99. Their CIFAR-10
targets are not measured by this harness: they sit below what these models
are published to reach with SGD (momentum 0.9, weight decay 5e-4), random
crop and flip, and this warm-up/cosine schedule in ~15 epochs (small) and
~40 epochs (base). For ``imagefolder`` data the CIFAR-10 budgets are
placeholders: set ``target`` and ``max_steps`` (or the suite's ``train:``)
to suit your data.

The learning rate warms up linearly over ``warmup_steps`` and then follows
a cosine from 1x down to 0.1x of ``lr`` at ``max_steps``, where it stays.

This module is framework-free (numpy): params, budgets, data, the network's
:class:`Layout`, its initial weights and the augmentation live here, and
``build`` / ``build_jax`` import torch or JAX only to make the model
(:mod:`~ampcert.workloads.torch_models`, :mod:`~ampcert.workloads.jax_models`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from ampcert.workloads import images, rng
from ampcert.workloads.base import Budget, DataError, Prepared, TorchTask, warmup_cosine
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


# -- the workload --------------------------------------------------------------------------


@dataclass
class ResNetPrepared(Prepared):
    layout: Layout | None = None


class ResNetWorkload:
    name = "resnet"
    summary = ("ResNet (BasicBlocks, BatchNorm) image classifier on digits (offline), "
               "CIFAR-10 or an image folder; sizes tiny (CPU) / small / base (ResNet-18, GPU)")
    metric = "accuracy"
    higher_is_better = True
    Params = ResNetParams

    def prepare(self, params: ResNetParams, seed: int) -> ResNetPrepared:
        """Data (normalised), initial weights, augmentation and schedule: all
        that the torch and the JAX task share."""
        data = load_data(params)
        net = layout(params, len(data.classes), data.channels, data.image_size)
        weights = initial_weights(net, seed)
        normalise = normaliser(data.train_x)
        augment = None
        if params.augment:
            augment = make_augment(seed, pad=max(1, data.image_size // 8), flip=params.data != "digits")
        info = data.info()
        info["parameters"] = weights.count()
        return ResNetPrepared(
            params=params, weights=weights, layout=net,
            train_x=normalise(data.train_x), train_y=data.train_y,
            eval_x=normalise(data.eval_x), eval_y=data.eval_y,
            batch_size=params.batch_size,  # type: ignore[arg-type]
            lr_lambda=warmup_cosine(params.warmup_steps, params.max_steps),  # type: ignore[arg-type]
            augment=augment, data_note=data.note, data_info=info,
        )

    def build(self, params: ResNetParams, seed: int, device: str) -> TorchTask:
        from ampcert.workloads import torch_models

        return torch_models.resnet_task(self.prepare(params, seed), device)

    def build_jax(self, params: ResNetParams, seed: int, device: str):
        """The same task for the JAX backend, from the same :meth:`prepare`."""
        from ampcert.workloads import jax_models

        return jax_models.resnet_task(self.prepare(params, seed))

    def default_budget(self, params: ResNetParams) -> Budget:
        return Budget(target=params.target, max_steps=params.max_steps,  # type: ignore[arg-type]
                      eval_every=params.eval_every)  # type: ignore[arg-type]

    def check(self, params: ResNetParams) -> None:
        """Plan-time data validation; raises DataError (one line, path first)."""
        if params.data == "cifar10":
            images.check_cifar10(params.path)  # type: ignore[arg-type]
        elif params.data == "imagefolder":
            images.check_image_folder(params.path)  # type: ignore[arg-type]
        else:
            images.check_digits()


WORKLOAD = ResNetWorkload()

# The torch network lives in torch_models; these names load it on first use.
_TORCH_NAMES = ("ResNet", "BasicBlock", "build_model", "parameter_count", "accuracy")


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        from ampcert.workloads import torch_models

        return getattr(torch_models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["WORKLOAD", "Block", "CropFlip", "DataError", "Layout", "ResNetParams", "ResNetWorkload",
           "initial_weights", "layout", "make_augment"]
