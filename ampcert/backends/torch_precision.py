"""The precision a torch run actually computed in, measured, for MLPerf's
``lowest_numerical_precision_in_{linear,attn,comm}`` disclosure.

Declaring "bf16 run, so bfloat16" would be a guess: autocast keeps some ops
in fp32, a policy may keep a layer in fp32, and on a GPU an fp32 matmul may
run as TF32. So the run watches its first training step (forward and
backward, the same ops every later step runs) through a TorchDispatchMode,
which sees every aten op after autocast has cast its inputs, and records:

- linear: the lowest floating dtype that matmul and convolution ops (mm,
  addmm, bmm, baddbmm, matmul, linear, convolution and their backward) took
  as inputs;
- attn: the lowest that ops inside attention modules (a module whose class
  name holds ``Attention``; forward only, as module hooks see no backward) or
  any scaled-dot-product / flash attention op (forward and backward) took;
- comm: for one process, ``fp32`` (no gradient collective runs, and the
  optimizer reads fp32 gradients); under DDP, the dtype of the gradient
  buckets the all-reduce carried (recorded by a DDP comm hook).

An fp32 matmul on CUDA where torch allows TF32 for it (``torch.backends.
cuda.matmul.allow_tf32``, or the float32 matmul precision below "highest")
is recorded as ``tf32``; an fp32 convolution where ``torch.backends.cudnn.
allow_tf32`` (torch's default) likewise. fp16 and bf16 have the same width;
neither is "lower" than the other, and a run computes in one of them.

A model without attention ops has nothing to measure for attn, yet MLPerf's
rules need exactly one value: the linear value is logged, with metadata
``{"observed": false, "reason": "no attention ops"}``, so no reader takes it
for a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# MLPerf's spelling of each dtype (its rules accept `bfloat16`, not `bf16`).
MLPERF_NAME = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bfloat16",
               torch.float16: "fp16", torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8"}
# Width in bits, to find the lowest; tf32 has fp32's storage but 10 mantissa bits.
_BITS = {"fp64": 64, "fp32": 32, "tf32": 19, "bfloat16": 16, "fp16": 16, "fp8": 8}

_LINEAR_OPS = ("mm", "_scaled_mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution",
               "convolution_backward", "cudnn_convolution", "mkldnn_convolution", "addmv", "mv", "dot")
_CONV_OPS = ("convolution", "_convolution", "convolution_backward", "cudnn_convolution", "mkldnn_convolution")


def _is_attention_op(name: str) -> bool:
    return "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name


def _lower(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    if b is None:
        return a
    return b if _BITS[b] < _BITS[a] else a


@dataclass
class Observed:
    """The lowest precision seen per category (None: no op of it ran)."""

    linear: str | None = None
    attn: str | None = None
    comm: str | None = None
    linear_ops: set[str] = field(default_factory=set)
    attn_ops: set[str] = field(default_factory=set)


class PrecisionProbe(TorchDispatchMode):
    """Records the lowest floating input dtype of linear and attention ops."""

    def __init__(self, model: torch.nn.Module, device: str):
        super().__init__()
        self.observed = Observed()
        self._cuda = device == "cuda"
        self._depth = 0  # > 0 while inside an attention module's forward
        self._handles: list[Any] = []
        for module in model.modules():
            if "Attention" in type(module).__name__:
                self._handles.append(module.register_forward_pre_hook(self._enter))
                self._handles.append(module.register_forward_hook(self._leave))

    def _enter(self, *_: Any) -> None:
        self._depth += 1

    def _leave(self, *_: Any) -> None:
        self._depth -= 1

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _dtype_of(self, name: str, args: Any, kwargs: Any) -> str | None:
        lowest: str | None = None
        for a in torch.utils._pytree.tree_leaves((args, kwargs)):
            if isinstance(a, torch.Tensor) and a.dtype in MLPERF_NAME:
                lowest = _lower(lowest, MLPERF_NAME[a.dtype])
        if lowest == "fp32" and self._cuda and self._tf32(name):
            lowest = "tf32"
        return lowest

    @staticmethod
    def _tf32(name: str) -> bool:
        if name in _CONV_OPS:
            return bool(torch.backends.cudnn.allow_tf32)
        return bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        linear, attn = name in _LINEAR_OPS, _is_attention_op(name)
        if linear or attn or self._depth > 0:
            dtype = self._dtype_of(name, args, kwargs)
            if dtype is not None:
                obs = self.observed
                if linear:
                    obs.linear, _ = _lower(obs.linear, dtype), obs.linear_ops.add(name)
                if attn or self._depth > 0:
                    obs.attn, _ = _lower(obs.attn, dtype), obs.attn_ops.add(name)
        return func(*args, **kwargs)


def note_comm_dtype(observed: Observed, dtype: Any) -> None:
    """The dtype a data-parallel wrapper reduces gradients in by its configuration (FSDP2's
    ``reduce_dtype``, which exposes no hook to watch)."""
    observed.comm = _lower(observed.comm, MLPERF_NAME.get(dtype))


def observing_comm(inner: Any, observed: Observed) -> Any:
    """A DDP communication hook that notes the dtype each gradient bucket is communicated
    in, then communicates it as ``inner`` does (None: DDP's default, averaged over ranks).
    A hook that compresses says its wire dtype (``wire_dtype``); otherwise it is the
    bucket's own."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    reduce = inner if inner is not None else default_hooks.allreduce_hook
    wire = getattr(inner, "wire_dtype", None)

    # No annotations: DDP refuses a hook whose `bucket` is annotated as anything
    # but dist.GradBucket (and this module's annotations are strings).
    def hook(state, bucket):
        dtype = MLPERF_NAME.get(wire if wire is not None else bucket.buffer().dtype)
        observed.comm = _lower(observed.comm, dtype)
        return reduce(state, bucket)

    return hook


def disclosure(observed: Observed, world_size: int, fp8_layers: int = 0) -> dict[str, dict[str, Any]]:
    """The three MLLOG values with metadata, keyed linear / attn / comm.

    Where nothing of a category ran, the value is one that was measured
    (see the module doc), marked ``observed: false`` with the reason.
    ``fp8_layers``: Linear layers an fp8/mxfp8 run converted. Emulated FP8
    hands the dispatcher fp32 matmuls of values already rounded to FP8, so
    the probe's dtype is not the precision: the layers' FP8 operands are."""
    out: dict[str, dict[str, Any]] = {}
    linear = observed.linear
    out["linear"] = ({"value": linear, "observed": True, "ops": sorted(observed.linear_ops)} if linear
                     else {"value": "fp32", "observed": False, "reason": "no linear or convolution ops"})
    if fp8_layers:
        out["linear"] = {"value": "fp8", "observed": True,
                         "what": f"{fp8_layers} Linear layer(s) multiply FP8 operands (amp/torch/fp8.py)"}
    out["attn"] = ({"value": observed.attn, "observed": True, "ops": sorted(observed.attn_ops)} if observed.attn
                   else {"value": out["linear"]["value"], "observed": False, "reason": "no attention ops"})
    if world_size > 1:
        out["comm"] = ({"value": observed.comm, "observed": True,
                        "what": "the gradients' reduction across ranks (DDP's buckets, or FSDP2's reduce_dtype)"}
                       if observed.comm else {"value": "fp32", "observed": False,
                                              "reason": "no gradient all-reduce seen in the first step"})
    else:
        out["comm"] = {"value": "fp32", "observed": True,
                       "what": "one process: no gradient collective; the optimizer reads fp32 gradients"}
    return out
