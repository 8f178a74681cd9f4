"""What training holds per parameter, by precision and recipe: report.json's
``training_state`` and report.html's table beside the memory sweep's.

Each row is a (workload, backend, amp, precision) subject's bytes per parameter
for its weights, their gradients and the optimizer's state, as its runs read them
from their own tensors (results.TrainingState: the same on every seed), the total
against FP32's of the same entry, and, where the suite swept memory, the
activations' bytes per sample and the largest batch per budget from the sweep's
fit (ampcert/memory.py), so a recipe's saving is set beside AMP's in one place.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ampcert.aggregate import group_runs, reference_key
from ampcert.memory import MemoryFit
from ampcert.results import RunResult, TrainingState
from ampcert.vocabulary import Subject


class TrainingStateRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    subject: Subject
    parameters: int
    weights_dtype: str
    optimizer: str
    weights_per_parameter: float = Field(description="bytes")
    gradients_per_parameter: float = Field(description="bytes")
    optimizer_state_per_parameter: float = Field(description="bytes")
    total_per_parameter: float = Field(description="weights + gradients + optimizer state, bytes")
    total_vs_fp32: float | None = Field(default=None, description="this total over FP32's of the same entry")
    activations_per_sample: float | None = Field(
        default=None, description="bytes per sample from the memory sweep's fit, where the suite swept")
    largest_batch: list[tuple[int, int | None]] = Field(
        default_factory=list, description="(budget in bytes, the fitted largest batch) from the sweep")


def training_state_rows(runs: list[RunResult], fits: list[MemoryFit]) -> list[TrainingStateRow]:
    """One row per subject whose completed runs read their training state (torch runs)."""
    states: dict[Subject, TrainingState] = {}
    for key, group in group_runs(runs, skipped=False).items():
        found = next((r.training_state for r in group if r.status == "completed" and r.training_state), None)
        if found is not None and found.parameters:
            states[key] = found
    by_subject = {fit.subject: fit for fit in fits}
    rows = []
    for key, state in states.items():
        total = state.total_bytes
        reference = states.get(reference_key(key))
        fp32_total = reference.total_bytes if reference is not None else None
        fit = by_subject.get(key)
        rows.append(TrainingStateRow(
            subject=key, parameters=state.parameters, weights_dtype=state.weights_dtype,
            optimizer=state.optimizer,
            weights_per_parameter=state.weights_bytes / state.parameters,
            gradients_per_parameter=state.gradients_bytes / state.parameters,
            optimizer_state_per_parameter=state.optimizer_state_bytes / state.parameters,
            total_per_parameter=total / state.parameters,
            total_vs_fp32=total / fp32_total if fp32_total else None,
            activations_per_sample=fit.bytes_per_sample if fit is not None else None,
            largest_batch=[(b.budget_bytes, b.largest_batch) for b in fit.budgets] if fit is not None else []))
    return rows
