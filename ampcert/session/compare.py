"""Comparing against a baseline: the regression gate (``compare``) and capacity planning, and their files.

``compare`` judges NEW against one BASELINE (two folders or report.json
files); the nightly gate against a history of nights is :mod:`.history`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ampcert.errors import UserError
from ampcert.runner.signals import interruptible

if TYPE_CHECKING:
    from ampcert.gate import GateResult
    from ampcert.plan import CapacityPlan


def write_files(files: Iterable[tuple[str | Path | None, str]]) -> list[Path]:
    """Write each (path, text) whose path is given, atomically; the paths written.
    The one writer of every output file a comparison asks for (JSON, Markdown,
    HTML, CSV): a path that cannot be written is one line naming it."""
    from ampcert.results import atomic_write_text

    written = []
    with interruptible():
        for path, text in files:
            if path is None:
                continue
            try:
                atomic_write_text(path, text)
            except OSError as exc:
                raise UserError(f"{path}: cannot write ({type(exc).__name__}: {exc.strerror or exc})") from None
            written.append(Path(path))
    return written


def compare(baseline: str | Path, new: str | Path, *, gate: str | Path | None = None) -> GateResult:
    """The baseline gate: ``new`` against ``baseline`` (report.json files or results folders)."""
    from ampcert import gate as regression

    with interruptible():
        return regression.compare(regression.load_source(Path(baseline)), regression.load_source(Path(new)),
                                  regression.load_gate(Path(gate) if gate is not None else None))


def write_gate_outputs(result: GateResult, json_path: str | Path | None, markdown: str | Path | None) -> list[Path]:
    """The baseline gate's JSON and Markdown files (atomically); the paths written."""
    from ampcert.gate.output import to_markdown

    return write_files([(json_path, result.model_dump_json(indent=1) + "\n"),
                        (markdown, to_markdown(result) if markdown is not None else "")])


@dataclass(frozen=True)
class Capacity:
    plan: CapacityPlan
    suite: str
    rows: list[dict[str, str]]
    notes: list[str]


def capacity(source: str | Path, target_samples: int, *, gpus: int = 1, price_per_gpu_hour: float | None = None,
             pricing: str | Path | None = None) -> Capacity:
    """Capacity plan from a report.json or a results folder: wall time, GPU-hours,
    energy and cost of ``target_samples`` samples on ``gpus`` devices per precision."""
    from ampcert import gate as regression
    from ampcert import plan as planning

    with interruptible():
        side = regression.load_source(Path(source))
        cp = planning.capacity_plan(side.runs, target_samples, gpus, price_per_gpu_hour, pricing)
        if not cp.rows:
            raise UserError(f"{source}: no run results to plan from")
        return Capacity(cp, side.suite_name, planning.table_rows(cp), cp.assumptions + planning.notes(cp))


def write_capacity(cap: Capacity, *, csv: str | Path | None, json_path: str | Path | None) -> list[Path]:
    """The capacity plan's CSV and JSON files (atomically); the paths written."""
    from ampcert import plan as planning

    return write_files([(csv, planning.csv_text(cap.plan)), (json_path, cap.plan.model_dump_json(indent=1) + "\n")])
