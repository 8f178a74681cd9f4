"""What crosses from a backend to the worker: the contract of ``backend.train``.

Every backend (:mod:`~ampcert.backends.torch_backend`,
:mod:`~ampcert.backends.jax_backend`) has one entry point::

    train(spec: RunSpec, log: MLLogger, progress: Callable[[dict], None] | None) -> TrainOutcome

A run that completes returns a :class:`TrainOutcome`: the measured fields of
its :class:`~ampcert.results.RunResult` as typed attributes, the time it spent
per phase (:class:`PhaseTimes`) and the telemetry samples to write beside the
result (a :class:`~ampcert.telemetry.Series`, plain data). A run that cannot
go on raises: a :class:`RunFailed` says why in its message, and its class
says what kind of failure it is, so nobody reads the message to decide. The
worker (:mod:`ampcert.runner.worker`) records every exception as a failed
RunResult, its ``failure`` (a :class:`~ampcert.results.FailureKind`) from the
exception's type: :class:`NonFiniteLoss` is ``NON_FINITE``,
:class:`Unsupported` ``UNSUPPORTED``, another RunFailed or any other
exception ``ERROR`` (a ``UserError``: ``BAD_INPUT``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ampcert.results import CompileStats, EvalPoint, Fp8Stats, LowestPrecision, Measured, StepTimes

if TYPE_CHECKING:
    from ampcert.telemetry import Series


class RunFailed(Exception):
    """The run cannot go on; the message is the reason, recorded as it is."""


class NonFiniteLoss(RunFailed):
    """The training loss or the evaluation metric became inf or NaN: a finding
    about the precision (fp16 without loss scaling is expected to produce one)."""


class Unsupported(RunFailed):
    """The workload, the backend and the launcher cannot run this combination
    (a workload without a JAX version, a batch that does not split over the ranks)."""


@dataclass(frozen=True)
class PhaseTimes:
    """Where a backend's time went, in seconds (the worker adds its own
    start-up and everything else to make :class:`~ampcert.results.Phases`)."""

    build_s: float  # data, model, optimizer (JAX: and the first, compiling step)
    train_s: float  # training steps, evaluation excluded
    eval_s: float


# Attributes of TrainOutcome that are not RunResult fields.
_NOT_RESULT_FIELDS = ("phases", "telemetry_series")


@dataclass(frozen=True)
class TrainOutcome:
    """A completed run as its backend measured it.

    Every attribute but ``phases`` and ``telemetry_series`` is the RunResult
    field of the same name (:meth:`result_fields`); those left at None are
    the ones a run does not measure (no target, no loss scaling, no peak
    FLOP/s for the device, ...)."""

    metric: str
    higher_is_better: bool
    steps: int
    train_samples: int
    final_metric: float
    target: float | None
    loss: list[float | None]  # per step; None where non-finite
    evals: list[EvalPoint]
    amp_policy: dict[str, Any]
    determinism: dict[str, Any]
    environment: dict[str, Any]
    peak_memory: Measured
    weights_sha256: str
    # The telemetry summary; the worker adds the name of the series file to it.
    telemetry: dict[str, Any]
    phases: PhaseTimes
    # The samples behind ``telemetry``, for runs/<id>/telemetry.csv; None where
    # this process sampled nothing (a torchrun rank other than 0).
    telemetry_series: Series | None
    samples_per_s: float | None = None
    flops_per_step: float | None = None
    achieved_flops: float | None = None
    mfu: float | None = None
    peak_flops: Measured | None = None
    data_time_s: float | None = None
    data_share: float | None = None
    data_info: dict[str, Any] | None = None
    step_time: StepTimes | None = None
    step_times_ms: list[float] | None = None
    target_reached: bool | None = None
    steps_to_target: int | None = None
    samples_to_target: int | None = None
    time_to_target_s: float | None = None
    # The scale after each step and the skipped steps; None for a run that does not scale.
    loss_scale: list[float] | None = None
    skipped_steps: list[int] | None = None
    # Measured over the first training step; None where no step ran.
    lowest_precision: LowestPrecision | None = None
    # What torch.compile did (compile: true runs only).
    compile_stats: CompileStats | None = None
    # The FP8 recipe and eligibility map (fp8/mxfp8 runs only).
    fp8: Fp8Stats | None = None

    def result_fields(self) -> dict[str, Any]:
        """The RunResult fields this outcome holds, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_RESULT_FIELDS}
