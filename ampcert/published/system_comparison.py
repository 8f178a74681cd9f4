"""Systems compared for one benchmark: published MLPerf results and ampcert's own measured runs, row by row.

A procurement review asks the same questions of every system: how long one training run
takes (and how much that varies), what it costs in accelerator-hours, energy and money,
in which precision it trained, and whether MLPerf's own tools accept the result. A row
answers them for one imported system (``ampcert import mlperf``) or one subject of an
ampcert results folder (a workload in one precision), read the same way:

- **time to train**: MLPerf's score for a published system; for a measured subject the
  same rule (:func:`~ampcert.published.scores.olympic_score`) over its seeds' time to
  target, a seed that missed its target dropped as MLPerf drops a run that did not
  succeed; the 95% bootstrap interval of either (:func:`~ampcert.published.scores.bootstrap`);
- **accelerator-hours per run**: the time to train x the accelerators (a published
  system's nodes x accelerators per node; a measured run's GPUs; none on a CPU);
- **energy per run**: a published system's energy to train from its power logs
  (:mod:`.energy`); a measured subject's training-phase energy (joules per training
  sample x samples, evaluations excluded), in the scope its telemetry measured;
- **cost per run**: accelerator-hours x the price per accelerator-hour (a price table
  by the accelerator's name, or one price for all);
- **precision**: as the logs disclose it or "not disclosed" (a published system, whose
  free-text notes are quoted, never parsed); the precision the run trained in (measured);
- **compliance**: MLPerf's checkers' verdicts for the round (published); a measured
  folder is no MLPerf submission, and says so with its certificate's verdict.

The comparison is plain data; :mod:`ampcert.report.systems` renders it (JSON,
Markdown, HTML with plots) and signs it.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ampcert.aggregate import group_runs, run_value
from ampcert.capacity_planning import J_PER_KWH, Pricing, scaled
from ampcert.errors import BadArgument, UserError
from ampcert.published.importer import PUBLISHED_FILE, PublishedBenchmark
from ampcert.published.scores import bootstrap, olympic_score
from ampcert.results import ResultSet, RunResult

FORMAT: Literal["ampcert.compare-systems/1"] = "ampcert.compare-systems/1"
Status = Literal["passed", "failed", "not run"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SystemRow(_Model):
    source: Literal["published", "measured"]
    name: str = Field(description="submitter and system (published), or folder and subject (measured)")
    folder: str
    benchmark: str
    round: str | None = None
    division: str | None = None
    availability: str | None = None
    accelerator: str
    accelerators: int = Field(description="what accelerator-hours multiply by; 0 on a CPU")
    precision: str = Field(description="as disclosed, or 'not disclosed' (published); as trained (measured)")
    precision_note: str = ""
    runs: int
    counted: int = Field(description="runs that count towards the time to train")
    time_to_train_minutes: float | None
    interval_minutes: list[float] | None
    cv: float | None = None
    discrete_note: str = ""
    accelerator_hours_per_run: float | None
    accelerator_hours_range: list[float] | None
    energy_kwh_per_run: float | None
    energy_scope: str | None = None
    energy_note: str = ""
    price_per_gpu_hour: float | None
    price_source: str | None
    cost_per_run: float | None
    cost_range: list[float] | None
    compliance: Status
    compliance_detail: str
    notes: list[str] = Field(default_factory=list, description="why figures are missing")


class SystemInput(_Model):
    folder: str
    sha256: str = Field(description="published.json's sha256 (published), or that of the runs' result.json "
                                    "files in run-id order (measured)")


class SystemComparison(_Model):
    format: Literal["ampcert.compare-systems/1"] = FORMAT
    benchmark: str
    currency: str
    pricing: str
    pricing_sha256: str | None
    inputs: list[SystemInput]
    assumptions: list[str]
    rows: list[SystemRow]


def _hours(minutes: float | None, rng: list[float] | None, accelerators: int
           ) -> tuple[float | None, list[float] | None]:
    """Accelerator-hours of a run of ``minutes`` (none on a system without accelerators)."""
    return scaled(minutes, rng, lambda m: m * accelerators / 60) if accelerators else (None, None)


def _priced(row: dict[str, Any], pricing: Pricing, price: float | None) -> dict[str, Any]:
    """The cost fields of a row, from its accelerator-hours."""
    found = pricing.lookup(row["accelerator"], price)
    hours, rng = row["accelerator_hours_per_run"], row["accelerator_hours_range"]
    out: dict[str, Any] = {"price_per_gpu_hour": found[0] if found else None, "price_source": found[1] if found else None,
           "cost_per_run": None, "cost_range": None}
    if found and hours is not None:
        out["cost_per_run"], out["cost_range"] = scaled(hours, rng, lambda h: h * found[0])
    elif hours is not None:
        row["notes"].append(f"no cost: no price for {row['accelerator']!r} in {pricing.source}")
    return out


def published_row(folder: Path, rec: PublishedBenchmark, pricing: Pricing, price: float | None,
                  shown: Callable[[Path], str] = str) -> SystemRow:
    fp, score, energy, checked = rec.fingerprint, rec.score, rec.energy, rec.reverification
    hours, hours_rng = _hours(score.score_minutes, score.interval_minutes, fp.accelerators)
    joules, scope = energy.per_run()
    failed = [c for c in checked.checks if c.status == "failed"]
    if checked.reason:
        compliance: Status = "not run"
        detail = checked.reason
    elif failed:
        compliance, detail = "failed", "; ".join(f"{c.name}: {c.detail}" for c in failed)
    else:
        compliance = "passed"
        detail = (f"MLPerf training {checked.ruleset}: " +
                  ", ".join(f"{c.name} {c.status}" for c in checked.checks))
    row: dict[str, Any] = {
        "source": "published", "name": f"{rec.submitter} {rec.system}" + (f" v{rec.round}" if rec.round else ""),
        "folder": shown(folder),
        "benchmark": rec.benchmark, "round": rec.round, "division": rec.division, "availability": rec.availability,
        "accelerator": fp.accelerator_model, "accelerators": fp.accelerators, "precision": rec.precision.disclosed,
        "precision_note": f"sw_notes: {rec.precision.sw_notes}" if rec.precision.sw_notes else "",
        "runs": len(score.runs), "counted": sum(r.minutes is not None for r in score.runs),
        "time_to_train_minutes": score.score_minutes, "interval_minutes": score.interval_minutes, "cv": score.cv,
        "discrete_note": score.discrete_note, "accelerator_hours_per_run": hours, "accelerator_hours_range": hours_rng,
        "energy_kwh_per_run": None if joules is None else joules / J_PER_KWH,
        "energy_scope": None if scope is None else
        scope + (f", {'/'.join(energy.measurement_types)}" if energy.measurement_types else ""),
        "energy_note": energy.no_figure, "compliance": compliance, "compliance_detail": detail,
        "notes": [f"no time to train: {score.no_score}"] if score.no_score else [],
    }
    return SystemRow.model_validate(row | _priced(row, pricing, price))


def _accelerators(r: RunResult) -> int:
    if r.spec.device != "cuda":
        return 0
    return r.spec.world_size


def measured_rows(folder: Path, rs: ResultSet, benchmark: str, pricing: Pricing, price: float | None,
                  certificate: str | None, shown: Callable[[Path], str] = str) -> list[SystemRow]:
    """A row per subject of ``rs`` whose workload label is ``benchmark``."""
    rows = []
    for subject, runs in group_runs(rs.runs, skipped=False).items():
        if subject.workload != benchmark:
            continue
        reached = [r for r in runs if r.status == "completed" and r.target_reached and r.time_to_target_s is not None]
        minutes = [float(r.time_to_target_s or 0) / 60 for r in reached]
        score, why = olympic_score(minutes, len(runs) - len(reached), benchmark)
        interval = bootstrap(minutes, len(runs) - len(reached), benchmark, 1.0) if score is not None else None
        first = (reached or runs)[0]
        accelerators = _accelerators(first)
        hours, hours_rng = _hours(score, interval, accelerators)
        energies = [j * r.train_samples for r in reached if (j := run_value(r, "energy_j_per_sample")) is not None]
        scope = ((first.telemetry or {}).get("energy") or {}).get("scope")
        device = str((first.environment or {}).get("device_name") or first.spec.device)
        notes = [f"no time to train: {why}"] if why else []
        if not accelerators:
            notes.append("no accelerator-hours: trained on a CPU")
        elif first.spec.command is not None and first.spec.launch.launcher == "process":
            notes.append("accelerators: 1 GPU counted per run (an own job's own launcher may use more; "
                         "ampcert does not know how many)")
        row: dict[str, Any] = {
            "source": "measured", "name": f"{folder.name}: {subject}", "folder": shown(folder), "benchmark": benchmark,
            "accelerator": device, "accelerators": accelerators, "precision": subject.precision,
            "precision_note": "the precision the runs trained in (ampcert's AMP)" if subject.amp == "ampcert"
            else "the precision the runs trained in", "runs": len(runs), "counted": len(reached),
            "time_to_train_minutes": score, "interval_minutes": interval,
            "cv": statistics.stdev(minutes) / statistics.mean(minutes) if len(minutes) > 1 else None,
            "accelerator_hours_per_run": hours, "accelerator_hours_range": hours_rng,
            "energy_kwh_per_run": statistics.median(energies) / J_PER_KWH if energies else None,
            "energy_scope": f"training phase, {scope}" if energies and scope else "training phase" if energies else None,
            "energy_note": "" if energies else "the runs recorded no energy",
            "compliance": "not run", "compliance_detail": "measured by ampcert, not an MLPerf submission"
            + (f"; ampcert certificate {certificate}" if certificate else ""),
            "notes": notes,
        }
        rows.append(SystemRow.model_validate(row | _priced(row, pricing, price)))
    return rows


def measured_digest(rs: ResultSet) -> str:
    digest = hashlib.sha256()
    for r in sorted(rs.runs, key=lambda r: r.run_id):
        digest.update(r.model_dump_json().encode())
    return digest.hexdigest()


def compare(published: Sequence[tuple[Path, PublishedBenchmark]],
            measured: Sequence[tuple[Path, ResultSet, str | None]], benchmark: str | None,
            pricing: Pricing, price_per_gpu_hour: float | None = None,
            shown: Callable[[Path], str] = str) -> SystemComparison:
    """The comparison of ``published`` (imported folders) and ``measured`` (results folders, each with its
    certificate's verdict) for ``benchmark`` (default: the one benchmark the published folders share).
    ``shown`` names a folder in the comparison (the caller's choice: relative to the output, so the
    same inputs give the same bytes however their paths were typed)."""
    named = sorted({rec.benchmark for _, rec in published})
    if benchmark is None:
        if len(named) != 1:
            raise BadArgument("benchmark", "the imported folders hold " + (", ".join(named) or "no benchmark")
                              + "; name the one to compare")
        benchmark = named[0]
    rows = [published_row(f, rec, pricing, price_per_gpu_hour, shown) for f, rec in published
            if rec.benchmark == benchmark]
    for folder, rs, certificate in measured:
        found = measured_rows(folder, rs, benchmark, pricing, price_per_gpu_hour, certificate, shown)
        if not found:
            raise UserError(f"{folder}: no runs of {benchmark!r} (its workloads: "
                            f"{', '.join(sorted({s.workload for s in group_runs(rs.runs)})) or 'none'})")
        rows += found
    rows.sort(key=lambda row: (row.source != "published", row.name))  # the same table whatever the order given
    if not rows:
        raise BadArgument("benchmark", f"none of the folders holds it (they hold {', '.join(named)})", benchmark)
    inputs = sorted((SystemInput(folder=shown(f), sha256=hashlib.sha256((f / PUBLISHED_FILE).read_bytes()).hexdigest())
                     for f, rec in published if rec.benchmark == benchmark), key=lambda i: i.folder)
    inputs += sorted((SystemInput(folder=shown(f), sha256=measured_digest(rs)) for f, rs, _ in measured),
                     key=lambda i: i.folder)
    source = ("--price-per-gpu-hour" if price_per_gpu_hour is not None
              else f"{pricing.source} ({pricing.note or 'prices'})")
    assumptions = [
        "time to train: MLPerf's score (olympic mean x scaling factor) of the published runs; for measured "
        "runs the same rule over the seeds' time to target; 95% bootstrap intervals over the counted runs",
        "accelerator-hours per run: time to train x the system's accelerators",
        "energy per run: published power logs (MLPerf's arithmetic, switches' readings counted where measured); "
        "measured: the training phase's energy in the scope the run measured",
        f"cost per run: accelerator-hours x price per accelerator-hour, prices from {source}",
        "precision: as the logs disclose it, or not disclosed (free-text notes quoted, never parsed)",
    ]
    return SystemComparison(benchmark=benchmark, currency=pricing.currency, pricing=source,
                            pricing_sha256=None if price_per_gpu_hour is not None else pricing.sha256 or None,
                            inputs=inputs, assumptions=assumptions, rows=rows)
