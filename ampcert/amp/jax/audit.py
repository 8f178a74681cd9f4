"""Audit ampcert's JAX autocast, primitive by primitive, on real arrays.

JAX has no native autocast to compare with, so the audit checks the engine
against the policy it claims to apply, and against fp32 for values:

- for every primitive of the policy, one sample program calls a public entry
  point that lowers to it (``jnp.exp`` for ``exp``, ``x @ w`` for
  ``dot_general``) and is run through :func:`~ampcert.amp.jax.autocast` in
  three input scenarios (``f32``: all floating inputs float32; ``low``: all
  in the autocast dtype; ``mix``: the first float32, the others low, for
  two-input samples). The rewritten jaxpr is searched for the primitive and
  the dtypes its operands really got are compared with the family's rule;
  the output is compared with the fp32 result (largest error over the
  largest |fp32 value|, informative).
- for every kind of nested region (jit, scan, while, cond, custom_jvp,
  custom_vjp, remat) a program with a matmul inside that region shows
  whether the matmul inside was rewritten.

A primitive without a sample is reported with ``agree=False`` and the note
``"no sample inputs"``, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..policy import Family, OpPolicy
from .autocast import autocast, iter_eqns, jax_policy
from .primitives import REGION_KINDS

__all__ = ["JaxAuditRow", "RegionRow", "SAMPLES", "audit_jax", "audit_regions", "format_jax_table",
           "format_region_table"]

# Dtypes as jaxprs print them (``f32[8,16]``, ``bf16[]``): JAX's own notation for what the
# rewriter produced, not precision names (those are :mod:`ampcert.amp.precision`'s).
_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64"}


def _short(dt) -> str:
    return _SHORT.get(np.dtype(dt).name, np.dtype(dt).name)


@dataclass(frozen=True)
class Sample:
    fn: Callable
    inputs: Callable[[np.random.Generator], tuple[np.ndarray, ...]]


def _u(lo: float, hi: float, *shape: int):
    return lambda rng: (rng.uniform(lo, hi, shape).astype(np.float32),)


def _u2(lo: float, hi: float, s1: tuple, s2: tuple):
    return lambda rng: (rng.uniform(lo, hi, s1).astype(np.float32), rng.uniform(lo, hi, s2).astype(np.float32))


SAMPLES: dict[str, Sample] = {
    "dot_general": Sample(lambda a, b: a @ b, _u2(-1, 1, (8, 16), (16, 4))),
    "conv_general_dilated": Sample(
        lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW")),
        _u2(-1, 1, (2, 3, 6, 6), (4, 3, 3, 3))),
    "acos": Sample(jnp.arccos, _u(-0.9, 0.9, 16)),
    "asin": Sample(jnp.arcsin, _u(-0.9, 0.9, 16)),
    "cosh": Sample(jnp.cosh, _u(-2, 2, 16)),
    "sinh": Sample(jnp.sinh, _u(-2, 2, 16)),
    "tan": Sample(jnp.tan, _u(-1, 1, 16)),
    "erf_inv": Sample(lax.erf_inv, _u(-0.9, 0.9, 16)),
    "exp": Sample(jnp.exp, _u(-3, 3, 16)),
    "exp2": Sample(jnp.exp2, _u(-3, 3, 16)),
    "expm1": Sample(jnp.expm1, _u(-1, 1, 16)),
    "log": Sample(jnp.log, _u(0.1, 10, 16)),
    "log1p": Sample(jnp.log1p, _u(0, 2, 16)),
    "pow": Sample(jnp.power, _u2(0.5, 2, (16,), (16,))),
    "rsqrt": Sample(lax.rsqrt, _u(0.1, 4, 16)),
    "sqrt": Sample(jnp.sqrt, _u(0.1, 4, 16)),
    "reduce_sum": Sample(jnp.sum, _u(-1, 1, 64)),
    "reduce_prod": Sample(jnp.prod, _u(0.9, 1.1, 16)),
    "cumsum": Sample(lambda x: lax.cumsum(x), _u(-1, 1, 32)),
    "cumprod": Sample(lambda x: lax.cumprod(x), _u(0.9, 1.1, 16)),
    "cumlogsumexp": Sample(lambda x: lax.cumlogsumexp(x), _u(-2, 2, 16)),
    "atan2": Sample(jnp.arctan2, _u2(-1, 1, (16,), (16,))),
    "concatenate": Sample(lambda a, b: jnp.concatenate([a, b]), _u2(-1, 1, (8,), (8,))),
    "logistic": Sample(jax.nn.sigmoid, _u(-3, 3, 16)),
    "tanh": Sample(jnp.tanh, _u(-3, 3, 16)),
    "reduce_max": Sample(jnp.max, _u(-1, 1, 64)),
    "add": Sample(jnp.add, _u2(-1, 1, (16,), (16,))),
    "mul": Sample(jnp.multiply, _u2(-1, 1, (16,), (16,))),
}


@dataclass(frozen=True)
class JaxAuditRow:
    op: str
    family: str
    observed: str      # "f32:bf16 low:bf16 mix:bf16" - operand dtype per scenario
    expected: str
    max_rel_err: float | None
    agree: bool
    note: str = ""


def _expected(family: str | None, ins: Sequence[np.dtype], low: np.dtype) -> str:
    floats = [np.dtype(d) for d in ins]
    if family == Family.LOWER_PRECISION:
        return _short(low)
    if family == Family.FP32:
        return "f32"
    return _short(jnp.result_type(*floats)) if floats else "-"


def _operand_dtype(closed, op: str) -> str | None:
    for _, eqn in iter_eqns(closed):
        if eqn.primitive.name == op:
            dts = {_short(v.aval.dtype) for v in eqn.invars if jnp.issubdtype(v.aval.dtype, jnp.floating)}
            return "/".join(sorted(dts)) if dts else "-"
    return None


def audit_op(op: str, family: str | None, policy: OpPolicy, dtype) -> JaxAuditRow:
    low = np.dtype(dtype)
    sample = SAMPLES.get(op)
    if sample is None:
        return JaxAuditRow(op, family or "-", "", "", None, False, "no sample inputs")
    rng = np.random.default_rng(0)
    base = [jnp.asarray(a) for a in sample.inputs(rng)]
    scenarios = [("f32", base), ("low", [a.astype(low) for a in base])]
    if len(base) >= 2:
        scenarios.append(("mix", [base[0], *[a.astype(low) for a in base[1:]]]))
    reference = np.asarray(jax.jit(sample.fn)(*base), dtype=np.float64)
    observed, expected, errs, agree, notes = [], [], [], True, []
    for name, args in scenarios:
        try:
            jax.eval_shape(sample.fn, *args)
        except TypeError:  # the public function itself refuses mixed dtypes (lax.conv)
            observed.append(f"{name}:n/a")
            expected.append(f"{name}:n/a")
            continue
        fn = autocast(sample.fn, policy, low)
        got = _operand_dtype(fn.rewritten_jaxpr(*args), op)
        want = _expected(family, [a.dtype for a in args], low)
        if got is None:
            notes.append(f"{name}: {op} not in the traced program")
            agree = False
            got = "absent"
        elif got != want:
            agree = False
        observed.append(f"{name}:{got}")
        expected.append(f"{name}:{want}")
        out = np.asarray(jax.jit(fn)(*args), dtype=np.float64)
        # error relative to the output's magnitude (elementwise ratios explode near zero)
        errs.append(float(np.max(np.abs(out - reference)) / max(float(np.max(np.abs(reference))), 1e-12)))
    return JaxAuditRow(op, family or "follow", " ".join(observed), " ".join(expected),
                       max(errs) if errs else None, agree, "; ".join(notes))


def audit_jax(policy: OpPolicy | str | None = None, dtype=jnp.bfloat16,
              extra_ops: Sequence[str] = ()) -> list[JaxAuditRow]:
    """One row per primitive of the policy (plus ``extra_ops``, which should
    follow their inputs), in family order."""
    pol = jax_policy(policy)
    rows = [audit_op(op, fam, pol, dtype) for fam, ops in pol.families.items() for op in ops]
    rows += [audit_op(op, pol.family(op), pol, dtype) for op in extra_ops if op not in pol]
    return rows


# --------------------------------------------------------------------------- regions


@dataclass(frozen=True)
class RegionRow:
    region: str
    rewritten: bool
    matmul_dtypes: str
    note: str = ""


def _region_programs() -> dict[str, Callable]:
    @jax.custom_vjp
    def cvjp(x, w):
        return x @ w

    cvjp.defvjp(lambda x, w: (x @ w, (x, w)), lambda r, g: (g @ r[1].T, r[0].T @ g))

    @jax.custom_jvp
    def cjvp(x, w):
        return x @ w

    cjvp.defjvp(lambda p, t: (cjvp(*p), t[0] @ p[1] + p[0] @ t[1]))

    return {
        "jit": lambda x, w: jax.jit(lambda a: a @ w)(x),
        "scan": lambda x, w: lax.scan(lambda c, _: (c @ w, None), x, None, length=2)[0],
        "while": lambda x, w: lax.while_loop(lambda s: s[1] < 2, lambda s: (s[0] @ w, s[1] + 1), (x, 0))[0],
        "cond": lambda x, w: lax.cond(jnp.sum(x) > -1e9, lambda a: a @ w, lambda a: a, x),
        "custom_jvp": cjvp,
        "custom_vjp": cvjp,
        "remat": lambda x, w: jax.checkpoint(lambda a: a @ w)(x),
    }


def audit_regions(policy: OpPolicy | str | None = None, dtype=jnp.bfloat16) -> list[RegionRow]:
    """For each nested-region kind: is the matmul inside it rewritten?"""
    pol = jax_policy(policy)
    low = _short(dtype)
    x = jnp.ones((4, 8), jnp.float32)
    w = jnp.eye(8, dtype=jnp.float32)
    rows = []
    for kind, program in _region_programs().items():
        assert kind in REGION_KINDS
        fn = autocast(program, pol, dtype)
        dts = sorted({"/".join(sorted({_short(v.aval.dtype) for v in eqn.invars}))
                      for path, eqn in iter_eqns(fn.rewritten_jaxpr(x, w))
                      if eqn.primitive.name == "dot_general" and path})
        ok = bool(dts) and all(d == low for d in dts) and fn.report(x, w).regions.get(kind, 0) > 0
        rows.append(RegionRow(kind, ok, ",".join(dts) or "-", "" if ok else "matmul inside left unrewritten"))
    return rows


def format_jax_table(rows: Sequence[JaxAuditRow]) -> str:
    head = f"{'primitive':<22} {'family':<16} {'operand dtype (observed)':<30} {'expected':<30} {'err/max|ref|':>12}  agree"
    lines = [head, "-" * len(head)]
    for r in rows:
        err = f"{r.max_rel_err:.2e}" if r.max_rel_err is not None else "-"
        lines.append(f"{r.op:<22} {r.family:<16} {r.observed:<30} {r.expected:<30} {err:>12}  "
                     f"{'yes' if r.agree else 'NO'}{'  ' + r.note if r.note else ''}")
    return "\n".join(lines)


def format_region_table(rows: Sequence[RegionRow]) -> str:
    lines = [f"{'nested region':<14} {'rewritten':<10} matmul operands inside", "-" * 50]
    for r in rows:
        lines.append(f"{r.region:<14} {'yes' if r.rewritten else 'NO':<10} {r.matmul_dtypes}"
                     f"{'  ' + r.note if r.note else ''}")
    return "\n".join(lines)
