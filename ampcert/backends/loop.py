"""Bookkeeping shared by the training loops (torch and JAX), framework-free.

The backends differ in how they step a model; which examples they train on
and in what order, what they log, when a run has reached its target, and how
the measured fields of a RunResult are finished must not differ, or the two
frameworks' results stop being comparable.
"""

from __future__ import annotations

import random
import resource
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ampcert import mllog
from ampcert.spec import RunSpec
from ampcert.workloads import rng


class RunFailed(Exception):
    """The run cannot go on (e.g. non-finite loss); the message is the reason."""


def seed_host(seed: int) -> dict[str, Any]:
    """Seed python's and numpy's global generators with the run's seed.

    The built-in workloads draw nothing from them (:mod:`ampcert.workloads.rng`
    names every stream); this is for a user's workload that does. Returns
    what was set, for the run result."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    return {"seed": seed}


def index_batches(n: int, batch_size: int, seed: int) -> Iterator[np.ndarray]:
    """Index batches (int64 arrays) in a fixed order for a seed, from
    ``rng.stream(seed, "batches")``: the same for every precision and for
    both backends, so parity compares like with like and a torch and a JAX
    run of one seed see the same examples in the same order. Reshuffles each
    epoch and drops the ragged tail, so every step sees a full batch."""
    gen = rng.stream(seed, "batches")
    per_epoch = max(n // batch_size, 1)
    while True:
        order = gen.permutation(n)
        for i in range(per_epoch):
            yield order[i * batch_size:(i + 1) * batch_size]


def step_time_stats(seconds: list[float], method: str) -> dict[str, Any] | None:
    if not seconds:
        return None
    ms = np.asarray(seconds) * 1e3
    return {
        "n": len(ms), "mean_ms": float(ms.mean()), "std_ms": float(ms.std()),
        "p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)), "min_ms": float(ms.min()), "max_ms": float(ms.max()),
        "method": method,
    }


def step_times_ms(seconds: list[float]) -> list[float] | None:
    """Per-step durations in ms rounded to 1 us: compact, and finer than the clock's noise."""
    return [round(s * 1e3, 3) for s in seconds] or None


def log_run_config(log: mllog.MLLogger, spec: RunSpec, batch_size: int, n_train: int, n_eval: int,
                   policy_name: str | None, extra: Iterable[tuple[str, Any]] = ()) -> None:
    """The MLLOG events between init_start and init_stop, then init_stop."""
    budget = spec.train
    for key, value in [
        (mllog.SUBMISSION_BENCHMARK, spec.label), (mllog.SEED, spec.seed),
        (mllog.GLOBAL_BATCH_SIZE, batch_size), (mllog.PRECISION, spec.precision),
        (mllog.AMP_IMPL, spec.amp), (mllog.AMP_POLICY, policy_name),
        (mllog.TRAIN_SAMPLES, n_train), (mllog.EVAL_SAMPLES, n_eval),
        ("max_steps", budget.step_limit), ("target", budget.target), *extra,
    ]:
        log.event(key, value)
    log.end(mllog.INIT_STOP)


def target_hit(value: float, target: float | None, higher_is_better: bool) -> bool:
    if target is None:
        return False
    return value >= target if higher_is_better else value <= target


def stop_telemetry(out: dict[str, Any], tel, log: mllog.MLLogger, train_samples: int) -> None:
    """Stop the sampler into ``out`` (summary and series) and log the training energy."""
    out["telemetry"] = tel.stop(train_samples=train_samples)
    out["telemetry_series"] = tel
    energy = out["telemetry"]["energy"]
    log.event(mllog.ENERGY_J, energy["train_j"], {"phase": "train", "scope": energy["scope"],
                                                  "method": energy["method"] or energy["reason"]})


def finish(out: dict[str, Any], spec: RunSpec, reached_at: dict[str, Any] | None) -> None:
    """The fields every backend derives the same way: peak FLOP/s and MFU, and the target outcome."""
    if spec.peak_flops:
        out["peak_flops"] = {"value": spec.peak_flops, "unit": "FLOP/s", "method": spec.peak_source}
        if out["achieved_flops"]:
            out["mfu"] = out["achieved_flops"] / spec.peak_flops
    if spec.train.target is not None:
        out["target_reached"] = reached_at is not None
        out.update(reached_at or {})


def host_peak_memory() -> dict[str, Any]:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    return {"value": float(kib * scale), "unit": "bytes",
            "method": "peak RSS of the worker process (getrusage ru_maxrss; includes the framework itself)"}
