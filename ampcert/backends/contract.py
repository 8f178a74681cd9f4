"""What crosses from a backend to the worker: the contract of ``backend.train``.

Every backend (:mod:`~ampcert.backends.torch_backend`,
:mod:`~ampcert.backends.jax_backend`) has one entry point::

    train(spec: RunSpec, log: MLLogger, progress: Callable[[dict], None] | None) -> TrainOutcome

A run that completes returns a :class:`TrainOutcome`: the fields of its
:class:`~ampcert.results.RunResult` that training fills in (it is a
:class:`~ampcert.results.TrainedFields`, the model RunResult inherits them
from), the time it spent per phase (:class:`PhaseTimes`) and the telemetry
samples to write beside the result (a :class:`~ampcert.telemetry.Series`,
plain data); the one training loop's :class:`~ampcert.backends.training_loop.Tally` builds it.
A run that cannot go on raises: a :class:`RunFailed` says why in its message,
and its class says what kind of failure it is, so nobody reads the message to
decide. The worker (:mod:`ampcert.runner.worker`) records every exception as a failed
RunResult, its ``failure`` (a :class:`~ampcert.results.FailureKind`) from the
exception's type: :class:`LossNotFinite` is ``NON_FINITE``,
:class:`Unsupported` ``UNSUPPORTED``, another RunFailed or any other
exception ``ERROR`` (a ``UserError``: ``BAD_INPUT``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict

from ampcert.results import TrainedFields

if TYPE_CHECKING:
    from ampcert.spec import RunSpec
    from ampcert.telemetry import Series
else:  # not imported at run time (nor validated): the worker's imports stay light
    Series = Any


class RunFailed(Exception):
    """The run cannot go on; the message is the reason, recorded as it is."""


class LossNotFinite(RunFailed):
    """The training loss or the evaluation metric became inf or NaN: a finding
    about the precision (fp16 without loss scaling is expected to produce one)."""


class DoesNotFit(RunFailed):
    """The device ran out of memory: the run does not fit at its batch (a
    memory sweep's finding, recorded as a result, never a crash)."""

    @classmethod
    def during(cls, spec: RunSpec, error: BaseException) -> DoesNotFit:
        """The one reason both backends give: ``does not fit: out of cuda memory at batch 64
        (<the framework's first line>)``, the batch a memory sweep's point trains at."""
        first = str(error).strip().splitlines()[0] if str(error).strip() else "out of memory"
        batch = spec.sweep.batch_size
        at = f"batch {batch}" if batch is not None else "the workload's batch"
        return cls(f"does not fit: out of {spec.device} memory at {at} ({first})")


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


class TrainOutcome(TrainedFields):
    """A completed run as its backend measured it: the RunResult fields that
    training fills in (:class:`~ampcert.results.TrainedFields`; those left at
    their defaults are the ones a run does not measure: no target, no loss
    scaling, no peak FLOP/s for the device, ...) and two attributes that are
    not RunResult fields. The worker adds the name of the series file to
    ``telemetry`` (the summary)."""

    model_config = ConfigDict(frozen=True)

    phases: PhaseTimes
    # The samples behind ``telemetry``, for runs/<id>/telemetry.csv; None where
    # this process sampled nothing (a torchrun rank other than 0).
    telemetry_series: Series | None
