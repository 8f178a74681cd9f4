"""ampcert's autocast: a policy-driven mirror of ``torch.autocast``, on two engines.

An :class:`OpPolicy` (YAML) decides which ops are cast, instead of native's C++ op lists.
Each region is decided by one of two engines, which decide alike
(``tests/amp/torch/test_torch_autocast_kernels.py``):

* **the dispatcher engine** (:mod:`.kernels`), wherever the policy can be
  said at the dispatcher: the region turns native autocast on, native's C++ kernels cast
  every op the policy puts in native's family, and ampcert's kernels at the Autocast key
  decide the ops where it differs. An op costs what it costs under ``torch.autocast``
  unless the policy differs on it (``benchmarks/dispatch_overhead.py``), and a region
  traces under torch.compile as ``torch.autocast`` does;
* **the Python engine** (this module): a :class:`torch.overrides.TorchFunctionMode`,
  for a policy that names a Python function rather than an ATen op, a device type
  without native autocast, and regions opened inside one of its own (``_AmpcertMode``,
  below).

Both sit above autograd: casts are recorded by autograd, so backward runs in the forward
dtype.

Where things are
----------------
* this module: the public :class:`autocast` (which engine decides a region, its entry
  and exit), the Python engine's dispatch (below), and introspection;
* :mod:`.state`: the per-thread region stack and the casts, with the
  weight cache, that both engines share;
* :mod:`.kernels`: the dispatcher engine;
* :mod:`.families`: the :class:`~.families.Family`
  enum and the dispatch table, one handler per family deciding what a call is
  cast to (both engines use it);
* :mod:`.tracing`: re-entrant clones of torch's Python composites
  and what torch.compile needs of them (the Python engine);
* :mod:`.op_names` (names of torch callables) and :mod:`.rnn` (nn.RNN/GRU).

How the Python engine intercepts and maps calls
-----------------------------------------------
Inside its region every overridable torch entry point reaches
``_AmpcertMode.__torch_function__``: ``torch.*`` functions, ``torch.nn.functional.*``
(C builtins and Python functions), ``torch.linalg/fft/special.*``, Tensor methods
and operators (``x @ w`` arrives as ``Tensor.matmul``, ``x ** 2`` as ``pow``).
Each callable is mapped once (cached per callable) to a policy op name: its
``__name__`` (the ATen name for C bindings: ``linalg_vector_norm``, ``fft_rfft``),
put through a small alias table (``__rmatmul__`` -> ``matmul``, ``arccos`` -> ``acos``,
``concat`` -> ``cat``, ``special_expm1`` -> ``expm1``) and, for two composite C
builtins, an argument-dependent resolver (``pad`` -> ``reflection_pad2d``/...,
``nll_loss_nd`` -> ``nll_loss``/``nll_loss2d``). The name then selects the
region's handler (one dict lookup); the handler returns the dtype to cast to,
or None; the mode casts the eligible tensors and calls the op:

* Op in the policy: the decision is made once, at this outermost call; the op then
  runs with the mode popped (TorchFunctionMode pops itself while
  ``__torch_function__`` runs), so calls nested inside it (``F.linear`` inside
  ``nn.Linear``, ``Tensor.softmax`` inside ``F.softmax``) are not cast again.
* Op not in the policy, Python composite from torch (``torch.nn.functional``,
  ``torch.functional``, ``torch._tensor``, ...: ``F.cross_entropy``, ``F.interpolate``,
  ``F.multi_head_attention_forward``): it is re-run with the mode active but its own
  top-level ``has_torch_function`` check skipped (a clone, see
  :mod:`.tracing`), so the ops it calls are decided one by one, as
  native autocast decides them at the ATen level. If a clone cannot skip its
  check, the repeated call is detected and the function runs untouched.
* Anything else runs untouched.

Eligible tensors: floating point, on the region's device type, not float64.
In-place ops (never in a policy) and ``out=`` calls are not cast. Weight cache:
fp32 leaf tensors that require grad (not views) are cast to the low-precision dtype
once per outermost region and reused, like native; a cached cast is dropped when
the source tensor's ``_version`` changes (in-place update) and is not reused in
grad mode if it was made under ``no_grad``. (On the dispatcher engine the ops native's
kernels decide use native's cache, which keeps a cast made before an in-place update
until the outermost region ends, as under ``torch.autocast``: step the optimizer outside
the region, as torch's docs ask.)

This module imports only torch, the standard library and its ``ampcert.amp``
siblings. It re-exports the op-name registry of :mod:`.op_names`
(:data:`~.op_names.OP_TORCH_VERSIONS`, :func:`known_op_names`, ...).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from torch.overrides import TorchFunctionMode

from ..policy import OpPolicy, load_policy, shipped_policy
from ..precision import LOW_PRECISIONS, dtype_name
from .dynamo_marks import constant_under_compile
from .families import BCE_BANNED_MESSAGE, Family, Region, fixed_target, iter_tensors
from .families import set_opt_dtype as _SETS_DTYPE
from .kernels import Overrides, serial_of
from .kernels import close_region as _close_region
from .kernels import open_region as _open_region
from .op_names import (
    _NAME_CACHE,
    OP_TORCH_VERSIONS,
    canonical_op_name,
    known_op_names,
    op_callables,
    op_in_torch,
    torch_version,
)
from .rnn import RNN_OPS
from .rnn import decompose as decompose_rnn
from .state import ELIGIBLE_DTYPES as _ELIGIBLE_DTYPES
from .state import SEQUENCES as _SEQUENCES
from .state import STATE as _STATE
from .state import State as _State
from .state import cast_arg as _cast_arg
from .state import cast_eligible as _cast_eligible
from .tracing import Tracing, never_compiled_alone, refuse_untraceable_region
from .tracing import compiling as _compiling

__all__ = [
    "BCE_BANNED_MESSAGE",
    "OP_TORCH_VERSIONS",
    "Family",
    "autocast",
    "cache_stats",
    "canonical_op_name",
    "clear_cache",
    "engine_of",
    "get_autocast_dtype",
    "is_autocast_enabled",
    "known_op_names",
    "op_callables",
    "op_in_torch",
    "torch_version",
]

_DEFAULT_DTYPE = {"cpu": torch.bfloat16, "cuda": torch.float16, "xpu": torch.float16,
                  "mps": torch.float16, "hpu": torch.bfloat16}
_LOW_DTYPES = tuple(getattr(torch, dtype_name(p)) for p in LOW_PRECISIONS)  # fp16, bf16


# ---------------------------------------------------------------------------
# op naming: the registry lives in .op_names (the policy loader validates with it);
# only the argument-dependent resolution of two composites is decided here.
# ---------------------------------------------------------------------------
def _arg(args: tuple, kwargs: dict, index: int, key: str, default: Any = None) -> Any:
    if key in kwargs:
        return kwargs[key]
    return args[index] if len(args) > index else default


def _resolve_pad(args: tuple, kwargs: dict) -> str | None:
    # ATen's pad (CompositeImplicit) dispatches on mode and pad length.
    mode = _arg(args, kwargs, 2, "mode", "constant")
    pad = _arg(args, kwargs, 1, "pad", ())
    try:
        n = len(pad) // 2
    except TypeError:
        return None
    if mode == "reflect" and n in (1, 2, 3):
        return f"reflection_pad{n}d"
    if mode == "replicate" and n in (1, 2, 3):
        return f"replication_pad{n}d"
    return None


def _resolve_nll_loss_nd(args: tuple, kwargs: dict) -> str | None:
    x = _arg(args, kwargs, 0, "input")
    if isinstance(x, torch.Tensor):
        return "nll_loss" if x.dim() in (1, 2) else "nll_loss2d"
    return None


#: Composite C builtins whose native decision happens on an op chosen from the arguments.
_RESOLVERS: dict[str, Callable[[tuple, dict], str | None]] = {
    "pad": _resolve_pad,
    "nll_loss_nd": _resolve_nll_loss_nd,
}


# ---------------------------------------------------------------------------
# region state
# ---------------------------------------------------------------------------
#: One Region per setting, reused by every entry: torch.compile guards on the
#: objects its trace read, so a fresh one per step would recompile every step.
#: (A region holds its policy, so the policy's id stays its own.)
_REGIONS: dict[tuple, Region] = {}


@constant_under_compile
def _region_key(device_type: str, dtype: torch.dtype, policy: str, enabled: bool,
                cache_enabled: bool) -> tuple:
    """The key of this setting's region in _REGIONS, made on first use (the policy by its
    digest: torch 2.11's Dynamo cannot pass a frozen dataclass here). Under torch.compile it
    runs once, while the tracer reads the code: a region made in the trace would be made
    again by the compiled call, and the next step, finding _REGIONS changed, would recompile."""
    key = (device_type, dtype, policy, enabled, cache_enabled)
    if key not in _REGIONS:
        _REGIONS[key] = Region(device_type, dtype, _POLICIES[policy], enabled, cache_enabled)
    return key


def _pick_region(active: tuple[Region, ...], args: tuple, kwargs: dict) -> Region | None:
    if len(active) == 1:
        return active[0]
    by_dev = {r.device_type: r for r in active}
    chosen = None
    for t in iter_tensors(args, kwargs):
        dev = t.device.type
        if dev in by_dev and (chosen is None or chosen.device_type == "cpu"):
            chosen = by_dev[dev]
    return chosen


# ---------------------------------------------------------------------------
# plans: the fast path's decision per (region, callable), made once
# ---------------------------------------------------------------------------
_UNPLANNED = object()
#: The plan of a call that runs as it is: no family, no clone, no decomposition.
_AS_IS = object()


def _plan(region: Region, func: Any) -> object:
    """What the fast path may do with ``func`` in ``region``, decided as the general path
    would: ``_AS_IS``; the dtype every eligible tensor is cast to (families whose target
    does not depend on the arguments, ops not ``uncast_if_mixed``); or None (the general
    path decides each call: argument-dependent ops, composites, banned ops, ...)."""
    name = canonical_op_name(func)
    if type(func) is _FunctionType or name in _RESOLVERS:
        return None  # a Python composite (re-run as a clone) or an op chosen from the arguments
    if name is None:
        return _AS_IS
    family = region.families.get(name)
    if family is None:
        return None if name in RNN_OPS and region.device_type == "cpu" else _AS_IS
    return fixed_target(region, family, name)


def _cast_positional(args: tuple, to: torch.dtype, region: Region, st: _State) -> list | None:
    """``args`` with every eligible tensor cast to ``to``, when the call is one the fast
    path covers (tensors positional and not in lists, at least one eligible); else None,
    and the general path decides."""
    dev = region.device_type
    out = list(args)
    found = False
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            dt = a.dtype
            if dt in _ELIGIBLE_DTYPES and (
                (a.is_cpu or a.is_mkldnn) if dev == "cpu" else a.is_cuda if dev == "cuda" else a.device.type == dev
            ):
                found = True
                if dt is not to:
                    out[i] = _cast_eligible(a, to, region, st, False)
        elif type(a) in _SEQUENCES and any(isinstance(x, torch.Tensor) for x in a):
            return None
    return out if found else None




# ---------------------------------------------------------------------------
# the mode
# ---------------------------------------------------------------------------
class _AmpcertMode(TorchFunctionMode):
    """The single TorchFunctionMode pushed while any ampcert region is open (per thread).

    Two paths decide a call. The fast one serves the common case in eager code (one
    device type's region open, no clone running): the region's plan for the callable,
    made once by :func:`_plan`, says "run as it is" or "cast the eligible tensors to X",
    and the call costs one dict lookup and the casts (``benchmarks/dispatch_overhead.py``
    measures it). Every other call (argument-dependent ops, composites re-run as clones,
    tensors inside lists or keywords, ``out=``, nested device types, torch.compile's
    trace) takes the general path, :meth:`_decide`, which the plans only short-cut."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        st = _STATE
        active = st.active
        if len(active) == 1 and st.pending is None and not _compiling():
            region = active[0]
            try:
                plan = region.plans.get(func, _UNPLANNED)
            except TypeError:  # an unhashable callable: no plan
                plan = None
            if plan is _UNPLANNED:
                plan = region.plans[func] = _plan(region, func)
            if plan is _AS_IS:
                return func(*args, **kwargs) if kwargs else func(*args)
            if plan is not None and not kwargs:
                cast = _cast_positional(args, plan, region, st)
                if cast is not None:
                    return func(*cast)
        return self._decide(func, args, {} if kwargs is None else kwargs)

    def _decide(self, func, args, kwargs):
        """The general path: every call can take it, and gets the same decision."""
        st = _STATE
        pending = st.pending
        if pending is not None:
            st.pending = None
            if pending is func:  # a clone whose override check could not be skipped
                return func(*args, **kwargs)
        active = st.active
        if not active:
            return func(*args, **kwargs)
        compiling = _compiling()
        if compiling:  # the snapshot of _TRACING.prepare; subscripting is what the tracer can do
            try:
                name = _TRACING.names[func]
            except KeyError:
                name = canonical_op_name(func)
        else:
            entry = _NAME_CACHE.get(id(func))
            name = entry[1] if entry is not None and entry[0] is func else canonical_op_name(func)

        # The op's family, as its handler: one dict lookup in the region's table.
        region = handler = None
        if name is not None:
            region = _pick_region(active, args, kwargs)
            if region is not None:
                resolver = _RESOLVERS.get(name)
                if resolver is not None:
                    specific = resolver(args, kwargs)
                    if specific is not None and specific in region.handlers:
                        name = specific
                handler = region.handlers.get(name)
        if handler is None or kwargs.get("out") is not None:
            return self._uncast(func, name, region, handler is None, args, kwargs, compiling)

        to = handler(region, name, args, kwargs)
        if to is None:
            return func(*args, **kwargs)
        if handler is _SETS_DTYPE:  # native's fp32_set_opt_dtype: the op gets dtype=, its tensors as given
            return func(*args, **{**kwargs, "dtype": to})
        return func(*[_cast_arg(a, to, region, st, compiling) for a in args],
                    **{k: _cast_arg(v, to, region, st, compiling) for k, v in kwargs.items()})

    def _uncast(self, func: Any, name: str | None, region: Region | None, no_family: bool,
                args: tuple, kwargs: dict, compiling: bool) -> Any:
        """A call the policy does not cast: decomposed (nn.RNN/GRU on the CPU), re-run
        as a clone (a Python composite of torch) or run as it is."""
        if no_family and name in RNN_OPS and region is not None and region.device_type == "cpu":
            # An ATen composite native autocast decides op by op (rnn's module doc).
            with self:
                decomposed = decompose_rnn(name, args, kwargs)
            if decomposed is not None:
                return decomposed
        if type(func) is _FunctionType:
            clone = _TRACING.clone(func, compiling)
            if clone is not None:
                st = _STATE
                st.pending = func
                try:
                    with self:
                        return clone(*args, **kwargs)
                finally:
                    st.pending = None
        return func(*args, **kwargs)


@constant_under_compile
def _dispatcher_serial(key: tuple) -> int:
    """The serial of the region ``key`` names if the dispatcher engine decides it
    (:func:`~.kernels.serial_of`), else -1. Under torch.compile it runs once,
    for real, while the tracer reads the code."""
    return serial_of(key, _REGIONS[key])


_FunctionType = types.FunctionType
#: The one mode object: entered at the outermost region, left at its exit.
_MODE = _AmpcertMode()
#: The clone caches and torch.compile's ahead-of-tracer snapshot (tracing).
_TRACING = Tracing(_MODE)

#: The policies autocast objects were made with, one object per content (effective_sha256).
_POLICIES: dict[str, OpPolicy] = {}
#: device type -> the digest of its shipped policy, read by the first eager autocast made with none
_SHIPPED: dict[str, str] = {}


# The two functions below run once under torch.compile, while the tracer reads the code
# (assume_constant_result, dynamo_marks: called for real, their result a constant of the
# graph), so an autocast made and entered inside a compiled function traces with no graph
# break: the tracer cannot read a file (the policy) or build modules (the traced clones).


@constant_under_compile
def _read_policy(device_type: str, ref: str | Path | None) -> str:
    """The content digest of the policy ``ref`` names (None: the shipped one for the device),
    its object kept in _POLICIES: one object per content, whichever autocast read it, so a
    trace's guards on it hold from step to step and the region made for it is reused."""
    return _keep_policy(shipped_policy(device_type) if ref is None else load_policy(ref))


@constant_under_compile
def _keep_policy(policy: OpPolicy) -> str:
    """Its digest, the object kept in _POLICIES for the digest (one object per content)."""
    return _POLICIES.setdefault(policy.effective_sha256, policy).effective_sha256


@constant_under_compile
def _prepare(policy: str) -> bool:
    """The per-callable decisions (tracing), made once per process."""
    _TRACING.prepare(_POLICIES[policy])
    return True


# ---------------------------------------------------------------------------
# public context manager
# ---------------------------------------------------------------------------
class autocast:
    """Context manager / decorator mirroring ``torch.autocast`` with a YAML op policy.

    Args:
        device_type: ``"cpu"`` or ``"cuda"`` (``"cuda:0"`` is accepted).
        dtype: the low-precision dtype (default: bf16 on cpu, fp16 on cuda).
        policy: an :class:`OpPolicy`, a policy path or shipped name; default
            ``shipped_policy(device_type)``.
        enabled: ``False`` makes the region a no-op for this device type (and
            disables an enclosing region for it, like native nesting).
        cache_enabled: cache low-precision casts of fp32 leaf weights per
            outermost region.
    """

    def __init__(
        self,
        device_type: str,
        dtype: torch.dtype | None = None,
        policy: OpPolicy | str | Path | None = None,
        enabled: bool = True,
        cache_enabled: bool = True,
    ) -> None:
        if not isinstance(device_type, str):
            raise ValueError(f"device_type: expected a string like 'cpu' or 'cuda', got {device_type!r}")
        dev = device_type.split(":", 1)[0]
        if dev not in _DEFAULT_DTYPE:
            raise ValueError(f"device_type: expected one of {sorted(_DEFAULT_DTYPE)}, got {device_type!r}")
        if dtype is None:
            dtype = _DEFAULT_DTYPE[dev]
        if dtype not in _LOW_DTYPES:
            raise ValueError(f"dtype: expected torch.float16 or torch.bfloat16, got {dtype!r}")
        if policy is None and not _compiling():
            # The shipped policy is package data: read once per process (a stat per
            # construction would cost five times native's whole region).
            policy = _POLICIES.get(_SHIPPED.get(dev, ""))
            if policy is None:
                digest = _SHIPPED[dev] = _read_policy(dev, None)
                policy = _POLICIES[digest]
        elif not isinstance(policy, OpPolicy):
            policy = _POLICIES[_read_policy(dev, policy)]
        elif policy.effective_sha256 not in _POLICIES:  # (a kept one is not passed: 2.11's Dynamo cannot)
            _keep_policy(policy)
        self.device_type = dev
        self.fast_dtype = dtype
        self.policy = policy
        self.enabled = bool(enabled)
        self.cache_enabled = bool(cache_enabled)
        #: this object's entries inside a traced function (a local there); eagerly they are
        #: per thread, in the state (State.entries), so threads may share the object
        self._entries: list[tuple[int, Any]] = []

    def __repr__(self) -> str:
        return (f"ampcert.autocast(device_type={self.device_type!r}, dtype={self.fast_dtype}, "
                f"policy={self.policy.name!r}, enabled={self.enabled}, cache_enabled={self.cache_enabled})")

    def __enter__(self) -> autocast:
        refuse_untraceable_region()
        st = _STATE
        key = _region_key(self.device_type, self.fast_dtype, self.policy.effective_sha256, self.enabled,
                          self.cache_enabled)
        if st.mode_depth == 0:
            serial = _dispatcher_serial(key)
            if serial >= 0:  # the dispatcher engine (kernels)
                _open_region(serial)
                try:
                    native = torch.amp.autocast_mode._enter_autocast(
                        self.device_type, self.fast_dtype, self.enabled, self.cache_enabled)
                except BaseException:
                    _close_region(serial)
                    raise
                self._entries_here().append((serial, native))
                return self
        self._entries_here().append((-1, self._enter_mode(st, _REGIONS[key])))
        return self

    def _entries_here(self) -> list[tuple[int, Any]]:
        return self._entries if _compiling() else _STATE.entries

    def _enter_mode(self, st: _State, region: Region) -> Any:
        """The Python engine's entry: the mode pushed at its first region. Returns the native
        autocast it turned off (inside a region of the dispatcher engine), or None."""
        if st.mode_depth == 0:
            _prepare(self.policy.effective_sha256)
        native_off = None
        if not _compiling() and torch.is_autocast_enabled(region.device_type):
            # inside a region of the dispatcher engine: native's casts stop here, the mode decides
            native_off = torch.autocast(region.device_type, enabled=False)
            native_off.__enter__()
        st.stack.append(region)
        st.engines.append(None)
        st.mode_depth += 1
        st.refresh()
        if st.mode_depth == 1:
            try:
                _MODE.__enter__()
            except BaseException:
                self._leave_mode(st, native_off, None)
                raise
        return native_off

    def _leave_mode(self, st: _State, native_off: Any, exc_info: tuple | None) -> None:
        if st.stack:
            st.stack.pop()
            st.engines.pop()
        st.mode_depth = max(0, st.mode_depth - 1)
        st.refresh()
        try:
            if exc_info is not None and st.mode_depth == 0:
                _MODE.__exit__(*exc_info)
        finally:
            if native_off is not None:
                native_off.__exit__(*(exc_info or (None, None, None)))
            if not st.stack:
                st.cache.clear()
                st.pending = None

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        st = _STATE
        entries = self._entries_here()
        serial, held = entries.pop() if entries else (-1, None)
        if serial >= 0:
            try:
                torch.amp.autocast_mode._exit_autocast(held)
            finally:
                _close_region(serial)
        else:
            self._leave_mode(st, held, (exc_type, exc, tb))
        return False

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper


# Entered and left as plain Python when Dynamo hands it a frame whole (tracing).
never_compiled_alone(autocast.__init__, autocast.__enter__, autocast.__exit__,
                     _AmpcertMode.__torch_function__, _AmpcertMode._decide, _AmpcertMode._uncast)


# ---------------------------------------------------------------------------
# introspection helpers
# ---------------------------------------------------------------------------
def _innermost(device_type: str) -> Region | None:
    dev = device_type.split(":", 1)[0]
    for region in reversed(_STATE.stack):
        if region.device_type == dev:
            return region
    return None


def is_autocast_enabled(device_type: str = "cpu") -> bool:
    """Whether an enabled ampcert region is active for ``device_type`` on this thread."""
    region = _innermost(device_type)
    return bool(region and region.enabled)


def get_autocast_dtype(device_type: str = "cpu") -> torch.dtype | None:
    """The low-precision dtype of the innermost ampcert region for ``device_type``."""
    region = _innermost(device_type)
    return region.dtype if region else None


def engine_of(device_type: str, dtype: torch.dtype | None = None,
              policy: OpPolicy | str | Path | None = None) -> dict[str, Any]:
    """Which engine an eager region of this setting runs on, for a run's record:
    ``{"engine": "dispatcher", "ampcert_kernels": [...]}`` (native's kernels, and ampcert's
    for the ops listed, where the policy differs from native) or ``{"engine": "python"}``."""
    probe = autocast(device_type, dtype, policy)
    key = _region_key(probe.device_type, probe.fast_dtype, probe.policy.effective_sha256, probe.enabled,
                      probe.cache_enabled)
    if _dispatcher_serial(key) < 0:
        return {"engine": "python"}
    overrides = _REGIONS[key].kernel_ops
    assert isinstance(overrides, Overrides)
    return {"engine": "dispatcher", "ampcert_kernels": sorted(overrides.added | overrides.shadowed)}


def clear_cache() -> None:
    """Drop the weight-cast cache of this thread (done automatically at outermost exit)."""
    _STATE.cache.clear()


def cache_stats(reset: bool = False) -> dict[str, int]:
    """Counters of this thread: casts made, weight-cache hits, live cache entries."""
    st = _STATE
    out = {"casts": st.casts, "cache_hits": st.cache_hits, "cached": len(st.cache)}
    if reset:
        st.casts = 0
        st.cache_hits = 0
    return out
