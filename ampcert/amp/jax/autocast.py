"""Autocast for JAX by jaxpr rewriting.

JAX has no autocast: ``jmp`` casts whole modules (every op of a layer runs in
the compute dtype), and the public jaxpr-rewriting attempts only rewrite the
top level of a program, so anything inside ``jit``, ``scan``, ``cond`` or a
``custom_vjp`` keeps its fp32. This module traces a function to a jaxpr once
per input signature and re-evaluates it with a per-primitive dtype decision
taken from an :class:`~ampcert.amp.policy.OpPolicy` (``configs/policies/jax.yaml``):

``lower_precision`` (dot_general, conv_general_dilated)
    floating operands cast to the autocast dtype; with ``accumulate_fp32``
    the product accumulates in float32 (``preferred_element_type``) and is
    rounded to the autocast dtype, and its backward products also take
    low-precision operands (a ``custom_vjp`` per product: plain autodiff of
    an fp32-accumulating product would make the cotangent fp32 and the
    backward matmuls fp32 with it).
``fp32`` (exp, log, pow, reductions, normalisation statistics)
    16-bit floating inputs cast to float32.
``promote``
    floating inputs cast to the widest among them.
everything else
    runs in its inputs' dtypes; where they disagree the widest strongly-typed
    one wins (torch's type promotion), and weak-typed Python scalars take the
    dtype of the array they meet.

Nested programs are rewritten too:

- ``jit``/``pjit`` and ``remat`` (``jax.checkpoint``) regions are re-traced
  with the dtypes that reach them, so their outputs follow like any op;
- ``scan``, ``while_loop`` and ``cond`` regions keep their signature (a loop
  carry or a branch output must have one type): inputs are cast back to the
  region's original dtypes at entry and outputs at exit, and the body in
  between follows the policy;
- ``custom_jvp`` and ``custom_vjp`` functions keep their signature as well, so
  the user's derivative rules stay type-correct; the primal computation and
  the forward pass used under ``jax.grad`` (``fwd``) and the JVP rule are
  rewritten. A ``custom_vjp``'s ``bwd`` runs as written.

Higher-order primitives it does not know (``shard_map``, ``custom_linear_solve``,
...) run untouched in their original dtypes and are listed in the
:class:`RewriteReport`. How each JAX release spells the params of the ones it
knows (JAX 0.10 to 0.12) is in :mod:`.compat`, and nowhere else.

Usage::

    from ampcert.amp.jax import autocast

    loss_bf16 = autocast(loss_fn, dtype=jnp.bfloat16)     # same signature as loss_fn
    grads = jax.jit(jax.grad(loss_bf16))(params, batch)

The wrapper composes with ``jax.jit``, ``jax.grad`` and ``jax.vmap`` because
evaluating the rewritten jaxpr just binds primitives under whatever
transformation is active. The rewrite is cached per input signature (tree
structure, shapes, dtypes, weak types and the values of non-array arguments),
like ``jax.jit``'s cache: a function whose behaviour depends on Python state
that changes between calls sees the first trace. Functions that close over
tracers of an enclosing transformation are re-traced on every call, because
the trace holds those tracers. Forward-mode differentiation (``jax.jvp``,
``jax.hessian``) of an ``accumulate_fp32`` product is not supported, as for
any ``custom_vjp``.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import linear_util as lu
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, jaxpr_as_fun, jaxprs_in_params

from ..policy import Family, OpPolicy, PolicyError, load_policy, shipped_policy
from ..precision import AUTOCAST_PRECISIONS, LOW_PRECISIONS, dtype_name
from .compat import Region, eqn_context, region_for
from .primitives import SAME_DTYPE

__all__ = ["AutocastFunction", "RewriteReport", "autocast", "iter_eqns", "jax_policy"]

_F32 = np.dtype(np.float32)
#: The dtypes of the precisions (one table for torch and JAX: :mod:`ampcert.amp.precision`):
#: the low ones autocast runs in, and every one it casts between.
_LOW = tuple(np.dtype(jnp.dtype(dtype_name(p))) for p in LOW_PRECISIONS)
_CASTABLE = frozenset(np.dtype(jnp.dtype(dtype_name(p))) for p in AUTOCAST_PRECISIONS)


def jax_policy(policy: OpPolicy | str | None = None) -> OpPolicy:
    """The policy to use: ``None`` is the shipped ``jax`` policy; a name or path is loaded."""
    pol = shipped_policy("any", framework="jax") if policy is None else load_policy(policy)
    if pol.framework != "jax":
        raise PolicyError(f"{pol.source or pol.name}: framework: expected 'jax' for JAX autocast, "
                          f"got {pol.framework!r}")
    return pol


@dataclass
class RewriteReport:
    """What one rewrite did: the regions it recursed into (by kind), the
    primitives it cast (by family) and the higher-order primitives it left as
    they were."""

    regions: collections.Counter = field(default_factory=collections.Counter)
    cast: collections.Counter = field(default_factory=collections.Counter)
    not_rewritten: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"regions": dict(self.regions), "cast": dict(self.cast),
                "not_rewritten": sorted(set(self.not_rewritten))}


# --------------------------------------------------------------------------- values


def _dtype(x: Any) -> np.dtype:
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def _is_float(dt: np.dtype) -> bool:
    return jnp.issubdtype(dt, jnp.floating)


def _cast(x: Any, dtype: np.dtype) -> Any:
    return x if _dtype(x) == dtype else lax.convert_element_type(x, dtype)


def _widest(dtypes: Sequence[np.dtype]) -> np.dtype:
    # bf16 and f16 promote to f32 (lattice join), anything with f32 to f32, f64 wins.
    return functools.reduce(jnp.promote_types, dtypes)


def _aval_spec(aval) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def _spec_of(x: Any, weak: bool | None = None) -> jax.ShapeDtypeStruct:
    spec = _aval_spec(jax.typeof(x))
    if weak is not None and weak != spec.weak_type:
        spec = jax.ShapeDtypeStruct(spec.shape, spec.dtype, weak_type=weak)
    return spec


# Primitives that only move or re-type data: a value made from scalar
# constants through these is still "a constant the programmer wrote".
_CONSTANT_PRESERVING = frozenset({"broadcast_in_dim", "reshape", "convert_element_type", "squeeze",
                                  "expand_dims", "transpose", "copy"})


# --------------------------------------------------------------------------- the rewriter


class _Rewriter:
    """Evaluates jaxprs, binding each primitive with the policy's dtypes."""

    def __init__(self, policy: OpPolicy, dtype: np.dtype, report: RewriteReport):
        self.policy, self.low, self.report = policy, np.dtype(dtype), report

    # -- jaxprs -----------------------------------------------------------------
    def eval(self, jaxpr: Jaxpr, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        """Evaluate ``jaxpr`` binding each primitive with the policy's dtypes.

        Alongside the values it tracks which ones are weak: Python-scalar
        literals, weak-typed inputs, and values made only from those by
        broadcasting or re-typing. jax.numpy turns ``x * 2.0`` into
        ``mul x 2.0:f32[]`` (a strong fp32 literal) and ``where(m, x, -inf)``
        into a broadcast fp32 array, so without this every scalar written in
        a program would drag a bf16 value back to fp32."""
        env: dict[Any, Any] = {}
        weak: set[Any] = {v for v in jaxpr.invars if getattr(v.aval, "weak_type", False)}

        def read(v):
            return v.val if isinstance(v, Literal) else env[v]

        def is_weak(v):
            if isinstance(v, Literal):
                return v.aval.shape == () or getattr(v.aval, "weak_type", False)
            return v in weak

        for v, c in zip(jaxpr.constvars, consts, strict=True):
            env[v] = c
        for v, a in zip(jaxpr.invars, args, strict=True):
            env[v] = a
        for eqn in jaxpr.eqns:
            weak_in = [is_weak(v) for v in eqn.invars]
            with eqn_context(eqn):  # keeps jax.named_scope names through the rewrite
                outs = self.eqn(eqn, [read(v) for v in eqn.invars], weak_in)
            constant = eqn.primitive.name in _CONSTANT_PRESERVING and weak_in and all(weak_in)
            for v, o in zip(eqn.outvars, outs, strict=True):
                env[v] = o
                if constant:
                    weak.add(v)
        return [read(v) for v in jaxpr.outvars]

    def eval_same_signature(self, closed: ClosedJaxpr, args: Sequence[Any]) -> list[Any]:
        """Evaluate with the policy inside, but with ``closed``'s own input and
        output dtypes at the boundary (loop carries, branches, custom rules)."""
        args = [_cast(a, av.dtype) if _is_float(av.dtype) else a for a, av in zip(args, closed.in_avals, strict=True)]
        outs = self.eval(closed.jaxpr, closed.consts, args)
        return [_cast(o, av.dtype) if _is_float(av.dtype) else o for o, av in zip(outs, closed.out_avals, strict=True)]

    def retrace(self, closed: ClosedJaxpr, specs: Sequence[jax.ShapeDtypeStruct] | None = None) -> ClosedJaxpr:
        """``closed`` rewritten as a new jaxpr: for ``specs`` (outputs follow),
        or, without specs, with the original signature."""
        if specs is None:
            fn = functools.partial(self.eval_same_signature, closed)
            specs = [_aval_spec(a) for a in closed.in_avals]
        else:
            fn = functools.partial(self.eval, closed.jaxpr, closed.consts)
        return jax.make_jaxpr(lambda *a: fn(list(a)))(*specs)

    # -- one equation -----------------------------------------------------------
    def eqn(self, eqn, invals: list[Any], weak_in: list[bool] | None = None) -> list[Any]:
        prim = eqn.primitive
        name = prim.name
        weak_in = weak_in if weak_in is not None else [False] * len(invals)
        region = region_for(name, eqn.params)
        if region is not None:
            self.report.regions[region.kind] += 1
            outs = self._regions[region.kind](self, eqn, region, invals, weak_in)
        elif any(True for _ in jaxprs_in_params(eqn.params)):
            # Unknown higher-order primitive: run it as traced, in its own dtypes.
            self.report.not_rewritten.append(name)
            outs = self._bind(eqn, self._original_dtypes(eqn, invals))
        else:
            outs = self._first_order(eqn, invals, weak_in)
        return list(outs) if prim.multiple_results else [outs]

    def _bind(self, eqn, invals, params: dict | None = None):
        bind_params = eqn.primitive.get_bind_params(params if params is not None else eqn.params)
        return eqn.primitive.bind(*invals, **bind_params)

    @staticmethod
    def _original_dtypes(eqn, invals):
        return [_cast(x, v.aval.dtype) if _is_float(v.aval.dtype) else x for x, v in zip(invals, eqn.invars, strict=True)]

    def _first_order(self, eqn, invals, weak_in):
        name = eqn.primitive.name
        family = self.policy.family(name)
        dts = [_dtype(x) for x in invals]
        if family is Family.BANNED:
            raise TypeError(f"{name} is banned inside ampcert's JAX autocast by policy {self.policy.name!r}")
        if family is Family.LOWER_PRECISION:
            if any(d in _CASTABLE for d in dts) and not any(d == np.float64 for d in dts):
                self.report.cast["lower_precision"] += 1
                low = [_cast(x, self.low) if d in _CASTABLE else x for x, d in zip(invals, dts, strict=True)]
                return self._lower_precision(eqn, low)
            return self._bind(eqn, invals)
        if family is Family.FP32:
            if any(d in _CASTABLE and d != _F32 for d in dts):
                self.report.cast["fp32"] += 1
                invals = [_cast(x, _F32) if d in _CASTABLE else x for x, d in zip(invals, dts, strict=True)]
            return self._bind(eqn, invals)
        floats = [d for d in dts if _is_float(d)]
        mixed = len(set(floats)) > 1
        if family is Family.PROMOTE or (mixed and name in SAME_DTYPE):
            if mixed:
                self.report.cast["promote"] += 1
                invals = self._unify(invals, dts, weak_in)
            return self._bind(eqn, invals)
        try:
            return self._bind(eqn, invals)
        except TypeError:
            if not mixed:
                raise
            # A primitive that needs equal dtypes and is not in SAME_DTYPE yet.
            self.report.cast["promote"] += 1
            return self._bind(eqn, self._unify(invals, dts, weak_in))

    @staticmethod
    def _unify(invals, dts, weak_in):
        strong = [d for d, w in zip(dts, weak_in, strict=True) if _is_float(d) and not w]
        target = _widest(strong or [d for d in dts if _is_float(d)])
        return [_cast(x, target) if _is_float(d) else x for x, d in zip(invals, dts, strict=True)]

    def _lower_precision(self, eqn, low_invals):
        params = dict(eqn.params)
        has_pref = "preferred_element_type" in params
        if not (has_pref and eqn.primitive.name in self.policy.accumulate_fp32):
            if has_pref:
                params["preferred_element_type"] = self.low
            return self._bind(eqn, low_invals, params)
        return _accumulating_product(eqn.primitive, params, self.low)(*low_invals)

    # -- regions ----------------------------------------------------------------
    # Each handler gets the equation and the compat.Region saying where its
    # sub-programs and operand groups are; the params it reads itself
    # (scan's length/reverse/unroll, remat's differentiated/prevent_cse/policy)
    # have the same names on every JAX release compat.REGIONS covers.

    def _jit(self, eqn, region: Region, invals, weak_in):
        [body] = region.programs(eqn.params)
        new = self.retrace(body, [_spec_of(x, w) for x, w in zip(invals, weak_in, strict=True)])
        return self._bind(eqn, invals, region.with_programs(eqn.params, [new]))

    def _remat(self, eqn, region: Region, invals, weak_in):
        params = eqn.params
        [body] = region.programs(params)
        if params["differentiated"]:
            # Already split by autodiff: keep its signature and bind it as it was.
            new = self.retrace(body)
            if new.consts:  # a remat body takes no consts
                self.report.not_rewritten.append(eqn.primitive.name)
                return self._bind(eqn, self._original_dtypes(eqn, invals))
            return self._bind(eqn, self._original_dtypes(eqn, invals), region.with_programs(params, [new]))
        fn = jax.checkpoint(lambda *a: self.eval(body.jaxpr, body.consts, list(a)),
                            prevent_cse=params["prevent_cse"], policy=params["policy"])
        return fn(*invals)

    def _scan(self, eqn, region: Region, invals, weak_in):
        p = eqn.params
        [body_jaxpr] = region.programs(p)
        consts, init, xs = region.split_operands(p, self._original_dtypes(eqn, invals))
        ncarry = len(init)

        def body(carry, x):
            outs = self.eval_same_signature(body_jaxpr, [*consts, *carry, *x])
            return outs[:ncarry], outs[ncarry:]

        carry, ys = lax.scan(body, init, xs, length=p["length"], reverse=p["reverse"], unroll=p["unroll"])
        return [*carry, *ys]

    def _while(self, eqn, region: Region, invals, weak_in):
        cond_jaxpr, body_jaxpr = region.programs(eqn.params)
        cconsts, bconsts, init = region.split_operands(eqn.params, self._original_dtypes(eqn, invals))

        def cond_fun(carry):
            return self.eval_same_signature(cond_jaxpr, [*cconsts, *carry])[0]

        def body_fun(carry):
            return self.eval_same_signature(body_jaxpr, [*bconsts, *carry])

        return lax.while_loop(cond_fun, body_fun, init)

    def _cond(self, eqn, region: Region, invals, weak_in):
        [index], ops = region.split_operands(eqn.params, self._original_dtypes(eqn, invals))
        branches = [functools.partial(self._branch, b) for b in region.programs(eqn.params)]
        return lax.switch(index, branches, *ops)

    def _branch(self, closed, *ops):
        return self.eval_same_signature(closed, list(ops))

    def _custom(self, eqn, region: Region, invals, weak_in):
        """custom_jvp and custom_vjp: the primal program and the rule's program
        (the JVP rule, or the VJP's ``fwd``) rewritten, signatures kept."""
        p = eqn.params
        [primal] = region.programs(p)
        rule_param = region.rule_param
        if rule_param is None:  # compat's custom_jvp/custom_vjp rows always name their rule's param
            raise RuntimeError(f"{eqn.primitive.name}: the compat Region ({region.kind}) names no rule_param")
        thunk = p[rule_param]

        @functools.cache
        def rewritten_rule(*zeros):
            # Both thunks return (jaxpr, consts, ...): the JVP rule adds which outputs are zero.
            jaxpr, consts, *rest = thunk.call_wrapped(*zeros)
            new = self.retrace(ClosedJaxpr(jaxpr, consts))
            return (new.jaxpr, new.consts, *rest)

        new_params = {**region.with_programs(p, [self.retrace(primal)]),
                      rule_param: lu.wrap_init(rewritten_rule, debug_info=thunk.debug_info)}
        return self._bind(eqn, self._original_dtypes(eqn, invals), new_params)

    #: region kind (compat.Region.kind) -> handler
    _regions: dict[str, Callable] = {
        "jit": _jit, "remat": _remat, "scan": _scan, "while": _while, "cond": _cond,
        "custom_jvp": _custom, "custom_vjp": _custom,
    }


def _accumulating_product(prim, params: dict, low: np.dtype) -> Callable:
    """``prim`` (a dot or convolution) on low-precision operands, accumulated in
    float32 and rounded to ``low``; its VJP takes the low-precision cotangent
    straight into low-precision products (backend accumulation, fp32 on
    XLA:CPU and XLA:GPU)."""
    fwd_params = {**params, "preferred_element_type": _F32}
    bwd_params = {**params, "preferred_element_type": low}

    @jax.custom_vjp
    def product(*xs):
        return lax.convert_element_type(prim.bind(*xs, **fwd_params), low)

    def fwd(*xs):
        return product(*xs), xs

    def bwd(xs, ct):
        _, pullback = jax.vjp(lambda *a: prim.bind(*a, **bwd_params), *xs)
        return pullback(ct)

    product.defvjp(fwd, bwd)
    return product


# --------------------------------------------------------------------------- the wrapper


def _is_dynamic(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic, float, int, complex)) \
        or isinstance(leaf, jax.core.Tracer)


@dataclass
class _Entry:
    jaxpr: ClosedJaxpr
    out_tree: Any
    report: RewriteReport


class AutocastFunction:
    """``fn`` with ampcert's autocast applied (see the module docstring).

    Calling it evaluates the rewritten jaxpr for the arguments' signature,
    tracing and rewriting on the first call with that signature only.
    """

    def __init__(self, fn: Callable, policy: OpPolicy, dtype: Any):
        self.fn, self.policy, self.dtype = fn, policy, np.dtype(dtype)
        if self.dtype not in _LOW:
            raise ValueError(f"autocast dtype must be bfloat16 or float16, got {self.dtype}")
        self._cache: dict[Any, _Entry] = {}
        #: number of times ``fn`` was traced and rewritten (for tests and curiosity)
        self.traces = 0
        functools.update_wrapper(self, fn)

    def _entry(self, args, kwargs) -> tuple[_Entry, list[Any]]:
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        dynamic = [_is_dynamic(x) for x in leaves]
        dyn = [x for x, d in zip(leaves, dynamic, strict=True) if d]
        specs = [_spec_of(x) for x in dyn]
        static = tuple(x for x, d in zip(leaves, dynamic, strict=True) if not d)
        key = (treedef, tuple(dynamic), static,
               tuple((s.shape, s.dtype, s.weak_type) for s in specs))
        entry = self._cache.get(key)
        if entry is not None:
            return entry, dyn

        def flat_fn(*dyn_vals):
            it = iter(dyn_vals)
            full = [next(it) if d else x for x, d in zip(leaves, dynamic, strict=True)]
            a, kw = jax.tree_util.tree_unflatten(treedef, full)
            return self.fn(*a, **kw)

        self.traces += 1
        original, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*specs)
        report = RewriteReport()
        rewritten = _Rewriter(self.policy, self.dtype, report).retrace(original, specs)
        entry = _Entry(rewritten, jax.tree_util.tree_structure(out_shape), report)
        if not any(isinstance(c, jax.core.Tracer) for c in (*original.consts, *rewritten.consts)):
            self._cache[key] = entry
        return entry, dyn

    def __call__(self, *args, **kwargs):
        entry, dyn = self._entry(args, kwargs)
        return jax.tree_util.tree_unflatten(entry.out_tree, jaxpr_as_fun(entry.jaxpr)(*dyn))

    def rewritten_jaxpr(self, *args, **kwargs) -> ClosedJaxpr:
        """The rewritten program for these arguments (what a call evaluates)."""
        return self._entry(args, kwargs)[0].jaxpr

    def report(self, *args, **kwargs) -> RewriteReport:
        """What the rewrite for these arguments did."""
        return self._entry(args, kwargs)[0].report

    def cache_size(self) -> int:
        return len(self._cache)


@overload
def autocast(fn: Callable, policy: OpPolicy | str | None = ..., dtype: Any = ...) -> AutocastFunction: ...


@overload
def autocast(fn: None = None, policy: OpPolicy | str | None = ...,
             dtype: Any = ...) -> Callable[[Callable], AutocastFunction]: ...


def autocast(fn: Callable | None = None, policy: OpPolicy | str | None = None,
             dtype: Any = jnp.bfloat16) -> AutocastFunction | Callable[[Callable], AutocastFunction]:
    """``fn`` rewritten to run each primitive in the dtype ``policy`` gives it.

    Args:
        fn: any JAX-traceable function of arrays (pytrees welcome); arguments
            that are not arrays or Python numbers are treated as static.
        policy: an :class:`OpPolicy` with ``framework: jax``, a policy file
            path, or a shipped name; default ``configs/policies/jax.yaml``.
        dtype: the low-precision dtype, ``jnp.bfloat16`` or ``jnp.float16``.

    Returns a callable with ``fn``'s signature; usable as a decorator with
    ``functools.partial(autocast, dtype=...)`` or ``@autocast``.
    """
    pol = jax_policy(policy)
    if fn is None:
        return lambda f: AutocastFunction(f, pol, dtype)
    return AutocastFunction(fn, pol, dtype)


def iter_eqns(jaxpr: ClosedJaxpr | Jaxpr, path: tuple[str, ...] = ()):
    """Every equation of ``jaxpr`` and of the jaxprs nested in its equations'
    params, depth first, as ``(path, eqn)``; ``path`` names the enclosing
    primitives (``("jit", "scan")``)."""
    inner = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    for eqn in inner.eqns:
        yield path, eqn
        for sub in jaxprs_in_params(eqn.params):
            yield from iter_eqns(sub, (*path, eqn.primitive.name))
