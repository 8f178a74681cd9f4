"""ampcert.amp.jax.autocast: nested regions rewritten (checked on the jaxpr),
gradients, caching, composition with jit/grad/vmap, policy handling.

Runs without torch (nox -s jax_current / jax_oldest); the one test that loads
a torch policy skips there."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from ampcert.amp.jax import autocast, compat, iter_eqns, jax_policy  # noqa: E402
from ampcert.amp.jax.audit import audit_regions  # noqa: E402
from ampcert.amp.policy import PolicyError, load_policy  # noqa: E402

BF16 = jnp.dtype(jnp.bfloat16)


def _dots(closed):
    """(enclosing primitives, operand dtypes) of every dot_general in a jaxpr, nested ones included."""
    return [(path, tuple(str(v.aval.dtype) for v in e.invars))
            for path, e in iter_eqns(closed) if e.primitive.name == "dot_general"]


@jax.custom_vjp
def _cvjp_layer(x, w):
    return jnp.tanh(x @ w)


def _cvjp_fwd(x, w):
    y = _cvjp_layer(x, w)
    return y, (x, w, y)


def _cvjp_bwd(res, g):
    x, w, y = res
    d = g * (1 - y**2)
    return d @ w.T, x.T @ d


_cvjp_layer.defvjp(_cvjp_fwd, _cvjp_bwd)


def program(x, w):
    """A matmul inside each kind of nested region, one after the other."""
    h = jax.jit(lambda a: a @ w)(x)
    h, _ = lax.scan(lambda c, _: (jnp.tanh(c @ w), None), h, None, length=2)
    h = lax.cond(jnp.sum(h) > -1e9, lambda a: a @ w, lambda a: a * 2.0, h)
    h = _cvjp_layer(h, w)
    h = jax.checkpoint(lambda a: jnp.tanh(a @ w))(h)
    return jnp.sum(jax.nn.softplus(h) ** 2)


def with_while(x, w):
    h = lax.while_loop(lambda s: s[1] < 3, lambda s: (jnp.tanh(s[0] @ w), s[1] + 1), (x, 0))[0]
    return jnp.sum(h)


@pytest.fixture
def xw():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
            jnp.asarray(rng.normal(size=(16, 16)) / 4, jnp.float32))


def test_every_nested_region_is_rewritten_on_the_jaxpr(xw):
    f = autocast(program)
    dots = _dots(f.rewritten_jaxpr(*xw))
    regions = {path[0] for path, _ in dots if path}
    # custom_vjp_call inside each region: the fp32-accumulating bf16 product
    assert {"jit", "scan", "cond", "custom_vjp_call", "remat2"} <= regions
    assert dots and all(dt == ("bfloat16", "bfloat16") for _, dt in dots)
    wl = autocast(with_while)
    wdots = _dots(wl.rewritten_jaxpr(*xw))
    assert any(path and path[0] == "while" for path, _ in wdots)
    assert all(dt == ("bfloat16", "bfloat16") for _, dt in wdots)
    report = f.report(*xw).as_dict()
    assert {"jit", "scan", "cond", "custom_vjp", "custom_jvp", "remat"} <= set(report["regions"])
    assert report["not_rewritten"] == []
    # the untouched program has fp32 matmuls only: the rewrite did this
    assert all(dt == ("float32", "float32") for _, dt in _dots(jax.make_jaxpr(program)(*xw)))


def test_audit_finds_every_region_kind_rewritten():
    rows = audit_regions()
    assert [r.region for r in rows if not r.rewritten] == []
    assert {r.matmul_dtypes for r in rows} == {"bf16"}


def test_loop_operand_layouts_consts_carries_and_forwarded_outputs(xw):
    """Scan and while regions with every operand group filled: closed-over
    consts, two carries (one an int), scanned inputs, a ys output that JAX
    forwards from xs instead of computing it; the cond of the while loop has a
    const too. The JAX releases spell these layouts differently (compat.py)."""
    x, w = xw
    limit = jnp.asarray(3)

    def scanned(x, w):
        def step(carry, row):
            h, i = carry
            h = jnp.tanh(h @ w + row)
            return (h, i + 1), (row, jnp.sum(h))   # `row` is forwarded from xs

        (h, n), (rows, sums) = lax.scan(step, (x[:2], 0), x.reshape(4, 2, 16))
        return jnp.sum(h) + jnp.sum(sums) + jnp.sum(rows) + n

    def f(x, w):
        g = lax.while_loop(lambda s: s[1] < limit, lambda s: (jnp.tanh(s[0] @ w), s[1] + 1), (x, 0))[0]
        return scanned(x, w) + jnp.sum(g)

    af = autocast(f)
    report = af.report(x, w).as_dict()
    assert report["regions"]["scan"] == 1 and report["regions"]["while"] == 1
    assert report["not_rewritten"] == []
    dots = _dots(af.rewritten_jaxpr(x, w))
    assert {p[0] for p, _ in dots if p} >= {"scan", "while"}
    assert all(dt == ("bfloat16", "bfloat16") for _, dt in dots)
    np.testing.assert_allclose(float(af(x, w)), float(f(x, w)), rtol=0.05)
    # the rewritten scan differentiates (a while loop does not, in any dtype)
    g16 = jax.grad(autocast(scanned), argnums=1)(x, w)
    g32 = jax.grad(scanned, argnums=1)(x, w)
    assert float(jnp.max(jnp.abs(g16 - g32))) < 0.05 * float(jnp.max(jnp.abs(g32)))


def test_call_primitive_is_rewritten(xw):
    """``closed_call`` (JAX 0.10, 0.11.0), ``eval_jaxpr`` from 0.11.1: a jaxpr called
    as it is, re-traced like a jit region."""
    from jax.extend.core import primitives as prims

    x, w = xw
    inner = jax.make_jaxpr(lambda a: jnp.tanh(a @ w))(x)

    def f(x):
        [out] = prims.closed_call_p.bind(x, **prims.closed_call_p.get_bind_params({"call_jaxpr": inner}))
        return out

    af = autocast(f)
    assert af.report(x).as_dict()["regions"] == {"jit": 1}
    dots = _dots(af.rewritten_jaxpr(x))
    assert dots and dots[0][0][0] == prims.closed_call_p.name and dots[0][1] == ("bfloat16", "bfloat16")
    np.testing.assert_allclose(np.asarray(af(x), np.float32), np.asarray(f(x)), atol=0.05)


def test_params_unlike_the_table_leave_the_region_untouched(monkeypatch):
    """A JAX newer than compat.REGIONS: a region whose params are not the ones its
    row reads runs as traced (reported, with a warning) instead of raising KeyError."""
    monkeypatch.setattr(compat, "_warned", set())
    old_scan = {"jaxpr": None, "num_consts": 1, "num_carry": 2, "length": 3, "reverse": False, "unroll": 1}
    region = compat.region_for("scan", old_scan, version=(0, 10, 2))
    assert region.kind == "scan" and region.split_operands(old_scan, list("abcdef")) == [["a"], ["b", "c"], ["d", "e", "f"]]
    with pytest.warns(RuntimeWarning, match="does not know the params of 'scan'.*ft_in"):
        assert compat.region_for("scan", old_scan, version=(0, 12)) is None
    assert compat.region_for("scan", old_scan, version=(0, 9)) is None  # older than any row
    assert compat.region_for("shard_map", {}) is None


def test_fp32_family_and_follow_rules(xw):
    x, w = xw

    def f(x, w, b):
        y = x @ w                      # bf16 (lower_precision)
        z = y * 2.0                    # follows: a Python scalar keeps bf16
        masked = jnp.where(z > 0, z, -jnp.inf)  # a broadcast constant keeps bf16 too
        s = jnp.exp(z)                 # fp32 family
        return z, masked, s, jnp.sum(z), y + b  # sum fp32; bf16 + an fp32 bias -> fp32

    z, masked, s, total, biased = autocast(f)(x, w, jnp.ones((16,), jnp.float32))
    assert z.dtype == BF16 and masked.dtype == BF16
    assert s.dtype == jnp.float32 and total.dtype == jnp.float32
    assert biased.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(s), np.exp(np.asarray(x @ w) * 2), rtol=0.1)


def test_gradients_match_fp32_within_bf16_tolerance(xw):
    x, w = xw
    g32 = jax.grad(program, argnums=(0, 1))(x, w)
    g16 = jax.jit(jax.grad(autocast(program), argnums=(0, 1)))(x, w)
    for a, b in zip(g32, g16, strict=True):
        assert b.dtype == jnp.float32
        scale = float(jnp.max(jnp.abs(a)))
        assert float(jnp.max(jnp.abs(a - b))) < 0.05 * scale  # bf16 keeps ~3 significant digits
        assert float(jnp.max(jnp.abs(a - b))) > 0  # and it really ran in bf16


def test_backward_matmuls_run_in_low_precision(xw):
    f = autocast(lambda x, w: jnp.sum(jnp.tanh(jax.jit(lambda a: a @ w)(x) @ w)))
    dots = _dots(jax.make_jaxpr(jax.grad(f, argnums=1))(*xw))
    # forward (2) and backward (4) products, all on bf16 operands
    assert len(dots) >= 6 and all(dt == ("bfloat16", "bfloat16") for _, dt in dots)


def test_rewrite_is_traced_once_per_signature(xw):
    calls = []

    def f(x, w):
        calls.append(1)
        return jnp.sum(x @ w)

    af = autocast(f)
    x, w = xw
    for _ in range(3):
        af(x, w)
    jax.grad(af, argnums=1)(x, w)       # jvp tracers of the same shapes: same entry
    jax.jit(af)(x, w)
    assert af.traces == 1 and len(calls) == 1 and af.cache_size() == 1
    af(x[:4], w)                        # a new shape is a new signature
    assert af.traces == 2 and af.cache_size() == 2


def test_composes_with_vmap_and_closures(xw):
    x, w = xw
    af = autocast(lambda row, w: jnp.tanh(row @ w))
    batched = jax.vmap(af, in_axes=(0, None))(x, w)
    assert batched.shape == (8, 16) and batched.dtype == BF16
    np.testing.assert_allclose(np.asarray(batched, np.float32), np.tanh(np.asarray(x @ w)), atol=0.05)

    def loss(w):  # autocast of a function closing over a tracer of jax.grad
        return autocast(lambda a: jnp.sum(a @ w))(x)

    g = jax.grad(loss)(w)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(lambda w: jnp.sum(x @ w))(w)), rtol=0.05, atol=0.05)


def test_fp16_and_static_arguments(xw):
    x, w = xw
    af = autocast(lambda x, w, act: act(x @ w), dtype=jnp.float16)
    assert af(x, w, jnp.tanh).dtype == jnp.float16
    assert af.traces == 1
    af(x, w, jax.nn.relu)  # a different static argument is a different signature
    assert af.traces == 2


def test_policy_names_jax_primitives(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nframework: jax\nfamilies:\n  fp32: [softmax]\n")
    with pytest.raises(PolicyError, match=r"families.fp32\[0\].*'softmax'"):
        load_policy(bad)


def test_policy_must_be_a_jax_policy(tmp_path):
    pytest.importorskip("torch")  # a torch policy's op names are checked against torch
    with pytest.raises(PolicyError, match="framework: expected 'jax'"):
        jax_policy("torch-cpu")
    torch_acc = tmp_path / "acc.yaml"
    torch_acc.write_text("name: acc\nextends: torch-cpu\naccumulate_fp32: [linear]\n")
    with pytest.raises(PolicyError, match="accumulate_fp32: expected only in `framework: jax`"):
        load_policy(torch_acc)


def test_a_user_policy_changes_the_decisions(tmp_path, xw):
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\nextends: jax\noverrides: {exp: none, tanh: lower_precision}\n")
    pol = load_policy(mine)
    assert pol.framework == "jax" and pol.family("exp") is None
    x = xw[0].astype(jnp.bfloat16)
    out_exp, out_tanh = autocast(lambda a: (jnp.exp(a), jnp.tanh(a.astype(jnp.float32))), pol)(x)
    assert out_exp.dtype == BF16 and out_tanh.dtype == BF16


def test_banned_primitive_raises(tmp_path, xw):
    banned = tmp_path / "banned.yaml"
    banned.write_text("name: banned\nextends: jax\noverrides: {log: banned}\n")
    with pytest.raises(TypeError, match="log is banned"):
        autocast(jnp.log, banned)(jnp.abs(xw[0]) + 1)
