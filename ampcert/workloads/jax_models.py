"""The standard workloads in JAX: the same networks, weights, data and optimizer as in torch.

A JAX run must certify the *same* workload as the torch run beside it, and a
JAX-only install has no torch, so both are built from one framework-free
:class:`~ampcert.workloads.base.Prepared` (the workload's ``prepare``):

- the initial weights are the workload's numpy ``initial_weights``, a dict of
  arrays keyed by the torch parameter names (``stages.0.conv1.weight``),
  BatchNorm running statistics a second dict; torch copies the very same
  arrays into its modules, so a seed's starting point is bit-identical in
  both frameworks (:mod:`ampcert.workloads.init` says which distributions);
- the forward pass is written in plain ``jax.numpy``/``jax.lax`` against
  those names, layer for layer (NCHW convolutions, BatchNorm with torch's
  momentum and unbiased running variance, pre-LN GPT blocks with a tied head),
  reading the network's shape from the workload (``resnet.Layout``, the GPT
  params), not from a torch model;
- the optimizer is the workload's (SGD with momentum and L2 weight decay, or
  AdamW; GPT decays matrices only) written with optax at learning rate 1, and
  the backend applies ``base_lr * lr_lambda(step - 1)`` per step, as torch's
  LambdaLR does;
- data, batch order and augmentation are shared too: the data are the
  Prepared's numpy arrays, both backends draw index batches and augmentation
  from :mod:`ampcert.workloads.rng`, and the augmentation is the workload's
  numpy one (torch applies the same draws on its device).

tests/workloads/test_jax_workloads.py checks the correspondence: identical initial
weights, and one forward pass and one optimizer step equal to torch's.

Plain JAX rather than flax: the parameter tree *is* the torch state dict, so
a reviewer can check the correspondence name by name, there is no second
initialisation scheme to keep in step, and ampcert's autocast works on any
traceable function, so a module system adds nothing. Dropout is not ported
(the shipped workloads train without it); a GPT with ``dropout > 0`` is
refused with a clear message.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from ampcert.workloads.base import HostData, Prepared

if TYPE_CHECKING:
    from ampcert.workloads.gpt_prep import GPTPrepared
    from ampcert.workloads.resnet_prep import ResNetPrepared

Params = dict[str, jax.Array]

BN_MOMENTUM = 0.1  # torch's default
BN_EPS = 1e-5
LN_EPS = 1e-5
ADAM_EPS = 1e-8  # torch's default
ADAM_BETAS = (0.9, 0.999)  # torch's default, where the workload names none


@dataclass
class JaxTask(HostData):
    """A workload ready for the JAX backend (what ``build_jax`` returns).

    ``apply(params, state, x, train) -> (logits, new_state)`` is the model;
    ``state`` holds non-trained buffers (BatchNorm running statistics), and may
    be empty. The optimizer is an optax transformation at learning rate 1: the
    backend scales its updates by ``base_lr * lr_lambda(step - 1)``. Data is in
    memory as numpy arrays; the backend draws index batches from
    :mod:`ampcert.workloads.rng`, in the same order as the torch backend for a
    seed, and ``augment(x, y, step)`` (numpy in, numpy out) must depend only on
    its inputs and the step.

    Or the training data streams: ``train_data`` (``train_x`` and ``train_y``
    None), an iterable of numpy ``(x, y)`` batches iterated afresh each epoch
    until the step budget is spent, or a callable ``epoch -> iterable`` of
    batches, as for :class:`~ampcert.workloads.base.TorchTask` (whose
    docstring says the rest: data time, samples, and that the loader, not
    ampcert, decides the order and its determinism). A batch of a new shape
    (a ragged last one) traces and compiles the step again, inside a timed
    step: a streamed JAX task had better yield full batches only.
    """

    params: Params
    state: dict[str, jax.Array]
    apply: Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
    loss_fn: Callable[[jax.Array, jax.Array], jax.Array]
    # (predict(x) -> logits, x, y) -> metric, evaluated on the host in chunks
    evaluate: Callable[[Callable[[np.ndarray], jax.Array], np.ndarray, np.ndarray], float]
    optimizer: optax.GradientTransformation
    base_lr: float
    train_x: np.ndarray | None  # None when train_data streams the training set
    train_y: np.ndarray | None
    # (eval_x, eval_y, batch_size, lr_lambda, augment, data_note, data_info: HostData's)
    info: dict[str, Any] = field(default_factory=dict)
    # Streamed training data instead of train_x/train_y: an iterable of (x, y)
    # numpy batches re-iterated each epoch, or a callable epoch -> iterable.
    train_data: Iterable[tuple[Any, Any]] | Callable[[int], Iterable[tuple[Any, Any]]] | None = None


# --------------------------------------------------------------------------- optimizer


def sgd_or_adamw(params: Any, decay_mask: Callable[[Params], Any] | None = None) -> optax.GradientTransformation:
    """The workloads' optimizer in optax, at learning rate 1 (the backend
    multiplies the updates by the scheduled rate, as torch's LambdaLR does):

    - SGD: L2 weight decay added to the gradient, then heavy-ball momentum,
      as ``torch.optim.SGD(momentum=m, weight_decay=wd)``;
    - AdamW: decoupled decay, ``p -= lr * (adam + wd * p)``, as ``torch.optim.AdamW``.

    ``decay_mask(params)`` picks the decayed parameters (GPT: matrices and
    embeddings only); None decays all of them."""
    wd = float(params.weight_decay)
    if params.optimizer == "adamw":
        b1, b2 = getattr(params, "betas", ADAM_BETAS)
        return optax.adamw(1.0, b1=b1, b2=b2, eps=ADAM_EPS, weight_decay=wd, mask=decay_mask)
    parts = [optax.add_decayed_weights(wd, mask=decay_mask)] if wd else []
    parts.append(optax.sgd(1.0, momentum=params.momentum or None))
    return optax.chain(*parts)


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


def resnet_task(prepared: ResNetPrepared) -> JaxTask:
    """The resnet workload's network (a ``resnet.Layout``) in JAX."""
    from ampcert.workloads.resnet_prep import EVAL_CHUNK

    net = prepared.layout
    assert net is not None
    blocks = [(b.name, b.stride, b.projected) for b in net.blocks]

    def apply(p, s, x, train: bool):
        new_s: dict[str, jax.Array] = {}
        x = conv2d(x, p["stem.0.weight"], net.stem_stride, net.stem_padding)
        x, ns = batch_norm(x, p, s, "stem.1", train)
        new_s |= ns
        x = jax.nn.relu(x)
        if net.imagenet_stem:
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
        correct = 0
        for i in range(0, len(x), EVAL_CHUNK):
            logits = np.asarray(predict(x[i:i + EVAL_CHUNK]))
            correct += int((logits.argmax(axis=1) == y[i:i + EVAL_CHUNK]).sum())
        return correct / len(x)

    return _task(prepared, apply, evaluate, sgd_or_adamw(prepared.params))


# --------------------------------------------------------------------------- gpt


def gpt_task(prepared: GPTPrepared) -> JaxTask:
    """The gpt workload's network (shape from its params) in JAX."""
    from ampcert.workloads import gpt_prep

    params = prepared.params
    if params.dropout > 0:
        raise ValueError("dropout > 0 is not ported to the JAX GPT; use dropout: 0")
    n_layer, n_head = params.n_layer, params.n_head

    def attention(x, p, name):
        # Named, so the precision disclosure can find attention in the jaxpr
        # (ampcert.backends.jax_precision); a name changes nothing computed.
        with jax.named_scope("attention"):
            return _attention(x, p, name)

    def _attention(x, p, name):
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
        rows = max(1, gpt_prep.EVAL_TOKENS_PER_CHUNK // max(1, x.shape[1]))
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

    def matrices(tree):  # decayed: matrices and embeddings, not biases or LayerNorm gains
        return jax.tree_util.tree_map(lambda a: a.ndim >= 2, tree)

    return _task(prepared, apply, evaluate, sgd_or_adamw(params, decay_mask=matrices))


# --------------------------------------------------------------------------- common


def _task(prepared: Prepared, apply, evaluate, optimizer: optax.GradientTransformation) -> JaxTask:
    weights = prepared.weights
    params = {n: jnp.asarray(a) for n, a in weights.params.items()}
    state = {n: jnp.asarray(a) for n, a in weights.buffers.items()}
    return JaxTask(params=params, state=state, apply=apply, loss_fn=cross_entropy, evaluate=evaluate,
                   optimizer=optimizer, base_lr=float(prepared.params.lr),
                   train_x=prepared.train_x, train_y=prepared.train_y,
                   eval_x=prepared.eval_x, eval_y=prepared.eval_y,
                   batch_size=prepared.batch_size, lr_lambda=prepared.lr_lambda, augment=prepared.augment,
                   data_note=prepared.data_note, data_info=prepared.data_info,
                   info={"parameters": weights.count()})
