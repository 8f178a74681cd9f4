"""The torch op names a policy may use: how torch callables map to them, and
which torch releases have each op.

A policy names ops (``linear``, ``softmax``, ``fft_rfft``), not callables. This
module is the one place that knows the mapping: it scans torch's public
namespaces once and names every callable by its ``__name__`` (the ATen name for
C bindings), put through a small alias table. :mod:`.policy` validates op names
against :func:`known_op_names`, and :mod:`.autocast` maps each call it
intercepts with :func:`canonical_op_name`.

It imports torch and the standard library, and nothing of ampcert: the policy
loader imports it lazily (a policy for a framework that is not installed is a
one-line error there), and the autocast engine imports both.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Iterator
from typing import Any

import torch

from .support import release

__all__ = [
    "OP_TORCH_VERSIONS",
    "canonical_op_name",
    "known_op_names",
    "op_callables",
    "op_in_torch",
    "torch_version",
]

#: Public aliases whose native (ATen-level) implementation is the target op.
_ALIASES: dict[str, str] = {
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "linalg_matmul": "matmul",
    "__pow__": "pow",
    "__rpow__": "pow",
    "arccos": "acos",
    "arcsin": "asin",
    "arctan2": "atan2",
    "concat": "cat",
    "concatenate": "cat",
}

#: Op names (as policies and the audit spell them) that exist in only part of the
#: supported torch range (the ``torch`` extra: >=2.13,<2.15), as ``(first release that
#: has it, first release that lacks it)``, ``None`` for an open end. This is the one
#: place that knows torch versions: the policies name every op of the range; an op the
#: installed torch lacks is still a known name (a policy naming it loads everywhere),
#: its entry never fires, and the audit expects it to be uncallable rather than cast.
#: Read from each release (its dispatcher's ops and AutocastCPU/AutocastCUDA kernels,
#: ``torch._C._dispatch_dump``) and checked on the installed torch by
#: tests/amp/test_audit.py.
OP_TORCH_VERSIONS: dict[str, tuple[tuple[int, int] | None, tuple[int, int] | None]] = {
    # aten::cholesky / aten::qr are gone in 2.14 (deprecated since 1.9): torch.cholesky,
    # torch.qr and the Tensor methods are Python stubs that raise RuntimeError.
    "cholesky": (None, (2, 14)),
    "qr": (None, (2, 14)),
    # New in 2.14: torch.linalg.matrix_sqrth, fp32 under CPU and CUDA autocast.
    "linalg_matrix_sqrth": ((2, 14), None),
    # New in 2.14: torch.linalg.polar, in no autocast list (torch.polar is fp32 on CPU).
    "linalg_polar": ((2, 14), None),
}


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``version`` (default: the installed torch's ``__version__``)."""
    return release(str(torch.__version__ if version is None else version))


def op_in_torch(op: str, version: tuple[int, int] | None = None) -> bool:
    """Whether ``op`` exists in torch ``version`` (default: the installed one), per
    :data:`OP_TORCH_VERSIONS`; ops not listed there exist across the supported range."""
    first, gone = OP_TORCH_VERSIONS.get(op, (None, None))
    v = torch_version() if version is None else version
    return (first is None or v >= first) and (gone is None or v < gone)


#: Namespaces scanned to build the registry of mappable op names.
def _namespaces() -> list[tuple[str, Any]]:
    return [
        ("torch", torch),
        ("torch.nn.functional", torch.nn.functional),
        ("torch._C._nn", torch._C._nn),
        ("torch.linalg", torch.linalg),
        ("torch.fft", torch.fft),
        ("torch.special", torch.special),
        ("torch.Tensor", torch.Tensor),
    ]


#: id(callable) -> (callable, op name or None): read directly by the autocast engine's
#: hot path. Keyed by identity, not equality: distinct torch builtins can compare
#: equal (torch.mm == torch.dsmm, torch.hspmm == torch.hsmm), and a dict keyed by
#: the callable would give one the other's name. The entry holds the callable, so
#: its id cannot be reused while the entry exists.
_NAME_CACHE: dict[int, tuple[Any, str | None]] = {}
_REGISTRY: dict[str, tuple[str, ...]] | None = None
_REGISTRY_LOCK = threading.Lock()


def _raw_name(func: Any) -> str | None:
    name = getattr(func, "__name__", None)
    return name if isinstance(name, str) else None


def _canon(name: str, base_names: frozenset[str] | set[str]) -> str:
    if name in _ALIASES:
        return _ALIASES[name]
    if name.startswith("special_"):
        base = name[len("special_"):]
        if base in base_names:
            return base
    return name


def _public_callables() -> Iterator[tuple[str, str, Any]]:
    """(namespace, attribute, callable) of every torch callable an op name can come from."""
    for qual_ns, ns in _namespaces():
        for attr in dir(ns):
            if attr.startswith("__") and attr not in _ALIASES:
                continue
            try:
                obj = getattr(ns, attr)
            except Exception:  # pragma: no cover - lazy attributes that fail
                continue
            if isinstance(obj, type) or not callable(obj):
                continue
            if not isinstance(obj, (types.BuiltinFunctionType, types.FunctionType,
                                    types.MethodDescriptorType, types.WrapperDescriptorType)):
                continue
            yield qual_ns, attr, obj


def public_callables() -> Iterator[Any]:
    """Every torch callable :func:`canonical_op_name` may be asked about (the registry's)."""
    return (obj for _, _, obj in _public_callables())


def _registry() -> dict[str, tuple[str, ...]]:
    """canonical op name -> qualified names of the public callables mapping to it."""
    global _REGISTRY
    if _REGISTRY is not None:
        return _REGISTRY
    with _REGISTRY_LOCK:
        if _REGISTRY is not None:
            return _REGISTRY
        found: dict[str, str] = {}  # raw name -> first qualname
        for qual_ns, attr, obj in _public_callables():
            found.setdefault(_raw_name(obj) or attr, f"{qual_ns}.{attr}")
        raw_names = set(found)
        reg: dict[str, list[str]] = {}
        for raw, qual in found.items():
            reg.setdefault(_canon(raw, raw_names), []).append(qual)
        _REGISTRY = {k: tuple(v) for k, v in reg.items()}
        return _REGISTRY


@functools.lru_cache(maxsize=1)
def known_op_names() -> frozenset[str]:
    """Every op name a policy may use: names the dispatcher maps torch callables to,
    plus the ops of :data:`OP_TORCH_VERSIONS` (those of other torch releases in range)."""
    names = {n for n in _registry() if not (n.endswith("_") and not n.startswith("__"))}
    return frozenset(names | set(OP_TORCH_VERSIONS))


def op_callables(op: str) -> tuple[str, ...]:
    """Qualified names of the public torch callables that map to ``op``."""
    return _registry().get(op, ())


def canonical_op_name(func: Any) -> str | None:
    """The policy op name ``func`` maps to (before argument-dependent resolution)."""
    entry = _NAME_CACHE.get(id(func))
    if entry is not None and entry[0] is func:
        return entry[1]
    raw = _raw_name(func)
    name = None if raw is None or raw == "__get__" else _canon(raw, known_op_names())
    _NAME_CACHE[id(func)] = (func, name)
    return name
