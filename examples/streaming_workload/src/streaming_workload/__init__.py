"""A user's workload whose training set streams from shard files on disk.

The training set is never in memory as a whole: ``build`` returns a
TorchTask whose ``train_data`` makes, for each epoch, a torch DataLoader over
an IterableDataset (:class:`streaming_workload.torch_data.ShardDataset`) that reads the folder one shard at
a time (:mod:`streaming_workload.shards`); ``build_jax`` gives a JaxTask the
same batches as numpy arrays, without torch. ampcert draws from them epoch
after epoch until the step budget, counts the wait for each batch as data
time, and counts each batch's real length as its samples (docs/workloads.md,
"Streaming data").

The batches' order is this workload's to make reproducible (ampcert does
not shuffle a stream): each epoch's shard order and each shard's example
order come from ``(seed, epoch)``, so a rerun of a seed trains on the same
batches, in torch and in JAX, with any number of loader workers (each reads
every n-th shard of the epoch's order; with several, the DataLoader
interleaves their batches, a different but equally fixed order).

Write a folder of synthetic shards and certify (with ``src/`` on the path,
or after ``pip install -e examples/streaming_workload``)::

    python -m streaming_workload write /tmp/ampcert-shards
    ampcert run examples/streaming_workload/suite.yaml   # data_dir: /tmp/ampcert-shards
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from ampcert.workloads.base import Budget, DataError, TorchTask
from streaming_workload import shards


class StreamParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data_dir: str  # a folder written by `python -m streaming_workload write DIR` (or your converter)
    hidden: PositiveInt = 32
    batch_size: PositiveInt = 64
    lr: float = Field(0.01, gt=0)
    # DataLoader worker processes (0: read in the training process). `ampcert run`'s
    # run processes are daemonic and may not start any: more than 0 is for other callers.
    workers: NonNegativeInt = 0
    target: float = Field(0.9, ge=0, le=1)
    max_steps: PositiveInt = 300


def _meta(params: StreamParams) -> dict:
    try:
        return shards.read_meta(params.data_dir)
    except shards.ShardError as exc:
        raise DataError(str(exc)) from None


def _data_info(params: StreamParams, meta: dict) -> dict:
    return {"source": str(Path(params.data_dir).resolve()), "train_examples": meta["examples"],
            "shards": len(meta["shards"]), "eval_examples": meta["eval_examples"], "streamed": True}


def _accuracy_of(logits: np.ndarray, y: np.ndarray) -> float:
    return float((np.asarray(logits).argmax(axis=1) == y).mean())


class StreamingWorkload:
    name = "streaming"
    summary = "MLP on a synthetic classification set streamed from .npy shards on disk (torch and JAX)"
    metric = "accuracy"
    higher_is_better = True
    Params = StreamParams

    def check(self, params: StreamParams) -> None:
        """Plan-time: the folder exists and lists its shards (raises DataError)."""
        _meta(params)

    def default_budget(self, params: StreamParams) -> Budget:
        return Budget(target=params.target, max_steps=params.max_steps, eval_every=25)

    def build(self, params: StreamParams, seed: int, device: str) -> TorchTask:
        import torch
        from torch import nn

        from streaming_workload import torch_data

        meta = _meta(params)
        ex, ey = shards.load_eval(params.data_dir)
        # ampcert seeded torch with the run's seed before calling build: the
        # initial weights follow the seed.
        model = nn.Sequential(nn.Linear(meta["dim"], params.hidden), nn.ReLU(),
                              nn.Linear(params.hidden, meta["classes"]))

        def train_data(epoch: int):
            # A fresh DataLoader per epoch, over that epoch's order (ampcert calls this with 0, 1, ...).
            return torch_data.loader(params.data_dir, params.batch_size, seed, epoch, params.workers)

        def accuracy(model, x, y):
            return (model(x).argmax(dim=1) == y).float().mean().item()

        return TorchTask(
            model=model.to(device), train_x=None, train_y=None, train_data=train_data,
            eval_x=torch.from_numpy(ex).to(device), eval_y=torch.from_numpy(ey).to(device),
            batch_size=params.batch_size, loss_fn=nn.functional.cross_entropy,
            make_optimizer=lambda ps: torch.optim.Adam(ps, lr=params.lr), evaluate=accuracy,
            data_note=f"{meta['examples']} examples streamed from {len(meta['shards'])} .npy shards, "
                      f"{meta['eval_examples']} eval in memory",
            data_info=_data_info(params, meta),
        )

    def build_jax(self, params: StreamParams, seed: int, device: str):
        import jax
        import jax.numpy as jnp
        import optax

        from ampcert.workloads.jax_models import JaxTask, cross_entropy

        meta = _meta(params)
        ex, ey = shards.load_eval(params.data_dir)
        dim, hidden, classes = meta["dim"], params.hidden, meta["classes"]
        k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
        b1, b2 = 1 / np.sqrt(dim), 1 / np.sqrt(hidden)  # torch.nn.Linear's init range
        weights = {
            "w1": jax.random.uniform(k1, (dim, hidden), minval=-b1, maxval=b1), "b1": jnp.zeros(hidden),
            "w2": jax.random.uniform(k2, (hidden, classes), minval=-b2, maxval=b2), "b2": jnp.zeros(classes),
        }

        def apply(p, state, x, train):
            return jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"], state

        def train_data(epoch: int):
            return shards.iter_batches(params.data_dir, params.batch_size, seed, epoch)

        return JaxTask(params=weights, state={}, apply=apply, loss_fn=cross_entropy,
                       evaluate=lambda predict, x, y: _accuracy_of(predict(x), y),
                       optimizer=optax.adam(1.0), base_lr=params.lr,
                       train_x=None, train_y=None, train_data=train_data,
                       eval_x=ex, eval_y=ey, batch_size=params.batch_size,
                       data_note=f"{meta['examples']} examples streamed from {len(meta['shards'])} .npy shards",
                       data_info=_data_info(params, meta))


WORKLOAD = StreamingWorkload()
