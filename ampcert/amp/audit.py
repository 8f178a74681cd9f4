"""Audit ampcert's autocast against native ``torch.autocast``, op by op.

For every op of a policy the audit builds small real inputs (``SAMPLES``: one or
more builders per op, each calling a *public* entry point such as ``F.pad(...,
mode="reflect")`` for ``reflection_pad2d``), then runs each builder under
``ampcert.amp.autocast`` and under ``torch.autocast`` in three input scenarios:

``f32``  every floating input is float32;
``low``  every floating input is the autocast dtype (bf16/fp16);
``mix``  the first floating input is float32, the others low precision
         (only for builders with two or more floating inputs).

A row agrees when, for every builder and scenario, both runs give the same
output dtypes (or both raise the same exception type) *and* the same values,
bit for bit. Ops without a builder are reported with ``agree=False`` and the
note ``"no sample inputs"``: they are never dropped.

Torch versions: the shipped policies and :data:`NATIVE_REFERENCE` cover the whole
supported range (torch 2.11 to 2.14). An op that the installed torch lacks
(:data:`~ampcert.amp.torch_autocast.OP_TORCH_VERSIONS`: ``cholesky`` and ``qr`` are
gone in 2.14, ``linalg_matrix_sqrth`` is new there) agrees when neither engine can
run it (its builder fails, or both raise in every scenario), with a note naming
the release; one that runs anyway is a disagreement, as the table is then wrong.

:func:`probe_native` is the helper used to derive ``configs/policies/torch-cpu.yaml``:
it classifies what native autocast does to an op by comparing a native
autocast run with a run without autocast.

Standalone: imports torch, the standard library and sibling modules only.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .policy import FAMILIES, OpPolicy, load_policy, shipped_policy
from .torch_autocast import OP_TORCH_VERSIONS, autocast, op_in_torch, torch_version

__all__ = [
    "AuditRow",
    "SAMPLES",
    "audit_torch",
    "coverage",
    "format_coverage",
    "format_table",
    "probe_native",
    "sample_ops",
]

_SHORT = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.complex64: "c64", torch.complex128: "c128", torch.complex32: "c32", torch.int64: "i64",
    torch.int32: "i32", torch.bool: "bool", torch.uint8: "u8",
}


@dataclass(frozen=True)
class AuditRow:
    op: str
    family: str
    ampcert_dtype: str
    native_dtype: str
    agree: bool
    note: str = ""


# ---------------------------------------------------------------------------
# sample inputs
# ---------------------------------------------------------------------------
class Inputs:
    """Tensor factory handed to sample builders; the scenario decides float dtypes."""

    def __init__(self, scenario: str, low: torch.dtype, device: str, seed: int = 0) -> None:
        self.scenario = scenario
        self.low = low
        self.device = device
        self.n_float = 0
        self.gen = torch.Generator().manual_seed(seed)

    def _next_dtype(self) -> torch.dtype:
        i = self.n_float
        self.n_float += 1
        if self.scenario == "f32":
            return torch.float32
        if self.scenario == "low":
            return self.low
        return torch.float32 if i == 0 else self.low

    def _base(self, shape: tuple[int, ...], kind: str) -> torch.Tensor:
        g = self.gen
        if kind == "randn":
            return torch.randn(*shape, generator=g)
        if kind == "pos":
            return torch.rand(*shape, generator=g) + 0.5
        if kind == "unit":
            return torch.rand(*shape, generator=g) * 0.8 + 0.1
        if kind == "spd":
            n = shape[-1]
            m = torch.randn(n, n, generator=g)
            return m @ m.T + n * torch.eye(n)
        if kind == "tril":
            n = shape[-1]
            return torch.tril(torch.randn(n, n, generator=g)) + n * torch.eye(n)
        raise ValueError(f"unknown sample kind {kind!r}")

    def __call__(self, *shape: int, kind: str = "randn") -> torch.Tensor:
        return self._base(shape, kind).to(device=self.device, dtype=self._next_dtype())

    def of(self, value: torch.Tensor) -> torch.Tensor:
        """A floating tensor with the given (float32) values, in the scenario dtype."""
        return value.to(device=self.device, dtype=self._next_dtype())

    def long(self, data) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.long, device=self.device)

    def int32(self, data) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.int32, device=self.device)


Builder = Callable[[Inputs], Callable[[], object]]


def _c(fn: Callable, *args, **kwargs) -> Callable[[], object]:
    return functools.partial(fn, *args, **kwargs)


def _first_output(fn: Callable, args: tuple, kwargs: dict):
    return fn(*args, **kwargs)[0]


def _c0(fn: Callable, *args, **kwargs) -> Callable[[], object]:
    """Like :func:`_c` but keeps only the first output (drops RNG state / scratch outputs)."""
    return functools.partial(_first_output, fn, args, kwargs)


def _lu(t: Inputs):
    lu, piv = torch.linalg.lu_factor(t._base((4, 4), "spd"))
    return t.of(lu), piv.to(t.device)


def _qr_parts(t: Inputs):
    a, tau = torch.geqrf(torch.randn(4, 3, generator=t.gen))
    return t.of(a), t.of(tau)


def _lstm_call(t: Inputs):
    x, h, c = t(5, 2, 4), t(1, 2, 3), t(1, 2, 3)
    params = [t(12, 4), t(12, 3), t(12), t(12)]
    return _c(torch.lstm, x, (h, c), params, True, 1, 0.0, False, False, False)


def _interp(mode: str, dims: int, **kw) -> Builder:
    shape = (1, 2) + (4,) * dims
    return lambda t: _c(F.interpolate, t(*shape), scale_factor=2, mode=mode, **kw)


def _pad(mode: str, dims: int) -> Builder:
    shape = (1, 2) + (4,) * dims
    return lambda t: _c(F.pad, t(*shape), (1,) * (2 * dims), mode=mode)


def _mha(t: Inputs):
    q = t(2, 4, 8)
    return _c(torch._native_multi_head_attention, q, q, q, 8, 2, t(24, 8), t(24), t(8, 8), t(8),
              None, False)


#: op -> builders. Each builder takes an :class:`Inputs` and returns a thunk that
#: calls a public torch entry point (inputs are created before any region opens).
SAMPLES: dict[str, tuple[Builder, ...]] = {
    # ---- matmul / conv family -------------------------------------------------
    "conv1d": (lambda t: _c(F.conv1d, t(2, 3, 8), t(4, 3, 3), t(4)),),
    "conv2d": (lambda t: _c(F.conv2d, t(1, 3, 6, 6), t(4, 3, 3, 3), t(4)),
               lambda t: _c(F.conv2d, t(1, 3, 6, 6), t(4, 3, 3, 3), padding="same")),
    "conv3d": (lambda t: _c(F.conv3d, t(1, 2, 4, 4, 4), t(3, 2, 3, 3, 3), t(3)),),
    "conv_transpose1d": (lambda t: _c(F.conv_transpose1d, t(1, 3, 6), t(3, 4, 3), t(4)),),
    "conv_transpose2d": (lambda t: _c(F.conv_transpose2d, t(1, 3, 4, 4), t(3, 4, 3, 3), t(4)),),
    "conv_transpose3d": (lambda t: _c(F.conv_transpose3d, t(1, 2, 3, 3, 3), t(2, 3, 2, 2, 2), t(3)),),
    "convolution": (lambda t: _c(torch.convolution, t(1, 3, 6, 6), t(4, 3, 3, 3), t(4),
                                 [1, 1], [0, 0], [1, 1], False, [0, 0], 1),),
    "_convolution": (lambda t: _c(torch._convolution, t(1, 3, 6, 6), t(4, 3, 3, 3), t(4),
                                  [1, 1], [0, 0], [1, 1], False, [0, 0], 1, False, False, True, True),),
    "cudnn_convolution": (lambda t: _c(torch.cudnn_convolution, t(1, 3, 6, 6), t(4, 3, 3, 3),
                                       [0, 0], [1, 1], [1, 1], 1, False, False, True),),
    "cudnn_convolution_transpose": (lambda t: _c(torch.cudnn_convolution_transpose, t(1, 3, 4, 4), t(3, 4, 3, 3),
                                                 [0, 0], [0, 0], [1, 1], [1, 1], 1, False, False, True),),
    "_scaled_dot_product_flash_attention": (
        lambda t: _c0(torch._scaled_dot_product_flash_attention, t(1, 2, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8)),),
    "conv_tbc": (lambda t: _c(torch.conv_tbc, t(6, 2, 3), t(3, 3, 4), t(4), 1),),
    "prelu": (lambda t: _c(F.prelu, t(2, 3, 4), t(3)),),
    "linear": (lambda t: _c(F.linear, t(4, 8), t(6, 8), t(6)),
               lambda t: _c(F.linear, t(2, 4, 8), t(6, 8))),
    "matmul": (lambda t: _c(torch.matmul, t(4, 8), t(8, 4)),
               lambda t: _c(torch.Tensor.__matmul__, t(4, 8), t(8, 4)),
               lambda t: _c(torch.Tensor.__rmatmul__, t(8, 4), t(4, 8)),
               lambda t: _c(torch.Tensor.matmul, t(2, 4, 8), t(8))),
    "mm": (lambda t: _c(torch.mm, t(4, 8), t(8, 4)),),
    "bmm": (lambda t: _c(torch.bmm, t(2, 4, 8), t(2, 8, 4)),),
    "baddbmm": (lambda t: _c(torch.baddbmm, t(2, 4, 4), t(2, 4, 8), t(2, 8, 4)),),
    "addmm": (lambda t: _c(torch.addmm, t(4, 4), t(4, 8), t(8, 4)),),
    "_addmm_activation": (lambda t: _c(torch._addmm_activation, t(4, 4), t(4, 8), t(8, 4)),),
    "addbmm": (lambda t: _c(torch.addbmm, t(4, 4), t(2, 4, 8), t(2, 8, 4)),),
    "addmv": (lambda t: _c(torch.addmv, t(4), t(4, 8), t(8)),),
    "addr": (lambda t: _c(torch.addr, t(4, 4), t(4), t(4)),),
    "mv": (lambda t: _c(torch.mv, t(4, 8), t(8)),),
    "einsum": (lambda t: _c(torch.einsum, "ij,jk->ik", t(4, 8), t(8, 4)),),
    "linalg_vecdot": (lambda t: _c(torch.linalg.vecdot, t(4, 8), t(4, 8)),),
    "inner": (lambda t: _c(torch.inner, t(4, 8), t(3, 8)),),
    "matrix_power": (lambda t: _c(torch.matrix_power, t(4, 4), 3),),
    "linalg_matrix_power": (lambda t: _c(torch.linalg.matrix_power, t(4, 4), 2),),
    "linalg_norm": (lambda t: _c(torch.linalg.norm, t(4, 4)),),
    "pairwise_distance": (lambda t: _c(F.pairwise_distance, t(2, 4), t(2, 4)),),
    "chain_matmul": (lambda t: _c(torch.chain_matmul, t(4, 8), t(8, 4), t(4, 4)),),
    "linalg_multi_dot": (lambda t: _c(torch.linalg.multi_dot, [t(4, 8), t(8, 4), t(4, 4)]),),
    "lstm_cell": (lambda t: _c(torch.lstm_cell, t(2, 4), (t(2, 3), t(2, 3)), t(12, 4), t(12, 3), t(12), t(12)),),
    "gru_cell": (lambda t: _c(torch.gru_cell, t(2, 4), t(2, 3), t(9, 4), t(9, 3), t(9), t(9)),),
    "rnn_tanh_cell": (lambda t: _c(torch.rnn_tanh_cell, t(2, 4), t(2, 3), t(3, 4), t(3, 3), t(3), t(3)),),
    "rnn_relu_cell": (lambda t: _c(torch.rnn_relu_cell, t(2, 4), t(2, 3), t(3, 4), t(3, 3), t(3), t(3)),),
    "lstm": (_lstm_call,),
    "scaled_dot_product_attention": (
        lambda t: _c(F.scaled_dot_product_attention, t(1, 2, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8)),
        lambda t: _c(F.scaled_dot_product_attention, t(1, 2, 4, 8), t(1, 2, 4, 8), t(1, 2, 4, 8),
                     attn_mask=t(4, 4))),
    "_native_multi_head_attention": (_mha,),
    # ---- pointwise fp32 family --------------------------------------------------
    "acos": (lambda t: _c(torch.acos, t(4, kind="unit")), lambda t: _c(torch.arccos, t(4, kind="unit"))),
    "asin": (lambda t: _c(torch.asin, t(4, kind="unit")),),
    "cosh": (lambda t: _c(torch.cosh, t(4)),),
    "erfinv": (lambda t: _c(torch.erfinv, t(4, kind="unit")),),
    "exp": (lambda t: _c(torch.exp, t(4)), lambda t: _c(torch.Tensor.exp, t(4))),
    "expm1": (lambda t: _c(torch.expm1, t(4)), lambda t: _c(torch.special.expm1, t(4))),
    "log": (lambda t: _c(torch.log, t(4, kind="pos")),),
    "log10": (lambda t: _c(torch.log10, t(4, kind="pos")),),
    "log2": (lambda t: _c(torch.log2, t(4, kind="pos")),),
    "log1p": (lambda t: _c(torch.log1p, t(4, kind="pos")),),
    "reciprocal": (lambda t: _c(torch.reciprocal, t(4, kind="pos")),),
    "rsqrt": (lambda t: _c(torch.rsqrt, t(4, kind="pos")),),
    "sinh": (lambda t: _c(torch.sinh, t(4)),),
    "tan": (lambda t: _c(torch.tan, t(4, kind="unit")),),
    "pow": (lambda t: _c(torch.pow, t(4, kind="pos"), 2),
            lambda t: _c(torch.Tensor.__pow__, t(4, kind="pos"), 2.5),
            lambda t: _c(torch.Tensor.__rpow__, t(4), 2),
            lambda t: _c(torch.pow, t(4, kind="pos"), t(4))),
    "softplus": (lambda t: _c(F.softplus, t(4)),),
    "layer_norm": (lambda t: _c(F.layer_norm, t(2, 4), (4,), t(4), t(4)),
                   lambda t: _c(F.layer_norm, t(2, 4), (4,))),
    "native_layer_norm": (lambda t: _c(torch.native_layer_norm, t(2, 4), [4], t(4), t(4), 1e-5),),
    "rms_norm": (lambda t: _c(F.rms_norm, t(2, 4), (4,), t(4)),),
    "group_norm": (lambda t: _c(F.group_norm, t(2, 4, 3), 2, t(4), t(4)),),
    "frobenius_norm": (lambda t: _c(torch.frobenius_norm, t(4, 4), [0, 1]),),
    "nuclear_norm": (lambda t: _c(torch.nuclear_norm, t(4, 4)),),
    "cosine_similarity": (lambda t: _c(F.cosine_similarity, t(2, 4), t(2, 4)),),
    "dist": (lambda t: _c(torch.dist, t(4), t(4)),),
    "pdist": (lambda t: _c(F.pdist, t(4, 3)),),
    "cdist": (lambda t: _c(torch.cdist, t(4, 3), t(5, 3)),),
    "renorm": (lambda t: _c(torch.renorm, t(4, 4), 2, 0, 1.0),),
    "logsumexp": (lambda t: _c(torch.logsumexp, t(4, 4), 1),),
    "upsample_nearest1d": (_interp("nearest", 1),),
    "_upsample_nearest_exact1d": (_interp("nearest-exact", 1),),
    "upsample_nearest2d": (_interp("nearest", 2),),
    "_upsample_nearest_exact2d": (_interp("nearest-exact", 2),),
    "upsample_nearest3d": (_interp("nearest", 3),),
    "_upsample_nearest_exact3d": (_interp("nearest-exact", 3),),
    "upsample_linear1d": (_interp("linear", 1, align_corners=False),),
    "upsample_bilinear2d": (_interp("bilinear", 2, align_corners=False),),
    "_upsample_bilinear2d_aa": (_interp("bilinear", 2, align_corners=False, antialias=True),),
    "upsample_trilinear3d": (_interp("trilinear", 3, align_corners=False),),
    "upsample_bicubic2d": (_interp("bicubic", 2, align_corners=False),),
    "_upsample_bicubic2d_aa": (_interp("bicubic", 2, align_corners=False, antialias=True),),
    # ---- reductions with dtype= -------------------------------------------------
    "prod": (lambda t: _c(torch.prod, t(4)), lambda t: _c(torch.Tensor.prod, t(2, 4), 1)),
    "softmax": (lambda t: _c(F.softmax, t(2, 4), -1), lambda t: _c(torch.softmax, t(2, 4), 1),
                lambda t: _c(torch.Tensor.softmax, t(2, 4), -1)),
    "log_softmax": (lambda t: _c(F.log_softmax, t(2, 4), -1), lambda t: _c(torch.log_softmax, t(2, 4), 1)),
    "cumprod": (lambda t: _c(torch.cumprod, t(4), 0),),
    "cumsum": (lambda t: _c(torch.cumsum, t(4), 0), lambda t: _c(torch.Tensor.cumsum, t(2, 4), 1)),
    "linalg_vector_norm": (lambda t: _c(torch.linalg.vector_norm, t(4)),),
    "linalg_matrix_norm": (lambda t: _c(torch.linalg.matrix_norm, t(4, 4)),),
    "sum": (lambda t: _c(torch.sum, t(4)), lambda t: _c(torch.Tensor.sum, t(2, 4), 1)),
    "norm": (lambda t: _c(torch.norm, t(4)), lambda t: _c(torch.Tensor.norm, t(2, 4), dim=1)),
    # ---- promote ----------------------------------------------------------------
    "addcdiv": (lambda t: _c(torch.addcdiv, t(4), t(4), t(4, kind="pos")),),
    "addcmul": (lambda t: _c(torch.addcmul, t(4), t(4), t(4)),),
    "atan2": (lambda t: _c(torch.atan2, t(4), t(4)),),
    "bilinear": (lambda t: _c(F.bilinear, t(2, 3), t(2, 4), t(5, 3, 4), t(5)),),
    "cross": (lambda t: _c(torch.cross, t(4, 3), t(4, 3), dim=1),),
    "dot": (lambda t: _c(torch.dot, t(4), t(4)),),
    "vdot": (lambda t: _c(torch.vdot, t(4), t(4)),),
    "index_put": (lambda t: _c(torch.index_put, t(4), (t.long([0, 2]),), t(2)),),
    "tensordot": (lambda t: _c(torch.tensordot, t(2, 3), t(3, 4), dims=1),),
    "scatter_add": (lambda t: _c(torch.scatter_add, t(4), 0, t.long([0, 1]), t(2)),),
    "cat": (lambda t: _c(torch.cat, [t(2), t(3)]), lambda t: _c(torch.concat, (t(2, 2), t(1, 2)))),
    "stack": (lambda t: _c(torch.stack, [t(2), t(2)]),),
    "index_copy": (lambda t: _c(torch.index_copy, t(4), 0, t.long([0, 2]), t(2)),
                   lambda t: _c(torch.Tensor.index_copy, t(4, 2), 0, t.long([1, 3]), t(2, 2))),
    # ---- pooling / padding / sampling --------------------------------------------
    "avg_pool3d": (lambda t: _c(F.avg_pool3d, t(1, 2, 4, 4, 4), 2),),
    "max_pool3d": (lambda t: _c(F.max_pool3d, t(1, 2, 4, 4, 4), 2),),
    "adaptive_avg_pool3d": (lambda t: _c(F.adaptive_avg_pool3d, t(1, 2, 4, 4, 4), 2),),
    "adaptive_max_pool3d": (lambda t: _c(F.adaptive_max_pool3d, t(1, 2, 4, 4, 4), 2),),
    "max_unpool2d": (lambda t: _c(F.max_unpool2d, t(1, 1, 2, 2), t.long([[[[0, 3], [8, 11]]]]), 2),),
    "max_unpool3d": (lambda t: _c(F.max_unpool3d, t(1, 1, 2, 2, 2),
                                  t.long([[[[[0, 3], [8, 11]], [[32, 35], [40, 43]]]]]), 2),),
    "fractional_max_pool2d": (lambda t: _c(F.fractional_max_pool2d, t(1, 1, 8, 8), 2, output_size=4,
                                           _random_samples=t(1, 1, 2, kind="unit")),),
    "fractional_max_pool3d": (lambda t: _c(F.fractional_max_pool3d, t(1, 1, 8, 8, 8), 2, output_size=4,
                                           _random_samples=t(1, 1, 3, kind="unit")),),
    "reflection_pad1d": (_pad("reflect", 1),),
    "reflection_pad2d": (_pad("reflect", 2),),
    "reflection_pad3d": (_pad("reflect", 3),),
    "replication_pad1d": (_pad("replicate", 1),),
    "replication_pad2d": (_pad("replicate", 2),),
    "replication_pad3d": (_pad("replicate", 3),),
    "grid_sampler": (lambda t: _c(F.grid_sample, t(1, 1, 4, 4), t(1, 2, 2, 2, kind="unit"), align_corners=False),),
    "grid_sampler_2d": (lambda t: _c(torch.grid_sampler_2d, t(1, 1, 4, 4), t(1, 2, 2, 2, kind="unit"), 0, 0, False),),
    "_grid_sampler_2d_cpu_fallback": (
        lambda t: _c(torch._grid_sampler_2d_cpu_fallback, t(1, 1, 4, 4), t(1, 2, 2, 2, kind="unit"), 0, 0, False),),
    "grid_sampler_3d": (lambda t: _c(torch.grid_sampler_3d, t(1, 1, 4, 4, 4), t(1, 2, 2, 2, 3, kind="unit"),
                                     0, 0, False),),
    # ---- losses -----------------------------------------------------------------
    "mse_loss": (lambda t: _c(F.mse_loss, t(4), t(4)),),
    "l1_loss": (lambda t: _c(F.l1_loss, t(4), t(4)),),
    "smooth_l1_loss": (lambda t: _c(F.smooth_l1_loss, t(4), t(4)),),
    "huber_loss": (lambda t: _c(F.huber_loss, t(4), t(4)),),
    "kl_div": (lambda t: _c(F.kl_div, t(4), t(4, kind="unit"), reduction="batchmean"),),
    "poisson_nll_loss": (lambda t: _c(F.poisson_nll_loss, t(4), t(4, kind="pos")),),
    "cosine_embedding_loss": (lambda t: _c(F.cosine_embedding_loss, t(2, 4), t(2, 4), t.long([1, -1])),),
    "hinge_embedding_loss": (lambda t: _c(F.hinge_embedding_loss, t(4), t.long([1, -1, 1, -1])),),
    "margin_ranking_loss": (lambda t: _c(F.margin_ranking_loss, t(4), t(4), t.of(torch.tensor([1.0, -1, 1, -1]))),),
    "soft_margin_loss": (lambda t: _c(F.soft_margin_loss, t(4), t.of(torch.tensor([1.0, -1, 1, -1]))),),
    "triplet_margin_loss": (lambda t: _c(F.triplet_margin_loss, t(2, 4), t(2, 4), t(2, 4)),),
    "multi_margin_loss": (lambda t: _c(F.multi_margin_loss, t(2, 4), t.long([1, 2])),),
    "multilabel_margin_loss": (lambda t: _c(F.multilabel_margin_loss, t(2, 4),
                                            t.long([[1, 2, -1, 0], [0, -1, 0, 0]])),),
    "nll_loss": (lambda t: _c(F.nll_loss, t(2, 4), t.long([1, 2])),),
    "nll_loss2d": (lambda t: _c(F.nll_loss, t(1, 3, 2, 2), t.long([[[0, 1], [2, 0]]])),),
    "cross_entropy_loss": (lambda t: _c(F.cross_entropy, t(2, 4), t.long([1, 2])),
                           lambda t: _c(F.cross_entropy, t(2, 4), t(2, 4, kind="unit"))),
    "ctc_loss": (lambda t: _c(F.ctc_loss, t.of(torch.randn(6, 1, 4, generator=t.gen).log_softmax(2)),
                              t.long([[1, 2]]), [6], [2]),),
    "binary_cross_entropy": (lambda t: _c(F.binary_cross_entropy, t(4, kind="unit"), t(4, kind="unit")),),
    "binary_cross_entropy_with_logits": (
        lambda t: _c(F.binary_cross_entropy_with_logits, t(4), t(4, kind="unit")),),
    # ---- spectral ---------------------------------------------------------------
    "fft_fft": (lambda t: _c(torch.fft.fft, t(8)),),
    "fft_ifft": (lambda t: _c(torch.fft.ifft, t(8)),),
    "fft_fft2": (lambda t: _c(torch.fft.fft2, t(4, 4)),),
    "fft_ifft2": (lambda t: _c(torch.fft.ifft2, t(4, 4)),),
    "fft_fftn": (lambda t: _c(torch.fft.fftn, t(4, 4)),),
    "fft_ifftn": (lambda t: _c(torch.fft.ifftn, t(4, 4)),),
    "fft_rfft": (lambda t: _c(torch.fft.rfft, t(8)),),
    "fft_irfft": (lambda t: _c(torch.fft.irfft, t(8)),),
    "fft_rfft2": (lambda t: _c(torch.fft.rfft2, t(4, 4)),),
    "fft_irfft2": (lambda t: _c(torch.fft.irfft2, t(4, 4)),),
    "fft_rfftn": (lambda t: _c(torch.fft.rfftn, t(4, 4)),),
    "fft_irfftn": (lambda t: _c(torch.fft.irfftn, t(4, 4)),),
    "fft_hfft": (lambda t: _c(torch.fft.hfft, t(8)),),
    "fft_ihfft": (lambda t: _c(torch.fft.ihfft, t(8)),),
    "stft": (lambda t: _c(torch.stft, t(64), 16, return_complex=True),),
    "view_as_complex": (lambda t: _c(torch.view_as_complex, t(4, 2)),),
    "polar": (lambda t: _c(torch.polar, t(4, kind="pos"), t(4)),),
    # ---- statistics / misc --------------------------------------------------------
    "quantile": (lambda t: _c(torch.quantile, t(8), 0.5), lambda t: _c(torch.quantile, t(8), t(2, kind="unit"))),
    "nanquantile": (lambda t: _c(torch.nanquantile, t(8), 0.5),),
    "trace": (lambda t: _c(torch.trace, t(4, 4)),),
    "fake_quantize_per_tensor_affine": (lambda t: _c(torch.fake_quantize_per_tensor_affine, t(4), 0.1, 0, 0, 255),),
    # ---- linear algebra -----------------------------------------------------------
    "cholesky": (lambda t: _c(torch.cholesky, t(4, 4, kind="spd")),),
    "cholesky_inverse": (lambda t: _c(torch.cholesky_inverse, t(4, 4, kind="tril")),),
    "cholesky_solve": (lambda t: _c(torch.cholesky_solve, t(4, 2), t(4, 4, kind="tril"), upper=False),),
    "inverse": (lambda t: _c(torch.inverse, t(4, 4, kind="spd")),),
    "lu_solve": (lambda t: _c(torch.lu_solve, t(4, 2), *_lu(t)),),
    "orgqr": (lambda t: _c(torch.orgqr, *_qr_parts(t)),),
    "ormqr": (lambda t: _c(torch.ormqr, *_qr_parts(t), t(4, 2)),),
    "pinverse": (lambda t: _c(torch.pinverse, t(4, 3)),),
    "geqrf": (lambda t: _c(torch.geqrf, t(4, 3)),),
    "_lu_with_info": (lambda t: _c(torch._lu_with_info, t(4, 4, kind="spd")),),
    "qr": (lambda t: _c(torch.qr, t(4, 3)),),
    "svd": (lambda t: _c(torch.svd, t(4, 3)),),
    "triangular_solve": (lambda t: _c(torch.triangular_solve, t(4, 2), t(4, 4, kind="tril"), upper=False),),
    "linalg_cond": (lambda t: _c(torch.linalg.cond, t(4, 4, kind="spd")),),
    "linalg_matrix_rank": (lambda t: _c(torch.linalg.matrix_rank, t(4, 4)),),
    "linalg_solve": (lambda t: _c(torch.linalg.solve, t(4, 4, kind="spd"), t(4, 2)),),
    "linalg_cholesky": (lambda t: _c(torch.linalg.cholesky, t(4, 4, kind="spd")),),
    "linalg_cholesky_ex": (lambda t: _c(torch.linalg.cholesky_ex, t(4, 4, kind="spd")),),
    "linalg_svdvals": (lambda t: _c(torch.linalg.svdvals, t(4, 3)),),
    "linalg_svd": (lambda t: _c(torch.linalg.svd, t(4, 3)),),
    "linalg_eigvals": (lambda t: _c(torch.linalg.eigvals, t(4, 4)),),
    "linalg_eigvalsh": (lambda t: _c(torch.linalg.eigvalsh, t(4, 4, kind="spd")),),
    "linalg_eig": (lambda t: _c(torch.linalg.eig, t(4, 4)),),
    "linalg_eigh": (lambda t: _c(torch.linalg.eigh, t(4, 4, kind="spd")),),
    "linalg_inv": (lambda t: _c(torch.linalg.inv, t(4, 4, kind="spd")),),
    "linalg_inv_ex": (lambda t: _c(torch.linalg.inv_ex, t(4, 4, kind="spd")),),
    "linalg_householder_product": (lambda t: _c(torch.linalg.householder_product, *_qr_parts(t)),),
    "linalg_tensorinv": (lambda t: _c(torch.linalg.tensorinv, t.of(t._base((4, 4), "spd").reshape(4, 2, 2)), 1),),
    "linalg_tensorsolve": (lambda t: _c(torch.linalg.tensorsolve, t.of(t._base((4, 4), "spd").reshape(2, 2, 4)),
                                        t(2, 2)),),
    "linalg_qr": (lambda t: _c(torch.linalg.qr, t(4, 3)),),
    "linalg_lstsq": (lambda t: _c(torch.linalg.lstsq, t(4, 3), t(4, 2)),),
    # torch 2.14 and later (OP_TORCH_VERSIONS): on older torch the builder fails
    "linalg_matrix_sqrth": (lambda t: _c(torch.linalg.matrix_sqrth, t(4, 4, kind="spd")),),
    "linalg_polar": (lambda t: _c(torch.linalg.polar, t(4, 4, kind="spd")),),
}


#: Ops whose native behaviour no policy family reproduces exactly (native casts
#: *inside* a composite with mixed decisions). Reported by the ``unlisted`` audit.
KNOWN_DIVERGENCES: dict[str, dict[str, str]] = {
    "cpu": {
        "bilinear": "native casts the inner bmm of _trilinear to bf16, then adds the fp32 bias in fp32",
        "lstm_cell": "native runs the two linears in bf16 and the state update promoted to fp32",
        "gru_cell": "native runs the two linears in bf16 and the state update promoted to fp32",
        "lstm": "native goes through mkldnn_rnn_layer (raises on CPUs without bf16 oneDNN RNN support)",
        "linalg_polar": "torch >= 2.14: native runs the inner linalg_svd in fp32 and the products in bf16",
    },
    "cuda": {
        "pairwise_distance": "native runs x1 - x2 in fp16 and the norm in fp32",
        "lstm": "native casts _cudnn_rnn to fp16 in a special wrapper, whatever the region dtype",
    },
}

#: The native op lists, transcribed from aten/src/ATen/autocast_mode.{h,cpp} (torch 2.x)
#: and spelled with the dispatcher's names; what :func:`coverage` measures a policy against.
#: The union over the supported torch range: ops that only some releases have are in
#: OP_TORCH_VERSIONS. tests/amp/test_audit.py checks the op sets (not the families)
#: against the AutocastCPU/AutocastCUDA kernels of the installed torch's dispatcher.
NATIVE_REFERENCE: dict[str, dict[str, tuple[str, ...]]] = {
    "cpu": {
        "lower_precision": (
            "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm",
            "_addmm_activation", "addbmm", "linear", "_convolution", "matmul", "conv_tbc",
            "mkldnn_rnn_layer", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu",
            "scaled_dot_product_attention", "_native_multi_head_attention"),
        "fp32": (
            "avg_pool3d", "binary_cross_entropy", "grid_sampler", "polar", "prod", "quantile",
            "nanquantile", "stft", "cdist", "grid_sampler_2d", "_grid_sampler_2d_cpu_fallback",
            "grid_sampler_3d", "trace", "view_as_complex", "cholesky", "cholesky_inverse",
            "cholesky_solve", "inverse", "lu_solve", "orgqr", "ormqr", "pinverse", "max_pool3d",
            "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d", "reflection_pad1d",
            "reflection_pad2d", "replication_pad1d", "replication_pad2d", "replication_pad3d",
            "mse_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss",
            "poisson_nll_loss", "smooth_l1_loss", "cross_entropy_loss", "l1_loss", "huber_loss",
            "margin_ranking_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
            "ctc_loss", "kl_div", "multilabel_margin_loss", "binary_cross_entropy_with_logits",
            "fft_fft", "fft_ifft", "fft_fft2", "fft_ifft2", "fft_fftn", "fft_ifftn", "fft_rfft",
            "fft_irfft", "fft_rfft2", "fft_irfft2", "fft_rfftn", "fft_irfftn", "fft_hfft", "fft_ihfft",
            "linalg_cond", "linalg_matrix_rank", "linalg_solve", "linalg_cholesky", "linalg_svdvals",
            "linalg_eigvals", "linalg_eigvalsh", "linalg_inv", "linalg_householder_product",
            "linalg_tensorinv", "linalg_tensorsolve", "fake_quantize_per_tensor_affine", "geqrf",
            "_lu_with_info", "qr", "svd", "triangular_solve", "fractional_max_pool2d",
            "fractional_max_pool3d", "adaptive_max_pool3d", "multilabel_margin_loss_forward",
            "linalg_qr", "linalg_cholesky_ex", "linalg_svd", "linalg_eig", "linalg_eigh",
            "linalg_lstsq", "linalg_inv_ex", "linalg_matrix_sqrth"),
        "fp32_with_dtype": (),
        "promote": ("stack", "cat", "index_copy"),
        "banned": (),
    },
    "cuda": {
        "lower_precision": (
            "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
            "conv_transpose2d", "conv_transpose3d", "convolution", "cudnn_convolution",
            "cudnn_convolution_transpose", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm",
            "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
            "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell",
            "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
            "scaled_dot_product_attention"),
        "fp32": (
            "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
            "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm",
            "group_norm", "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss",
            "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
            "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
            "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
            "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
            "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
            "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
            "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
            "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
            "linalg_matrix_sqrth", "rms_norm"),
        "fp32_with_dtype": (
            "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
            "linalg_matrix_norm", "sum", "norm"),
        "promote": (
            "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
            "index_put", "tensordot", "scatter_add"),
        "banned": ("binary_cross_entropy",),
    },
}


def sample_ops() -> tuple[str, ...]:
    """Every op that has a sample-input builder."""
    return tuple(sorted(SAMPLES))


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------
def _short(dtype: torch.dtype) -> str:
    return _SHORT.get(dtype, str(dtype).removeprefix("torch."))


def _flat(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        res: list[torch.Tensor] = []
        for o in out:
            res.extend(_flat(o))
        return res
    return []


def _run(thunk: Callable[[], object], ctx) -> tuple[str, list[torch.Tensor] | None]:
    torch.manual_seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with ctx:
                out = thunk()
    except Exception as exc:  # noqa: BLE001 - the exception type is the observation
        return f"err({type(exc).__name__})", None
    tensors = _flat(out)
    return "/".join(_short(t.dtype) for t in tensors) or "-", tensors


def _same_values(a: list[torch.Tensor], b: list[torch.Tensor], exact: bool = True) -> bool:
    """Bitwise equality (NaN == NaN); with ``exact=False``, closeness for the dtype."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.is_complex():
            x, y = torch.view_as_real(x.resolve_conj()), torch.view_as_real(y.resolve_conj())
        if x.is_floating_point():
            if exact:
                same = (x == y) | (torch.isnan(x) & torch.isnan(y))
            else:
                tol = 1e-4 if x.dtype in (torch.float32, torch.float64) else 2e-2
                same = torch.isclose(x, y, rtol=tol, atol=tol, equal_nan=True)
            if not bool(same.all()):
                return False
        elif not torch.equal(x, y):
            return False
    return True


_SCENARIOS = ("f32", "low", "mix")
_VALUE_RETRIES = 3


def _scenarios_for(builder: Builder, low: torch.dtype, device: str) -> list[tuple[str, Callable[[], object]]]:
    out = []
    for sc in _SCENARIOS:
        inputs = Inputs(sc, low, device)
        thunk = builder(inputs)
        if sc == "mix" and inputs.n_float < 2:
            continue
        out.append((sc, thunk))
    return out


def _native_ctx(device_type: str, dtype: torch.dtype):
    return torch.autocast(device_type, dtype=dtype)


class _NoCtx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _resolve(device_type: str, policy: OpPolicy | str | None, dtype: torch.dtype | None):
    if policy is None:
        policy = shipped_policy(device_type)
    elif not isinstance(policy, OpPolicy):
        policy = load_policy(policy)
    if dtype is None:
        dtype = torch.bfloat16 if device_type == "cpu" else torch.float16
    return policy, dtype


def _release(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def _absent_note(op: str) -> str:
    first, gone = OP_TORCH_VERSIONS[op]
    if gone is not None and torch_version() >= gone:
        when = f"removed in torch {_release(gone)}"
    else:
        when = f"added in torch {_release(first)}" if first is not None else "not in this release"
    return f"not in torch {torch.__version__} ({when}): uncallable natively and under ampcert"


def _audit_absent(op: str, family: str, device_type: str, policy: OpPolicy, dtype: torch.dtype) -> AuditRow:
    """An op the installed torch lacks: agrees when neither engine can run it."""
    amp_parts: list[str] = []
    nat_parts: list[str] = []
    for bi, builder in enumerate(SAMPLES[op]):
        tag = "" if len(SAMPLES[op]) == 1 else f"{bi}:"
        try:
            scenarios = _scenarios_for(builder, dtype, device_type)
        except Exception as exc:  # noqa: BLE001 - the callable is not there: nothing to run
            amp_parts.append(f"{tag}build>err({type(exc).__name__})")
            nat_parts.append(f"{tag}build>err({type(exc).__name__})")
            continue
        for sc, thunk in scenarios:
            amp_parts.append(f"{tag}{sc}>" + _run(thunk, autocast(device_type, dtype=dtype, policy=policy))[0])
            nat_parts.append(f"{tag}{sc}>" + _run(thunk, _native_ctx(device_type, dtype))[0])
    ran = [p for p in amp_parts + nat_parts if not p.split(">", 1)[1].startswith("err")]
    note = _absent_note(op) if not ran else (
        f"OP_TORCH_VERSIONS says {op} is not in torch {torch.__version__}, but it ran: update the table")
    return AuditRow(op, family, " ".join(amp_parts), " ".join(nat_parts), not ran, note)


def audit_op(op: str, family: str, device_type: str, policy: OpPolicy, dtype: torch.dtype) -> AuditRow:
    builders = SAMPLES.get(op)
    if not builders:
        return AuditRow(op, family, "-", "-", False, "no sample inputs")
    if not op_in_torch(op):
        return _audit_absent(op, family, device_type, policy, dtype)
    amp_parts: list[str] = []
    nat_parts: list[str] = []
    problems: list[str] = []
    infos: list[str] = []
    for bi, builder in enumerate(builders):
        try:
            scenarios = _scenarios_for(builder, dtype, device_type)
        except Exception as exc:  # noqa: BLE001
            return AuditRow(op, family, "-", "-", False, f"sample builder {bi} failed: {type(exc).__name__}: {exc}")
        for sc, thunk in scenarios:
            amp_sig, amp_out = _run(thunk, autocast(device_type, dtype=dtype, policy=policy))
            nat_sig, nat_out = _run(thunk, _native_ctx(device_type, dtype))
            tag = f"{sc}>" if len(builders) == 1 else f"{bi}:{sc}>"
            amp_parts.append(tag + amp_sig)
            nat_parts.append(tag + nat_sig)
            if amp_sig != nat_sig:
                problems.append(f"{tag} dtype {amp_sig} vs native {nat_sig}")
            elif amp_out is not None and nat_out is not None and not _same_values(amp_out, nat_out):
                # Some kernels (e.g. LAPACK gelsy behind linalg.lstsq, multithreaded) are
                # not bitwise reproducible run to run, and one repeat may happen to agree
                # with itself. Repeat both sides: an exact match in any pair agrees; if
                # native disagrees with itself, compare with a dtype tolerance instead.
                amp_runs, nat_runs = [amp_out], [nat_out]
                for _ in range(_VALUE_RETRIES):
                    amp_runs.append(_run(thunk, autocast(device_type, dtype=dtype, policy=policy))[1])
                    nat_runs.append(_run(thunk, _native_ctx(device_type, dtype))[1])
                pairs = [(a, n) for a in amp_runs for n in nat_runs if a is not None and n is not None]
                native_varies = any(n is not None and not _same_values(nat_out, n) for n in nat_runs[1:])
                if any(_same_values(a, n) for a, n in pairs):
                    if native_varies and "nondeterministic" not in " ".join(infos):
                        infos.append("nondeterministic natively: matched on a repeat")
                elif native_varies and _same_values(amp_out, nat_out, exact=False):
                    if "nondeterministic" not in " ".join(infos):
                        infos.append("nondeterministic natively: values compared with tolerance")
                elif native_varies:
                    problems.append(f"{tag} values differ beyond tolerance (nondeterministic op)")
                else:
                    problems.append(f"{tag} values differ")
    if family != "banned" and all(p.split(">", 1)[1].startswith("err") for p in nat_parts):
        if family == "none" and not problems:
            infos.append("raises natively in every scenario on this device")
        else:
            problems.append("native raises in every scenario: sample inputs unusable on this device")
    elif family == "banned" and not all(p.split(">", 1)[1].startswith("err") for p in amp_parts):
        problems.append("banned op did not raise under ampcert")
    return AuditRow(op, family, " ".join(amp_parts), " ".join(nat_parts), not problems,
                    "; ".join(problems or infos))


def audit_torch(
    device_type: str = "cpu",
    policy: OpPolicy | str | None = None,
    dtype: torch.dtype | None = None,
    ops: Iterable[str] | None = None,
    unlisted: bool = False,
) -> list[AuditRow]:
    """Compare ampcert's autocast with ``torch.autocast`` for every op of ``policy``.

    ``ops`` restricts the audit to a subset. With ``unlisted=True`` every op that
    has sample inputs but is *not* in the policy is audited too (family ``none``):
    both engines must then leave it alone.
    """
    policy, dtype = _resolve(device_type, policy, dtype)
    names = list(policy.ops) if ops is None else list(ops)
    if unlisted:
        names += [op for op in sample_ops() if op not in policy.ops and op not in names]
    return [audit_op(op, policy.family(op) or "none", device_type, policy, dtype) for op in names]


def format_table(rows: Sequence[AuditRow]) -> str:
    """A plain-text table of audit rows plus a one-line summary."""
    headers = ("op", "family", "agree", "ampcert", "native", "note")
    body = [(r.op, r.family, "yes" if r.agree else "NO", r.ampcert_dtype, r.native_dtype, r.note) for r in rows]
    widths = [max(len(h), *(len(str(b[i])) for b in body)) if body else len(h) for i, h in enumerate(headers)]
    widths[3] = min(widths[3], 60)
    widths[4] = min(widths[4], 60)

    def line(cells) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False)).rstrip()

    out = [line(headers), line("-" * w for w in widths)]
    out += [line(b) for b in body]
    agree = sum(r.agree for r in rows)
    out.append(f"{agree}/{len(rows)} ops agree with native torch.autocast")
    return "\n".join(out)


def coverage(
    rows: Sequence[AuditRow], device_type: str | None = None, policy: OpPolicy | None = None
) -> dict[str, dict]:
    """Per family: how much of it the audit covered and how much of native's list the policy has.

    Keys per family: ``ops`` (policy ops in the rows), ``audited`` (with sample
    inputs), ``agree``; with ``device_type``: ``native`` (size of the native list
    in :data:`NATIVE_REFERENCE`), ``covered`` (native ops the policy puts in the
    same family), ``missing`` and ``extra`` (sorted op lists).
    """
    cov: dict[str, dict] = {fam: {"ops": 0, "audited": 0, "agree": 0} for fam in FAMILIES}
    for r in rows:
        if r.family not in cov:
            continue
        c = cov[r.family]
        c["ops"] += 1
        if r.note != "no sample inputs":
            c["audited"] += 1
        if r.agree:
            c["agree"] += 1
    if device_type is not None:
        ref = NATIVE_REFERENCE.get(device_type, {})
        pol_fams: dict[str, set[str]] = {fam: set() for fam in FAMILIES}
        if policy is not None:
            for op, fam in policy.ops.items():
                pol_fams[fam].add(op)
        else:
            for r in rows:
                if r.family in pol_fams:
                    pol_fams[r.family].add(r.op)
        for fam in FAMILIES:
            native = set(ref.get(fam, ()))
            cov[fam]["native"] = len(native)
            cov[fam]["covered"] = len(native & pol_fams[fam])
            cov[fam]["missing"] = sorted(native - pol_fams[fam])
            cov[fam]["extra"] = sorted(pol_fams[fam] - native)
    return cov


def format_coverage(rows: Sequence[AuditRow], device_type: str | None = None,
                    policy: OpPolicy | None = None) -> str:
    cov = coverage(rows, device_type, policy)
    head = "family            ops  audited  agree"
    if device_type is not None:
        head += "  native  covered"
    lines = [head]
    for fam, c in cov.items():
        line = f"{fam:<16} {c['ops']:>4} {c['audited']:>8} {c['agree']:>6}"
        if device_type is not None:
            line += f"  {c['native']:>6} {c['covered']:>8}"
            if c["missing"]:
                line += f"  missing: {', '.join(c['missing'])}"
        lines.append(line)
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# probing native autocast (used to derive the shipped CPU policy)
# ---------------------------------------------------------------------------
def probe_native(
    ops: Iterable[str] | None = None, device_type: str = "cpu", dtype: torch.dtype | None = None
) -> dict[str, str]:
    """Infer native autocast's family for each op with a sample builder.

    Compares ``torch.autocast`` runs with plain runs, scenario by scenario:
    ``lower_precision`` when fp32 inputs come out low precision, ``fp32`` when
    low-precision inputs come out fp32 (``fp32_with_dtype`` and ``fp32`` look the
    same here), ``promote`` when mixed inputs change, ``none`` when autocast
    changes nothing observable, ``raises`` when native raises and plain does not, and
    ``unavailable`` when no builder can run the op even without autocast (its callable
    is missing or raises on fp32 inputs: an op this torch release lacks).
    """
    dtype = dtype or (torch.bfloat16 if device_type == "cpu" else torch.float16)
    result: dict[str, str] = {}
    for op in (ops if ops is not None else sample_ops()):
        verdict = "none"
        usable = False
        for builder in SAMPLES.get(op, ()):
            try:
                scen = dict(_scenarios_for(builder, dtype, device_type))
            except Exception:  # noqa: BLE001 - the callable is not in this torch
                continue
            sigs = {}
            for sc, thunk in scen.items():
                nat, _ = _run(thunk, _native_ctx(device_type, dtype))
                plain, _ = _run(thunk, _NoCtx())
                sigs[sc] = (nat, plain)
            low = _short(dtype)
            nat_f32, plain_f32 = sigs["f32"]
            nat_low, plain_low = sigs["low"]
            usable = usable or not plain_f32.startswith("err")
            if nat_f32.startswith("err") and not plain_f32.startswith("err"):
                verdict = "raises"
            elif nat_f32 != plain_f32 and low in nat_f32.split("/"):
                verdict = "lower_precision"
            elif nat_low != plain_low:
                verdict = "fp32"
            elif "mix" in sigs and sigs["mix"][0] != sigs["mix"][1]:
                verdict = "promote"
            if verdict != "none":
                break
        result[op] = verdict if usable or op not in SAMPLES else "unavailable"
    return result
