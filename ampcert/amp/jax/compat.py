"""How each JAX release spells its higher-order primitives: the one place that knows.

The rewriter (:mod:`.autocast`) recurses into jit, scan, while, cond,
custom_jvp, custom_vjp and remat regions. For each it needs the sub-program(s)
held in the equation's params, how the operands split (constants, loop carry,
scanned inputs, a branch index) and, for custom derivatives, which param holds
the rule. These are JAX internals and change between releases, so
:data:`REGIONS` records them: one row per primitive and per JAX release where
its params changed. The rows were read from each release's ``jax/_src`` (lax
control flow, ``pjit``, ``ad_checkpoint``, ``custom_derivatives``, ``core``)
for 0.10.2, 0.11.0, 0.11.1, 0.11.2 and 0.12.0:

``jit``
    sub-program ``jaxpr``. Unchanged.
``closed_call``, then ``eval_jaxpr``
    sub-program ``call_jaxpr``; the primitive is ``closed_call`` up to 0.11.0
    and ``eval_jaxpr`` from 0.11.1 (``jax.extend.core.primitives.closed_call_p``
    names either).
``scan``
    sub-program ``jaxpr``; ``length``, ``reverse``, ``unroll``. The operands
    are (consts, carry, xs): up to 0.10 counted by ``num_consts`` and
    ``num_carry`` (ints), from 0.11.0 by ``ft_in``, a FlatTree of the three
    groups (``ft_out`` holds (carry, ys) and may drop ys that JAX forwards
    from xs; the rewrite needs only ``ft_in``).
``while``
    sub-programs ``cond_jaxpr`` and ``body_jaxpr``; operands (cond consts,
    body consts, carry) counted by ``cond_nconsts`` and ``body_nconsts``.
    Unchanged.
``cond``
    sub-programs ``branches`` (a tuple); operands (index, operands...).
    Unchanged.
``custom_jvp_call``, ``custom_vjp_call``
    sub-program ``call_jaxpr``; ``num_consts`` leading consts; the rule as a
    thunk of which inputs are symbolic zeros: ``jvp_jaxpr_fun`` returning
    (jaxpr, consts, out_zeros), or ``fwd_jaxpr_thunk`` returning (jaxpr,
    consts); ``bwd`` runs as written. Unchanged.
``remat2`` (``jax.checkpoint``)
    sub-program ``jaxpr``, an open jaxpr (no consts: they are operands);
    ``prevent_cse``, ``differentiated``, ``policy``. Unchanged.

One change cuts across all of them: from 0.11.0 ``ClosedJaxpr`` is ``Jaxpr``
(a jaxpr carries its consts). ``jax.extend.core.ClosedJaxpr(jaxpr, consts)``,
``.jaxpr``, ``.consts``, ``.in_avals`` and ``.out_avals`` work on both, and
they are all the rewriter uses; :meth:`Region.programs` hands out closed
jaxprs whatever the param holds.

A primitive whose params do not have the names its row reads (a JAX release
newer than this table) is treated like an unknown higher-order primitive:
it runs as traced, in its original dtypes, and is listed in the rewrite
report, with a warning, instead of failing with a ``KeyError``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.extend.core import ClosedJaxpr

__all__ = ["JAX_VERSION", "REGIONS", "Region", "region_for"]

#: The installed JAX as ints, ``(0, 12, 0, 1)``.
JAX_VERSION: tuple[int, ...] = tuple(jax.__version_info__)


def _no_groups(params: Mapping[str, Any]) -> tuple[int, ...]:
    return ()


@dataclass(frozen=True)
class Region:
    """How the rewriter reads one higher-order primitive on one JAX release."""

    #: which rewrite applies (one of :data:`~.primitives.REGION_KINDS`)
    kind: str
    #: params holding the sub-programs, in order; a tuple-valued param (cond's
    #: ``branches``) contributes each of its jaxprs
    program_params: tuple[str, ...]
    #: sizes of the leading operand groups (consts, carry, ...); the operands
    #: left over form one last group (scan's xs, a while loop's carry)
    operand_groups: Callable[[Mapping[str, Any]], tuple[int, ...]] = _no_groups
    #: params ``operand_groups`` reads
    layout_params: tuple[str, ...] = ()
    #: the param holding the derivative rule's thunk (custom_jvp, custom_vjp)
    rule_param: str | None = None
    #: other params the rewrite reads by name (scan's ``length``)
    handler_params: tuple[str, ...] = ()
    #: the sub-program is an open ``Jaxpr`` with no consts (remat2), not a closed one
    open_program: bool = False

    def reads(self) -> tuple[str, ...]:
        """Every param name this row reads."""
        rule = (self.rule_param,) if self.rule_param else ()
        return (*self.program_params, *self.layout_params, *rule, *self.handler_params)

    def programs(self, params: Mapping[str, Any]) -> list[ClosedJaxpr]:
        """The sub-programs, each as a closed jaxpr."""
        out = []
        for name in self.program_params:
            value = params[name]
            for jaxpr in value if isinstance(value, tuple) else (value,):
                out.append(ClosedJaxpr(jaxpr, ()) if self.open_program else jaxpr)
        return out

    def with_programs(self, params: Mapping[str, Any], new: Sequence[ClosedJaxpr]) -> dict[str, Any]:
        """``params`` with the sub-programs replaced by ``new`` (same order as
        :meth:`programs`); an open program must come back without consts."""
        out, it = dict(params), iter(new)
        for name in self.program_params:
            value = params[name]
            repl = [next(it) for _ in (value if isinstance(value, tuple) else (value,))]
            if self.open_program:
                assert not any(r.consts for r in repl), f"{name}: an open jaxpr cannot take consts"
                repl = [r.jaxpr for r in repl]
            out[name] = tuple(repl) if isinstance(value, tuple) else repl[0]
        return out

    def split_operands(self, params: Mapping[str, Any], operands: Sequence[Any]) -> list[list[Any]]:
        """``operands`` cut into the leading groups plus the rest."""
        groups, start = [], 0
        for size in self.operand_groups(params):
            groups.append(list(operands[start:start + size]))
            start += size
        return [*groups, list(operands[start:])]


def _scan_groups_by_count(params: Mapping[str, Any]) -> tuple[int, int]:
    return params["num_consts"], params["num_carry"]


def _scan_groups_by_flattree(params: Mapping[str, Any]) -> tuple[int, int]:
    # ft_in is a FlatTree (consts, carry, xs); a part's len() counts its flat
    # operands, nested tuples included (a transposed scan nests them).
    consts, carry, _xs = params["ft_in"].unpack()
    return len(consts), len(carry)


_JIT = Region("jit", ("jaxpr",))
_CALL = Region("jit", ("call_jaxpr",))
_SCAN_PARAMS = ("length", "reverse", "unroll")

#: primitive name -> ((first JAX release with this spelling, how to read it), ...), oldest first.
REGIONS: dict[str, tuple[tuple[tuple[int, ...], Region], ...]] = {
    "jit": (((0, 10), _JIT),),
    "closed_call": (((0, 10), _CALL),),
    "eval_jaxpr": (((0, 11, 1), _CALL),),
    "scan": (
        ((0, 10), Region("scan", ("jaxpr",), _scan_groups_by_count, ("num_consts", "num_carry"),
                         handler_params=_SCAN_PARAMS)),
        ((0, 11), Region("scan", ("jaxpr",), _scan_groups_by_flattree, ("ft_in",),
                         handler_params=_SCAN_PARAMS)),
    ),
    "while": (((0, 10), Region("while", ("cond_jaxpr", "body_jaxpr"),
                               lambda p: (p["cond_nconsts"], p["body_nconsts"]),
                               ("cond_nconsts", "body_nconsts"))),),
    "cond": (((0, 10), Region("cond", ("branches",), lambda p: (1,))),),  # the branch index comes first
    # custom_* operands (num_consts consts first) pass through whole: the rewrite keeps the signature.
    "custom_jvp_call": (((0, 10), Region("custom_jvp", ("call_jaxpr",), rule_param="jvp_jaxpr_fun")),),
    "custom_vjp_call": (((0, 10), Region("custom_vjp", ("call_jaxpr",), rule_param="fwd_jaxpr_thunk")),),
    "remat2": (((0, 10), Region("remat", ("jaxpr",), open_program=True,
                                handler_params=("differentiated", "prevent_cse", "policy"))),),
}

_warned: set[str] = set()


def region_for(name: str, params: Mapping[str, Any], version: tuple[int, ...] = JAX_VERSION) -> Region | None:
    """How to read primitive ``name`` on JAX ``version``, or None when the rewriter
    does not recurse into it (not in the table, or its params are not the ones
    the table expects)."""
    rows = [region for since, region in REGIONS.get(name, ()) if since <= version]
    if not rows:
        return None
    region = rows[-1]
    missing = [p for p in region.reads() if p not in params]
    if missing:
        if name not in _warned:
            _warned.add(name)
            warnings.warn(f"ampcert's JAX autocast does not know the params of {name!r} on JAX "
                          f"{jax.__version__} (no {', '.join(missing)}): it runs in its original dtypes",
                          RuntimeWarning, stacklevel=3)
        return None
    return region


def eqn_context(eqn: Any) -> Any:
    """A context that re-binds ``eqn`` under its own name stack and traceback,
    so that names given with ``jax.named_scope`` (and error locations) survive
    the autocast rewrite: the precision disclosure finds attention by its
    name. JAX exposes no public way to set these; on a release where the
    private helper moved, names are lost and nothing else changes."""
    import contextlib

    info = getattr(eqn, "source_info", None)
    try:
        from jax._src import source_info_util
    except ImportError:  # pragma: no cover - a JAX release without it
        return contextlib.nullcontext()
    if info is None or not hasattr(source_info_util, "user_context"):
        return contextlib.nullcontext()
    return source_info_util.user_context(info.traceback, name_stack=info.name_stack)
