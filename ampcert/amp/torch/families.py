"""The op families of ampcert's torch autocast: what each one does to a call.

Why
---
An :class:`~ampcert.amp.policy.OpPolicy` puts every op it names in one family
(a :class:`~ampcert.amp.policy.Family`, the policy file's names). Native ``torch.autocast``
has the same idea in C++, its ``CastPolicy`` (``aten/src/ATen/autocast_mode.h``);
here each family is a :class:`Family` member, and :data:`HANDLERS` maps each to a
small function that decides what a call of one of its ops is cast to:

==================  =====================  =============================================
Family              native CastPolicy      the call's eligible tensors are cast to
==================  =====================  =============================================
``lower_precision`` ``lower_precision_fp`` the region's dtype (float16 or bfloat16)
``fp32``            ``fp32``               float32
``fp32_with_dtype`` ``fp32_set_opt_dtype`` nothing: the call gets ``dtype=float32``
                                           (the op computes in fp32 from its inputs
                                           as given), unless it passes a ``dtype`` or
                                           its first tensor is not eligible
``promote``         ``promote``            the widest dtype among them
``banned``          (CUDA's banned ops)    nothing: the call raises if a tensor is on
                                           the region's device type
==================  =====================  =============================================

*Eligible* tensors are floating point, not float64 and on the region's device
type, found among the arguments and one level into lists and tuples, as native
autocast looks. A call with none runs untouched, and so does a call of an
``uncast_if_mixed`` op whose eligible tensors disagree on their dtype.

How the table is used
---------------------
A :class:`Region` (one autocast setting: device type, dtype, policy) resolves
its policy once, when it is built: ``handlers`` maps each op name straight to
its family's handler. The mode (:mod:`.autocast`) then makes one dict
lookup per call, keyed by the op, and calls the handler::

    to = region.handlers[name](region, name, args, kwargs)

A handler only decides: it returns the dtype to cast to, or None when the call
runs as given (or raises, for ``banned``). The mode casts (through its weight
cache, which every family shares) and calls the op; for the ``fp32_with_dtype`` ops
that take a ``dtype`` (:func:`set_opt_dtype`), it passes the dtype as that argument
instead, as native's ``set_opt_dtype`` does. Handlers allocate nothing beyond the
list of eligible tensors.

Imports torch, the standard library and :mod:`.policy`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import torch

from ..policy import Family, OpPolicy

__all__ = [
    "BCE_BANNED_MESSAGE",
    "HANDLERS",
    "Family",
    "Handler",
    "Region",
    "dtype_slot",
    "eligible",
    "fixed_target",
    "iter_tensors",
    "on_device",
    "set_opt_dtype",
    "takes_dtype",
]

BCE_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast. "
    "Many models use a sigmoid layer right before the binary cross entropy layer. "
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits "
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are "
    "safe to autocast."
)


# ---------------------------------------------------------------------------
# which tensors a region may cast
# ---------------------------------------------------------------------------
def on_device(t: torch.Tensor, device_type: str) -> bool:
    if device_type == "cpu":
        return t.is_cpu or t.is_mkldnn
    if device_type == "cuda":
        return t.is_cuda
    return t.device.type == device_type


def eligible(t: torch.Tensor, device_type: str) -> bool:
    return t.is_floating_point() and t.dtype is not torch.float64 and on_device(t, device_type)


def iter_tensors(args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    """Tensors among the arguments, one level into lists and tuples (as native autocast looks)."""
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif type(a) in (list, tuple):
            for x in a:
                if isinstance(x, torch.Tensor):
                    yield x


def _castable(region: Region, name: str, args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
    """The eligible tensors of a call, or None when there is nothing to decide:
    none is eligible (ints, float64, other devices), or ``name`` is an
    ``uncast_if_mixed`` op and their dtypes differ."""
    dev = region.device_type
    found = [t for t in iter_tensors(args, kwargs) if eligible(t, dev)]
    if not found:
        return None
    if name in region.mixed and any(t.dtype is not found[0].dtype for t in found):
        return None
    return found


# ---------------------------------------------------------------------------
# the handlers: (region, op name, args, kwargs) -> dtype to cast to, or None
# ---------------------------------------------------------------------------
def _to_lower_precision(region: Region, name: str, args: tuple, kwargs: dict) -> torch.dtype | None:
    return None if _castable(region, name, args, kwargs) is None else region.dtype


def _to_fp32(region: Region, name: str, args: tuple, kwargs: dict) -> torch.dtype | None:
    return None if _castable(region, name, args, kwargs) is None else torch.float32


def _to_fp32_unless_dtype(region: Region, name: str, args: tuple, kwargs: dict) -> torch.dtype | None:
    # Native's fp32_set_opt_dtype: a dtype the caller asked for wins, and only a
    # call whose first tensor is eligible is cast.
    if _castable(region, name, args, kwargs) is None:
        return None
    if kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args):
        return None
    first = next(iter(iter_tensors(args, kwargs)), None)
    if first is None or not eligible(first, region.device_type):
        return None
    return torch.float32


def _to_widest(region: Region, name: str, args: tuple, kwargs: dict) -> torch.dtype | None:
    found = _castable(region, name, args, kwargs)
    if found is None:
        return None
    current = region.dtype
    for t in found:
        nxt = t.dtype
        if current is torch.float32 or nxt is torch.float32:
            current = torch.float32
        elif current is region.dtype and nxt is region.dtype:
            current = region.dtype
        else:
            raise RuntimeError(
                f"Unexpected floating ScalarType in ampcert autocast promote: {nxt} inside a "
                f"{region.dtype} region (native torch.autocast raises here too)"
            )
    return current


def _refuse(region: Region, name: str, args: tuple, kwargs: dict) -> torch.dtype | None:
    dev = region.device_type
    if any(on_device(t, dev) for t in iter_tensors(args, kwargs)):
        if name == "binary_cross_entropy":
            raise RuntimeError(BCE_BANNED_MESSAGE)
        raise RuntimeError(
            f"{name} is banned inside an ampcert autocast region (policy "
            f"{region.policy.name!r}, device_type {dev!r}): it is unsafe to autocast"
        )
    return None


def fixed_target(region: Region, family: Family, name: str) -> torch.dtype | None:
    """The dtype a call of ``name`` is cast to whatever its arguments, where there is one:
    ``lower_precision`` and ``fp32`` ops that are not ``uncast_if_mixed`` (a call with no
    eligible tensor casts nothing either way). None: the family's handler decides each call."""
    if name in region.mixed:
        return None
    if family is Family.LOWER_PRECISION:
        return region.dtype
    return torch.float32 if family is Family.FP32 else None


Handler = Callable[["Region", str, tuple, dict], "torch.dtype | None"]

#: Family -> its handler: the dispatch table. Every Family has exactly one.
HANDLERS: dict[Family, Handler] = {
    Family.LOWER_PRECISION: _to_lower_precision,
    Family.FP32: _to_fp32,
    Family.FP32_WITH_DTYPE: _to_fp32_unless_dtype,
    Family.PROMOTE: _to_widest,
    Family.BANNED: _refuse,
}


def set_opt_dtype(region: Region, name: str, args: tuple, kwargs: dict) -> torch.dtype | None:
    """fp32_with_dtype's handler for an op that takes a ``dtype`` argument: the dtype is
    given to the call as ``dtype=`` and no tensor is cast, as native's set_opt_dtype does.
    (An op with none, listed there by a user's policy, gets the plain handler: its tensors
    are cast.)"""
    return _to_fp32_unless_dtype(region, name, args, kwargs)


def dtype_slot(op: torch._ops.OpOverload) -> int | None:
    """Where ``op`` takes its ``dtype`` argument: its position, or -1 for a keyword-only
    one; None when it has none (fp32_with_dtype then casts the tensors instead)."""
    positional = 0
    for arg in op._schema.arguments:
        if arg.name == "dtype":
            return -1 if arg.kwarg_only else positional
        if not arg.kwarg_only:
            positional += 1
    return None


def takes_dtype(name: str) -> bool:
    """Whether an overload of ``aten::name`` takes a ``dtype`` argument."""
    packet = getattr(torch.ops.aten, name, None)
    return packet is not None and any(dtype_slot(getattr(packet, o)) is not None for o in packet.overloads())


# ---------------------------------------------------------------------------
# a region: one setting, its policy resolved to handlers
# ---------------------------------------------------------------------------
class Region:
    """One autocast setting, with ``handlers``: each policy op name -> its family's
    handler, resolved once here so that a call costs one dict lookup."""

    __slots__ = ("device_type", "dtype", "policy", "families", "handlers", "mixed", "enabled", "cache_enabled",
                 "plans", "kernel_ops")

    def __init__(self, device_type: str, dtype: torch.dtype, policy: OpPolicy, enabled: bool,
                 cache_enabled: bool) -> None:
        self.device_type = device_type
        self.dtype = dtype
        self.policy = policy
        self.families: dict[str, Family] = dict(policy.ops)
        self.handlers: dict[str, Handler] = {
            op: set_opt_dtype if fam is Family.FP32_WITH_DTYPE and takes_dtype(op) else HANDLERS[fam]
            for op, fam in self.families.items()}
        self.mixed = policy.uncast_if_mixed
        self.enabled = enabled
        self.cache_enabled = cache_enabled
        #: callable -> what the mode's fast path does with it here (autocast._plan)
        self.plans: dict[object, object] = {}
        #: the ops ampcert's kernels decide at the dispatcher for this region (kernels),
        #: False where the Python engine decides it, None until the first eager entry asks
        self.kernel_ops: object = None  # kernels.Overrides, False or None
