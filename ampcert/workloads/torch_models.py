"""The built-in workloads in PyTorch: their networks, metrics and TorchTasks.

The workload modules (:mod:`~ampcert.workloads.resnet`, ``gpt``, ``digits``,
``numerics``) are framework-free: they prepare data, initial weights and
schedules as numpy (:class:`~ampcert.workloads.base.Prepared`). This module
turns a Prepared into a :class:`~ampcert.workloads.base.TorchTask`: it builds
the network, copies the initial weights in by name (:func:`load_weights`),
makes device tensors of the data, and supplies the optimizer, loss and metric.
:mod:`~ampcert.workloads.jax_models` does the same for JAX from the same
Prepared, so the two frameworks train the same workload from the same bits.
Both import the workloads' framework-free halves (:mod:`~ampcert.workloads.gpt_prep`,
:mod:`~ampcert.workloads.resnet_prep`), never the workload objects, which import
them lazily: the imports run one way.

The modules here hold no initialisation of their own: whatever torch draws
when a module is constructed is overwritten by :func:`load_weights`, so the
numpy initialisers are the one place an initial distribution is written down.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ampcert.workloads import gpt_prep, resnet_prep
from ampcert.workloads.base import Prepared, TorchTask
from ampcert.workloads.init import Weights


def load_weights(model: nn.Module, weights: Weights) -> nn.Module:
    """Copy ``weights`` into ``model``'s parameters and buffers, by name.

    Every parameter and buffer (BatchNorm's ``num_batches_tracked`` counter
    aside, which starts at 0 anyway) must have exactly one entry of the same
    shape: a mismatch means the numpy description of the network and this
    module disagree, which would silently unpair torch and JAX runs, so it is
    an error. Tied parameters (GPT's head) appear once and are set once."""
    params = dict(model.named_parameters())
    buffers = {n: b for n, b in model.named_buffers() if not n.endswith("num_batches_tracked")}
    with torch.no_grad():
        for kind, have, given in (("parameter", params, weights.params), ("buffer", buffers, weights.buffers)):
            if set(have) != set(given):
                missing, extra = sorted(set(have) - set(given)), sorted(set(given) - set(have))
                raise ValueError(f"initial weights do not fit {type(model).__name__}: {kind}s missing "
                                 f"{missing}, unexpected {extra}")
            for name, tensor in have.items():
                value = torch.from_numpy(given[name])
                if value.shape != tensor.shape:
                    raise ValueError(f"initial weights do not fit {type(model).__name__}: {name} is "
                                     f"{tuple(value.shape)}, the model's is {tuple(tensor.shape)}")
                tensor.copy_(value)
    return model


def parameter_count(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in model.parameters())


count_parameters = parameter_count


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy, fed in chunks of ``resnet_prep.EVAL_CHUNK`` to bound activation memory."""
    chunk = resnet_prep.EVAL_CHUNK
    correct = 0
    for i in range(0, len(x), chunk):
        logits = model(x[i:i + chunk])
        correct += int((logits.argmax(dim=1) == y[i:i + chunk]).sum())
    return correct / len(x)


def _sgd_or_adamw(params: Any, groups: Any, weight_decay: float) -> torch.optim.Optimizer:
    """The workloads' two optimizers: AdamW (torch's betas and eps unless the
    params say otherwise) or SGD with momentum and L2 weight decay."""
    if params.optimizer == "adamw":
        betas = tuple(getattr(params, "betas", (0.9, 0.999)))
        return torch.optim.AdamW(groups, lr=params.lr, betas=betas, weight_decay=weight_decay)
    return torch.optim.SGD(groups, lr=params.lr, momentum=params.momentum, weight_decay=weight_decay)


def _task(prepared: Prepared, model: nn.Module, device: str,
          make_optimizer: Callable[[Any], torch.optim.Optimizer],
          evaluate: Callable[[nn.Module, torch.Tensor, torch.Tensor], float],
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
          data: tuple[torch.Tensor, ...] | None = None,
          augment: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None) -> TorchTask:
    """A TorchTask from a Prepared and the torch pieces; ``data`` replaces the
    Prepared's arrays when the workload makes its own tensors (GPT's views)."""
    if data is None:
        data = tuple(torch.from_numpy(a).to(device)
                     for a in (prepared.train_x, prepared.train_y, prepared.eval_x, prepared.eval_y))
    train_x, train_y, eval_x, eval_y = data
    return TorchTask(
        model=load_weights(model, prepared.weights).to(device),
        train_x=train_x, train_y=train_y, eval_x=eval_x, eval_y=eval_y,
        batch_size=prepared.batch_size, loss_fn=loss_fn, make_optimizer=make_optimizer, evaluate=evaluate,
        data_note=prepared.data_note, lr_lambda=prepared.lr_lambda, augment=augment,
        data_info=prepared.data_info,
    )


# --------------------------------------------------------------------------- resnet


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with ReLU and a shortcut (identity, or a
    strided 1x1 conv-BN projection when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """The network a :class:`resnet.Layout` describes: stem, BasicBlocks,
    global mean pool (``AdaptiveAvgPool2d``'s CUDA backward is not
    deterministic), linear head."""

    def __init__(self, net: resnet_prep.Layout):
        super().__init__()
        conv = nn.Conv2d(net.in_channels, net.width, net.stem_kernel, stride=net.stem_stride,
                         padding=net.stem_padding, bias=False)
        stem: list[nn.Module] = [conv, nn.BatchNorm2d(net.width), nn.ReLU()]
        if net.imagenet_stem:
            stem.append(nn.MaxPool2d(3, stride=2, padding=1))
        self.stem = nn.Sequential(*stem)
        self.stages = nn.Sequential(*(BasicBlock(b.cin, b.cout, b.stride) for b in net.blocks))
        self.head = nn.Linear(net.features, net.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


def build_model(params: resnet_prep.ResNetParams, classes: int, in_channels: int, image_size: int,
                seed: int = 0) -> ResNet:
    """A ResNet for these params and inputs, at the workload's initial weights for ``seed``."""
    net = resnet_prep.layout(params, classes, in_channels, image_size)
    return load_weights(ResNet(net), resnet_prep.initial_weights(net, seed))  # type: ignore[return-value]


@dataclass(frozen=True)
class TorchCropFlip:
    """:class:`resnet.CropFlip` on torch tensors: the same numpy draws, the
    pixels moved by torch ops on the batch's own device (no host round trip),
    so the result equals the numpy version's bit for bit."""

    crop: resnet_prep.CropFlip

    def __call__(self, x: torch.Tensor, y: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        n, c, h, w = x.shape
        oy, ox, flips = (torch.from_numpy(a).to(x.device) for a in self.crop.draws(step, n))
        pad = self.crop.pad
        if pad > 0:
            xp = F.pad(x, (pad, pad, pad, pad))
            rows = oy[:, None] + torch.arange(h, device=x.device)  # (n, h)
            cols = ox[:, None] + torch.arange(w, device=x.device)  # (n, w)
            xp = xp.gather(2, rows[:, None, :, None].expand(n, c, h, w + 2 * pad))
            x = xp.gather(3, cols[:, None, None, :].expand(n, c, h, w))
        if self.crop.flip:
            x = torch.where(flips[:, None, None, None], x.flip(3), x)
        return x, y


def resnet_task(prepared: resnet_prep.ResNetPrepared, device: str) -> TorchTask:
    params = prepared.params

    def make_optimizer(parameters):
        return _sgd_or_adamw(params, parameters, params.weight_decay)

    assert prepared.layout is not None
    crop = prepared.augment
    return _task(prepared, ResNet(prepared.layout), device, make_optimizer, accuracy,
                 augment=TorchCropFlip(crop) if isinstance(crop, resnet_prep.CropFlip) else None)


# --------------------------------------------------------------------------- gpt


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)  # writes into the residual stream
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.proj = nn.Linear(4 * d_model, d_model)  # writes into the residual stream
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Pre-LN: normalise the input of each sub-layer, add its output to the stream."""

    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Bytes (B, T) int64 in, next-byte logits (B, T, 256) out. Its weights
    come from ``gpt.initial_weights`` (:func:`gpt_model`)."""

    def __init__(self, n_layer: int, d_model: int, n_head: int, seq_len: int, dropout: float = 0.0):
        super().__init__()
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(gpt_prep.VOCAB, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, gpt_prep.VOCAB, bias=False)
        self.head.weight = self.tok_emb.weight  # tied: one (256, d_model) matrix

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.seq_len:
            raise ValueError(f"sequence of {T} bytes is longer than the model's context ({self.seq_len})")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt_model(params: gpt_prep.GPTParams, seed: int = 0) -> GPT:
    """The GPT these params describe, at the workload's initial weights for ``seed``."""
    model = GPT(params.n_layer, params.d_model, params.n_head, params.seq_len, params.dropout)  # type: ignore[arg-type]
    return load_weights(model, gpt_prep.initial_weights(params, seed))  # type: ignore[return-value]


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy (nats) over all B*T positions. Its
    precision is left to the run's autocast policy: that is under test."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def bits_per_byte(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean next-byte cross-entropy over every position of ``(x, y)``, in bits.

    The model runs in whatever precision the caller set up (autocast), but
    the per-byte cross-entropy is computed in fp32 from the logits and summed
    in fp64, so the metric itself does not round differently between
    precisions (or between chunkings).
    Windows are fed in chunks of at most ``gpt_prep.EVAL_TOKENS_PER_CHUNK`` tokens."""
    rows = max(1, gpt_prep.EVAL_TOKENS_PER_CHUNK // max(1, x.shape[1]))
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for i in range(0, len(x), rows):
        logits = model(x[i:i + rows]).float()
        nats = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y[i:i + rows].reshape(-1), reduction="none"
        )
        total += nats.double().sum()
    return float(total) / y.numel() / math.log(2)


def gpt_task(prepared: gpt_prep.GPTPrepared, device: str) -> TorchTask:
    params, win = prepared.params, prepared.windows
    assert win is not None

    def make_optimizer(parameters):
        # Decay matrices and embeddings only, not biases or LayerNorm gains (GPT-2, nanoGPT).
        parameters = list(parameters)
        groups = [{"params": [p for p in parameters if p.dim() >= 2], "weight_decay": params.weight_decay},
                  {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}]
        return _sgd_or_adamw(params, groups, 0.0)

    # The corpus goes to the device once; every training window is a view of it.
    train = torch.from_numpy(win.train_bytes).to(device)
    data = (train[:-1].unfold(0, win.seq_len, 1), train[1:].unfold(0, win.seq_len, 1),
            torch.from_numpy(win.eval_x).to(device), torch.from_numpy(win.eval_y).to(device))
    model = GPT(params.n_layer, params.d_model, params.n_head, params.seq_len, params.dropout)
    return _task(prepared, model, device, make_optimizer, bits_per_byte, loss_fn=loss_fn, data=data)


# --------------------------------------------------------------------------- digits and numerics


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


def digits_task(prepared: Prepared, device: str) -> TorchTask:
    params = prepared.params

    def make_optimizer(parameters):
        return _sgd_or_adamw(params, parameters, params.weight_decay)

    return _task(prepared, DigitsCNN(params.width, params.hidden), device, make_optimizer, accuracy)


def underflow_task(prepared: Prepared, device: str) -> TorchTask:
    """Loss times ``loss_gain``, learning rate divided by it (see numerics)."""
    params = prepared.params
    gain = params.loss_gain
    model = nn.Sequential(nn.Linear(64, params.hidden), nn.ReLU(), nn.Linear(params.hidden, 10))

    def scaled_loss(logits, y):
        return F.cross_entropy(logits, y) * gain

    def make_optimizer(parameters):
        return torch.optim.SGD(parameters, lr=params.lr / gain, momentum=params.momentum)

    return _task(prepared, model, device, make_optimizer, accuracy, loss_fn=scaled_loss)


class OffsetLinear(nn.Linear):
    """A Linear layer whose stored weight is the used one plus ``offset``, subtracted in
    the forward (see numerics, ``stagnation``): the same function, stored where bf16's
    step is coarse."""

    def __init__(self, in_features: int, out_features: int, offset: float) -> None:
        super().__init__(in_features, out_features)
        self.offset = offset  # a constant, not a tensor: a dtype change of the model leaves it exact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight - self.offset, self.bias)


def stagnation_task(prepared: Prepared, device: str) -> TorchTask:
    params = prepared.params
    offset = params.weight_offset
    model = nn.Sequential(OffsetLinear(64, params.hidden, offset), nn.ReLU(), OffsetLinear(params.hidden, 10, offset))

    def make_optimizer(parameters):
        return torch.optim.SGD(parameters, lr=params.lr, momentum=params.momentum)

    return _task(prepared, model, device, make_optimizer, accuracy)


def overflow_task(prepared: Prepared, device: str) -> TorchTask:
    params = prepared.params
    model = nn.Sequential(nn.Linear(64, params.hidden), nn.LayerNorm(params.hidden), nn.ReLU(),
                          nn.Linear(params.hidden, 10))

    def make_optimizer(parameters):
        return torch.optim.SGD(parameters, lr=params.lr, momentum=params.momentum)

    return _task(prepared, model, device, make_optimizer, accuracy)
