"""Capacity from published results: what N training runs of a benchmark take on each imported system.

An imported folder (``ampcert import mlperf``) holds MLPerf's time to train of one
system for one benchmark and the system's accelerator count. A procurement plan
asks what N such training runs (a team's hyper-parameter sweep, a month of
retraining) take:

- wall time = N x MLPerf's score (minutes), run one after another on the system;
- accelerator-hours = N x score x accelerators / 60 (the system's whole
  allocation, as the submission used it);
- energy = N x the benchmark's energy to train, where the submission has power logs;
- cost = accelerator-hours x price per accelerator-hour (``--price-per-gpu-hour``,
  else the price table by the accelerator's model name, else null with the reason);
- the ranges come from the score's bootstrap interval (:mod:`.scores`), so they say
  how much the published runs varied, not how another site's would.

Unlike :func:`ampcert.capacity_planning.capacity_plan`, nothing is extrapolated from throughput:
a published score already is a whole training run at its published scale.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from functools import partial
from operator import mul
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ampcert import formats
from ampcert.capacity_planning import J_PER_KWH, Pricing, load_pricing, scaled
from ampcert.errors import BadArgument
from ampcert.published.importer import PublishedBenchmark


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PublishedCapacityRow(_Model):
    submitter: str
    system: str
    benchmark: str
    round: str | None
    accelerator: str
    accelerators: int
    score_minutes: float | None = Field(description="MLPerf's time to train of one run")
    score_interval_minutes: list[float] | None
    wall_time_h: float | None = Field(description="N x score, one run after another")
    wall_time_h_range: list[float] | None
    accelerator_hours: float | None = Field(description="N x score x accelerators / 60")
    accelerator_hours_range: list[float] | None
    price_per_gpu_hour: float | None
    price_source: str | None
    cost: float | None
    cost_range: list[float] | None
    energy_kwh: float | None = Field(default=None, description="N x the benchmark's energy to train (nodes and "
                                     "switches where every switch is known, else nodes), kWh")
    energy_scope: str | None = Field(default=None, description="what the energy counts: nodes and switches, or nodes")
    energy_reason: str | None = Field(default=None, description="why energy is null")
    reason: str | None = Field(default=None, description="why a figure is null")


class PublishedCapacity(_Model):
    training_runs: int
    currency: str
    pricing: str
    pricing_sha256: str | None
    assumptions: list[str]
    rows: list[PublishedCapacityRow]


def training_plan(records: Sequence[PublishedBenchmark], training_runs: int, *,
                  price_per_gpu_hour: float | None = None, pricing: Pricing | str | None = None) -> PublishedCapacity:
    """Wall time, accelerator-hours and cost of ``training_runs`` runs on each imported system."""
    if training_runs < 1:
        raise BadArgument("training_runs", "expected at least 1 training run", training_runs)
    if price_per_gpu_hour is not None and not price_per_gpu_hour > 0:
        raise BadArgument("price_per_gpu_hour", "expected a positive price", price_per_gpu_hour)
    table = pricing if isinstance(pricing, Pricing) else load_pricing(pricing)
    n = training_runs
    rows = []
    for rec in records:
        fp, score = rec.fingerprint, rec.score
        minutes, interval = score.score_minutes, score.interval_minutes
        wall, wall_rng = scaled(minutes, interval, lambda m: n * m / 60)
        hours, hours_rng = (scaled(wall, wall_rng, partial(mul, fp.accelerators)) if fp.accelerators
                            else (None, None))
        found = table.lookup(fp.accelerator_model, price_per_gpu_hour)
        price, source = found if found else (None, None)
        cost, cost_rng = scaled(hours, hours_rng, partial(mul, price)) if price is not None else (None, None)
        reason = (f"no score: {score.no_score}" if minutes is None else
                  "no accelerators in the system description" if not fp.accelerators else
                  f"no price for {fp.accelerator_model!r} in {table.source}: pass --price-per-gpu-hour or --pricing"
                  if price is None else None)
        joules, scope = rec.energy.per_run()
        rows.append(PublishedCapacityRow(
            submitter=rec.submitter, system=rec.system, benchmark=rec.benchmark, round=rec.round,
            accelerator=fp.accelerator_model, accelerators=fp.accelerators, score_minutes=minutes,
            score_interval_minutes=interval, wall_time_h=wall, wall_time_h_range=wall_rng,
            accelerator_hours=hours, accelerator_hours_range=hours_rng, price_per_gpu_hour=price,
            price_source=source, cost=cost, cost_range=cost_rng, reason=reason,
            energy_kwh=None if joules is None else n * joules / J_PER_KWH, energy_scope=scope,
            energy_reason=None if joules is not None else rec.energy.no_figure or "no power logs"))
    source = "--price-per-gpu-hour" if price_per_gpu_hour is not None else f"{table.source} ({table.note or 'prices'})"
    assumptions = [
        f"{n:,} training run(s) of each system's published configuration, one after another; a run takes "
        "MLPerf's score (the olympic mean of the published runs x the review's scaling factor)",
        "accelerator-hours: wall time x the system's accelerators (nodes x accelerators per node, from its "
        "system description)",
        f"cost: accelerator-hours x price per accelerator-hour, prices from {source}",
        "ranges: the score's 95% bootstrap interval over the published runs",
        "energy: N x the benchmark's energy to train from its power logs (MLPerf's arithmetic, the switches' "
        "readings counted where they have them; docs/published.md); null where none were published",
    ]
    return PublishedCapacity(training_runs=n, currency=table.currency, pricing=source,
                         pricing_sha256=None if price_per_gpu_hour is not None else table.sha256 or None,
                         assumptions=assumptions, rows=rows)


def table_rows(plan: PublishedCapacity) -> list[dict[str, str]]:
    """One row of strings per system (terminal table)."""
    def rng(values: list[float] | None, f: Any) -> str:
        return f" ({f(values[0])}–{f(values[1])})" if values else ""

    def num(v: float | None) -> str:
        return formats.number(v, 3)

    return [{
        "system": f"{r.submitter} {r.system}",
        "benchmark": r.benchmark,
        "accelerators": f"{r.accelerators} x {r.accelerator}",
        "time to train min": num(r.score_minutes) + rng(r.score_interval_minutes, num),
        "wall time": formats.hours(r.wall_time_h) + rng(r.wall_time_h_range, formats.hours),
        "accelerator-hours": num(r.accelerator_hours) + rng(r.accelerator_hours_range, num),
        f"cost {plan.currency}": num(r.cost) + rng(r.cost_range, num) if r.cost is not None else "—",
        "energy kWh": num(r.energy_kwh) if r.energy_kwh is not None else "not published",
    } for r in plan.rows]


def notes(plan: PublishedCapacity) -> list[str]:
    return [f"{r.submitter} {r.system} {r.benchmark}: {r.reason}" for r in plan.rows if r.reason]


CSV_FIELDS = ["submitter", "system", "benchmark", "round", "accelerator", "accelerators", "score_minutes",
              "wall_time_h", "accelerator_hours", "price_per_gpu_hour", "price_source", "cost", "energy_kwh", "energy_scope", "energy_reason", "reason"]


def csv_text(plan: PublishedCapacity) -> str:
    """One line per system; ranges as _min/_max columns; empty cells where null."""
    out = io.StringIO()
    ranged = {"score_minutes": "score_interval_minutes", "wall_time_h": "wall_time_h_range",
              "accelerator_hours": "accelerator_hours_range", "cost": "cost_range"}
    fields = ["training_runs", "currency"]
    for f in CSV_FIELDS:
        fields += [f, f"{f}_min", f"{f}_max"] if f in ranged else [f]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in plan.rows:
        d = row.model_dump()
        line: dict[str, Any] = {"training_runs": plan.training_runs, "currency": plan.currency}
        for f in CSV_FIELDS:
            line[f] = d[f]
            if f in ranged:
                line[f"{f}_min"], line[f"{f}_max"] = d[ranged[f]] or (None, None)
        writer.writerow({k: "" if v is None else v for k, v in line.items()})
    return out.getvalue()
