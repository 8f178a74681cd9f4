"""DynamicLossScale: the torch scaler's state machine as a pytree that keeps every field.

Only the comparison with the torch scaler needs torch; it skips where torch is absent."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from ampcert.amp.jax import DynamicLossScale, all_finite, select_tree  # noqa: E402

PERIOD = 7


def _plan(n=400, seed=0):
    """Mostly clean steps, some inf/nan, a burst that drives the scale to its floor,
    then a long clean stretch that grows it to the ceiling."""
    rng = random.Random(seed)
    plan = [rng.choice(["inf", "nan"]) if rng.random() < 0.15 else None for _ in range(n)]
    plan[100:140] = ["inf"] * 40           # 2**16 * 0.5**40 < 1: pinned at min_scale
    plan[140:] = [None] * (n - 140)        # 260 clean steps: 37 growths, clamped at max_scale
    return plan


def _torch_run(plan, **kw):
    torch = pytest.importorskip("torch")
    from ampcert.amp import DynamicLossScaler

    scaler = DynamicLossScaler("cpu", growth_interval=PERIOD, **kw)
    p = torch.zeros(1)
    opt = torch.optim.SGD([p], lr=1.0)
    scales, skipped = [], []
    for i, kind in enumerate(plan):
        g = scaler.scale(torch.full((1,), -1.0))
        if kind is not None:
            g[0] = float(kind)
        p.grad = g
        before = p.item()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        if p.item() == before:
            skipped.append(i)
    return scales, skipped


def _jax_run(plan, **kw):
    @jax.jit
    def step(param, ls, bad):
        grad = ls.scale(jnp.full((1,), -1.0))
        grad = jnp.where(jnp.isnan(bad), jnp.nan, jnp.where(jnp.isinf(bad), jnp.inf, grad))
        grad = ls.unscale(grad)
        finite = all_finite(grad)
        param = select_tree(finite, param - grad, param)
        return param, ls.adjust(finite)

    ls = DynamicLossScale.create(2.0**16, period=PERIOD, **kw)
    param = jnp.zeros((1,))
    scales, skipped = [], []
    for i, kind in enumerate(plan):
        before = float(param[0])
        param, ls = step(param, ls, jnp.float32(0.0 if kind is None else float(kind)))
        scales.append(float(ls.loss_scale))
        if float(param[0]) == before:
            skipped.append(i)
    return scales, skipped


@pytest.mark.parametrize("bounds", [{}, {"min_loss_scale": 0.0, "max_loss_scale": math.inf}],
                         ids=["ampcert-bounds", "gradscaler-unbounded"])
def test_same_gradients_give_the_same_scales_and_skips_as_the_torch_scaler(bounds):
    plan = _plan()
    torch_kw = {"min_scale": bounds["min_loss_scale"], "max_scale": bounds["max_loss_scale"]} if bounds else {}
    t_scales, t_skipped = _torch_run(plan, **torch_kw)
    j_scales, j_skipped = _jax_run(plan, **bounds)
    assert j_scales == t_scales
    assert j_skipped == t_skipped
    assert len(t_skipped) > 40  # the plan really exercised overflow ...
    if not bounds:
        assert min(t_scales) == 1.0 and max(t_scales) == 2.0**24  # ... the floor and the ceiling


def test_every_field_survives_jit_tree_map_and_flatten():
    ls = DynamicLossScale.create(1024.0, period=5, factor=4.0, backoff=0.25, min_loss_scale=8.0,
                                 max_loss_scale=2.0**20)
    leaves, treedef = jax.tree_util.tree_flatten(ls)
    assert len(leaves) == 2  # scale and counter are the only array leaves
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    mapped = jax.tree_util.tree_map(lambda x: x, ls)
    through_jit = jax.jit(lambda s: s)(ls)
    for other in (again, mapped, through_jit):
        assert (other.period, other.factor, other.backoff, other.min_loss_scale, other.max_loss_scale) == \
            (5, 4.0, 0.25, 8.0, 2.0**20)
        assert float(other.loss_scale) == 1024.0 and int(other.counter) == 0
    # the floor is honoured after jit (jmp's min_loss_scale is lost here)
    down = jax.jit(lambda s: s.adjust(jnp.asarray(False)))
    state = ls
    for _ in range(10):
        state = down(state)
    assert float(state.loss_scale) == 8.0


def test_unscale_is_fp32_and_keeps_leaf_dtypes():
    ls = DynamicLossScale.create(2.0**15)
    grads = {"w": jnp.full((3,), 2.0**15, jnp.float16), "b": jnp.ones((2,), jnp.float32) * 2.0**15}
    out = ls.unscale(grads)
    assert out["w"].dtype == jnp.float16 and out["b"].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out["w"], np.float32), 1.0)
    assert ls.scale(jnp.asarray(1.0, jnp.float16)).dtype == jnp.float16
    assert bool(all_finite({})) and not bool(all_finite([jnp.ones(2), jnp.asarray([jnp.nan])]))


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="factor"):
        DynamicLossScale(factor=1.0)
    with pytest.raises(ValueError, match="max_loss_scale"):
        DynamicLossScale(min_loss_scale=4.0, max_loss_scale=2.0)
