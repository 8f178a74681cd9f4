"""ampcert's autocast: a policy-driven mirror of ``torch.autocast`` in Python.

Built on :class:`torch.overrides.TorchFunctionMode`, which (like native autocast)
sits *above* autograd: casts made here are recorded by autograd, so backward runs
in the forward dtype, and the cast decisions come from an :class:`OpPolicy`
(YAML) instead of a C++ op list.

How calls are intercepted and mapped
------------------------------------
Inside a region every overridable torch entry point reaches
``_AmpcertMode.__torch_function__``: ``torch.*`` functions, ``torch.nn.functional.*``
(C builtins and Python functions), ``torch.linalg/fft/special.*``, Tensor methods
and operators (``x @ w`` arrives as ``Tensor.matmul``, ``x ** 2`` as ``pow``).
Each callable is mapped once (cached per callable) to a policy op name: its
``__name__`` (the ATen name for C bindings: ``linalg_vector_norm``, ``fft_rfft``),
put through a small alias table (``__rmatmul__`` -> ``matmul``, ``arccos`` -> ``acos``,
``concat`` -> ``cat``, ``special_expm1`` -> ``expm1``) and, for two composite C
builtins, an argument-dependent resolver (``pad`` -> ``reflection_pad2d``/...,
``nll_loss_nd`` -> ``nll_loss``/``nll_loss2d``).

* Op in the policy: the decision is made once, at this outermost call; the op then
  runs with the mode popped (TorchFunctionMode pops itself while
  ``__torch_function__`` runs), so calls nested inside it (``F.linear`` inside
  ``nn.Linear``, ``Tensor.softmax`` inside ``F.softmax``) are not cast again.
* Op not in the policy, Python composite from torch (``torch.nn.functional``,
  ``torch.functional``, ``torch._tensor``, ...: ``F.cross_entropy``, ``F.interpolate``,
  ``F.multi_head_attention_forward``): it is re-run with the mode active but its own
  top-level ``has_torch_function`` check skipped (a clone of the function whose
  three ``has_torch_function*`` globals say False), so the ops it calls are decided
  one by one, as native autocast decides them at the ATen level. If a clone cannot
  skip its check, the repeated call is detected and the function runs untouched.
* Anything else runs untouched.

Eligible tensors: floating point, on the region's device type, not float64.
In-place ops (never in a policy) and ``out=`` calls are not cast. Weight cache:
fp32 leaf tensors that require grad (not views) are cast to the low-precision dtype
once per outermost region and reused, like native; a cached cast is dropped when
the source tensor's ``_version`` changes (in-place update) and is not reused in
grad mode if it was made under ``no_grad``.

This module imports only torch, the standard library and its siblings ``.policy``,
``.precision`` and ``.torch_ops`` (where op names come from: the registry of torch
callables and :data:`~.torch_ops.OP_TORCH_VERSIONS`; re-exported here).
"""

from __future__ import annotations

import functools
import itertools
import threading
import types
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import torch
from torch.overrides import TorchFunctionMode

from .policy import OpPolicy, load_policy, shipped_policy
from .precision import LOW_PRECISIONS, dtype_name
from .torch_ops import (
    _NAME_CACHE,
    OP_TORCH_VERSIONS,
    canonical_op_name,
    known_op_names,
    op_callables,
    op_in_torch,
    public_callables,
    torch_version,
)
from .torch_rnn import RNN_OPS
from .torch_rnn import decompose as decompose_rnn

__all__ = [
    "OP_TORCH_VERSIONS",
    "autocast",
    "cache_stats",
    "canonical_op_name",
    "clear_cache",
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

BCE_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast. "
    "Many models use a sigmoid layer right before the binary cross entropy layer. "
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits "
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are "
    "safe to autocast."
)

# ---------------------------------------------------------------------------
# op naming: the registry lives in .torch_ops (the policy loader validates with it);
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
# re-entrant clones of Python composites
# ---------------------------------------------------------------------------
_HTF_NAMES = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")
_NO_REENTER_MODULES = ("torch.autograd", "torch.utils", "torch._dynamo", "torch.distributed",
                       "torch.testing", "torch.nn.init", "torch.fx", "torch.jit")
_NO_REENTER = frozenset({
    "backward", "register_hook", "register_post_accumulate_grad_hook", "__deepcopy__",
    "__reduce_ex__", "_reduce_ex_internal", "__setstate__", "__repr__", "__format__",
    "__dlpack__", "__dlpack_device__", "__array__", "__array_wrap__", "storage",
    "untyped_storage", "_typed_storage", "share_memory_", "module_load",
})


def _never(*_args: Any, **_kwargs: Any) -> bool:
    return False


class _Globals(dict):
    """Globals for a clone: the skip-overrides names here, everything else live from the module."""

    def __init__(self, base: dict, overrides: dict) -> None:
        super().__init__(overrides)
        self._base = base

    def __missing__(self, key: str) -> Any:
        return self._base[key]


_CLONES: dict[Any, Callable | None] = {}
_TRACED_CLONES: dict[Any, Callable | None] = {}


def _reentrant_clone(func: Any, traced: bool = False) -> Callable | None:
    """``func`` with its ``has_torch_function*`` checks answering False, or None.

    Eagerly the clone reads the module's globals live (a dict subclass that
    falls back to them); ``traced`` (under torch.compile, whose tracer resolves
    globals only from a plain dict) it gets a plain copy of them, taken once:
    torch's modules are fully imported by the time any op runs."""
    clones = _TRACED_CLONES if traced else _CLONES
    try:
        return clones[func]
    except KeyError:
        pass
    clone = None
    code = getattr(func, "__code__", None)
    module = getattr(func, "__module__", None) or ""
    if (
        code is not None
        and (module == "torch" or module.startswith("torch."))
        and not module.startswith(_NO_REENTER_MODULES)
        # Traced, Tensor's Python methods stay whole: their bodies forward to
        # torch._VF builtins (Tensor.split -> _VF.split), which torch.compile's
        # tracer cannot call; whole, it records them as the Tensor method.
        and not (traced and module == "torch._tensor")
        and func.__name__ not in _NO_REENTER
        and any(func.__globals__.get(n) is getattr(torch.overrides, n) for n in _HTF_NAMES if n in code.co_names)
    ):
        base = func.__globals__
        overrides = {n: _never for n in _HTF_NAMES}
        overrides["__builtins__"] = base.get("__builtins__", __builtins__)
        scope = _traced_globals(base, overrides) if traced else _Globals(base, overrides)
        clone = types.FunctionType(code, scope, func.__name__, func.__defaults__, func.__closure__)
        clone.__kwdefaults__ = func.__kwdefaults__
    clones[func] = clone
    return clone


_TRACED_TORCH: types.ModuleType | None = None
_TRACED_MODULES: dict[str, types.ModuleType] = {}


def _traced_globals(base: dict, overrides: dict) -> dict:
    """Globals for traced clones of one module's functions: a plain copy (the
    tracer resolves globals only from a dict) with ``torch`` as
    :func:`_traced_torch` gives it. The dict belongs to a module registered
    under its own name: the tracer guards on globals through the module they
    belong to, and must find these, not the original module's."""
    name = f"ampcert.amp._traced.{base.get('__name__', 'unknown')}"
    module = _TRACED_MODULES.get(name)
    if module is None:
        import sys

        module = types.ModuleType(name)
        module.__dict__.update(base)
        module.__dict__.update(overrides)
        module.__dict__["__name__"] = name
        if module.__dict__.get("torch") is torch:
            module.__dict__["torch"] = _traced_torch()
        sys.modules[name] = module
        _TRACED_MODULES[name] = module
    return module.__dict__


def _traced_torch() -> types.ModuleType:
    """``torch`` as traced clones see it: the same module, except that the
    ``torch._C._nn`` builtins torch.compile does not route to torch function
    modes (those missing from ``torch.overrides.get_overridable_functions()``,
    e.g. ``cross_entropy_loss`` inside ``F.cross_entropy``) are called through
    this engine's ``__torch_function__`` explicitly, so the policy decides them
    in the compiled graph as it does eagerly."""
    global _TRACED_TORCH
    if _TRACED_TORCH is not None:
        return _TRACED_TORCH
    routed = {f for fs in torch.overrides.get_overridable_functions().values() for f in fs}

    def through_mode(builtin: Any) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            return _MODE.__torch_function__(builtin, (), args, kwargs)
        return call

    nn = types.ModuleType("torch._C._nn")
    nn.__dict__.update(torch._C._nn.__dict__)
    for attr, obj in torch._C._nn.__dict__.items():
        if callable(obj) and not attr.startswith("_") and obj not in routed:
            setattr(nn, attr, through_mode(obj))
    c = types.ModuleType("torch._C")
    c.__dict__.update(torch._C.__dict__)
    c._nn = nn  # type: ignore[attr-defined]
    shim = types.ModuleType("torch")
    shim.__dict__.update(torch.__dict__)
    shim._C = c  # type: ignore[attr-defined]
    _TRACED_TORCH = shim
    return shim


# ---------------------------------------------------------------------------
# region state
# ---------------------------------------------------------------------------
class _Region:
    __slots__ = ("device_type", "dtype", "policy", "ops", "mixed", "enabled", "cache_enabled")

    def __init__(self, device_type: str, dtype: torch.dtype, policy: OpPolicy, enabled: bool,
                 cache_enabled: bool) -> None:
        self.device_type = device_type
        self.dtype = dtype
        self.policy = policy
        self.ops = policy.ops
        self.mixed = policy.uncast_if_mixed
        self.enabled = enabled
        self.cache_enabled = cache_enabled


_REGIONS: dict[tuple, _Region] = {}


def _region(device_type: str, dtype: torch.dtype, policy: OpPolicy, enabled: bool, cache_enabled: bool) -> _Region:
    """One region object per setting, reused by every entry: torch.compile guards
    on the objects its trace read, so a fresh one per step would recompile
    every step. (A region holds its policy, so the policy's id stays its own.)"""
    key = (device_type, dtype, id(policy), enabled, cache_enabled)
    region = _REGIONS.get(key)
    if region is None:
        region = _REGIONS[key] = _Region(device_type, dtype, policy, enabled, cache_enabled)
    return region


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: list[_Region] = []
        self.active: tuple[_Region, ...] = ()  # innermost region per device type, enabled only
        self.cache: dict[tuple[int, torch.dtype], tuple] = {}
        self.pending: Any = None
        self.casts = 0
        self.cache_hits = 0

    def refresh(self) -> None:
        seen: dict[str, _Region] = {}
        for region in reversed(self.stack):
            seen.setdefault(region.device_type, region)
        self.active = tuple(r for r in seen.values() if r.enabled)


_STATE = _State()


def _on_device(t: torch.Tensor, device_type: str) -> bool:
    if device_type == "cpu":
        return t.is_cpu or t.is_mkldnn
    if device_type == "cuda":
        return t.is_cuda
    return t.device.type == device_type


def _eligible(t: torch.Tensor, device_type: str) -> bool:
    return t.is_floating_point() and t.dtype is not torch.float64 and _on_device(t, device_type)


def _iter_tensors(args: tuple, kwargs: dict) -> Iterable[torch.Tensor]:
    """Tensors among the arguments, one level into lists and tuples (as native autocast looks)."""
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif type(a) in (list, tuple):
            for x in a:
                if isinstance(x, torch.Tensor):
                    yield x


def _map_tensors(args: tuple, kwargs: dict, fn: Callable[[torch.Tensor], torch.Tensor]) -> tuple[tuple, dict]:
    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return fn(a)
        if type(a) in (list, tuple) and any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(fn(x) if isinstance(x, torch.Tensor) else x for x in a)
        return a

    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def _cast(t: torch.Tensor, to: torch.dtype, region: _Region, st: _State) -> torch.Tensor:
    if not _eligible(t, region.device_type) or t.dtype is to:
        return t
    if (
        region.cache_enabled
        # Under torch.compile the graph holds the cast once anyway, and the
        # cache's Python-side checks (_is_view, weakrefs, _version) would each
        # break the graph.
        and not _compiling()
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
    if not _compiling():  # a counter in the traced region would be a guard that fails every step
        st.casts += 1
    return t.to(to)


def _dtype_given(args: tuple, kwargs: dict) -> bool:
    if kwargs.get("dtype") is not None:
        return True
    return any(isinstance(a, torch.dtype) for a in args)


def _promote_type(region: _Region, eligible: list[torch.Tensor]) -> torch.dtype:
    current = region.dtype
    for t in eligible:
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


def _pick_region(active: tuple[_Region, ...], args: tuple, kwargs: dict) -> _Region | None:
    if len(active) == 1:
        return active[0]
    by_dev = {r.device_type: r for r in active}
    chosen = None
    for t in _iter_tensors(args, kwargs):
        dev = t.device.type
        if dev in by_dev and (chosen is None or chosen.device_type == "cpu"):
            chosen = by_dev[dev]
    return chosen


class _AmpcertMode(TorchFunctionMode):
    """The single TorchFunctionMode pushed while any ampcert region is open (per thread)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: C901 - hot path
        if kwargs is None:
            kwargs = {}
        st = _STATE
        pending = st.pending
        if pending is not None:
            st.pending = None
            if pending is func:  # a clone whose override check could not be skipped
                return func(*args, **kwargs)
        active = st.active
        if not active:
            return func(*args, **kwargs)

        # Traced: the snapshot taken by _prepare_tracing, which nothing changes
        # afterwards (the tracer guards on a dict it reads; a growing one would
        # recompile the step whenever an eager op adds a name).
        if _compiling():
            try:  # (subscripting is what the tracer can do with a callable key; `in` it cannot)
                name = _TRACE_NAMES[func]
            except KeyError:
                name = canonical_op_name(func)
        else:
            entry = _NAME_CACHE.get(id(func))
            name = entry[1] if entry is not None and entry[0] is func else canonical_op_name(func)

        family = None
        region = None
        if name is not None:
            region = _pick_region(active, args, kwargs)
            if region is not None:
                ops = region.ops
                resolver = _RESOLVERS.get(name)
                if resolver is not None:
                    specific = resolver(args, kwargs)
                    if specific is not None and specific in ops:
                        name = specific
                family = ops.get(name)

        if family is None and name in RNN_OPS and region is not None and region.device_type == "cpu":
            # An ATen composite native autocast decides op by op (torch_rnn's module doc).
            with self:
                decomposed = decompose_rnn(name, args, kwargs)
            if decomposed is not None:
                return decomposed
        if family is None or kwargs.get("out") is not None:
            if type(func) is types_FunctionType:
                clone = _reentrant_clone(func, _compiling())
                if clone is not None:
                    st.pending = func
                    try:
                        with self:
                            return clone(*args, **kwargs)
                    finally:
                        st.pending = None
            return func(*args, **kwargs)

        dev = region.device_type
        if family == "banned":
            if any(_on_device(t, dev) for t in _iter_tensors(args, kwargs)):
                if name == "binary_cross_entropy":
                    raise RuntimeError(BCE_BANNED_MESSAGE)
                raise RuntimeError(
                    f"{name} is banned inside an ampcert autocast region (policy "
                    f"{region.policy.name!r}, device_type {dev!r}): it is unsafe to autocast"
                )
            return func(*args, **kwargs)
        # fast path: nothing eligible (ints, float64, other devices) -> nothing to decide
        eligible = [t for t in _iter_tensors(args, kwargs) if _eligible(t, dev)]
        if not eligible:
            return func(*args, **kwargs)
        if name in region.mixed and any(t.dtype is not eligible[0].dtype for t in eligible):
            return func(*args, **kwargs)
        if family == "lower_precision":
            to = region.dtype
        elif family == "fp32":
            to = torch.float32
        elif family == "fp32_with_dtype":
            if _dtype_given(args, kwargs):
                return func(*args, **kwargs)
            first = next(iter(_iter_tensors(args, kwargs)), None)
            if first is None or not _eligible(first, dev):
                return func(*args, **kwargs)
            to = torch.float32
        else:  # promote
            to = _promote_type(region, eligible)

        args, kwargs = _map_tensors(args, kwargs, lambda t: _cast(t, to, region, st))
        return func(*args, **kwargs)


types_FunctionType = types.FunctionType
_MODE = _AmpcertMode()
_TRACEABLE = False
_TRACE_NAMES: dict[Any, str | None] = {}


def _prepare_tracing(policy: OpPolicy) -> None:
    """Make every per-callable decision ahead of torch.compile's tracer, once.

    Dynamo traces ``__torch_function__`` as plain Python, and the two caches it
    reads (callable -> op name, callable -> re-entrant clone) are filled from
    attributes of the callable (``__name__``, ``__module__``, ``__code__``) that
    the tracer cannot read as constants: a miss inside a compiled region is a
    graph break. Filling both for every public torch callable takes ~30 ms on
    first entry to a region, and makes a cold compile trace without breaks."""
    global _TRACEABLE, _TRACE_NAMES
    if _TRACEABLE:
        return
    names: dict[Any, str | None] = {}
    for func in public_callables():
        name = canonical_op_name(func)
        if type(func) is types_FunctionType:
            _reentrant_clone(func, True)
        try:
            # The tracer looks callables up by equality, and a few distinct builtins
            # compare equal (torch.mm == torch.dsmm): the name a policy knows wins.
            if func not in names or (name in policy.ops and names[func] not in policy.ops):
                names[func] = name
        except TypeError:  # unhashable: looked up by identity only
            continue
    _TRACE_NAMES = names
    _TRACEABLE = True


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
        if policy is None:
            policy = shipped_policy(dev)
        elif not isinstance(policy, OpPolicy):
            policy = load_policy(policy)
        self.device_type = dev
        self.fast_dtype = dtype
        self.policy = policy
        self.enabled = bool(enabled)
        self.cache_enabled = bool(cache_enabled)

    def __repr__(self) -> str:
        return (f"ampcert.autocast(device_type={self.device_type!r}, dtype={self.fast_dtype}, "
                f"policy={self.policy.name!r}, enabled={self.enabled}, cache_enabled={self.cache_enabled})")

    def __enter__(self) -> autocast:
        st = _STATE
        region = _region(self.device_type, self.fast_dtype, self.policy, self.enabled, self.cache_enabled)
        outermost = not st.stack
        if outermost and not _TRACEABLE:
            _prepare_tracing(self.policy)
        st.stack.append(region)
        st.refresh()
        if outermost:
            try:
                _MODE.__enter__()
            except BaseException:
                st.stack.pop()
                st.refresh()
                raise
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        st = _STATE
        if st.stack:
            st.stack.pop()
        st.refresh()
        if not st.stack:
            try:
                _MODE.__exit__(exc_type, exc, tb)
            finally:
                st.cache.clear()
                st.pending = None
        return False

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper


# ---------------------------------------------------------------------------
# introspection helpers
# ---------------------------------------------------------------------------
def _innermost(device_type: str) -> _Region | None:
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
