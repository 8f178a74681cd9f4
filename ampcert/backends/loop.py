"""Bookkeeping shared by the training loops (torch and JAX), framework-free.

The backends differ in how they step a model; which examples they train on
and in what order, what they log, when a run has reached its target, and how
the measured fields of a RunResult are finished must not differ, or the two
frameworks' results stop being comparable.
"""

from __future__ import annotations

import math
import multiprocessing
import random
import resource
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ampcert import mllog
from ampcert.amp.precision import Precision
from ampcert.backends.contract import (
    LossNotFinite,
    RunFailed,
    Unsupported,
)
from ampcert.results import LowestPrecision, Measured, StepTimes
from ampcert.spec import RunSpec
from ampcert.workloads import rng

if TYPE_CHECKING:
    from ampcert.telemetry import Series


def seed_host(seed: int) -> dict[str, Any]:
    """Seed python's and numpy's global generators with the run's seed.

    The built-in workloads draw nothing from them (:mod:`ampcert.workloads.rng`
    names every stream); this is for a user's workload that does. Returns
    what was set, for the run result."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    return {"seed": seed}


def host_rng_state() -> dict[str, Any]:
    """Python's and numpy's global generators, as a checkpoint keeps them (the seeded ones a
    user's workload may draw from; :func:`seed_host`)."""
    return {"python": random.getstate(), "numpy": np.random.get_state()}


def set_host_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


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


class BatchStream:
    """The (x, y) batches of a task's ``train_data`` (a streaming workload),
    one per ``next()``, epoch after epoch for as long as the loop asks.

    ``train_data`` is either re-iterable (a DataLoader, a list: iterated
    afresh each epoch) or a callable ``epoch -> iterable`` (called with 0, 1,
    ...). A one-shot iterator (a generator object) is accepted, and lasts as
    long as it yields. Each item must be an ``(x, y)`` pair with the batch on
    the first axis of both; the backend converts and moves it. Anything else
    fails the run with a one-line :class:`RunFailed`: a source that yields no
    batch (in its first epoch or a later one), an item that is not such a pair,
    a one-shot iterator that runs out before the step budget, a DataLoader
    with worker processes in a process that may not start any (a daemonic
    one, as ``ampcert run``'s run workers are)."""

    def __init__(self, train_data: Any):
        self._source = train_data
        self._iter: Iterator[Any] | None = None
        self._one_shot = False
        self.epoch = 0  # the epoch now being drawn, from 0
        self.drawn = 0  # batches drawn so far, all epochs
        self._in_epoch = 0

    def _open(self) -> Iterator[Any]:
        source = self._source
        if callable(source) and not hasattr(source, "__iter__"):
            source = source(self.epoch)
            what = f"train_data({self.epoch}) returned {type(source).__name__},"
        else:
            what = f"train_data ({type(source).__name__}) is"
        workers = getattr(source, "num_workers", 0)
        if isinstance(workers, int) and workers > 0 and multiprocessing.current_process().daemon:
            # `ampcert run` trains each run in a daemonic worker process, which may not have children.
            raise RunFailed(f"train_data: a DataLoader with num_workers={workers} cannot start its worker "
                            "processes in this run's process (a daemonic one); use num_workers=0")
        try:
            it = iter(source)
        except TypeError:
            raise RunFailed(f"{what} not an iterable of (x, y) batches") from None
        if it is source and source is self._source:  # an iterator: it cannot start over
            self._one_shot = True
        return it

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> tuple[Any, Any]:
        while True:
            if self._iter is None:
                self._iter = self._open()
            try:
                item = next(self._iter)
            except StopIteration:
                if self._in_epoch == 0:
                    raise RunFailed(
                        "train_data yielded no batches" if self.drawn == 0 else
                        f"train_data yielded no batches in epoch {self.epoch} "
                        f"(after {self.drawn} in the epochs before)") from None
                if self._one_shot:
                    raise RunFailed(
                        f"train_data is a one-shot iterator and ran out after {self.drawn} batches; give a "
                        "re-iterable (a DataLoader) or a callable epoch -> iterable of batches") from None
                self.epoch += 1
                self._iter, self._in_epoch = None, 0
                continue
            self.drawn += 1
            self._in_epoch += 1
            return self._pair(item)

    def _pair(self, item: Any) -> tuple[Any, Any]:
        n = self.drawn
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            kind = f"a {type(item).__name__} of {len(item)}" if isinstance(item, (tuple, list)) \
                else type(item).__name__
            raise RunFailed(f"train_data: batch {n} ({kind}) is not an (x, y) pair")
        x, y = item
        try:
            nx, ny = len(x), len(y)
        except TypeError:
            raise RunFailed(f"train_data: batch {n} is a pair of {type(x).__name__} and {type(y).__name__}, "
                            "not of arrays with the batch on the first axis") from None
        if nx != ny:
            raise RunFailed(f"train_data: batch {n} has {nx} inputs but {ny} labels")
        if nx == 0:
            raise RunFailed(f"train_data: batch {n} is empty")
        return x, y


def train_stream(task: Any) -> BatchStream | None:
    """Where a task's (TorchTask's or JaxTask's) training batches come from:
    None for arrays in memory (``train_x``, ``train_y``: the backend draws
    index batches), a :class:`BatchStream` for a ``train_data``. A task with
    neither, or with both, fails the run with a one-line :class:`RunFailed`."""
    data = getattr(task, "train_data", None)
    arrays = [name for name in ("train_x", "train_y") if getattr(task, name, None) is not None]
    if data is None:
        if len(arrays) < 2:
            raise RunFailed("the workload's task has no training data: give train_x and train_y (in memory) "
                            "or train_data (streamed batches)")
        return None
    if arrays:
        raise RunFailed(f"the workload's task gives {', '.join(arrays)} and train_data: give either "
                        "train_x and train_y (in memory) or train_data (streamed batches)")
    return BatchStream(data)


def stream_size(train_data: Any) -> int | None:
    """The number of training examples behind a ``train_data``, where it says
    (a DataLoader over a sized dataset); None where it does not."""
    try:
        return len(train_data.dataset)
    except (AttributeError, TypeError):
        return None


class TaskData:
    """What a framework's adapter knows of its task's training data, alike for torch and
    JAX: the batch size (a memory-sweep point sets it), the examples it holds in memory,
    and its batches: drawn by seeded index (:func:`index_batches`), or from its stream."""

    task: Any
    stream: BatchStream | None

    @property
    def batch_size(self) -> int:
        return int(self.task.batch_size)

    def set_batch_size(self, batch_size: int) -> None:
        self.task.batch_size = batch_size

    def examples_in_memory(self) -> int | None:
        return len(self.task.train_x) if self.stream is None else None

    def train_examples(self) -> int | None:
        """For MLLOG's train_samples: the examples held, or a stream's size where it has one."""
        held = self.examples_in_memory()
        return held if held is not None else stream_size(self.task.train_data)

    def indexed_batches(self, seed: int) -> Iterator[np.ndarray] | None:
        """The seeded batch indices of a task held in memory; None for a stream."""
        held = self.examples_in_memory()
        return index_batches(held, self.task.batch_size, seed) if held is not None else None

    def batches_after(self, seed: int, step: int) -> Iterator[np.ndarray]:
        """The seeded batch indices as they stand after ``step`` steps (a resumed run's); a
        stream's position is its loader's, not ampcert's, to restore."""
        from ampcert.backends.contract import Unsupported

        batches = self.indexed_batches(seed)
        if batches is None:
            raise Unsupported("resuming a run whose training data streams (train_data): its loader's "
                              "position is the loader's, not ampcert's, to restore")
        for _ in range(step):
            next(batches)
        return batches


def hold_step(fraction: float, started: float) -> None:
    """Fault injection (a suite's ``inject_slowdown``): hold the step that began at
    ``started`` (``time.perf_counter()``) for ``fraction`` of the time it took so far.

    A busy wait, not a sleep: a real slowdown is work, and a sleep of a small step's
    5% overshoots by a scheduler tick and frees the core for the other runs. On CUDA
    the caller synchronises first, so that the fraction is of the step's device time."""
    now = time.perf_counter()
    deadline = now + fraction * (now - started)
    while time.perf_counter() < deadline:
        pass


def step_time_stats(seconds: list[float], method: str) -> StepTimes | None:
    if not seconds:
        return None
    ms = np.asarray(seconds) * 1e3
    return StepTimes(
        n=len(ms), mean_ms=float(ms.mean()), std_ms=float(ms.std()),
        p50_ms=float(np.percentile(ms, 50)), p90_ms=float(np.percentile(ms, 90)),
        p99_ms=float(np.percentile(ms, 99)), min_ms=float(ms.min()), max_ms=float(ms.max()),
        method=method,
    )


def step_times_ms(seconds: list[float]) -> list[float] | None:
    """Per-step durations in ms rounded to 1 us: compact, and finer than the clock's noise."""
    return [round(s * 1e3, 3) for s in seconds] or None


def log_init_start(log: mllog.MLLogger) -> None:
    """cache_clear, then init_start: MLPerf's common rules want a cache_clear
    before init_start. What it stands for here: each run trains in a worker
    process of its own, so no framework state, compiled kernel or cached
    batch of another run is carried into it; the OS page cache is not
    dropped (the metadata says so)."""
    log.event(mllog.CACHE_CLEAR, True, {"scope": "fresh worker process per run; OS page cache not dropped"})
    log.start(mllog.INIT_START)


def log_run_config(log: mllog.MLLogger, spec: RunSpec, batch_size: int, n_train: int, n_eval: int,
                   policy_name: str | None, extra: Iterable[tuple[str, Any]] = ()) -> None:
    """The MLLOG events between init_start and init_stop, then init_stop.

    Besides ampcert's own keys, MLPerf's common disclosure: the submission
    (the suite's `submission:`; its division must come before init_stop, as
    it sets the checker's init window), the suite file's name, and the
    parallelism. ampcert trains data-parallel only, so tensor, pipeline,
    context and expert parallelism are 1; micro_batch_size is the batch one
    rank computes per step (the global batch over the world size)."""
    budget = spec.train
    assert budget is not None, "ampcert trains its own workloads only; an own job trains itself"
    sub = spec.submission
    platform = sub.platform or _platform_fallback(spec.device)
    for key, value in [
        (mllog.SUBMISSION_ORG, sub.org), (mllog.SUBMISSION_PLATFORM, platform),
        (mllog.SUBMISSION_DIVISION, sub.division), (mllog.SUBMISSION_STATUS, sub.status),
        # A spec built without planning (a test, a notebook) has no suite file.
        (mllog.CONFIG_FILENAME, spec.config_filename or f"{spec.suite}.yaml"),
        (mllog.TENSOR_PARALLELISM, 1), (mllog.PIPELINE_PARALLELISM, 1),
        (mllog.CONTEXT_PARALLELISM, 1), (mllog.EXPERT_PARALLELISM, 1),
        (mllog.MICRO_BATCH_SIZE, max(batch_size // spec.world_size, 1)),
    ]:
        log.event(key, value)
    for key, value in [
        (mllog.SUBMISSION_BENCHMARK, spec.label), (mllog.SEED, spec.seed),
        (mllog.GLOBAL_BATCH_SIZE, batch_size), (mllog.PRECISION, spec.precision),
        (mllog.AMP_IMPL, spec.amp), (mllog.AMP_POLICY, policy_name),
        (mllog.TRAIN_SAMPLES, n_train), (mllog.EVAL_SAMPLES, n_eval),
        ("max_steps", budget.step_limit), ("target", budget.target), *extra,
    ]:
        log.event(key, value)
    log.end(mllog.INIT_STOP)


def _platform_fallback(device: str) -> str:
    # Planning fills the platform; a RunSpec made elsewhere still logs a non-empty one.
    from ampcert.envinfo import cpu_info

    return str(cpu_info()["model"]) or f"unknown {device}"


# MLPerf's common rules read a block's and an evaluation's position from
# samples_count (or epochs). ampcert trains by steps over an endless shuffled
# stream, so everything is in "epoch" 0 and samples_count = steps x global batch.
def block_metadata(first_step: int, step_count: int, samples_count: int) -> dict[str, Any]:
    return {"first_step": first_step, "step_count": step_count, "samples_count": samples_count,
            "first_epoch_num": 0, "epoch_count": 1}


def eval_metadata(step: int, samples_count: int) -> dict[str, Any]:
    return {"step": step, "samples_count": samples_count, "epoch_num": 0}


def log_eval_value(log: mllog.MLLogger, metric: str, value: float, step: int, samples: int) -> None:
    """The evaluation's value: ``eval_<metric>`` as before, and, for a metric
    other than accuracy, eval_accuracy too (MLPerf's common rules want at
    least one) with the metric's name in its metadata, so no reader mistakes
    bits per byte for an accuracy."""
    meta = {**eval_metadata(step, samples), "samples": samples}
    if metric == "accuracy":
        log.event(mllog.EVAL_ACCURACY, value, meta)
        return
    log.event(f"eval_{metric}", value, meta)
    log.event(mllog.EVAL_ACCURACY, value, {**meta, "metric": metric})


def log_lowest_precision(log: mllog.MLLogger, disclosed: dict[str, dict[str, Any]]) -> LowestPrecision:
    """Log MLPerf's three lowest_numerical_precision_in_* events from what the
    backend measured ({"linear"|"attn"|"comm": {"value": ..., <metadata>}})
    and return them for the run result."""
    keys = {"linear": mllog.LOWEST_PRECISION_LINEAR, "attn": mllog.LOWEST_PRECISION_ATTN,
            "comm": mllog.LOWEST_PRECISION_COMM}
    for part, key in keys.items():
        meta = {k: v for k, v in disclosed[part].items() if k != "value"}
        log.event(key, disclosed[part]["value"], meta)
    return LowestPrecision(linear=disclosed["linear"]["value"], attn=disclosed["attn"]["value"],
                           comm=disclosed["comm"]["value"],
                           detail={p: {k: v for k, v in d.items() if k != "value"} for p, d in disclosed.items()})


def target_hit(value: float, target: float | None, higher_is_better: bool) -> bool:
    """Whether ``value`` meets ``target``; a non-finite value never does (an
    infinite accuracy is a diverged run, not a good one)."""
    if target is None or not math.isfinite(value):
        return False
    return value >= target if higher_is_better else value <= target


def stop_telemetry(tel, log: mllog.MLLogger, train_samples: int) -> tuple[dict[str, Any], Series | None]:
    """Stop the sampler and log the training energy. Returns its summary
    (RunResult.telemetry) and its samples (None where it sampled nothing)."""
    summary = tel.stop(train_samples=train_samples)
    energy = summary["energy"]
    log.event(mllog.ENERGY_J, energy["train_j"], {"phase": "train", "scope": energy["scope"],
                                                  "method": energy["method"] or energy["reason"]})
    return summary, tel.series()


@dataclass(frozen=True)
class Reached:
    """When a run first met its target: MLPerf's time-to-train."""

    steps: int
    samples: int
    time_s: float  # run_start to that evaluation, evaluations included


def peak_flops(spec: RunSpec, devices: int = 1) -> Measured | None:
    """The peak the run's MFU is measured against (``devices`` GPUs' worth under torchrun)."""
    if not spec.peak_flops:
        return None
    if devices == 1:
        return Measured(value=spec.peak_flops, unit="FLOP/s", method=spec.peak_source)
    return Measured(value=spec.peak_flops * devices, unit="FLOP/s", method=f"{spec.peak_source} x {devices} GPUs")


def mfu(achieved_flops: float | None, peak: Measured | None) -> float | None:
    if peak is None or not achieved_flops:
        return None
    return achieved_flops / peak.value


def target_reached(spec: RunSpec, reached: Reached | None) -> bool | None:
    """Whether the run met its target; None for a run without one."""
    return None if spec.target is None else reached is not None


def host_peak_memory(before_eval: bool = False) -> Measured:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024
    method = "peak RSS of the worker process (getrusage ru_maxrss; includes the framework itself)"
    if before_eval:  # a memory sweep's: a high-water mark cannot be reset, so the first step is in it
        method = ("peak RSS of the worker process over building and training, before any evaluation "
                  "(getrusage ru_maxrss: includes the framework, the data set and the first step)")
    return Measured(value=float(kib * scale), unit="bytes", method=method)


def sweep_problem(batch: int, n_train: int | None) -> str | None:
    """Why a memory sweep cannot train at ``batch`` out of ``n_train`` examples in memory
    (None: a streamed data set, whose batches are its loader's); None where it can. Planning
    refuses the suite with it, and a run that gets this far fails with it."""
    if n_train is None:
        return ("a memory sweep sets the batch size, and this workload streams its training batches from "
                "its own loader (train_data): sweep it with its own batch parameter instead")
    if batch > n_train:
        return (f"memory sweep batch {batch} is more than the {n_train} training examples this workload "
                "holds: sweep smaller batches")
    return None


def sweep_batch(spec: RunSpec, n_train: int | None) -> int:
    """The batch a memory-sweep run trains at: never silently fewer than asked (:func:`sweep_problem`)."""
    assert spec.sweep.batch_size is not None
    problem = sweep_problem(spec.sweep.batch_size, n_train)
    if problem is not None:
        raise Unsupported(f"{spec.workload}: {problem}")
    return spec.sweep.batch_size


# --------------------------------------------------------------------------- loss scaling


class NoLossScaling:
    """The loss scaling of a run that does not scale (fp32, bf16, and fp16
    with ``loss_scaling: false``), as the loop sees it: a non-finite loss ends
    the run at once, nothing is logged, and nothing recorded (the result's
    ``loss_scale`` and ``skipped_steps`` are None). Each backend's no-op
    scaler derives from it and passes the loss and the step through."""

    def check_window(self, finite: Sequence[bool], step: int, precision: Precision) -> None:
        """Raise :class:`LossNotFinite` if the window of losses ending at ``step`` may not go on."""
        if not all(finite):
            bad = step - len(finite) + 1 + list(finite).index(False)
            raise LossNotFinite(f"non-finite loss at step {bad} ({precision}, no loss scaling)")

    def log_eval(self, log: mllog.MLLogger, step: int) -> None:
        """The loss-scaling events of an evaluation (none)."""

    def recorded(self) -> tuple[list[float] | None, list[int] | None]:
        """(scale after each step, skipped steps): RunResult's loss_scale and skipped_steps."""
        return None, None


class DynamicLossScaling(NoLossScaling):
    """Dynamic loss scaling: a step whose gradients overflow is skipped and
    the scale backs off, so some non-finite losses are expected; only a
    window without one finite loss ends the run. Each evaluation logs the
    scale and the count of skipped steps. Subclasses say what they recorded."""

    def trajectory(self) -> tuple[list[float], list[int]]:
        """The scale after each step so far, and the (1-based) steps it skipped."""
        raise NotImplementedError

    def check_window(self, finite: Sequence[bool], step: int, precision: Precision) -> None:
        if not any(finite):
            raise LossNotFinite(f"loss non-finite for all {len(finite)} steps up to step {step} despite loss scaling")

    def log_eval(self, log: mllog.MLLogger, step: int) -> None:
        scales, skipped = self.trajectory()
        log.event(mllog.LOSS_SCALE, scales[-1] if scales else None, {"step": step})
        log.event(mllog.SKIPPED_STEPS, len(skipped), {"step": step})

    def recorded(self) -> tuple[list[float] | None, list[int] | None]:
        return self.trajectory()
