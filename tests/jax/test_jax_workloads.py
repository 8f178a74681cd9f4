"""The JAX workloads are their torch twins: same weights, same outputs, same optimizer."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from ampcert.backends.torch_backend import seed_everything  # noqa: E402
from ampcert.workloads import gpt, resnet  # noqa: E402


def _tasks(workload, params, seed=0):
    seed_everything(seed, "cpu")
    jt = workload.build_jax(params, seed, "cpu")
    return jt, jt.torch_task


@pytest.mark.parametrize("name", ["resnet", "gpt"])
def test_forward_and_one_optimizer_step_match_torch(name):
    if name == "resnet":
        workload, params = resnet.WORKLOAD, resnet.ResNetParams(size="tiny")
    else:
        workload, params = gpt.WORKLOAD, gpt.GPTParams(size="tiny", optimizer="adamw")
    jt, tt = _tasks(workload, params)
    model = tt.model
    x, y = tt.train_x[:16], tt.train_y[:16]
    model.train()
    logits_t = model(x)
    loss_t = tt.loss_fn(logits_t, y)
    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    logits_j, new_state = jt.apply(jt.params, jt.state, xj, True)
    np.testing.assert_allclose(np.asarray(logits_j), logits_t.detach().numpy(), rtol=1e-4, atol=1e-4)
    loss_j = jt.loss_fn(logits_j, yj)
    assert abs(float(loss_j) - float(loss_t.detach())) < 1e-4
    if name == "resnet":  # BatchNorm running statistics advance like torch's
        rm = model.state_dict()["stem.1.running_var"].numpy()
        np.testing.assert_allclose(np.asarray(new_state["stem.1.running_var"]), rm, rtol=1e-4)

    # one optimizer step at the first step's learning rate, torch and optax
    opt = tt.make_optimizer(model.parameters())
    lr0 = tt.lr_lambda(0)
    for group in opt.param_groups:
        group["lr"] *= lr0
    loss_t.backward()
    opt.step()

    def loss_of(p):
        return jt.loss_fn(jt.apply(p, jt.state, xj, True)[0], yj)

    grads = jax.grad(loss_of)(jt.params)
    updates, _ = jt.optimizer.update(grads, jt.optimizer.init(jt.params), jt.params)
    stepped = optax.apply_updates(jt.params, jax.tree_util.tree_map(lambda u: u * jt.base_lr * lr0, updates))
    for n, p in model.named_parameters():
        np.testing.assert_allclose(np.asarray(stepped[n]), p.detach().numpy(), rtol=1e-3, atol=2e-5, err_msg=n)


def test_the_same_seed_gives_the_same_weights_in_both_frameworks():
    jt, tt = _tasks(resnet.WORKLOAD, resnet.ResNetParams(size="tiny"), seed=3)
    for n, p in tt.model.named_parameters():
        np.testing.assert_array_equal(np.asarray(jt.params[n]), p.detach().numpy())
    other, _ = _tasks(resnet.WORKLOAD, resnet.ResNetParams(size="tiny"), seed=4)
    assert not np.array_equal(np.asarray(other.params["stem.0.weight"]), np.asarray(jt.params["stem.0.weight"]))


def test_gpt_with_dropout_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="dropout"):
        _tasks(gpt.WORKLOAD, gpt.GPTParams(size="tiny", dropout=0.1))
