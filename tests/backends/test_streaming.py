"""Streamed training data: a task's ``train_data`` (a DataLoader, any iterable of
(x, y) batches, a callable epoch -> iterable) trains through the real backends.

The same batches streamed or indexed from memory give the same run, loss for
loss; waiting for a batch is data time; a batch's samples are its length;
a task that has no batches to give fails with a one-line reason. The example
package examples/streaming_workload streams .npy shards written here.
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from conftest import REPO
from pydantic import BaseModel, ConfigDict
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from ampcert import mllog
from ampcert.backends import loop, torch_backend
from ampcert.backends.contract import RunFailed
from ampcert.errors import UserError
from ampcert.spec import expand, parse_suite
from ampcert.workloads import registry
from ampcert.workloads.base import Budget, TorchTask

EXAMPLE_SRC = REPO / "examples" / "streaming_workload" / "src"
N, DIM, CLASSES, BATCH = 100, 8, 3, 16  # 6 full batches an epoch: 12 steps are two epochs


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    gen = np.random.default_rng(0)
    teacher = gen.standard_normal((DIM, CLASSES)).astype(np.float32)
    x = gen.standard_normal((N + 40, DIM)).astype(np.float32)
    y = (x @ teacher).argmax(axis=1).astype(np.int64)
    return x[:N], y[:N], x[N:], y[N:]


class TinyParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _shift(x, y, step):
    """A per-batch augmentation that depends on the step (framework-agnostic)."""
    return x + 0.01 * step, y


class Tiny:
    """A two-layer MLP whose training data ``train(x, y, seed)`` makes: the
    TorchTask's (or JaxTask's) train_x/train_y/train_data fields."""

    name = "tiny-stream"
    summary = "tiny MLP, streamed or in memory (test only)"
    metric = "accuracy"
    higher_is_better = True
    Params = TinyParams

    def __init__(self, train: Callable[[Any, Any, int], dict[str, Any]], augment=None, flops=None):
        self.train, self.augment, self.flops = train, augment, flops

    def default_budget(self, params):
        return Budget(target=0.99, max_steps=12, eval_every=4)

    def build(self, params, seed, device):
        tx, ty, ex, ey = _data()
        model = nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Linear(16, CLASSES))  # torch's seeded generator

        def accuracy(model, x, y):
            return (model(x).argmax(dim=1) == y).float().mean().item()

        return TorchTask(model=model, eval_x=torch.from_numpy(ex), eval_y=torch.from_numpy(ey), batch_size=BATCH,
                         loss_fn=nn.functional.cross_entropy,
                         make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                         evaluate=accuracy, augment=self.augment, flops_per_step=self.flops,
                         **self.train(torch.from_numpy(tx), torch.from_numpy(ty), seed))

    def build_jax(self, params, seed, device):
        import jax
        import optax

        from ampcert.workloads.jax_models import JaxTask, cross_entropy

        tx, ty, ex, ey = _data()
        gen = np.random.default_rng(seed)
        weights = {"w1": gen.uniform(-0.3, 0.3, (DIM, 16)).astype(np.float32), "b1": np.zeros(16, np.float32),
                   "w2": gen.uniform(-0.25, 0.25, (16, CLASSES)).astype(np.float32),
                   "b2": np.zeros(CLASSES, np.float32)}

        def apply(p, state, x, train):
            return jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"], state

        def evaluate(predict, x, y):
            return float((np.asarray(predict(x)).argmax(axis=1) == y).mean())

        return JaxTask(params=weights, state={}, apply=apply, loss_fn=cross_entropy, evaluate=evaluate,
                       optimizer=optax.sgd(1.0, momentum=0.9), base_lr=0.1, eval_x=ex, eval_y=ey,
                       batch_size=BATCH, augment=self.augment, **self.train(tx, ty, seed))


@pytest.fixture
def workloads(monkeypatch):
    """Name -> workload: the registry finds these first (in planning and in the backends)."""
    table: dict[str, Any] = {}
    real = registry.get
    monkeypatch.setattr(registry, "get", lambda name: table[name] if name in table else real(name))
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield table
    torch.use_deterministic_algorithms(deterministic)  # the backend turned it on for the process


def _spec(workload: str, backend: str = "torch", steps: int = 12, eval_every: int = 4, **params):
    suite = {"name": "stream", "amp": "ampcert", "device": "cpu", "precisions": ["fp32"], "seeds": [3],
             "backend": backend, "train": {"steps": steps, "eval_every": eval_every},
             "workloads": [{"workload": workload, "params": params}]}
    (spec,) = expand(parse_suite(suite), "cpu")
    return spec


def _train(spec, backend=None):
    backend = backend or torch_backend
    text = io.StringIO()
    out = backend.train(spec, mllog.MLLogger(text))
    return out, text.getvalue()


def _events(log_text: str) -> list[dict[str, Any]]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log_text.splitlines() if ":::MLLOG" in line]


def _samples_counts(log_text: str) -> list[int]:
    return [e["metadata"]["samples_count"] for e in _events(log_text) if e["key"] in ("block_stop", "eval_start")]


def _logged(log_text: str, key: str) -> Any:
    (value,) = [e["value"] for e in _events(log_text) if e["key"] == key]
    return value


def in_memory(x, y, seed):
    return {"train_x": x, "train_y": y}


class SeedOrder(Sampler):
    """A batch sampler giving the backend's own index batches for a seed, one
    epoch per iteration: the DataLoader then yields what the in-memory run draws."""

    def __init__(self, n: int, seed: int):
        self.batches, self.per_epoch = loop.index_batches(n, BATCH, seed), n // BATCH

    def __iter__(self):
        for _ in range(self.per_epoch):
            yield next(self.batches).tolist()

    def __len__(self):
        return self.per_epoch


def loader_in_index_order(x, y, seed):
    return {"train_x": None, "train_y": None,
            "train_data": DataLoader(TensorDataset(x, y), batch_sampler=SeedOrder(len(x), seed))}


# --------------------------------------------------------------------------- torch


def test_a_dataloader_with_the_same_batches_trains_the_same_run(workloads):
    steps: dict[str, list[int]] = {"memory": [], "loader": []}

    def recording(kind):
        def augment(x, y, step):
            steps[kind].append(step)
            return _shift(x, y, step)
        return augment

    workloads["mem"] = Tiny(in_memory, augment=recording("memory"))
    workloads["dl"] = Tiny(loader_in_index_order, augment=recording("loader"))
    memory, memory_log = _train(_spec("mem"))
    loader, loader_log = _train(_spec("dl"))
    assert loader.loss == memory.loss and len(loader.loss) == 12  # two epochs of the loader
    assert loader.weights_sha256 == memory.weights_sha256
    assert [(e.step, e.samples, e.value) for e in loader.evals] == [(e.step, e.samples, e.value)
                                                                     for e in memory.evals]
    assert loader.train_samples == memory.train_samples == 12 * BATCH
    assert _samples_counts(loader_log) == _samples_counts(memory_log)
    assert loader.flops_per_step == memory.flops_per_step and loader.flops_per_step  # counted on the first batch
    assert loader.lowest_precision == memory.lowest_precision  # the probe watched step 1
    assert steps["loader"] == steps["memory"] == list(range(1, 13))  # augment applied to every batch
    assert _logged(loader_log, "train_samples") == _logged(memory_log, "train_samples") == N  # len(loader.dataset)


def test_waiting_for_a_slow_loader_is_data_time(workloads):
    first, delay = 0.6, 0.04

    def slow(x, y, seed):
        def epoch_batches(epoch):  # the callable form: epoch -> iterable
            for i in range(0, len(x) - BATCH + 1, BATCH):
                time.sleep(first if epoch == 0 and i == 0 else delay)
                yield x[i:i + BATCH], y[i:i + BATCH]
        return {"train_x": None, "train_y": None, "train_data": epoch_batches}

    workloads["slow"] = Tiny(slow)
    workloads["fast"] = Tiny(in_memory)
    out, _ = _train(_spec("slow", steps=8))
    fast, _ = _train(_spec("fast", steps=8))
    # Every batch's wait, the first's (drawn while building, for the FLOP count) too,
    # as training time: not as build time.
    assert out.data_time_s >= first + 7 * delay
    assert out.data_time_s <= out.phases.train_s and out.evals[0].train_time_s >= first
    assert out.phases.build_s < first
    assert out.data_share > 0.5 and fast.data_share < out.data_share


def test_a_batchs_samples_are_its_length(workloads):
    def ragged(x, y, seed):  # a list re-iterated each epoch: 16, 16, then a ragged 5
        return {"train_x": None, "train_y": None,
                "train_data": [(x[:16], y[:16]), (x[16:32].numpy(), y[16:32].numpy()), (x[32:37], y[32:37])]}

    workloads["ragged"] = Tiny(ragged, flops=1e6)  # FLOPs given: nothing drawn while building
    out, log_text = _train(_spec("ragged", steps=7, eval_every=7))
    assert out.train_samples == 16 + 16 + 5 + 16 + 16 + 5 + 16
    assert out.evals[-1].samples == out.train_samples
    assert _samples_counts(log_text) == [out.train_samples, out.train_samples]
    assert out.samples_per_s == pytest.approx(out.train_samples / out.phases.train_s)
    assert _logged(log_text, "train_samples") is None  # a list does not say its data set's size


def _empty(x, y, seed):
    return {"train_x": None, "train_y": None, "train_data": []}


def _not_pairs(x, y, seed):
    return {"train_x": None, "train_y": None, "train_data": [{"x": x[:16], "y": y[:16]}]}


def _triples(x, y, seed):
    return {"train_x": None, "train_y": None, "train_data": [(x[:16], y[:16], y[:16])]}


def _mismatched(x, y, seed):
    return {"train_x": None, "train_y": None, "train_data": [(x[:16], y[:15])]}


def _nothing(x, y, seed):
    return {"train_x": None, "train_y": None}


def _both(x, y, seed):
    return {"train_x": x, "train_y": y, "train_data": [(x[:16], y[:16])]}


def _one_shot(x, y, seed):
    return {"train_x": None, "train_y": None, "train_data": iter([(x[:16], y[:16]), (x[16:32], y[16:32])])}


def _dries_up(x, y, seed):
    return {"train_x": None, "train_y": None,
            "train_data": lambda epoch: [(x[:16], y[:16]), (x[16:32], y[16:32])] if epoch == 0 else []}


def _not_iterable(x, y, seed):
    return {"train_x": None, "train_y": None, "train_data": 42}


def _returns_none(x, y, seed):
    return {"train_x": None, "train_y": None, "train_data": lambda epoch: None}


@pytest.mark.parametrize("train, reason", [
    (_empty, "train_data yielded no batches"),
    (_not_pairs, "train_data: batch 1 (dict) is not an (x, y) pair"),
    (_triples, "train_data: batch 1 (a tuple of 3) is not an (x, y) pair"),
    (_mismatched, "train_data: batch 1 has 16 inputs but 15 labels"),
    (_nothing, "the workload's task has no training data: give train_x and train_y (in memory) "
               "or train_data (streamed batches)"),
    (_both, "the workload's task gives train_x, train_y and train_data: give either train_x and train_y "
            "(in memory) or train_data (streamed batches)"),
    (_one_shot, "train_data is a one-shot iterator and ran out after 2 batches; give a re-iterable "
                "(a DataLoader) or a callable epoch -> iterable of batches"),
    (_dries_up, "train_data yielded no batches in epoch 1 (after 2 in the epochs before)"),
    (_not_iterable, "train_data (int) is not an iterable of (x, y) batches"),
    (_returns_none, "train_data(0) returned NoneType, not an iterable of (x, y) batches"),
])
def test_a_task_without_batches_to_give_fails_with_one_line(workloads, train, reason):
    workloads["bad"] = Tiny(train)
    with pytest.raises(RunFailed) as info:
        _train(_spec("bad", steps=4, eval_every=4))
    assert str(info.value) == reason


def test_a_dataloader_with_workers_in_a_daemonic_process_fails_with_one_line(workloads, monkeypatch):
    """`ampcert run` trains each run in a daemonic process, which may not start a DataLoader's workers."""
    import multiprocessing

    def with_workers(x, y, seed):
        return {"train_x": None, "train_y": None,
                "train_data": lambda epoch: DataLoader(TensorDataset(x, y), batch_size=BATCH, num_workers=2)}

    workloads["workers"] = Tiny(with_workers)
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True)
    with pytest.raises(RunFailed) as info:
        _train(_spec("workers", steps=4, eval_every=4))
    assert str(info.value) == ("train_data: a DataLoader with num_workers=2 cannot start its worker processes "
                               "in this run's process (a daemonic one); use num_workers=0")


def test_the_worker_records_the_reason(workloads, tmp_path):
    from ampcert.results import FailureKind
    from ampcert.runner.worker import execute

    workloads["empty"] = Tiny(_empty)
    result = execute(_spec("empty", steps=4, eval_every=4), tmp_path)
    assert (result.status, result.failure, result.reason) == ("failed", FailureKind.ERROR,
                                                              "train_data yielded no batches")


# --------------------------------------------------------------------------- JAX


def test_jax_streams_the_same_batches_as_in_memory(workloads):
    pytest.importorskip("jax")
    from ampcert.backends import jax_backend

    def index_order(x, y, seed):  # the backend's own index batches, as a callable epoch -> list of numpy pairs
        batches = loop.index_batches(len(x), BATCH, seed)
        return {"train_x": None, "train_y": None,
                "train_data": lambda epoch: [(x[i], y[i]) for i in (next(batches) for _ in range(len(x) // BATCH))]}

    workloads["jmem"] = Tiny(in_memory, augment=_shift)
    workloads["jstream"] = Tiny(index_order, augment=_shift)
    memory, memory_log = _train(_spec("jmem", backend="jax"), jax_backend)
    streamed, streamed_log = _train(_spec("jstream", backend="jax"), jax_backend)
    assert streamed.loss == memory.loss and len(streamed.loss) == 12
    assert streamed.weights_sha256 == memory.weights_sha256
    assert streamed.train_samples == memory.train_samples == 12 * BATCH
    assert _samples_counts(streamed_log) == _samples_counts(memory_log)
    assert streamed.lowest_precision == memory.lowest_precision


def test_jax_fails_on_an_empty_stream(workloads):
    pytest.importorskip("jax")
    from ampcert.backends import jax_backend

    workloads["jempty"] = Tiny(_empty)
    with pytest.raises(RunFailed, match="^train_data yielded no batches$"):
        _train(_spec("jempty", backend="jax", steps=4, eval_every=4), jax_backend)


# --------------------------------------------------------------------------- the example package


@pytest.fixture
def example(monkeypatch, tmp_path):
    """The example package importable, and a shard folder written for it."""
    monkeypatch.syspath_prepend(str(EXAMPLE_SRC))
    from streaming_workload import shards

    folder = shards.write_shards(tmp_path / "shards", examples=1000, shard_size=300, dim=8, classes=3,
                                 eval_examples=200)
    yield shards, folder
    for name in [m for m in sys.modules if m == "streaming_workload" or m.startswith("streaming_workload.")]:
        del sys.modules[name]


def test_the_shard_reader_is_bounded_fixed_and_reshuffles(example):
    shards, folder = example
    epoch0 = list(shards.iter_batches(folder, 64, seed=1, epoch=0))
    assert len(epoch0) == 1000 // 64 and all(len(x) == len(y) == 64 for x, y in epoch0)  # the tail dropped
    again = list(shards.iter_batches(folder, 64, seed=1, epoch=0))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(epoch0, again, strict=True))
    epoch1 = list(shards.iter_batches(folder, 64, seed=1, epoch=1))
    assert not np.array_equal(epoch0[0][0], epoch1[0][0])
    # Every example at most once an epoch: rows of x are distinct Gaussian draws.
    rows = np.concatenate([x for x, _ in epoch0])
    assert len(np.unique(rows, axis=0)) == len(rows)
    # Two workers split the shards: no example read twice, each a training example,
    # and as many batches as one reader less the two ragged tails.
    split = [x for w in (0, 1) for x, _ in shards.iter_batches(folder, 64, 1, 0, worker=w, workers=2)]
    seen = [r.tobytes() for x in split for r in x]
    train_rows = {r.tobytes() for s in range(4) for r in np.load(folder / f"train-{s:05d}-x.npy")}
    assert len(seen) == len(set(seen)) and set(seen) <= train_rows
    assert len(epoch0) - 2 <= len(split) <= len(epoch0)


def test_the_example_trains_from_shards_in_torch(example, workloads):
    _, folder = example
    spec = _spec("streaming_workload:WORKLOAD", steps=45, eval_every=15, data_dir=str(folder), batch_size=32)
    out, _ = _train(spec)
    assert out.evals[-1].value > 0.8 and out.evals[-1].value > out.evals[0].value - 0.05
    assert out.train_samples == 45 * 32  # 31 batches an epoch: the loader was re-made for epoch 1
    assert out.data_info == {"source": str(folder.resolve()), "train_examples": 1000, "shards": 4,
                             "eval_examples": 200, "streamed": True}
    assert out.data_time_s > 0 and out.flops_per_step


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX imported by another test: the workers run numpy
def test_the_examples_loader_workers_split_the_shards(example):
    _, folder = example
    from streaming_workload import torch_data

    alone = [x for x, _ in torch_data.loader(str(folder), 64, 1, 0, workers=0)]
    with_workers = [x for x, _ in torch_data.loader(str(folder), 64, 1, 0, workers=2)]
    assert all(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in alone)
    seen = [r.numpy().tobytes() for x in with_workers for r in x]
    assert len(seen) == len(set(seen))  # no example read twice
    assert abs(len(with_workers) - len(alone)) <= 1


def test_the_example_trains_from_shards_in_jax(example, workloads):
    pytest.importorskip("jax")
    from ampcert.backends import jax_backend

    _, folder = example
    spec = _spec("streaming_workload:WORKLOAD", backend="jax", steps=45, eval_every=15, data_dir=str(folder),
                 batch_size=32)
    out, _ = _train(spec, jax_backend)
    assert out.evals[-1].value > 0.8
    assert out.train_samples == 45 * 32 and out.data_info["streamed"] is True


def test_the_example_refuses_a_folder_without_shards_at_planning(example, tmp_path):
    with pytest.raises(UserError, match=r"data: .*nowhere: not a folder"):
        _spec("streaming_workload:WORKLOAD", data_dir=str(tmp_path / "nowhere"))
