"""A GPT-style byte-level language model: the transformer workload.

Mixed precision is hardest on transformers: attention logits, softmax,
LayerNorm statistics and a large-vocabulary cross-entropy are where fp16
overflows and bf16 loses digits. This workload trains a small decoder-only
transformer (the GPT-2 recipe) on raw bytes, so it needs no tokenizer and no
download, and it is judged by **bits per byte** on held-out text (lower is
better): the mean next-byte cross-entropy in nats divided by ln 2. A model
that knows nothing scores 8 (all 256 bytes equally likely); a byte-frequency
(unigram) model scores 4-5 on English or Python source (4.0 on the default
corpus's eval split, a smoothed bigram model 2.8); good models of code and
prose reach 1-2.

The model
    token embedding (256 bytes) + learned position embedding, then
    ``n_layer`` pre-LayerNorm blocks, each::

        x = x + Attention(LayerNorm(x))   # causal, F.scaled_dot_product_attention
        x = x + MLP(LayerNorm(x))         # Linear(d, 4d) -> GELU -> Linear(4d, d)

    then a final LayerNorm and an output head that *shares* the token
    embedding matrix (weight tying: byte ``b``'s logit is the dot product of
    the final state with ``b``'s embedding). Initialisation follows GPT-2:
    weights ~ N(0, 0.02), biases 0, LayerNorm gains 1, and the two
    projections that write into the residual stream per block scaled by
    1/sqrt(2 * n_layer), so the stream's variance does not grow with depth.
    :func:`initial_weights` draws them with numpy, so the torch and the JAX
    model of a seed start from the same bits.

The data
    See :mod:`ampcert.workloads.text`: by default a fixed list of text-rich
    Python standard-library sources (about 2.7 MB on CPython 3.11), or any
    local file or folder (``data: text``, ``path: ...``). The first 90% of the
    bytes train, the last 10% evaluate. The split does not move with the seed;
    the seed moves the initial weights and the batch order (both from
    :mod:`ampcert.workloads.rng`, the same in torch and JAX).

Sizes (``size:``; any field given explicitly overrides the size's default)

    ======  =======  =======  ======  =======  =====  ======  =========  ======  ==========
    size    n_layer  d_model  n_head  seq_len  batch  lr      max_steps  target  parameters
    ======  =======  =======  ======  =======  =====  ======  =========  ======  ==========
    tiny    2        64       4       64       32     3e-3    600        2.75    0.12 M
    small   6        384      6       256      64     1e-3    3000       1.6     10.8 M
    base    12       768      12      256      32     6e-4    3000       1.5     85.4 M
    ======  =======  =======  ======  =======  =====  ======  =========  ======  ==========

    ``tiny`` is the CPU size: in fp32 it reaches its target (measured, seeds
    0-4) at step 125-200 of 600, 5-8 s on two idle cores (~770
    sequences/s; ~540 on one). ``small`` is nanoGPT's "baby
    GPT" shape and ``base`` is GPT-2 small's shape (12 x 768) with a 256-byte
    context; both are meant for a GPU, where they should reach their targets
    in minutes. Their targets are estimates (see SIZES), not GPU
    measurements. Targets are for the default corpus; on your own text give
    the suite an explicit ``train:`` budget.

The learning rate warms up linearly for ``warmup_steps``, then follows a
cosine from the peak down to 0.1x at ``max_steps`` (and stays there). AdamW
decays only matrices and embeddings (``p.dim() >= 2``), not biases or
LayerNorm gains, as GPT-2 and nanoGPT do.

This module is framework-free (numpy). Params, sizes, the corpus, the windows
and the initial weights live in :mod:`~ampcert.workloads.gpt_prep` (and are
re-exported here), which is what the models import; ``build`` / ``build_jax``
import torch or JAX only to make the model
(:mod:`~ampcert.workloads.torch_models`, :mod:`~ampcert.workloads.jax_models`),
so the imports run one way: workload -> models -> gpt_prep.
"""

from __future__ import annotations

from typing import Any

from ampcert.workloads import text
from ampcert.workloads.base import Budget, TorchTask, warmup_cosine
from ampcert.workloads.gpt_prep import (  # noqa: F401 - the workload's framework-free half, re-exported
    DEFAULT_MAX_BYTES,
    EVAL_TOKENS_PER_CHUNK,
    INIT_STD,
    LR_FLOOR,
    SIZES,
    VOCAB,
    GPTParams,
    GPTPrepared,
    SizeDefaults,
    initial_weights,
    load_corpus,
)


class GPTWorkload:
    name = "gpt"
    summary = "GPT-style byte-level transformer language model (stdlib text or local files, offline)"
    metric = "bits_per_byte"
    higher_is_better = False
    Params = GPTParams

    def check(self, params: GPTParams) -> None:
        """Plan-time data validation from file sizes alone; raises DataError."""
        if params.data == "text":
            text.check_text(params.path, params.seq_len, params.max_bytes, params.extensions)
        else:
            text.check_stdlib(params.seq_len, params.max_bytes)

    def default_budget(self, params: GPTParams) -> Budget:
        """The size's target (bits/byte on the default corpus; on your own
        text give the suite a ``train:`` budget instead) with ``max_steps``."""
        d = SIZES[params.size]
        return Budget(target=d.target, max_steps=params.max_steps, eval_every=d.eval_every)

    def prepare(self, params: GPTParams, seed: int) -> GPTPrepared:
        """Corpus, windows, initial weights and schedule: all that the torch
        and the JAX task share."""
        self.check(params)  # the same one-line DataError as at plan time
        corpus = load_corpus(params)
        win = text.make_windows(corpus.data, params.seq_len, params.eval_windows, corpus.root)  # type: ignore[arg-type]
        n_train = len(win.train_x)
        info = corpus.info()
        info.update(n_train_windows=n_train, n_eval_windows=len(win.eval_x),
                    n_train_bytes=win.n_train_bytes, n_eval_bytes=win.n_eval_bytes,
                    seq_len=params.seq_len)
        return GPTPrepared(
            params=params, weights=initial_weights(params, seed), windows=win,
            train_x=win.train_x, train_y=win.train_y, eval_x=win.eval_x, eval_y=win.eval_y,
            batch_size=params.batch_size,  # type: ignore[arg-type]
            lr_lambda=warmup_cosine(params.warmup_steps, params.max_steps, LR_FLOOR),  # type: ignore[arg-type]
            data_note=(
                f"{corpus.source}: {len(corpus.data)} bytes from {len(corpus.files)} files"
                f"{' (cut at max_bytes)' if corpus.capped else ''}, "
                f"sha256 {corpus.sha256[:12]}; {n_train} train windows (every offset of "
                f"the first 90%) / {len(win.eval_x)} eval windows of {params.seq_len} bytes"
            ),
            data_info=info,
        )

    def build(self, params: GPTParams, seed: int, device: str) -> TorchTask:
        from ampcert.workloads import torch_models

        return torch_models.gpt_task(self.prepare(params, seed), device)

    def build_jax(self, params: GPTParams, seed: int, device: str):
        """The same task for the JAX backend, from the same :meth:`prepare`."""
        from ampcert.workloads import jax_models

        return jax_models.gpt_task(self.prepare(params, seed))


Params = GPTParams
WORKLOAD = GPTWorkload()

# The torch network lives in torch_models; these names load it on first use.
_TORCH_NAMES = ("GPT", "Block", "MLP", "CausalSelfAttention", "count_parameters", "loss_fn", "bits_per_byte")


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        from ampcert.workloads import torch_models

        return getattr(torch_models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
