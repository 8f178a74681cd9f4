"""The standard workloads in JAX: the same networks, weights, data and optimizer as in torch.

A JAX run must certify the *same* workload as the torch run beside it, so
nothing here is re-invented: the torch task is built first (with the run's
seed, so the initial weights follow it), and then

- its weights become a dict of ``jnp`` arrays keyed by the torch parameter
  names (``stages.0.conv1.weight``), BatchNorm running statistics a second
  dict, so the initial weights are not only from the same distribution but
  bit-identical;
- the forward pass is written in plain ``jax.numpy``/``jax.lax`` against
  those names, layer for layer (NCHW convolutions, BatchNorm with torch's
  momentum and unbiased running variance, pre-LN GPT blocks with a tied head);
- the optimizer is read off the torch optimizer's parameter groups (type,
  learning rate, momentum, betas, eps, weight decay) and rebuilt with optax,
  with the learning-rate multiplier of the torch schedule applied per step;
- data, batch order and augmentation are the torch task's own (the backend
  draws the same index batches), converted to arrays per batch.

Plain JAX rather than flax: the parameter tree *is* the torch state dict, so
a reviewer can check the correspondence name by name, there is no second
initialisation scheme to keep in step, and ampcert's autocast works on any
traceable function, so a module system adds nothing. Dropout is not ported
(the shipped workloads train without it); a GPT with ``dropout > 0`` is
refused with a clear message.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from ampcert.workloads.base import TorchTask

Params = dict[str, jax.Array]

BN_MOMENTUM = 0.1  # torch's default
BN_EPS = 1e-5
LN_EPS = 1e-5


@dataclass
class JaxTask:
    """A workload ready for the JAX backend (what ``build_jax`` returns).

    ``apply(params, state, x, train) -> (logits, new_state)`` is the model;
    ``state`` holds non-trained buffers (BatchNorm running statistics), and may
    be empty. The optimizer is an optax transformation at learning rate 1: the
    backend scales its updates by ``base_lr * lr_lambda(step - 1)``. Data is in
    memory as numpy arrays; the backend draws index batches in the same order
    as the torch backend for a seed, and ``augment(x, y, step)`` (numpy in,
    numpy out) must depend only on its inputs and the step.
    """

    params: Params
    state: dict[str, jax.Array]
    apply: Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array]
    # (predict(x) -> logits, x, y) -> metric, evaluated on the host in chunks
    evaluate: Callable[[Callable[[np.ndarray], jax.Array], np.ndarray, np.ndarray], float]
    optimizer: optax.GradientTransformation
    base_lr: float
    train_x: np.ndarray
    train_y: np.ndarray
    eval_x: np.ndarray
    eval_y: np.ndarray
    batch_size: int
    lr_lambda: Callable[[int], float] | None = None
    augment: Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]] | None = None
    data_note: str = ""
    data_info: dict[str, Any] = field(default_factory=dict)
    # The torch twin this task was converted from, for the built-in workloads.
    torch_task: TorchTask | None = None
    info: dict[str, Any] = field(default_factory=dict)


def to_jax(tensor) -> jax.Array:
    return jnp.asarray(tensor.detach().cpu().numpy())


# --------------------------------------------------------------------------- optimizer


def optimizer_from_torch(optimizer, names: dict[int, str]) -> tuple[optax.GradientTransformation, float]:
    """An optax transformation equal to ``optimizer`` (torch SGD with momentum
    and L2 weight decay, or AdamW) at learning rate 1, per parameter group,
    and the groups' common base learning rate (the caller multiplies updates
    by ``base_lr * schedule(step)``, as torch's LambdaLR does)."""
    import torch

    kind = type(optimizer)
    lrs = {g["lr"] for g in optimizer.param_groups}
    if len(lrs) != 1:
        raise ValueError(f"parameter groups with different learning rates ({sorted(lrs)}) are not ported to JAX")
    transforms: dict[str, optax.GradientTransformation] = {}
    labels: dict[str, str] = {}
    for i, group in enumerate(optimizer.param_groups):
        wd = float(group.get("weight_decay", 0.0))
        if kind is torch.optim.SGD:
            if group.get("nesterov") or group.get("dampening", 0.0):
                raise ValueError("SGD with nesterov or dampening is not ported to JAX")
            parts = [optax.add_decayed_weights(wd)] if wd else []
            parts.append(optax.sgd(1.0, momentum=group["momentum"] or None))
            tx = optax.chain(*parts)
        elif kind is torch.optim.AdamW:
            b1, b2 = group["betas"]
            tx = optax.adamw(1.0, b1=b1, b2=b2, eps=group["eps"], weight_decay=wd)
        elif kind is torch.optim.Adam and not wd:
            b1, b2 = group["betas"]
            tx = optax.adam(1.0, b1=b1, b2=b2, eps=group["eps"])
        else:
            raise ValueError(f"optimizer {kind.__name__} (with these settings) is not ported to JAX")
        transforms[f"group{i}"] = tx
        for p in group["params"]:
            labels[names[id(p)]] = f"group{i}"
    return optax.multi_transform(transforms, labels), lrs.pop()


# --------------------------------------------------------------------------- layers


def conv2d(x, w, stride: int, padding: int):
    return lax.conv_general_dilated(x, w, (stride, stride), [(padding, padding)] * 2,
                                    dimension_numbers=("NCHW", "OIHW", "NCHW"))


def batch_norm(x, p: Params, s: dict, name: str, train: bool):
    """torch.nn.BatchNorm2d: batch statistics in training (biased variance for
    normalising, unbiased for the running estimate), running ones in eval."""
    w, b = p[f"{name}.weight"], p[f"{name}.bias"]
    shape = (1, -1, 1, 1)
    if train:
        mean = jnp.mean(x, axis=(0, 2, 3))
        var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=(0, 2, 3))
        n = x.shape[0] * x.shape[2] * x.shape[3]
        new = {
            f"{name}.running_mean": (1 - BN_MOMENTUM) * s[f"{name}.running_mean"]
            + BN_MOMENTUM * lax.stop_gradient(mean).astype(jnp.float32),
            f"{name}.running_var": (1 - BN_MOMENTUM) * s[f"{name}.running_var"]
            + BN_MOMENTUM * lax.stop_gradient(var).astype(jnp.float32) * (n / max(n - 1, 1)),
        }
    else:
        mean, var, new = s[f"{name}.running_mean"], s[f"{name}.running_var"], {}
    y = (x - mean.reshape(shape)) * lax.rsqrt(var.reshape(shape) + BN_EPS)
    return y * w.reshape(shape) + b.reshape(shape), new


def layer_norm(x, p: Params, name: str):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + LN_EPS) * p[f"{name}.weight"] + p[f"{name}.bias"]


def linear(x, p: Params, name: str, bias: bool = True):
    y = x @ p[f"{name}.weight"].T
    return y + p[f"{name}.bias"] if bias else y


def cross_entropy(logits, y):
    """Mean cross-entropy (nats) of integer targets, like F.cross_entropy."""
    logits = logits.reshape(-1, logits.shape[-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y.reshape(-1, 1), axis=-1))


# --------------------------------------------------------------------------- resnet


def resnet_from_torch(task: TorchTask) -> JaxTask:
    from torch import nn

    from ampcert.workloads.resnet import BasicBlock, ResNet

    model = task.model
    if not isinstance(model, ResNet):
        raise TypeError(f"expected the resnet workload's ResNet, got {type(model).__name__}")
    imagenet_stem = len(model.stem) == 4
    stem_stride = model.stem[0].stride[0]
    stem_pad = model.stem[0].padding[0]
    blocks = []
    for i, block in enumerate(model.stages):
        assert isinstance(block, BasicBlock)
        blocks.append((f"stages.{i}", block.conv1.stride[0], not isinstance(block.shortcut, nn.Identity)))

    def apply(p, s, x, train: bool):
        new_s: dict[str, jax.Array] = {}
        x = conv2d(x, p["stem.0.weight"], stem_stride, stem_pad)
        x, ns = batch_norm(x, p, s, "stem.1", train)
        new_s |= ns
        x = jax.nn.relu(x)
        if imagenet_stem:
            x = lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2),
                                  [(0, 0), (0, 0), (1, 1), (1, 1)])
        for name, stride, projected in blocks:
            out = conv2d(x, p[f"{name}.conv1.weight"], stride, 1)
            out, ns = batch_norm(out, p, s, f"{name}.bn1", train)
            new_s |= ns
            out = jax.nn.relu(out)
            out = conv2d(out, p[f"{name}.conv2.weight"], 1, 1)
            out, ns = batch_norm(out, p, s, f"{name}.bn2", train)
            new_s |= ns
            short = x
            if projected:
                short = conv2d(x, p[f"{name}.shortcut.0.weight"], stride, 0)
                short, ns = batch_norm(short, p, s, f"{name}.shortcut.1", train)
                new_s |= ns
            x = jax.nn.relu(out + short)
        logits = linear(jnp.mean(x, axis=(2, 3)), p, "head")
        return logits, ({**s, **new_s} if train else s)

    def evaluate(predict, x, y) -> float:
        from ampcert.workloads.resnet import EVAL_CHUNK

        correct = 0
        for i in range(0, len(x), EVAL_CHUNK):
            logits = np.asarray(predict(x[i:i + EVAL_CHUNK]))
            correct += int((logits.argmax(axis=1) == y[i:i + EVAL_CHUNK]).sum())
        return correct / len(x)

    return _task(task, apply, evaluate)


# --------------------------------------------------------------------------- gpt


def gpt_from_torch(task: TorchTask) -> JaxTask:
    from ampcert.workloads.gpt import EVAL_TOKENS_PER_CHUNK, GPT

    model = task.model
    if not isinstance(model, GPT):
        raise TypeError(f"expected the gpt workload's GPT, got {type(model).__name__}")
    if model.drop.p > 0:
        raise ValueError("dropout > 0 is not ported to the JAX GPT; use dropout: 0")
    n_layer, n_head = len(model.blocks), model.blocks[0].attn.n_head

    def attention(x, p, name):
        B, T, C = x.shape
        qkv = linear(x, p, f"{name}.qkv")
        q, k, v = (t.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)
                   for t in jnp.split(qkv, 3, axis=-1))
        scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(C // n_head))
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))
        scores = jnp.where(causal, scores, -jnp.inf)
        y = jax.nn.softmax(scores, axis=-1) @ v
        return linear(y.transpose(0, 2, 1, 3).reshape(B, T, C), p, f"{name}.proj")

    def apply(p, s, idx, train: bool):
        T = idx.shape[1]
        x = p["tok_emb.weight"][idx] + p["pos_emb.weight"][:T]
        for i in range(n_layer):
            b = f"blocks.{i}"
            x = x + attention(layer_norm(x, p, f"{b}.ln1"), p, f"{b}.attn")
            h = jax.nn.gelu(linear(layer_norm(x, p, f"{b}.ln2"), p, f"{b}.mlp.fc"), approximate=True)
            x = x + linear(h, p, f"{b}.mlp.proj")
        x = layer_norm(x, p, "ln_f")
        return x @ p["tok_emb.weight"].T, s  # the head is tied to the embedding

    def evaluate(predict, x, y) -> float:
        rows = max(1, EVAL_TOKENS_PER_CHUNK // max(1, x.shape[1]))
        total = 0.0
        for i in range(0, len(x), rows):
            logits = np.asarray(predict(x[i:i + rows])).astype(np.float32)
            logits = logits.reshape(-1, logits.shape[-1])
            # log-sum-exp in float64 on the host: the metric rounds the same in every precision
            m = logits.max(axis=1, keepdims=True).astype(np.float64)
            lse = np.log(np.exp(logits - m).sum(axis=1, keepdims=True)) + m
            target = np.take_along_axis(logits, y[i:i + rows].reshape(-1, 1), axis=1)
            total += float((lse - target).sum())
        return total / y.size / math.log(2)

    return _task(task, apply, evaluate)


# --------------------------------------------------------------------------- common


def _task(task: TorchTask, apply, evaluate) -> JaxTask:
    model = task.model
    named = dict(model.named_parameters())  # tied weights appear once
    names = {id(t): n for n, t in named.items()}
    params = {n: to_jax(t) for n, t in named.items()}
    state = {n: to_jax(t) for n, t in model.named_buffers() if not n.endswith("num_batches_tracked")}
    optimizer, base_lr = optimizer_from_torch(task.make_optimizer(model.parameters()), names)
    augment = None
    if task.augment is not None:
        import torch

        torch_augment = task.augment

        def augment(x, y, step):  # the torch twin's own augmentation, on numpy batches
            ax, ay = torch_augment(torch.from_numpy(x), torch.from_numpy(y), step)
            return ax.numpy(), ay.numpy()

    return JaxTask(params=params, state=state, apply=apply, loss_fn=cross_entropy, evaluate=evaluate,
                   optimizer=optimizer, base_lr=base_lr,
                   train_x=task.train_x.cpu().numpy(), train_y=task.train_y.cpu().numpy(),
                   eval_x=task.eval_x.cpu().numpy(), eval_y=task.eval_y.cpu().numpy(),
                   batch_size=task.batch_size, lr_lambda=task.lr_lambda, augment=augment,
                   data_note=task.data_note, data_info=task.data_info, torch_task=task,
                   info={"parameters": int(sum(np.prod(v.shape) for v in params.values()))})


CONVERTERS: dict[str, Callable[[TorchTask], JaxTask]] = {"resnet": resnet_from_torch, "gpt": gpt_from_torch}
