"""Bookkeeping shared by the training loops (torch and JAX), framework-free.

The backends differ in how they step a model; what they log, when a run has
reached its target, and how the measured fields of a RunResult are finished
must not differ, or the two frameworks' results stop being comparable.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable
from typing import Any

from ampcert import mllog
from ampcert.spec import RunSpec


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
