"""The JAX workloads are their torch twins: same weights, same data and batches,
same outputs, same optimizer step."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from ampcert import mllog  # noqa: E402
from ampcert.backends import loop  # noqa: E402
from ampcert.workloads import gpt, resnet, torch_models  # noqa: E402

WORKLOADS = {
    "resnet": (resnet.WORKLOAD, resnet.ResNetParams(size="tiny")),
    "gpt": (gpt.WORKLOAD, gpt.GPTParams(size="tiny", optimizer="adamw", max_bytes=200_000)),
}


def _tasks(name, seed=0):
    """The JAX task and the torch task of one workload and seed, built independently."""
    workload, params = WORKLOADS[name]
    return workload.build_jax(params, seed, "cpu"), workload.build(params, seed, "cpu")


@pytest.mark.parametrize("name", ["resnet", "gpt"])
def test_forward_and_one_optimizer_step_match_torch(name):
    jt, tt = _tasks(name)
    model = tt.model
    x, y = tt.train_x[:16], tt.train_y[:16]
    model.train()
    logits_t = model(x)
    loss_t = tt.loss_fn(logits_t, y)
    xj, yj = jnp.asarray(jt.train_x[:16]), jnp.asarray(jt.train_y[:16])
    # JAX's side is jitted, as the backend runs it: one compilation, where op-by-op dispatch
    # compiles each primitive apart (about three times the CPU time on these models).
    logits_j, new_state = jax.jit(jt.apply, static_argnums=3)(jt.params, jt.state, xj, True)
    np.testing.assert_allclose(np.asarray(logits_j), logits_t.detach().numpy(), rtol=1e-4, atol=1e-4)
    loss_j = jt.loss_fn(logits_j, yj)
    assert abs(float(loss_j) - float(loss_t.detach())) < 1e-4
    if name == "resnet":  # BatchNorm running statistics advance like torch's
        rm = model.state_dict()["stem.1.running_var"].numpy()
        np.testing.assert_allclose(np.asarray(new_state["stem.1.running_var"]), rm, rtol=1e-4)

    # one optimizer step at the first step's learning rate, torch and optax
    opt = tt.make_optimizer(model.parameters())
    lr0 = tt.lr_lambda(0)
    assert jt.lr_lambda(0) == lr0 and jt.base_lr == opt.param_groups[0]["lr"]
    for group in opt.param_groups:
        group["lr"] *= lr0
    loss_t.backward()
    opt.step()

    def loss_of(p):
        return jt.loss_fn(jt.apply(p, jt.state, xj, True)[0], yj)

    @jax.jit
    def one_step(params):
        grads = jax.grad(loss_of)(params)
        updates, _ = jt.optimizer.update(grads, jt.optimizer.init(params), params)
        return optax.apply_updates(params, jax.tree_util.tree_map(lambda u: u * jt.base_lr * lr0, updates))

    stepped = one_step(jt.params)
    for n, p in model.named_parameters():
        np.testing.assert_allclose(np.asarray(stepped[n]), p.detach().numpy(), rtol=1e-3, atol=2e-5, err_msg=n)


@pytest.mark.parametrize("name", ["resnet", "gpt"])
def test_the_same_seed_gives_the_same_weights_and_data_in_both_frameworks(name):
    jt, tt = _tasks(name, seed=3)
    torch.manual_seed(12345)  # torch's global generator plays no part
    _, tt_again = _tasks(name, seed=3)
    state = {n: t for n, t in tt.model.state_dict().items() if not n.endswith("num_batches_tracked")}
    tied = {"head.weight": "tok_emb.weight"} if name == "gpt" else {}  # GPT's head is its token embedding
    assert set(jt.params) | set(jt.state) == set(state) - set(tied)
    for n, p in state.items():
        key = tied.get(n, n)
        mine = jt.params[key] if key in jt.params else jt.state[key]
        np.testing.assert_array_equal(np.asarray(mine), p.numpy(), err_msg=n)  # bit for bit
        np.testing.assert_array_equal(tt_again.model.state_dict()[n].numpy(), p.numpy(), err_msg=n)
    for field in ("train_x", "train_y", "eval_x", "eval_y"):
        np.testing.assert_array_equal(np.asarray(getattr(jt, field)), getattr(tt, field).numpy(), err_msg=field)
    assert jt.data_info == tt.data_info and jt.data_note == tt.data_note
    other, _ = _tasks(name, seed=4)
    first = next(iter(jt.params))
    assert not np.array_equal(np.asarray(other.params[first]), np.asarray(jt.params[first]))


def test_resnet_augmentation_is_the_same_in_both_frameworks():
    jt, tt = _tasks("resnet", seed=5)
    idx = next(loop.index_batches(len(jt.train_x), jt.batch_size, 5))
    for step in (1, 2, 77):
        xj, yj = jt.augment(jt.train_x[idx], jt.train_y[idx], step)
        xt, yt = tt.augment(tt.train_x[torch.from_numpy(idx)], tt.train_y[torch.from_numpy(idx)], step)
        np.testing.assert_array_equal(xj, xt.numpy())
        np.testing.assert_array_equal(yj, yt.numpy())
    assert not np.array_equal(jt.augment(jt.train_x[idx], jt.train_y[idx], 1)[0],
                              jt.augment(jt.train_x[idx], jt.train_y[idx], 2)[0])


def test_both_backends_train_on_the_same_batches(monkeypatch):
    """Run each backend for a few steps and record what reached the model."""
    from ampcert.backends import jax_backend, torch_backend
    from ampcert.spec import expand, parse_suite

    seen: dict[str, list[np.ndarray]] = {"torch": [], "jax": []}
    numpy_crop, torch_crop = resnet.CropFlip.__call__, torch_models.TorchCropFlip.__call__

    def numpy_spy(self, x, y, step):
        out = numpy_crop(self, x, y, step)
        seen["jax"].append(out[0].copy())
        return out

    def torch_spy(self, x, y, step):
        out = torch_crop(self, x, y, step)
        seen["torch"].append(out[0].numpy().copy())
        return out

    monkeypatch.setattr(resnet.CropFlip, "__call__", numpy_spy)
    monkeypatch.setattr(torch_models.TorchCropFlip, "__call__", torch_spy)
    suite = {"name": "pair", "amp": "ampcert", "device": "cpu", "precisions": ["fp32"], "seeds": [2],
             "train": {"steps": 3, "eval_every": 3}, "workloads": [{"workload": "resnet"}]}
    (torch_spec,) = expand(parse_suite({**suite, "backend": "torch"}), "cpu")
    (jax_spec,) = expand(parse_suite({**suite, "backend": "jax"}), "cpu")
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        torch_out = torch_backend.train(torch_spec, mllog.MLLogger(io.StringIO()))
    finally:
        torch.use_deterministic_algorithms(deterministic)
    jax_out = jax_backend.train(jax_spec, mllog.MLLogger(io.StringIO()))
    assert len(seen["torch"]) == len(seen["jax"]) == 3
    for a, b in zip(seen["torch"], seen["jax"], strict=True):
        np.testing.assert_array_equal(a, b)
    # the same batches from the same weights: the losses agree to float rounding
    np.testing.assert_allclose(torch_out.loss, jax_out.loss, rtol=1e-3)


def test_batch_order_follows_the_seed_only():
    a = list(itertools.islice(loop.index_batches(1000, 64, 7), 20))
    np.random.seed(0)  # numpy's (and torch's) global generators play no part
    np.random.random(5)
    torch.manual_seed(0)
    b = list(itertools.islice(loop.index_batches(1000, 64, 7), 20))
    c = list(itertools.islice(loop.index_batches(1000, 64, 8), 20))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    epoch = np.concatenate(a[:15])  # 15 full batches per epoch, the ragged tail dropped
    assert len(set(epoch.tolist())) == 15 * 64 and all(len(x) == 64 for x in a)


def test_gpt_with_dropout_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="dropout"):
        gpt.WORKLOAD.build_jax(gpt.GPTParams(size="tiny", dropout=0.1), 0, "cpu")
