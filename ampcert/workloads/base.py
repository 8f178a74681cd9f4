"""What a workload is: the contract between a model and the training loop.

A workload is an object with a name, a pydantic ``Params`` model for its
knobs, the metric it is judged by (``metric``, ``higher_is_better``), a
``default_budget(params)`` (target quality, step cap, evaluation interval),
and a ``build(params, seed, device)`` that returns a :class:`TorchTask`: the
model, its data (in memory as tensors, or streamed from a DataLoader), its
loss, optimizer and evaluation. For the JAX backend it also has ``build_jax(params, seed,
device)`` returning a :class:`~ampcert.workloads.jax_models.JaxTask`. The
backend owns everything else (precision, loss scaling, batch order, timing,
FLOP counting), so one workload runs unchanged in fp32, fp16 and bf16. The
built-in workloads are written against exactly this protocol; docs/workloads.md
walks through a user's own (examples/custom_workload/).

``build`` is called after the torch backend seeded python, numpy and torch
with the run's seed, so a user's initial weights drawn from torch's global
generator follow the seed; data splits should not (every seed and precision
is scored on the same evaluation set). The built-in workloads draw nothing
from a global generator: a workload module (framework-free, so a suite is
validated and listed without torch or JAX) prepares a :class:`Prepared` from
the params and seed, numpy arrays and initial weights from
:mod:`ampcert.workloads.init`, and its ``build`` and ``build_jax`` turn that
one Prepared into a TorchTask (:mod:`~ampcert.workloads.torch_models`) or a
JaxTask (:mod:`~ampcert.workloads.jax_models`), importing their framework only
then. Both backends draw batches and augmentation from
:mod:`ampcert.workloads.rng`, so a torch and a JAX run of one seed start from
the same weights and see the same batches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel

from ampcert.workloads.init import Weights

if TYPE_CHECKING:
    import torch


@dataclass
class TorchTask:
    """A workload ready for the torch backend (what ``build`` returns).

    The training data is either in memory, ``train_x`` and ``train_y``
    (tensors on the run's device; the backend draws index batches of
    ``batch_size`` from :func:`ampcert.backends.loop.index_batches`, in an
    order fixed by the seed), or streamed, ``train_data`` (with ``train_x``
    and ``train_y`` None) for a data set too big for memory (an image folder,
    token files on disk). ``train_data`` is an iterable of ``(x, y)`` batches
    (tensors or numpy arrays, the batch on the first axis) that the backend
    iterates afresh each epoch until the step budget is spent, such as a
    ``torch.utils.data.DataLoader``, or a callable ``epoch -> iterable`` of
    batches (called with 0, 1, ...); a one-shot iterator serves as long as it
    yields. Batches come on the host and the backend moves them to the
    device; ``augment`` still applies to each. Waiting for a batch counts as
    data time (``data_time_s``), and the samples counted (throughput,
    ``train_samples``) are each batch's actual length, so a ragged last batch
    counts as what it is. The first batch also serves the FLOP count (drawn
    while building, its wait counted as step 1's data and training time)
    and the precision probe. Here the *loader* decides the order: ampcert
    draws nothing, so the batches following the run's seed, and a rerun
    seeing the same batches, are the workload's responsibility (a generator
    seeded from ``seed`` for a shuffling sampler, a fixed shard order per
    epoch; ``num_workers > 0`` splits an IterableDataset across workers
    only if the dataset does, by ``torch.utils.data.get_worker_info``).
    docs/workloads.md ("Streaming data") and examples/streaming_workload/
    show one.
    """

    model: torch.nn.Module
    # In memory: the whole training set, indexed by the backend. None when train_data streams it.
    train_x: torch.Tensor | None
    train_y: torch.Tensor | None
    eval_x: torch.Tensor
    eval_y: torch.Tensor
    batch_size: int
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    make_optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    # Returns the workload's metric on (x, y); called under torch.no_grad()
    # and inside the run's autocast region, like inference would be.
    evaluate: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], float]
    data_note: str = ""
    # Learning-rate multiplier for a 0-based step (torch LambdaLR), e.g. linear
    # warm-up then cosine decay; None keeps the optimizer's rate.
    lr_lambda: Callable[[int], float] | None = None
    # Applied to each training batch after indexing (seeded augmentation);
    # gets (x, y, step) and must be deterministic for a step.
    augment: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]] | None = None
    # Provenance the result should carry: source paths, sha256 of the data, sizes.
    data_info: dict[str, Any] = field(default_factory=dict)
    # FLOPs of one training step (forward + backward), when the workload knows
    # better than torch.utils.flop_counter (custom kernels); None: counted.
    flops_per_step: float | None = None
    # Streamed training data instead of train_x/train_y (see the class docstring):
    # an iterable of (x, y) batches re-iterated each epoch (a DataLoader), or a
    # callable epoch -> iterable of batches.
    train_data: Iterable[tuple[Any, Any]] | Callable[[int], Iterable[tuple[Any, Any]]] | None = None


@dataclass(kw_only=True)
class HostData:
    """What a task holds of its data on the host, whichever framework trains it: the
    evaluation set, the batch, the learning-rate schedule, the seeded augmentation
    (``augment(x, y, step)``, numpy in, numpy out) and the data's provenance. Its
    fields are keywords, after each task's own."""

    eval_x: np.ndarray
    eval_y: np.ndarray
    batch_size: int
    lr_lambda: Callable[[int], float] | None = None
    augment: Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]] | None = None
    data_note: str = ""
    data_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prepared(HostData):
    """A built-in workload before a framework is chosen: what its torch and
    JAX tasks share, so that they share it by construction.

    Data are numpy arrays (float32 inputs, int64 labels) already split and
    normalised; ``weights`` are the initial parameters keyed by torch name.
    A workload module may subclass it to carry what its models need (a
    layout, the text windows' bytes)."""

    params: Any  # the workload's validated Params
    weights: Weights
    train_x: np.ndarray
    train_y: np.ndarray


def warmup_cosine(warmup_steps: int, max_steps: int, floor: float = 0.1) -> Callable[[int], float]:
    """Learning-rate multiplier for a 0-based step (for ``TorchTask.lr_lambda``):
    linear warm-up from 1/warmup_steps to 1 over ``warmup_steps``, then a
    cosine from 1 down to ``floor`` at ``max_steps``, and ``floor`` after."""

    def lr_lambda(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return lr_lambda


class DataError(ValueError):
    """A data source is unusable: missing path, wrong or truncated format, too
    small. The message is one line, ``<path>: <problem>``; the harness shows it
    with exit code 2 at planning time (through a workload's optional
    ``check(params)``) or records it as the run's failure reason."""


@dataclass(frozen=True)
class Budget:
    """A workload's declared training budget: MLPerf-style target quality
    with a step cap, and how often to evaluate."""

    target: float
    max_steps: int
    eval_every: int


@runtime_checkable
class Workload(Protocol):
    name: str
    summary: str
    metric: str
    higher_is_better: bool
    Params: ClassVar[type[BaseModel]]

    def build(self, params: Any, seed: int, device: str) -> TorchTask: ...

    def default_budget(self, params: Any) -> Budget: ...

    # Optional, not part of the runtime check:
    # - ``check(params) -> None`` validates data sources cheaply (paths exist,
    #   headers parse) and raises DataError, so bad data is reported before any
    #   run starts;
    # - ``build_jax(params, seed, device) -> JaxTask`` for `backend: jax`.
