"""The gpt workload without a framework: what its torch and JAX networks are built from.

Params and their size defaults, the initial weights, the corpus and its
windows: everything :mod:`~ampcert.workloads.torch_models` and
:mod:`~ampcert.workloads.jax_models` need, so that they import this module and
never the workload object (:mod:`~ampcert.workloads.gpt`), which imports them
lazily, one way. See :mod:`ampcert.workloads.gpt` for the workload itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from ampcert.workloads import text
from ampcert.workloads.base import Prepared
from ampcert.workloads.init import Initialiser, Weights

VOCAB = 256
# Evaluation feeds at most this many tokens through the model at once, so the
# fp32 logits it keeps (tokens x 256 x 4 bytes, 32 MiB here) stay bounded.
EVAL_TOKENS_PER_CHUNK = 32_768
LR_FLOOR = 0.1
# 32 MiB of text: far more than the default corpus (about 2.7 MB), and enough
# for ``base`` to train for minutes without repeating itself much.
DEFAULT_MAX_BYTES = 32 * 2**20


@dataclass(frozen=True)
class SizeDefaults:
    n_layer: int
    d_model: int
    n_head: int
    seq_len: int
    batch_size: int
    lr: float          # AdamW peak learning rate
    sgd_lr: float      # SGD (momentum 0.9) peak learning rate
    warmup_steps: int
    max_steps: int
    eval_every: int
    eval_windows: int
    target: float      # bits/byte on the default corpus's eval split


SIZES: dict[str, SizeDefaults] = {
    # Measured on CPU through the backend (fp32, seeds 0-4, torch and JAX
    # alike): the target falls at step 200, 125, 150, 125, 125 of 600 (2.67,
    # 2.73, 2.63, 2.74, 2.73 bits/byte), so the cap leaves 3x margin. 2.75 is below a smoothed bigram model of the
    # corpus (2.78 on the eval split; unigram 4.0).
    "tiny": SizeDefaults(n_layer=2, d_model=64, n_head=4, seq_len=64, batch_size=32, lr=3e-3,
                         sgd_lr=0.03, warmup_steps=20, max_steps=600, eval_every=25,
                         eval_windows=256, target=2.75),
    # GPU sizes. Their targets are estimates, not yet measured on a GPU: a
    # 0.8 M-parameter model (4 x 128, 128-byte context) reaches 1.77 bits/byte
    # on CPU after 900 steps of 16 x 128 bytes (under one epoch), so these
    # 13x and 100x larger models, seeing 8x as many bytes per step, should
    # pass 1.6 and 1.5 within their first epochs, before they overfit 2.4 MB.
    "small": SizeDefaults(n_layer=6, d_model=384, n_head=6, seq_len=256, batch_size=64, lr=1e-3,
                          sgd_lr=0.03, warmup_steps=100, max_steps=3000, eval_every=100,
                          eval_windows=512, target=1.6),
    "base": SizeDefaults(n_layer=12, d_model=768, n_head=12, seq_len=256, batch_size=32, lr=6e-4,
                         sgd_lr=0.02, warmup_steps=200, max_steps=3000, eval_every=100,
                         eval_windows=512, target=1.5),
}


class GPTParams(BaseModel):
    """The workload's knobs. Fields left unset take the ``size``'s default;
    after validation every field is concrete, so a run's recorded params (and
    its id) name the actual shape and schedule it used."""

    model_config = ConfigDict(extra="forbid")

    size: Literal["tiny", "small", "base"] = "tiny"
    # Data: the stdlib corpus, or a local file/folder (`path`, required then).
    data: Literal["python-stdlib", "text"] = "python-stdlib"
    path: str | None = None
    extensions: list[str] = Field(default_factory=lambda: list(text.DEFAULT_EXTENSIONS))
    # Read at most this many bytes (the corpus is held as int64 on the device:
    # 8 bytes per byte); None reads everything.
    max_bytes: PositiveInt | None = DEFAULT_MAX_BYTES
    # Shape.
    n_layer: PositiveInt | None = None
    d_model: PositiveInt | None = None
    n_head: PositiveInt | None = None
    seq_len: PositiveInt | None = None
    dropout: float = Field(0.0, ge=0, lt=1)
    # Optimisation.
    batch_size: PositiveInt | None = None
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float | None = Field(None, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    momentum: float = Field(0.9, ge=0, lt=1)  # sgd only
    warmup_steps: NonNegativeInt | None = None
    max_steps: PositiveInt | None = None      # the schedule's length and the budget's cap
    eval_windows: PositiveInt | None = None

    @model_validator(mode="after")
    def _resolve(self) -> GPTParams:
        if self.data == "text" and not self.path:
            raise ValueError("data: text needs `path` (a text file, or a folder of them)")
        if self.data == "python-stdlib" and self.path is not None:
            raise ValueError("`path` applies to data: text; data: python-stdlib reads the stdlib")
        d = SIZES[self.size]
        for name in ("n_layer", "d_model", "n_head", "seq_len", "batch_size", "warmup_steps",
                     "max_steps", "eval_windows"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(d, name))
        if self.lr is None:
            self.lr = d.lr if self.optimizer == "adamw" else d.sgd_lr
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_head ({self.n_head})")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {list(self.betas)}")
        return self


# -- the model's starting point -----------------------------------------------------

INIT_STD = 0.02  # GPT-2's


def initial_weights(params: GPTParams, seed: int) -> Weights:
    """Every parameter of the model, keyed by torch name (``blocks.0.attn.qkv.weight``);
    the output head is the token embedding (tied), so it has no entry of its own."""
    d: int = params.d_model  # type: ignore[assignment]
    n_layer: int = params.n_layer  # type: ignore[assignment]
    residual_std = INIT_STD / math.sqrt(2 * n_layer)
    init = Initialiser(seed)
    init.normal("tok_emb.weight", (VOCAB, d), INIT_STD)
    init.normal("pos_emb.weight", (params.seq_len, d), INIT_STD)  # type: ignore[arg-type]
    for i in range(n_layer):
        b = f"blocks.{i}"
        init.layer_norm(f"{b}.ln1", d)
        init.layer_norm(f"{b}.ln2", d)
        for name, fan_in, fan_out, std in [(f"{b}.attn.qkv", d, 3 * d, INIT_STD),
                                           (f"{b}.attn.proj", d, d, residual_std),  # writes into the stream
                                           (f"{b}.mlp.fc", d, 4 * d, INIT_STD),
                                           (f"{b}.mlp.proj", 4 * d, d, residual_std)]:  # writes into the stream
            init.normal(f"{name}.weight", (fan_out, fan_in), std)
            init.constant(f"{name}.bias", (fan_out,), 0.0)
    init.layer_norm("ln_f", d)
    return init.weights



def load_corpus(params: GPTParams) -> text.Corpus:
    if params.data == "text":
        return text.load_text(params.path, params.max_bytes, params.extensions)
    return text.load_stdlib(params.max_bytes)


@dataclass
class GPTPrepared(Prepared):
    # The windows' bytes: torch makes its (device) views of them with unfold.
    windows: text.Windows | None = None

