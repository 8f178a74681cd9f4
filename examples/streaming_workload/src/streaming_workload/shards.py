"""Shard files on disk, written and read a shard at a time (numpy only, no framework).

A data folder holds the training set as shards, ``train-00000-x.npy`` (float32
inputs, one row an example) beside ``train-00000-y.npy`` (int64 labels), a
small evaluation set (``eval-x.npy``, ``eval-y.npy``) and ``meta.json``
(sizes, shard names). :func:`write_shards` makes such a folder from synthetic
data (a fixed random "teacher" labels Gaussian inputs), one shard in memory
at a time; your own converter (images, token files) would write the same
layout. :func:`iter_batches` reads it back for one epoch, again one shard at
a time, so memory holds a shard and a batch, however large the folder.

The order is the workload's to fix: for an epoch, the shards are visited in
a permutation drawn from ``(seed, epoch)`` and each shard's examples in
another, so a seed's run sees the same batches on every rerun, a new epoch
reshuffles, and torch (through a DataLoader) and JAX read the same batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

META = "meta.json"
TEACHER_SEED = 1234  # the data is fixed: it does not move with a run's seed


class ShardError(ValueError):
    """The folder is not a shard folder (missing, no shards, a bad meta.json)."""


def write_shards(folder: str | Path, *, examples: int = 4096, shard_size: int = 512, dim: int = 16,
                 classes: int = 4, eval_examples: int = 512) -> Path:
    """Write a synthetic shard folder: Gaussian inputs labelled by a fixed
    random linear teacher (``argmax(x @ W)``), ``examples`` of them in shards
    of ``shard_size``. Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(TEACHER_SEED)
    teacher = gen.standard_normal((dim, classes)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = gen.standard_normal((n, dim)).astype(np.float32)
        return x, (x @ teacher).argmax(axis=1).astype(np.int64)

    shards = []
    for i, start in enumerate(range(0, examples, shard_size)):
        x, y = draw(min(shard_size, examples - start))
        name = f"train-{i:05d}"
        np.save(folder / f"{name}-x.npy", x)
        np.save(folder / f"{name}-y.npy", y)
        shards.append({"name": name, "examples": len(x)})
    ex, ey = draw(eval_examples)
    np.save(folder / "eval-x.npy", ex)
    np.save(folder / "eval-y.npy", ey)
    meta = {"dim": dim, "classes": classes, "examples": examples, "eval_examples": eval_examples,
            "shards": shards}
    (folder / META).write_text(json.dumps(meta, indent=1) + "\n")
    return folder


def read_meta(folder: str | Path) -> dict:
    """The folder's meta.json, checked against the files beside it; raises
    ShardError with a one-line reason."""
    folder = Path(folder)
    path = folder / META
    if not folder.is_dir():
        raise ShardError(f"{folder}: not a folder (write one with `python -m streaming_workload write {folder}`)")
    try:
        meta = json.loads(path.read_text())
        shards, dim, classes = meta["shards"], int(meta["dim"]), int(meta["classes"])
    except FileNotFoundError:
        raise ShardError(f"{path}: missing: not a shard folder") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(f"{path}: not a shard folder's meta.json ({type(exc).__name__}: {exc})") from None
    if not shards:
        raise ShardError(f"{path}: lists no training shards")
    for name in [f"{s['name']}-{part}.npy" for s in shards for part in "xy"] + ["eval-x.npy", "eval-y.npy"]:
        if not (folder / name).is_file():
            raise ShardError(f"{folder / name}: missing (meta.json lists it)")
    if dim < 1 or classes < 2:
        raise ShardError(f"{path}: dim {dim} and classes {classes} make no classification task")
    return meta


def load_eval(folder: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The evaluation set (small: it stays in memory)."""
    folder = Path(folder)
    return np.load(folder / "eval-x.npy"), np.load(folder / "eval-y.npy")


def epoch_order(meta: dict, seed: int, epoch: int) -> list[str]:
    """The epoch's shard order, from (seed, epoch) alone."""
    names = [s["name"] for s in meta["shards"]]
    return [names[i] for i in np.random.default_rng([seed, epoch]).permutation(len(names))]


def iter_batches(folder: str | Path, batch_size: int, seed: int, epoch: int,
                 worker: int = 0, workers: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of ``(x, y)`` batches of ``batch_size``, reading one shard at
    a time. A batch may span two shards; the ragged tail of the epoch (fewer
    than ``batch_size`` examples left) is dropped, so every batch is full (a
    JAX step compiles once). ``worker`` of ``workers`` reads every
    ``workers``-th shard of the epoch's order, for a DataLoader's workers."""
    folder = Path(folder)
    meta = read_meta(folder)
    shard_index = {s["name"]: i for i, s in enumerate(meta["shards"])}
    carry_x: list[np.ndarray] = []
    carry_y: list[np.ndarray] = []
    held = 0
    for name in epoch_order(meta, seed, epoch)[worker::workers]:
        x, y = np.load(folder / f"{name}-x.npy"), np.load(folder / f"{name}-y.npy")
        # The shard's own order, from (seed, epoch, shard): the same whichever worker reads it.
        perm = np.random.default_rng([seed, epoch, shard_index[name]]).permutation(len(x))
        x, y = x[perm], y[perm]
        start = 0
        while start < len(x):
            take = min(batch_size - held, len(x) - start)
            carry_x.append(x[start:start + take])
            carry_y.append(y[start:start + take])
            held += take
            start += take
            if held == batch_size:
                yield np.concatenate(carry_x), np.concatenate(carry_y)
                carry_x, carry_y, held = [], [], 0
