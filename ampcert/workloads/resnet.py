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

This module is framework-free (numpy). Params, budgets, data, the network's
:class:`Layout`, its initial weights and the augmentation live in
:mod:`~ampcert.workloads.resnet_prep` (and are re-exported here), which is what
the models import; ``build`` / ``build_jax`` import torch or JAX only to make
the model (:mod:`~ampcert.workloads.torch_models`,
:mod:`~ampcert.workloads.jax_models`), so the imports run one way:
workload -> models -> resnet_prep.
"""

from __future__ import annotations

from typing import Any

from ampcert.workloads import images
from ampcert.workloads.base import Budget, DataError, TorchTask, warmup_cosine
from ampcert.workloads.resnet_prep import (  # noqa: F401 - the workload's framework-free half, re-exported
    BUDGETS,
    EVAL_CHUNK,
    LARGE_INPUT,
    OPTIMIZERS,
    SIZES,
    Block,
    CropFlip,
    Layout,
    ResNetParams,
    ResNetPrepared,
    Size,
    initial_weights,
    layout,
    load_data,
    make_augment,
    normaliser,
)


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
