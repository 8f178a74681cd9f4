"""The speed probe's processes of a results folder, their budgets resolved: run after the
certified runs, through the same driver (session/runs.py), where the folder is whole.

A pair's budget is ``share`` of the time its certified runs took: the low precision's
runs and its part of FP32's (FP32's time split over the entry's low precisions, so that
an entry's probes together take ``share`` of its runs' time), at most ``max_seconds``,
then split over the pair's ``processes``. Their specs, and so their run ids, come from the
plan alone (:func:`ampcert.spec.speed_probes`): the budget says how long a probe
measures, not what, and is not part of its id, so `--resume` finds a probe done."""

from __future__ import annotations

from collections import Counter

from ampcert.results import ResultSet
from ampcert.spec import RunSpec, SpeedProbe, speed_probes
from ampcert.stored_plan import StoredPlan

MIN_SECONDS = 0.1  # a process measures at least this long (and MIN_ROUNDS rounds: speed_probe.py)


def planned_probes(plan: StoredPlan, results: ResultSet) -> list[RunSpec]:
    """The folder's probes with their budgets (none for a shard's folder, or a suite without one)."""
    settings = plan.speed_probe
    if plan.shard or settings is None:
        return []
    probes = speed_probes(settings, plan.runs)
    low = Counter(label for label, _ in {(p.label, p.precision) for p in probes})
    return [p.model_copy(update={"probe": p.probe.model_copy(update={
        "probe_seconds": _seconds(settings, results, p, low[p.label])})}) for p in probes]


def _seconds(settings: SpeedProbe, results: ResultSet, probe: RunSpec, low_precisions: int) -> float:
    def spent(precision: str) -> float:
        return sum(r.wall_s or 0.0 for r in results.runs
                   if r.spec.label == probe.label and r.spec.precision == precision and r.status == "completed")

    pair_s = spent(probe.precision) + spent("fp32") / low_precisions
    return round(max(min(settings.share * pair_s, settings.max_seconds) / settings.processes, MIN_SECONDS), 3)
