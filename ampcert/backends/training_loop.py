"""The one training loop, for every framework: windows of steps, evaluation and the
target, MLLOG's phases and telemetry's, filling a :class:`Tally`.

A framework comes in as an adapter (:class:`Framework`: draw a batch, take a step,
read a window's losses, evaluate, peak memory, the weights' digest) and each feature
as a plug-in (:class:`Feature`, from :mod:`ampcert.backends.features`). The loop
names neither: a feature such as the memory sweep, FP8, a compile scope, torchrun or
the precision probe touches its own module and the registry, never this file.

The shape of one run::

    features.started          (before anything: a smaller device; which devices to sample)
    telemetry started         (on the framework's devices; stopped however the run ends)
    INIT_START, framework.build (calling features.built once the workload exists, and
                               features.model_ready before the optimizer sees the model)
    RUN_START
    for each window of eval_every steps:
        BLOCK_START, telemetry phase "train"
        for each step: clock.start, draw a batch (data time), features.before_step,
                       framework.step, features.after_step, clock.stop
        framework.sync, BLOCK_STOP; the window's losses read once, the loss scaling
        judges them; features.after_window
        telemetry phase "eval", EVAL_START, framework.evaluate, EVAL_STOP
        the decision (fail: not finite; stop: the target met; continue), features.decide
    telemetry stopped, RUN_STOP; framework.finish; features.contribute(tally);
    tally.outcome()

Compare optax: a transform is an (init, update) pair and ``chain`` composes them;
the update loop never names one.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ampcert import mllog
from ampcert.backends import loop
from ampcert.backends.contract import LossNotFinite, PhaseTimes, TrainOutcome
from ampcert.results import (
    CompileStats,
    EvalPoint,
    Fp8Stats,
    LowestPrecision,
    Measured,
    TrainingState,
)
from ampcert.spec import RunSpec
from ampcert.telemetry import Series
from ampcert.workloads.base import Workload


class Decision(enum.Enum):
    """What a run does after an evaluation."""

    CONTINUE = "continue"
    STOP = "stop"  # the target was met (or, under torchrun, rank 0 says so)
    FAIL = "fail"  # the metric is not finite


@dataclass
class Tally:
    """What a run measured, filled by the loop, the framework and the features; it
    builds the :class:`TrainOutcome` (:meth:`outcome`), the same way for every framework."""

    batch_size: int = 0
    steps: int = 0
    losses: list[float] = field(default_factory=list)
    evals: list[EvalPoint] = field(default_factory=list)
    reached: loop.Reached | None = None
    scaling: loop.NoLossScaling = field(default_factory=loop.NoLossScaling)
    build_s: float = 0.0
    # A first step timed apart from training (JAX's: traced, compiled and run): it counts
    # as building, and in the data share's denominator; None where every step is timed.
    compile_s: float | None = None
    train_s: float = 0.0
    eval_s: float = 0.0
    data_s: float = 0.0
    durations: list[float] = field(default_factory=list)
    timing: str = ""
    flops_per_step: float | None = None
    peak: Measured | None = None
    telemetry: dict[str, Any] = field(default_factory=dict)
    series: Series | None = None
    amp_policy: dict[str, Any] = field(default_factory=dict)
    determinism: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    peak_memory: Measured | None = None
    weights_sha256: str = ""
    data_info: dict[str, Any] = field(default_factory=dict)
    lowest_precision: LowestPrecision | None = None
    compile_stats: CompileStats | None = None
    fp8: Fp8Stats | None = None
    training_state: TrainingState | None = None
    # Each step's batch length where batches are streamed (train_data) and may differ;
    # None: every step trained batch_size.
    step_samples: list[int] | None = None
    trained: int = 0  # samples trained so far

    def step_times_ms(self) -> list[float] | None:
        return loop.step_times_ms(self.durations)

    def outcome(self, spec: RunSpec, workload: Workload) -> TrainOutcome:
        """The run's :class:`TrainOutcome`: the losses (a non-finite one as None), the
        final metric, the target fields (from ``reached``), the loss scale and skipped
        steps, the step-time statistics of ``durations`` (one per timed step, timed by
        ``timing``), throughput and achieved FLOP/s over the timed steps, MFU against
        ``peak``, the data share and the phase times; the rest as measured. The timed
        steps are the last ``len(durations)``."""
        assert self.peak_memory is not None, "the framework measures the peak memory"
        timed_steps = len(self.durations)
        if self.step_samples is None:
            train_samples, timed_samples = self.steps * self.batch_size, timed_steps * self.batch_size
        else:
            train_samples = sum(self.step_samples)
            timed_samples = sum(self.step_samples[len(self.step_samples) - timed_steps:]) if timed_steps else 0
        train_s, reached = self.train_s, self.reached
        achieved = self.flops_per_step * timed_steps / train_s if self.flops_per_step and train_s > 0 else None
        loss_scale, skipped = self.scaling.recorded()
        return TrainOutcome(
            steps=self.steps, train_samples=train_samples,
            metric=workload.metric, higher_is_better=workload.higher_is_better,
            final_metric=self.evals[-1].value, target=spec.target,
            target_reached=loop.target_reached(spec, reached),
            steps_to_target=reached.steps if reached else None,
            samples_to_target=reached.samples if reached else None,
            time_to_target_s=reached.time_s if reached else None,
            samples_per_s=timed_samples / train_s if train_s > 0 else None,
            flops_per_step=self.flops_per_step, achieved_flops=achieved, mfu=loop.mfu(achieved, self.peak),
            peak_flops=self.peak,
            data_time_s=self.data_s,
            data_share=self.data_s / (train_s + (self.compile_s or 0.0)) if train_s > 0 else None,
            data_info=self.data_info or None,
            loss=[v if math.isfinite(v) else None for v in self.losses], evals=list(self.evals),
            step_time=loop.step_time_stats(list(self.durations), self.timing),
            step_times_ms=self.step_times_ms(),
            peak_memory=self.peak_memory, telemetry=self.telemetry, loss_scale=loss_scale, skipped_steps=skipped,
            lowest_precision=self.lowest_precision, compile_stats=self.compile_stats, fp8=self.fp8,
            training_state=self.training_state,
            accelerated=spec.accelerated, capability_note=spec.capability_note,
            amp_policy=self.amp_policy, determinism=self.determinism, weights_sha256=self.weights_sha256,
            environment=self.environment,
            phases=PhaseTimes(build_s=self.build_s + (self.compile_s or 0.0), train_s=train_s, eval_s=self.eval_s),
            telemetry_series=self.series,
        )


class Clock(Protocol):
    """How a framework times its steps (CUDA events, or perf_counter once the step is done)."""

    method: str

    def start(self) -> Any: ...

    def stop(self, token: Any, step: int, tally: Tally) -> None:
        """Record the step that began at ``token``: into ``tally.durations``, or as
        ``tally.compile_s`` where the framework times its first step apart."""

    def counts(self, step: int) -> bool:
        """Whether ``step`` is timed as training (JAX's first, compiling step is not)."""

    def window(self, wall_s: float, tally: Tally) -> float:
        """The training seconds of a window that took ``wall_s`` (the framework has
        waited for its device); pending timings are resolved into ``tally``."""


class Framework(Protocol):
    """One framework's side of a run; everything else is the loop's or a feature's."""

    clock: Clock
    scaling: loop.NoLossScaling  # the loss scaling, as the loop judges a window with it

    def start_telemetry(self, gpus: list[int | None]) -> Any:
        """The sampler of this process (:class:`ampcert.telemetry.Telemetry`), on ``gpus``
        where the run is on GPUs (None: this process's device)."""

    def build(self, run: Run) -> None:
        """Seed, build the workload, the optimizer and the precision; fill the build's
        part of ``run.tally`` (batch size, FLOPs, policy, determinism); call
        ``run.built()`` once the workload exists, before anything runs, and
        ``run.model_ready()`` before the optimizer sees the model."""

    def batch(self, step: int, run: Run) -> tuple[Any, int]:
        """The batch of ``step`` on the device, and how many samples it holds."""

    def step(self, batch: Any, step: int) -> None:
        """One training step (forward, backward, optimizer); its loss kept on the device."""

    def window_losses(self) -> list[float]:
        """The losses of the steps since the last read, read from the device (the one read of a window)."""

    def sync(self) -> None:
        """Wait for the device."""

    def evaluate(self) -> float:
        """The eval metric of the model as it stands (NaN where this process does not evaluate)."""

    def peak_memory(self, training_only: bool = False) -> Measured:
        """The run's peak memory; ``training_only``: over training alone, before any evaluation,
        as what a card must hold (a memory-sweep point's result)."""

    def forget_peak_memory(self) -> None:
        """Start the peak afresh where the device can (a sweep point leaves its warm-up out)."""

    def limit_device_memory(self, limit: int) -> None:
        """Let this process use only ``limit`` bytes of its device, as a card that small
        would (or refuse, in one line, where the framework cannot)."""

    @property
    def batch_size(self) -> int: ...

    def set_batch_size(self, batch_size: int) -> None: ...

    def examples_in_memory(self) -> int | None:
        """The training examples held in memory (None: the workload streams its batches)."""

    def finish(self, tally: Tally) -> None:
        """After the last window: the weights' digest, the environment, what is measured last."""


class Feature:
    """A plug-in of the loop; every hook does nothing unless overridden.

    Hooks run in registry order (:mod:`ampcert.backends.features`). A feature may use
    its framework's adapter (a torch feature the torch adapter's attributes) and the
    :class:`Run`; it never reaches into another feature."""

    def started(self, run: Run) -> None:
        """Before the framework builds (e.g. a smaller device for a memory-sweep point)."""

    def built(self, run: Run) -> None:
        """The workload is built (its data, model and batch size) and nothing has run yet
        (e.g. a memory-sweep point's batch size, which the FLOP count then uses)."""

    def model_ready(self, run: Run) -> None:
        """The model as it will train, before the optimizer sees its parameters
        (e.g. FP8 conversion, the DDP wrapper, the precision probe's hooks)."""

    def before_step(self, run: Run, step: int) -> None:
        """After the step's batch is drawn, before the step."""

    def after_step(self, run: Run, step: int) -> None:
        """After the step, inside its timing."""

    def after_window(self, run: Run, step: int) -> None:
        """After a window of training, before its evaluation."""

    def decide(self, run: Run, step: int, decision: Decision) -> Decision:
        """After an evaluation: the decision as this feature would have it."""
        return decision

    def contribute(self, run: Run, tally: Tally) -> None:
        """What the feature adds to the result."""


@dataclass
class Run:
    """One run as the loop, its framework and its features share it."""

    spec: RunSpec
    log: mllog.MLLogger
    workload: Workload
    framework: Framework
    features: Sequence[Feature]
    tally: Tally = field(default_factory=Tally)
    # The sampler: started by the loop on ``gpus`` (None: this process's device), unless a
    # feature set one in its ``started`` hook (a torchrun rank that samples nothing).
    telemetry: Any = None
    gpus: list[int | None] = field(default_factory=lambda: [None])
    step_started: float = 0.0  # perf_counter at the current step's start
    fp8_layers: int = 0  # layers converted to FP8 (the precision disclosure counts them)
    config: list[tuple[str, Any]] = field(default_factory=list)  # more MLLOG keys before init_stop

    def built(self) -> None:
        """The framework has built the workload (:meth:`Feature.built`)."""
        for feature in self.features:
            feature.built(self)

    def model_ready(self) -> None:
        """The framework's model is about to meet its optimizer (:meth:`Feature.model_ready`)."""
        for feature in self.features:
            feature.model_ready(self)


def train(run: Run, progress: Callable[[dict], None] | None = None) -> TrainOutcome:
    """Train ``run`` to its budget or target; its outcome. Telemetry samples the whole
    run (phases init, train, eval) and stops with it, failed or not."""
    for feature in run.features:
        feature.started(run)
    if run.telemetry is None:
        run.telemetry = run.framework.start_telemetry(run.gpus)
    try:
        return _train(run, progress or (lambda _: None))
    finally:
        run.telemetry.close()  # a failed run stops the sampler too


def _train(run: Run, progress: Callable[[dict], None]) -> TrainOutcome:
    spec, log, tel, fw, features, tally = run.spec, run.log, run.telemetry, run.framework, run.features, run.tally
    budget = spec.train
    assert budget is not None, "ampcert trains its own workloads only; an own job trains itself"
    limit = budget.step_limit
    metric, higher = run.workload.metric, run.workload.higher_is_better
    loop.log_init_start(log)
    fw.build(run)
    tally.scaling, tally.timing = fw.scaling, fw.clock.method

    log.start(mllog.RUN_START)
    run_start = time.perf_counter()
    step = 0
    while step < limit:
        window = min(budget.eval_every, limit - step)
        log.start(mllog.BLOCK_START, metadata=loop.block_metadata(step + 1, window, tally.trained))
        tel.phase("train")
        t_window = time.perf_counter()
        for _ in range(window):
            step += 1
            token = fw.clock.start()
            run.step_started = t_data = time.perf_counter()
            batch, samples = fw.batch(step, run)
            tally.trained += samples
            if tally.step_samples is not None:
                tally.step_samples.append(samples)
            tally.data_s += time.perf_counter() - t_data
            for feature in features:
                feature.before_step(run, step)
            fw.step(batch, step)
            for feature in features:
                feature.after_step(run, step)
            fw.clock.stop(token, step, tally)
        fw.sync()
        tally.train_s += fw.clock.window(time.perf_counter() - t_window, tally)
        log.end(mllog.BLOCK_STOP, metadata=loop.block_metadata(step - window + 1, window, tally.trained))
        values = fw.window_losses()
        tally.losses.extend(values)
        finite = [math.isfinite(v) for v in values]
        fw.scaling.check_window(finite, step, spec.precision)
        for feature in features:
            feature.after_window(run, step)

        tel.phase("eval")
        t_eval = time.perf_counter()
        log.start(mllog.EVAL_START, metadata=loop.eval_metadata(step, tally.trained))
        value = fw.evaluate()
        fw.sync()
        tally.eval_s += time.perf_counter() - t_eval
        samples = tally.trained
        loop.log_eval_value(log, metric, value, step, samples)
        log.end(mllog.EVAL_STOP, metadata=loop.eval_metadata(step, samples))
        tally.evals.append(EvalPoint(step=step, samples=samples, train_time_s=tally.train_s, value=value))
        fw.scaling.log_eval(log, step)

        hit = loop.target_hit(value, budget.target, higher)
        decision = Decision.FAIL if not math.isfinite(value) else Decision.STOP if hit else Decision.CONTINUE
        for feature in features:
            decision = feature.decide(run, step, decision)
        if decision is Decision.FAIL:
            raise LossNotFinite(f"eval {metric} is {value} at step {step}")
        if math.isfinite(value):  # a process that does not evaluate (a torchrun rank) reports nothing
            ok = [v for v, f in zip(values, finite, strict=True) if f]
            progress({"step": step, "limit": limit, "metric": value,
                      "loss": sum(ok) / len(ok) if ok else float("nan")})
        if decision is Decision.STOP:
            if hit:
                tally.reached = loop.Reached(steps=step, samples=samples, time_s=time.perf_counter() - run_start)
            break

    tally.steps = step
    tally.telemetry, tally.series = loop.stop_telemetry(tel, log, tally.trained)
    log.end(mllog.RUN_STOP, metadata=mllog.run_stop_metadata(budget.target, tally.reached is not None, step))
    fw.finish(tally)
    for feature in features:
        feature.contribute(run, tally)
    if tally.peak_memory is None:
        tally.peak_memory = fw.peak_memory()
    return tally.outcome(spec, run.workload)
