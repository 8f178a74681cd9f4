"""A user's own workload for ampcert: a small MLP classifying wines.

It shows everything a workload provides (docs/workloads.md):

- ``name``, ``summary``, ``metric`` and ``higher_is_better``;
- ``Params``: a pydantic model of the knobs a suite may set (``params:``);
- ``default_budget(params)``: the target quality, step cap and evaluation interval;
- ``build(params, seed, device)``: a TorchTask (model, data, loss, optimizer, metric);
- ``build_jax(params, seed, device)``: the same task in plain JAX and optax, for
  ``backend: jax`` (optional).

The data is scikit-learn's bundled copy of the UCI wine data (178 wines, 13
chemical measurements, 3 cultivars), so it runs offline. Features are
standardised with the training split's statistics; the split is fixed (it
does not move with the seed), so every seed and precision is scored on the
same wines.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from ampcert.workloads.base import Budget, TorchTask


class WineParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hidden: PositiveInt = 32
    batch_size: PositiveInt = 32
    lr: float = Field(0.01, gt=0)
    target: float = Field(0.9, ge=0, le=1)
    max_steps: PositiveInt = 200


def _data():
    from sklearn.datasets import load_wine

    x, y = load_wine(return_X_y=True)
    order = np.random.default_rng(1234).permutation(len(x))  # a fixed split, not the run's seed
    x, y = x[order].astype(np.float32), y[order].astype(np.int64)
    n_eval = len(x) // 4
    mean, std = x[n_eval:].mean(0), x[n_eval:].std(0) + 1e-6
    x = (x - mean) / std
    return x[n_eval:], y[n_eval:], x[:n_eval], y[:n_eval]


class WineWorkload:
    name = "wine"
    summary = "MLP on scikit-learn's wine data (13 features, 3 classes), torch and JAX"
    metric = "accuracy"
    higher_is_better = True
    Params = WineParams

    def default_budget(self, params: WineParams) -> Budget:
        return Budget(target=params.target, max_steps=params.max_steps, eval_every=10)

    def build(self, params: WineParams, seed: int, device: str) -> TorchTask:
        import torch
        from torch import nn

        tx, ty, ex, ey = _data()
        # ampcert seeded torch with the run's seed before calling build: the
        # initial weights follow the seed.
        model = nn.Sequential(nn.Linear(13, params.hidden), nn.ReLU(), nn.Linear(params.hidden, 3))

        def accuracy(model, x, y):
            return (model(x).argmax(dim=1) == y).float().mean().item()

        return TorchTask(
            model=model.to(device),
            train_x=torch.from_numpy(tx).to(device), train_y=torch.from_numpy(ty).to(device),
            eval_x=torch.from_numpy(ex).to(device), eval_y=torch.from_numpy(ey).to(device),
            batch_size=params.batch_size,
            loss_fn=nn.functional.cross_entropy,
            make_optimizer=lambda ps: torch.optim.Adam(ps, lr=params.lr),
            evaluate=accuracy,
            data_note=f"sklearn load_wine: {len(tx)} train / {len(ex)} eval, standardised, fixed split",
        )

    def build_jax(self, params: WineParams, seed: int, device: str):
        import jax
        import jax.numpy as jnp
        import optax

        from ampcert.workloads.jax_models import JaxTask, cross_entropy

        tx, ty, ex, ey = _data()
        k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
        bound1, bound2 = 1 / np.sqrt(13), 1 / np.sqrt(params.hidden)  # torch.nn.Linear's init range
        weights = {
            "w1": jax.random.uniform(k1, (13, params.hidden), minval=-bound1, maxval=bound1),
            "b1": jnp.zeros(params.hidden),
            "w2": jax.random.uniform(k2, (params.hidden, 3), minval=-bound2, maxval=bound2),
            "b2": jnp.zeros(3),
        }

        def apply(p, state, x, train):
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            return h @ p["w2"] + p["b2"], state

        def evaluate(predict, x, y):
            return float((np.asarray(predict(x)).argmax(axis=1) == y).mean())

        return JaxTask(params=weights, state={}, apply=apply, loss_fn=cross_entropy, evaluate=evaluate,
                       optimizer=optax.adam(1.0), base_lr=params.lr,
                       train_x=tx, train_y=ty, eval_x=ex, eval_y=ey, batch_size=params.batch_size,
                       data_note=f"sklearn load_wine: {len(tx)} train / {len(ex)} eval")


WORKLOAD = WineWorkload()
