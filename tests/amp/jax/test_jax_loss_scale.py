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

    ls = DynamicLossScale.create(2.0**16, growth_interval=PERIOD, **kw)
    param = jnp.zeros((1,))
    scales, skipped = [], []
    for i, kind in enumerate(plan):
        before = float(param[0])
        param, ls = step(param, ls, jnp.float32(0.0 if kind is None else float(kind)))
        scales.append(float(ls.loss_scale))
        if float(param[0]) == before:
            skipped.append(i)
    return scales, skipped


@pytest.mark.parametrize("bounds", [{}, {"min_scale": 0.0, "max_scale": math.inf}],
                         ids=["ampcert-bounds", "gradscaler-unbounded"])
def test_same_gradients_give_the_same_scales_and_skips_as_the_torch_scaler(bounds):
    plan = _plan()
    t_scales, t_skipped = _torch_run(plan, **bounds)  # the same knobs under the same names
    j_scales, j_skipped = _jax_run(plan, **bounds)
    assert j_scales == t_scales
    assert j_skipped == t_skipped
    assert len(t_skipped) > 40  # the plan really exercised overflow ...
    if not bounds:
        assert min(t_scales) == 1.0 and max(t_scales) == 2.0**24  # ... the floor and the ceiling


def test_every_field_survives_jit_tree_map_and_flatten():
    ls = DynamicLossScale.create(1024.0, growth_interval=5, growth_factor=4.0, backoff_factor=0.25, min_scale=8.0,
                                 max_scale=2.0**20)
    leaves, treedef = jax.tree_util.tree_flatten(ls)
    assert len(leaves) == 2  # scale and counter are the only array leaves
    assert treedef.unflatten([None, None]).loss_scale is None  # rebuilt with what it is given (vmap in_axes)
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    mapped = jax.tree_util.tree_map(lambda x: x, ls)
    through_jit = jax.jit(lambda s: s)(ls)
    for other in (again, mapped, through_jit):
        assert (other.growth_interval, other.growth_factor, other.backoff_factor, other.min_scale,
                other.max_scale) == \
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
    with pytest.raises(ValueError, match="growth_factor"):
        DynamicLossScale(growth_factor=1.0)
    with pytest.raises(ValueError, match="max_scale"):
        DynamicLossScale(min_scale=4.0, max_scale=2.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'periodd'"):
        DynamicLossScale(periodd=3)


# --------------------------------------------------------------------------- option names

TORCH_NAMES = {"growth_interval": 5, "growth_factor": 4.0, "backoff_factor": 0.25, "min_scale": 8.0,
               "max_scale": 2.0**20}


def test_the_knobs_have_the_torch_scalers_names():
    """init_scale, growth_interval, growth_factor, backoff_factor, min_scale and max_scale
    mean the same in both scalers: the same keywords build both."""
    pytest.importorskip("torch")
    from ampcert.amp import DynamicLossScaler

    ls = DynamicLossScale(init_scale=1024.0, **TORCH_NAMES)
    scaler = DynamicLossScaler("cpu", init_scale=1024.0, **TORCH_NAMES)
    assert float(ls.loss_scale) == scaler.get_scale() == 1024.0
    assert (ls.growth_interval, ls.growth_factor, ls.backoff_factor, ls.min_scale, ls.max_scale) == (
        scaler.get_growth_interval(), scaler.get_growth_factor(), scaler.get_backoff_factor(),
        scaler.get_min_scale(), scaler.get_max_scale())
    # init_scale is clamped into the bounds, as the torch scaler clamps it
    assert float(DynamicLossScale(init_scale=4.0, min_scale=8.0).loss_scale) == 8.0
    assert DynamicLossScaler("cpu", init_scale=4.0, min_scale=8.0).get_scale() == 8.0
    assert float(DynamicLossScale.create(init_scale=2.0**30).loss_scale) == 2.0**24


OLD_NAMES = {"period": ("growth_interval", 5), "factor": ("growth_factor", 4.0),
             "backoff": ("backoff_factor", 0.25), "min_loss_scale": ("min_scale", 8.0),
             "max_loss_scale": ("max_scale", 2.0**20)}


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_an_old_name_still_works_with_a_deprecation_warning_naming_the_new_one(old):
    new, value = OLD_NAMES[old]
    for build in (lambda **kw: DynamicLossScale(**kw), lambda **kw: DynamicLossScale.create(1024.0, **kw)):
        with pytest.warns(DeprecationWarning, match=f"'{old}' is deprecated, use '{new}'") as rec:
            ls = build(**{old: value})
        assert rec[0].filename == __file__  # the warning points at the caller
        assert getattr(ls, new) == value
        with pytest.warns(DeprecationWarning, match=f"'{old}' is deprecated, use '{new}'"):
            assert getattr(ls, old) == value  # reading the old attribute too
        with pytest.raises(TypeError, match=f"both '{old}' and its new name '{new}'"):
            build(**{old: value, new: value})


def test_old_names_survive_jit_as_the_new_ones():
    with pytest.warns(DeprecationWarning):
        ls = DynamicLossScale.create(initial=1024.0, period=5, factor=4.0, backoff=0.25, min_loss_scale=8.0,
                                     max_loss_scale=2.0**20)
    assert float(ls.loss_scale) == 1024.0  # initial= is init_scale=
    through_jit = jax.jit(lambda s: s.adjust(jnp.asarray(False)))(ls)
    assert (through_jit.growth_interval, through_jit.growth_factor, through_jit.backoff_factor,
            through_jit.min_scale, through_jit.max_scale) == tuple(TORCH_NAMES.values())
    assert float(through_jit.loss_scale) == 256.0
    with pytest.warns(DeprecationWarning, match="'initial' is deprecated, use 'init_scale'"):
        assert float(DynamicLossScale.create(initial=2.0).loss_scale) == 2.0


def test_the_scale_state_keeps_its_name_loss_scale():
    """``loss_scale`` is the state (the current scale), not a knob: it keeps its name
    (the JAX backend reads ``state.loss_scale``)."""
    ls = DynamicLossScale(init_scale=32.0)
    assert isinstance(ls.loss_scale, jax.Array) and float(ls.loss_scale) == 32.0
    with pytest.raises(TypeError, match="both loss_scale"):
        DynamicLossScale(loss_scale=jnp.asarray(1.0), init_scale=2.0)
