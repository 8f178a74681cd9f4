"""The per-thread state of ampcert's torch autocast and its casts, with the weight cache:
what both engines share (:mod:`.autocast` the Python one, :mod:`.kernels`
the dispatcher's).

* :class:`State` (one per thread, :data:`STATE`): the open regions, which engine decides
  each, the innermost region per device type for each engine, the weight cache and its
  counters;
* :func:`cast_eligible`: one cast, through the weight cache where it applies (fp32 leaf
  tensors that require grad, not views: cast once per outermost region and reused, like
  native; dropped when the tensor's ``_version`` changes; not reused in grad mode if made
  under ``no_grad``). Never inside a trace: the graph holds the cast once anyway, and the
  cache's checks (``_is_view``, weakrefs, ``_version``) would each break it.

Imports torch, the standard library and :mod:`.families`.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from .families import Region, eligible
from .tracing import compiling as is_compiling

__all__ = ["ELIGIBLE_DTYPES", "SEQUENCES", "STATE", "State", "cast", "cast_arg", "cast_eligible", "kernel_cast_args"]

#: The dtypes :func:`~.families.eligible` accepts: floating point, not float64.
ELIGIBLE_DTYPES = frozenset(d for d in vars(torch).values()
                            if isinstance(d, torch.dtype) and d.is_floating_point and d is not torch.float64)
SEQUENCES = (list, tuple)


class State(threading.local):
    """Per thread: the open regions, the weight cache and its counters."""

    def __init__(self) -> None:
        self.stack: list[Region] = []
        #: per entry of ``stack``: where its policy differs from native (an Overrides: the
        #: dispatcher engine decides it) or None (the Python engine: the mode)
        self.engines: list[Any] = []
        self.mode_depth = 0  # entries of the Python engine open: the mode is pushed while > 0
        self.active: tuple[Region, ...] = ()  # the mode's: innermost region per device type, enabled only
        self.kernel_regions: dict[str, Region] = {}  # the kernels': innermost region per device type
        self.cache: dict[tuple[int, torch.dtype], tuple] = {}
        self.pending: Any = None  # the composite whose clone is running (see the mode)
        #: the autocast objects' entries of this thread, innermost last: (serial, native
        #: autocast entered) on the dispatcher engine, (-1, native autocast turned off or
        #: None) on the Python engine. Per thread, so one object may be entered by many.
        self.entries: list[tuple[int, Any]] = []
        #: len(stack) when the compile now running first opened a region (open_region)
        self.trace_base: int | None = None
        self.casts = 0
        self.cache_hits = 0

    def refresh(self) -> None:
        if not self.stack:
            self.active, self.kernel_regions = (), {}
            return
        if len(self.stack) == 1:  # the common case, met at every region entry and exit
            region = self.stack[0]
            on, kernels = region.enabled, self.engines[0] is not None
            self.active = (region,) if on and not kernels else ()
            self.kernel_regions = {region.device_type: region} if on and kernels else {}
            return
        seen: dict[str, tuple[Region, Any]] = {}
        for region, native in zip(reversed(self.stack), reversed(self.engines), strict=True):
            seen.setdefault(region.device_type, (region, native))
        self.active = tuple(r for r, native in seen.values() if r.enabled and native is None)
        self.kernel_regions = {r.device_type: r for r, native in seen.values() if r.enabled and native is not None}


STATE = State()


def cast(t: torch.Tensor, to: torch.dtype, region: Region, st: State, compiling: bool) -> torch.Tensor:
    if not eligible(t, region.device_type) or t.dtype is to:
        return t
    return cast_eligible(t, to, region, st, compiling)


def cast_eligible(t: torch.Tensor, to: torch.dtype, region: Region, st: State, compiling: bool) -> torch.Tensor:
    """Cast ``t`` (eligible, not already ``to``), through the weight cache where it applies."""
    if (
        region.cache_enabled
        # Under torch.compile the graph holds the cast once anyway, and the
        # cache's Python-side checks (_is_view, weakrefs, _version) would each
        # break the graph.
        and not compiling
        and to is region.dtype
        and t.dtype is torch.float32
        and t.requires_grad
        and t.is_leaf
        and not t._is_view()
    ):
        key = (id(t), to)
        grad_now = torch.is_grad_enabled()
        hit = st.cache.get(key)
        if (
            hit is not None
            and hit[0]() is t
            and hit[1] == t._version
            and (hit[2] or not grad_now)
        ):
            st.cache_hits += 1
            return hit[3]
        st.casts += 1
        out = t.to(to)
        st.cache[key] = (weakref.ref(t), t._version, grad_now, out)
        return out
    if not compiling:  # a counter in the traced region would be a guard that fails every step
        st.casts += 1
    return t.to(to)


def cast_arg(a: Any, to: torch.dtype, region: Region, st: State, compiling: bool) -> Any:
    """One argument cast: a tensor, or the tensors of a list or tuple (one level, as native looks)."""
    if isinstance(a, torch.Tensor):
        return cast(a, to, region, st, compiling)
    if type(a) in (list, tuple) and any(isinstance(x, torch.Tensor) for x in a):
        return type(a)(cast(x, to, region, st, compiling) if isinstance(x, torch.Tensor) else x for x in a)
    return a


#: Tensor types the weight cache may hold; a tracer's (fake, functional) tensors never.
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def kernel_cast_args(to: torch.dtype, region: Region, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """The dispatcher engine's casts: every eligible tensor of a call to ``to``, one level
    into lists and tuples, through the weight cache (never for a tracer's tensors)."""
    st = STATE
    tracing = is_compiling()

    def one(t: torch.Tensor) -> torch.Tensor:
        return cast(t, to, region, st, tracing or type(t) not in _PLAIN_TENSORS)

    def arg(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return one(a)
        if type(a) in SEQUENCES and any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(one(x) if isinstance(x, torch.Tensor) else x for x in a)
        return a

    return [arg(a) for a in args], ({k: arg(v) for k, v in kwargs.items()} if kwargs else kwargs)
