"""The audit's sample inputs: one or more calls per op, read from a data file.

:mod:`ampcert.amp.audit` runs every op of a policy on small real inputs. Which
inputs is data, in ``ampcert/amp/data/torch_audit_samples.yaml``: per op, a list
of *builders*, each one call of a public torch entry point written as a Python
call expression::

    linear:
      - F.linear(t(4, 8), t(6, 8), t(6))
      - F.linear(t(2, 4, 8), t(6, 8))

A builder is parsed with :mod:`ast` and evaluated by the small interpreter
below, never by ``eval``. It may use:

``torch``, ``F``
    the torch namespaces (``F`` is ``torch.nn.functional``); the outermost call
    is the op's entry point, called later inside each autocast region (its
    arguments are made first, outside any region);
``t(*shape, kind=...)``
    a floating tensor whose dtype the scenario decides (:class:`Inputs`:
    ``kind`` is ``randn``, ``pos``, ``unit``, ``spd`` or ``tril``);
    ``t.long(data)``, ``t.int32(data)``: index tensors; ``t.of(tensor)``: a
    float32 tensor moved into the scenario dtype; ``t.base(shape, kind)``: a
    float32 tensor; ``t.gen``: the scenario's random generator;
``lu_parts(t)``, ``qr_parts(t)``
    helpers for ops that take a factorisation (use with ``*``);
``first(call)``
    around the outermost call: keep only the first output (drops RNG state and
    scratch outputs);
literals
    numbers, strings, ``True``/``False``/``None``, lists and tuples (kept
    apart: ``torch.cat([a, b])`` and ``torch.cat((a, b))`` are different
    calls), and names bound by the builder's ``let`` mapping::

      - let:
          q: t(2, 4, 8)
        call: torch._native_multi_head_attention(q, q, q, 8, 2, ...)

Tensors are made in the order they are written (Python's evaluation order:
the callable, then positional arguments, then keyword arguments), so a
builder sees the same random values as the same call written in Python.
Anything else (operators, subscripts, lambdas, other names, dunder attributes
other than the Tensor operators) is refused when the file is read.

Imports torch, the standard library and :mod:`.yamlio` only.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml

from .yamlio import load_yaml

__all__ = ["DATA_DIR", "SAMPLES_FILE", "Builder", "Inputs", "SampleError", "load_samples", "parse_builder",
           "read_data"]

#: Where the audit's data files live, read as package data (like the shipped policies).
DATA_DIR = Path(str(files("ampcert").joinpath("amp", "data")))

SAMPLES_FILE = "torch_audit_samples.yaml"


class SampleError(ValueError):
    """The audit's data is missing or malformed (one-line message naming the file and entry)."""


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

    def base(self, shape: tuple[int, ...], kind: str) -> torch.Tensor:
        """A float32 tensor on the host (not counted as a floating input)."""
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
        return self.base(shape, kind).to(device=self.device, dtype=self._next_dtype())

    def of(self, value: torch.Tensor) -> torch.Tensor:
        """A floating tensor with the given (float32) values, in the scenario dtype."""
        return value.to(device=self.device, dtype=self._next_dtype())

    def long(self, data) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.long, device=self.device)

    def int32(self, data) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.int32, device=self.device)


#: A builder takes an :class:`Inputs` and returns a thunk that calls a public torch
#: entry point (inputs are created before any region opens).
Builder = Callable[[Inputs], Callable[[], object]]


def _lu_parts(t: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    lu, piv = torch.linalg.lu_factor(t.base((4, 4), "spd"))
    return t.of(lu), piv.to(t.device)


def _qr_parts(t: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    a, tau = torch.geqrf(torch.randn(4, 3, generator=t.gen))
    return t.of(a), t.of(tau)


def _first_output(fn: Callable, args: tuple, kwargs: dict):
    return fn(*args, **kwargs)[0]


# --------------------------------------------------------------------------- the interpreter
_NAMESPACES: dict[str, Any] = {"torch": torch, "F": F}
_HELPERS: dict[str, Callable[[Inputs], Any]] = {"lu_parts": _lu_parts, "qr_parts": _qr_parts}
_INPUTS_ATTRS = frozenset({"long", "int32", "of", "base", "gen"})
#: The dunder attributes a builder may name: the Tensor operators native autocast sees.
_DUNDERS = frozenset({"__matmul__", "__rmatmul__", "__pow__", "__rpow__"})
_FIRST = "first"


def _check(node: ast.AST, names: frozenset[str]) -> None:
    """Refuse anything outside the builder language (see the module docstring)."""
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, str, bool, type(None))):
            raise ValueError(f"unsupported constant {node.value!r}")
    elif isinstance(node, ast.UnaryOp):
        if not (isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(node.operand, ast.Constant)
                and isinstance(node.operand.value, (int, float))):
            raise ValueError("only a sign in front of a number is supported")
    elif isinstance(node, (ast.List, ast.Tuple)):
        for e in node.elts:
            _check(e, names)
    elif isinstance(node, ast.Name):
        if node.id not in names:
            raise ValueError(f"unknown name {node.id!r}: expected one of {sorted(names)}")
    elif isinstance(node, ast.Attribute):
        if node.attr.startswith("__") and node.attr not in _DUNDERS:
            raise ValueError(f"attribute {node.attr!r} is not one of the Tensor operators {sorted(_DUNDERS)}")
        if isinstance(node.value, ast.Name) and node.value.id == "t" and node.attr not in _INPUTS_ATTRS:
            raise ValueError(f"t.{node.attr}: expected one of {sorted(_INPUTS_ATTRS)}")
        _check(node.value, names)
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name) and node.func.id == _FIRST:
            raise ValueError("first(...) only around the outermost call")
        _check(node.func, names)
        for a in node.args:
            _check(a.value if isinstance(a, ast.Starred) else a, names)
        for k in node.keywords:
            if k.arg is None:
                raise ValueError("**kwargs is not supported")
            _check(k.value, names)
    else:
        raise ValueError(f"unsupported syntax {type(node).__name__}")


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp):
        value = node.operand.value  # type: ignore[attr-defined]
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List):
        return [_eval(e, env) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, env) for e in node.elts)
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.Attribute):
        return getattr(_eval(node.value, env), node.attr)
    if isinstance(node, ast.Call):
        fn, args, kwargs = _eval_call(node, env)
        return fn(*args, **kwargs)
    raise AssertionError(type(node).__name__)  # refused by _check


def _eval_call(node: ast.Call, env: Mapping[str, Any]) -> tuple[Callable, list[Any], dict[str, Any]]:
    fn = _eval(node.func, env)
    args: list[Any] = []
    for a in node.args:
        if isinstance(a, ast.Starred):
            args.extend(_eval(a.value, env))
        else:
            args.append(_eval(a, env))
    kwargs = {k.arg: _eval(k.value, env) for k in node.keywords if k.arg is not None}
    return fn, args, kwargs


def _parse(text: Any, names: frozenset[str], top: bool) -> tuple[ast.expr, bool]:
    if not isinstance(text, str):
        raise ValueError(f"expected a call expression (string), got {type(text).__name__}")
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a Python expression ({exc.msg})") from None
    first = False
    if top:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == _FIRST:
            if len(node.args) != 1 or node.keywords or not isinstance(node.args[0], ast.Call):
                raise ValueError("first(...) takes one call")
            node, first = node.args[0], True
        if not isinstance(node, ast.Call):
            raise ValueError("expected a call of the op's entry point")
        root = node.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if not (isinstance(root, ast.Name) and root.id in _NAMESPACES and root is not node.func):
            raise ValueError(f"expected the op's entry point in {sorted(_NAMESPACES)} (torch.exp(...)), "
                             f"got {ast.unparse(node.func)}(...)")
    _check(node, names)
    return node, first


def parse_builder(entry: Any) -> Builder:
    """A builder from one entry of the samples file: a call expression, or a mapping
    ``{let: {name: expression, ...}, call: expression}``. Raises ValueError."""
    lets: dict[str, ast.expr] = {}
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - {"let", "call"})
        if unknown or "call" not in entry:
            raise ValueError(f"expected the keys 'call' and optionally 'let', got {sorted(entry)}")
        let = entry.get("let") or {}
        if not isinstance(let, dict):
            raise ValueError(f"let: expected a mapping of name -> expression, got {type(let).__name__}")
        names = frozenset({*_NAMESPACES, *_HELPERS, "t"})
        for name, text in let.items():
            if not (isinstance(name, str) and name.isidentifier()) or name in names:
                raise ValueError(f"let: expected a new identifier, got {name!r}")
            lets[name] = _parse(text, names, top=False)[0]
            names = names | {name}
        call, first = _parse(entry["call"], names, top=True)
    else:
        call, first = _parse(entry, frozenset({*_NAMESPACES, *_HELPERS, "t"}), top=True)

    def builder(t: Inputs) -> Callable[[], object]:
        env: dict[str, Any] = {**_NAMESPACES, **_HELPERS, "t": t}
        for name, node in lets.items():
            env[name] = _eval(node, env)
        fn, args, kwargs = _eval_call(call, env)  # type: ignore[arg-type]
        if first:
            return functools.partial(_first_output, fn, tuple(args), kwargs)
        return functools.partial(fn, *args, **kwargs)

    return builder


# --------------------------------------------------------------------------- reading the data
def read_data(name: str) -> Any:
    """A data file of the audit, parsed (guarded YAML). One-line :class:`SampleError`
    when it is missing or not YAML."""
    path = DATA_DIR / name
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SampleError(f"{path}: the audit's data is missing from this installation of ampcert "
                          f"({type(exc).__name__}; a wheel built without its package data?): reinstall ampcert"
                          ) from None
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise SampleError(f"{path}: expected well-formed YAML, got {' '.join(str(exc).split())[:200]}") from None


def load_samples(data: Any, where: str = SAMPLES_FILE) -> dict[str, tuple[Builder, ...]]:
    """op -> builders, from the parsed samples file (a mapping of op -> list of entries)."""
    if not isinstance(data, dict):
        raise SampleError(f"{where}: expected a mapping of op -> list of calls, got {type(data).__name__}")
    out: dict[str, tuple[Builder, ...]] = {}
    for op, entries in data.items():
        if not isinstance(op, str) or not isinstance(entries, list) or not entries:
            raise SampleError(f"{where}: {op!r}: expected an op name with a non-empty list of calls")
        builders = []
        for i, entry in enumerate(entries):
            try:
                builders.append(parse_builder(entry))
            except ValueError as exc:
                raise SampleError(f"{where}: {op}[{i}]: {exc}") from None
        out[op] = tuple(builders)
    return out
