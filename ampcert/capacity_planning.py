"""Capacity planning: what training N samples takes in each precision, from measured results.

    from ampcert import capacity_planning
    cp = capacity_planning.capacity_plan(runs, target_samples=10**9, gpus=8, price_per_gpu_hour=2.5)
    for row in cp.rows: ...            # one row per workload/backend/AMP/precision

Per subject, from its completed runs (seeds; repeats left out):

- throughput: ``samples_per_s``, the median of the runs' training samples
  per second (evaluations excluded: the figure every view shows under that
  name); the range is the slowest and the fastest seed;
- wall time = N / (throughput x K devices), assuming linear scaling (no
  communication or input-pipeline overhead: a lower bound); device-hours =
  wall time x K (independent of K under that assumption; the console calls
  them GPU-hours where every row trained on a GPU);
- energy = N x the measured J per training sample, in the scope the run
  measured (a GPU's counter, or the host package); null with the reason when
  energy was not measured, never zero;
- cost = device-hours x price per device-hour (``--price-per-gpu-hour``, else
  ``configs/pricing.yaml`` by device name, else null with the reason);
- savings against FP32 of the same workload, backend and AMP: positive
  where the precision saves, in the console, the CSV and report.json alike.

:func:`capacity_plan` is a plain function over run results, so the CLI, a
CSV file and the HTML report render the same rows.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ampcert import formats
from ampcert.aggregate import REFERENCE, SubjectRow, group_runs, reference_key, run_value
from ampcert.errors import UserError
from ampcert.memory import MemoryFit, fit_budget
from ampcert.resources import config_path
from ampcert.results import RunResult

PRICING_FILE = config_path("pricing.yaml")
# How plans and reports name the shipped price table: by its place in the package, not
# on this disk, so report.json's signed bytes do not depend on where ampcert is installed
# (the sha256 beside it pins the content). A table the user passes keeps the user's path.
PRICING_NAME = "ampcert:configs/pricing.yaml"
J_PER_KWH = 3.6e6


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- pricing


class PriceEntry(_Model):
    name: str
    match: list[str] = Field(min_length=1)
    price_per_gpu_hour: float = Field(gt=0)


class Pricing(_Model):
    currency: str = "USD"
    note: str = ""
    devices: list[PriceEntry] = Field(default_factory=list)
    source: str = ""
    sha256: str = ""

    def lookup(self, device_name: str, override: float | None = None) -> tuple[float, str] | None:
        """The price per device-hour of ``device_name`` and where it comes from: ``override``
        (``--price-per-gpu-hour``) where given, else this table; None where neither has one."""
        return (override, "--price-per-gpu-hour") if override is not None else self.price_for(device_name)

    def price_for(self, device_name: str) -> tuple[float, str] | None:
        name = device_name.lower()
        for entry in self.devices:
            if all(part.lower() in name for part in entry.match):
                return entry.price_per_gpu_hour, f"{self.source}: {entry.name}" + (f" ({self.note})" if self.note else "")
        return None


def load_pricing(path: str | Path | None = None) -> Pricing:
    """A price table (default ``configs/pricing.yaml``); UserError with one line on any problem."""
    from ampcert.configio import read_yaml, validation_message

    p = Path(path) if path is not None else PRICING_FILE
    data = read_yaml(p, "pricing file")
    if not isinstance(data, dict):
        raise UserError(f"{p}: expected a mapping with currency and devices at the top level")
    try:
        pricing = Pricing.model_validate(data)
    except ValidationError as err:
        raise UserError(validation_message(str(p), err, data)) from None
    try:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
    except OSError as exc:  # read a moment ago; gone or unreadable since
        raise UserError(f"{p}: cannot read pricing file: {exc}") from None
    # Error messages above name the file on disk (that is what the user must find);
    # what is recorded names it as the user gave it, or by its package-relative name.
    return pricing.model_copy(update={"source": str(path) if path is not None else PRICING_NAME,
                                      "sha256": digest})


# --------------------------------------------------------------------------- the plan


class PlanRow(SubjectRow):
    device: str = Field(description="the device name the runs recorded")
    device_type: str = Field(description="what the runs trained on: cpu or cuda")
    accelerated: bool
    capability_note: str = ""
    seeds: int = Field(description="completed runs (seeds) the figures come from")
    samples_per_s: float | None = Field(description="median of the runs' samples_per_s (docs/reports.md)")
    samples_per_s_range: list[float] | None = Field(description="[slowest, fastest] seed")
    wall_time_h: float | None = Field(description="N / (samples/s x K) in hours (linear scaling assumed)")
    wall_time_h_range: list[float] | None = Field(description="from the fastest and the slowest seed")
    device_hours: float | None = Field(description="wall time x K devices (GPU-hours on GPUs, CPU-hours on CPUs)")
    device_hours_range: list[float] | None
    energy_j_per_sample: float | None = Field(description="median of the runs' training J per sample")
    energy_j_per_sample_range: list[float] | None
    energy_kwh: float | None = Field(description="N x J per sample / 3.6e6; null when not measured")
    energy_kwh_range: list[float] | None
    energy_scope: str | None = Field(default=None, description="what the energy covers (gpu, host, ...)")
    energy_method: str | None = None
    energy_reason: str | None = Field(default=None, description="why energy is null")
    price_per_gpu_hour: float | None = Field(description="price per device-hour (the pricing table's GPUs)")
    price_source: str | None
    cost: float | None
    cost_range: list[float] | None
    cost_reason: str | None = Field(default=None, description="why cost is null")
    speedup_vs_fp32: float | None = Field(default=None, description="samples/s over FP32's")
    # A saving is positive when the precision saves, negative when it costs more, everywhere.
    time_saving_vs_fp32: float | None = Field(default=None, description="1 - wall time / FP32's (0.4 = 40% less)")
    energy_saving_vs_fp32: float | None = Field(default=None, description="1 - energy / FP32's")
    cost_saving_vs_fp32: float | None = Field(default=None, description="1 - cost / FP32's")
    # The fitting question (a global batch and a memory sweep): written only when asked.
    device_memory_bytes: int | None = Field(default=None, exclude_if=lambda v: v is None,
                                            description="the memory of each device the batch must fit in")
    max_batch_per_device: int | None = Field(default=None, exclude_if=lambda v: v is None,
                                             description="the largest batch the memory sweep's fit puts in it")
    devices_for_global_batch: int | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="data parallel: ceil(global batch / max_batch_per_device) devices")
    fit_reason: str | None = Field(default=None, exclude_if=lambda v: v is None,
                                   description="why the devices needed are null")


class CapacityPlan(_Model):
    target_samples: int
    gpus: int
    currency: str
    pricing: str = Field(description="where prices came from: --price-per-gpu-hour, the price table as the "
                                     "user named it, or ampcert:configs/pricing.yaml (the shipped table)")
    pricing_sha256: str | None = Field(default=None, description="sha256 of the price table's bytes; "
                                                                 "null with --price-per-gpu-hour")
    assumptions: list[str]
    rows: list[PlanRow]
    global_batch: int | None = Field(default=None, exclude_if=lambda v: v is None,
                                     description="the global batch the devices needed are for")


def _values(runs: list[RunResult], figure: str) -> list[float]:
    return [v for r in runs if (v := run_value(r, figure)) is not None]


def _median_range(values: list[float]) -> tuple[float | None, list[float] | None]:
    if not values:
        return None, None
    return float(statistics.median(values)), [float(min(values)), float(max(values))]


def scaled(value: float | None, rng: list[float] | None,
           f: Callable[[float], float]) -> tuple[float | None, list[float] | None]:
    """``f`` applied to a value and its range (sorted again: f may be decreasing); (None, None)
    for no value. Every projection of a plan (here and :mod:`ampcert.published`) is one."""
    if value is None:
        return None, None
    return f(value), sorted([f(rng[0]), f(rng[1])]) if rng else None


def _saving(value: float | None, ref: float | None) -> float | None:
    if value is None or not ref:
        return None
    return 1.0 - value / ref


def capacity_plan(runs: Iterable[RunResult], target_samples: int, gpus: int = 1,
                  price_per_gpu_hour: float | None = None,
                  pricing: Pricing | str | Path | None = None, *, global_batch: int | None = None,
                  memory_fits: Sequence[MemoryFit] = (), device_memory: int | None = None) -> CapacityPlan:
    """Projected wall time, device-hours, energy and cost of training ``target_samples``
    samples on ``gpus`` devices, per workload/backend/AMP/precision of ``runs``; with a
    ``global_batch``, also how many devices of ``device_memory`` bytes (default: the memory
    the sweep ran on) each precision needs for it, from a memory sweep's ``memory_fits``."""
    if global_batch is not None and global_batch < 1:
        raise UserError(f"--global-batch: expected a positive batch, got {global_batch}")
    if device_memory is not None and device_memory < 1:
        raise UserError(f"--device-memory: expected a positive size, got {device_memory}")
    if target_samples < 1:
        raise UserError(f"--target-samples: expected a positive number of samples, got {target_samples}")
    if gpus < 1:
        raise UserError(f"--gpus: expected at least 1 device, got {gpus}")
    if price_per_gpu_hour is not None and not price_per_gpu_hour > 0:
        raise UserError(f"--price-per-gpu-hour: expected a positive price, got {price_per_gpu_hour}")
    table = pricing if isinstance(pricing, Pricing) else load_pricing(pricing)
    # The groups of every view (ampcert.aggregate); a plan projects from medians and
    # slowest-to-fastest ranges, so its figures are its own, its rows are the table's.
    groups = group_runs(runs, skipped=False)
    n, k = target_samples, gpus
    rows: list[PlanRow] = []
    for subject, members in sorted(groups.items()):  # report.json's order
        done = [r for r in members if r.status == "completed"]
        first = (done or members)[0]
        device = str((first.environment or {}).get("device_name") or first.spec.device)
        thr, thr_rng = _median_range(_values(done, "samples_per_s"))
        wall, wall_rng = scaled(thr, thr_rng, lambda t: n / (t * k) / 3600.0)
        hours, hours_rng = scaled(wall, wall_rng, lambda h: h * k)
        energies = [(r.telemetry or {}).get("energy") or {} for r in done]
        jps, jps_rng = _median_range(_values(done, "energy_j_per_sample"))
        kwh, kwh_rng = scaled(jps, jps_rng, lambda j: n * j / J_PER_KWH)
        measured = next((e for e in energies if e.get("train_j_per_sample") is not None), {})
        reason = None
        if jps is None:
            reason = next((str(e["reason"]) for e in energies if e.get("reason")),
                          "no completed run" if not done else "the runs recorded no energy")
        found = table.lookup(device, price_per_gpu_hour)
        price, source = found if found else (None, None)
        cost, cost_rng = scaled(hours, hours_rng, lambda h, p=price: h * p) if price is not None else (None, None)
        cost_reason = None
        if cost is None:
            cost_reason = (f"no price for {device!r} in {table.source}: pass --price-per-gpu-hour"
                           if price is None else "no throughput measured")
        rows.append(PlanRow.of(
            subject, device=device, device_type=first.spec.device.split(":")[0],
            accelerated=first.accelerated, capability_note=first.capability_note, seeds=len(done),
            samples_per_s=thr, samples_per_s_range=thr_rng, wall_time_h=wall, wall_time_h_range=wall_rng,
            device_hours=hours, device_hours_range=hours_rng, energy_j_per_sample=jps, energy_j_per_sample_range=jps_rng,
            energy_kwh=kwh, energy_kwh_range=kwh_rng, energy_scope=measured.get("scope"),
            energy_method=measured.get("method"), energy_reason=reason, price_per_gpu_hour=price,
            price_source=source, cost=cost, cost_range=cost_rng, cost_reason=cost_reason,
        ))
    ref = {r.key: r for r in rows if r.precision == REFERENCE}
    for i, row in enumerate(rows):
        fp32 = ref.get(reference_key(row.key))
        if fp32 is None or row is fp32:
            continue
        rows[i] = row.model_copy(update={
            "speedup_vs_fp32": row.samples_per_s / fp32.samples_per_s
            if row.samples_per_s and fp32.samples_per_s else None,
            "time_saving_vs_fp32": _saving(row.wall_time_h, fp32.wall_time_h),
            "energy_saving_vs_fp32": _saving(row.energy_kwh, fp32.energy_kwh),
            "cost_saving_vs_fp32": _saving(row.cost, fp32.cost),
        })
    if global_batch is not None:
        fits = {f.subject: f for f in memory_fits}
        rows = [row.model_copy(update=_fitting(fits.get(row.key), global_batch, device_memory)) for row in rows]
    source = "--price-per-gpu-hour" if price_per_gpu_hour is not None else f"{table.source} ({table.note or 'prices'})"
    assumptions = [
        f"linear scaling: {n:,} samples on {k} device(s) take N / ({k} x the measured single-device "
        "samples/s); real multi-device training adds communication and input overhead, so wall time "
        "and device-hours are lower bounds",
        "throughput: samples_per_s, the median of the seeds' training samples / training time (evaluation "
        "and start-up excluded); ranges run from the slowest to the fastest seed",
        "energy: N x the measured joules per training sample, in the scope each run measured; null "
        "where energy was not measured (never 0)",
        f"cost: device-hours x price per device-hour, prices from {source}",
        "savings: against FP32 of the same workload, backend and AMP, on the devices the runs used; "
        "positive where the precision saves, negative where it costs more",
    ]
    if global_batch is not None:
        against = "--device-memory" if device_memory else "the suite's first memory budget, else the sweep device's memory"
        assumptions.append(
            f"fitting: data parallel, every device holds the whole model, optimizer and framework (the memory "
            f"sweep's fixed bytes) and global batch / devices samples; the largest batch per device is the "
            f"sweep's fitted line against {against} (each row's device_memory_bytes), "
            "measured on the sweep's own device (docs/suites.md, \"Memory sweep\")")
    return CapacityPlan(target_samples=n, gpus=k, currency=table.currency, pricing=source,
                        pricing_sha256=None if price_per_gpu_hour is not None else table.sha256 or None,
                        assumptions=assumptions, rows=rows, global_batch=global_batch)


def _fitting(fit: MemoryFit | None, global_batch: int, device_memory: int | None) -> dict[str, Any]:
    """A row's answer to the fitting question: how many devices its precision needs."""
    if fit is None:
        return {"fit_reason": "no memory sweep of this subject (the suite's `memory:`)"}
    # --device-memory, else the budget the sweep was fitted against (the device's own, where
    # a batch that ran out of memory there caps it, else the suite's first).
    chosen = (fit_budget(fit, device_memory, "--device-memory") if device_memory is not None else
              next((b for b in fit.budgets if b.source == "device"), fit.budgets[0] if fit.budgets else None))
    if chosen is None:
        return {"fit_reason": "no device memory known: pass --device-memory"}
    if chosen.largest_batch is None:
        return {"device_memory_bytes": chosen.budget_bytes, "fit_reason": chosen.note}
    return {"device_memory_bytes": chosen.budget_bytes, "max_batch_per_device": chosen.largest_batch,
            "devices_for_global_batch": math.ceil(global_batch / chosen.largest_batch)}


# --------------------------------------------------------------------------- output

CSV_FIELDS = [
    "workload", "backend", "amp", "precision", "device", "device_type", "accelerated", "seeds",
    "samples_per_s", "samples_per_s_min", "samples_per_s_max",
    "wall_time_h", "wall_time_h_min", "wall_time_h_max", "device_hours", "device_hours_min", "device_hours_max",
    "energy_j_per_sample", "energy_kwh", "energy_kwh_min", "energy_kwh_max", "energy_scope", "energy_reason",
    "price_per_gpu_hour", "price_source", "cost", "cost_min", "cost_max", "cost_reason",
    "speedup_vs_fp32", "time_saving_vs_fp32", "energy_saving_vs_fp32", "cost_saving_vs_fp32",
]


def csv_text(cp: CapacityPlan) -> str:
    """One line per row; ranges as _min/_max columns; empty cells where null."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=["target_samples", "gpus", "currency", *CSV_FIELDS],
                            lineterminator="\n")
    writer.writeheader()
    for row in cp.rows:
        d: dict[str, Any] = row.model_dump()
        for key in ("samples_per_s", "wall_time_h", "device_hours", "energy_kwh", "cost"):
            rng = d.pop(f"{key}_range", None)
            d[f"{key}_min"], d[f"{key}_max"] = rng if rng else (None, None)
        line = {f: d.get(f) for f in CSV_FIELDS}
        writer.writerow({"target_samples": cp.target_samples, "gpus": cp.gpus, "currency": cp.currency,
                         **{f: "" if v is None else v for f, v in line.items()}})
    return out.getvalue()


def _num(v: float | None) -> str:
    return formats.number(v, 3)


def table_rows(cp: CapacityPlan) -> list[dict[str, str]]:
    """One row of strings per plan row (terminal table, HTML); ranges are the seed spread."""
    def rng(values, f):
        return f" ({f(values[0])}–{f(values[1])})" if values and values[0] != values[1] else ""

    hours_name = "GPU-hours" if cp.rows and all(r.device_type == "cuda" for r in cp.rows) else "device-hours"
    rows = []
    for r in cp.rows:
        rows.append({
            "workload": r.workload,
            "backend/amp": f"{r.backend}/{r.amp}",
            "precision": r.precision + ("" if r.accelerated else " (not accelerated)"),
            "device": r.device,
            "seeds": str(r.seeds),
            "samples/s": _num(r.samples_per_s) + rng(r.samples_per_s_range, _num),
            "wall time": formats.hours(r.wall_time_h) + rng(r.wall_time_h_range, formats.hours),
            hours_name: _num(r.device_hours) + rng(r.device_hours_range, _num),
            "energy kWh": _num(r.energy_kwh) + rng(r.energy_kwh_range, _num) if r.energy_kwh is not None
            else "not measured",
            f"cost {cp.currency}": _num(r.cost) + rng(r.cost_range, _num) if r.cost is not None else "—",
            "saved vs FP32 (time, energy, cost)": "" if r.precision == REFERENCE else
            ", ".join(formats.percent(x) for x in (r.time_saving_vs_fp32, r.energy_saving_vs_fp32,
                                                   r.cost_saving_vs_fp32)),
        })
        if cp.global_batch is not None:
            rows[-1][f"devices for batch {cp.global_batch:,}"] = (
                f"{r.devices_for_global_batch:,} ({r.max_batch_per_device:,}/device in {formats.budget(r.device_memory_bytes)})"
                if r.devices_for_global_batch is not None else "—")
    return rows


def notes(cp: CapacityPlan) -> list[str]:
    """Why figures are missing, each reason once."""
    out: dict[str, list[str]] = defaultdict(list)
    for r in cp.rows:
        name = str(r.key)
        if r.energy_reason:
            out[f"energy not measured: {r.energy_reason}"].append(name)
        if r.cost_reason:
            out[f"no cost: {r.cost_reason}"].append(name)
        if not r.accelerated:
            out[f"{r.precision} {r.capability_note or 'is not accelerated on this device'}"].append(name)
        if r.fit_reason:
            out[f"no devices for the global batch: {r.fit_reason}"].append(name)
    return [f"{why} ({', '.join(names) if len(names) <= 3 else f'{len(names)} rows'})" for why, names in out.items()]
