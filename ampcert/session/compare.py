"""Comparing against a baseline: the regression gate (``compare``) and capacity planning, and their files.

``compare`` judges NEW against one BASELINE (two folders or report.json
files); the nightly gate against a history of nights is :mod:`.history`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ampcert.errors import BadArgument, UserError
from ampcert.runner.signals import interruptible

if TYPE_CHECKING:
    from ampcert.capacity_planning import CapacityPlan
    from ampcert.gate import GateResult
    from ampcert.published.capacity import PublishedCapacity


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
    plan: CapacityPlan | PublishedCapacity
    suite: str
    rows: list[dict[str, str]]
    notes: list[str]


def capacity(source: str | Path, target_samples: int | None = None, *, gpus: int = 1,
             price_per_gpu_hour: float | None = None, pricing: str | Path | None = None,
             global_batch: int | None = None, device_memory: str | int | None = None,
             training_runs: int | None = None) -> Capacity:
    """Capacity plan from a report.json or a results folder: wall time, GPU-hours,
    energy and cost of ``target_samples`` samples on ``gpus`` devices per precision; with
    ``global_batch``, the devices of ``device_memory`` (``80GiB``; default: the memory the
    sweep ran on) each precision needs for it, from the folder's memory sweep.

    From imported MLPerf results (a folder of ``ampcert import mlperf``, or its ``out``):
    wall time, accelerator-hours and cost of ``training_runs`` training runs per system."""
    from ampcert import capacity_planning as measured
    from ampcert import gate as regression
    from ampcert.session.published import imported_folders, published_capacity

    with interruptible():
        if imported := imported_folders(Path(source)):
            given = [name for name, value in (("target_samples", target_samples), ("global_batch", global_batch),
                                              ("device_memory", device_memory), ("gpus", None if gpus == 1 else gpus))
                     if value is not None]
            if given:
                raise BadArgument(given[0], f"{source} holds imported MLPerf results: plan them in training_runs "
                                  "(each system's own accelerators)")
            from ampcert.published import capacity as published

            pp = published_capacity(imported, training_runs, price_per_gpu_hour=price_per_gpu_hour,
                                    pricing=pricing)
            return Capacity(pp, "imported MLPerf results", published.table_rows(pp),
                            pp.assumptions + published.notes(pp))
        if training_runs is not None:
            raise BadArgument("training_runs", f"{source} is not an imported MLPerf result: plan it in target_samples")
        if target_samples is None:
            raise BadArgument("target_samples", "expected the training samples to plan for")
        side = regression.load_source(Path(source))
        fits = _memory_fits(Path(source)) if global_batch is not None else []
        if global_batch is not None and not fits:
            raise UserError(f"{source}: no memory sweep to fit a global batch with (a suite's "
                            "`memory: {batch_sizes: [...]}`, docs/suites.md)")
        cp = measured.capacity_plan(side.runs, target_samples, gpus, price_per_gpu_hour, pricing,
                                    global_batch=global_batch, memory_fits=fits,
                                    device_memory=_size(device_memory, "--device-memory"))
        if not cp.rows:
            raise UserError(f"{source}: no run results to plan from")
        return Capacity(cp, side.suite_name, measured.table_rows(cp), cp.assumptions + measured.notes(cp))


def _memory_fits(source: Path) -> list:
    """The memory sweep's fits of a results folder (fitted now) or a report.json (as stored)."""
    import json

    from ampcert.configio import parse_model
    from ampcert.memory import MemoryFit
    from ampcert.report.model import memory_fits
    from ampcert.results import load

    if source.is_dir():
        return memory_fits(load(source))
    stored = json.loads(source.read_text(encoding="utf-8")).get("memory") or []  # load_source read it already
    if not isinstance(stored, list):
        raise UserError(f"{source}: memory: expected a list of memory fits")
    return [parse_model(MemoryFit, item, f"{source}: memory[{i}]") for i, item in enumerate(stored)]


def _size(value: str | int | None, name: str) -> int | None:
    """A memory size as bytes (``80GiB``, ``24GB``, ``512MiB`` or a number of bytes)."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    if value is None:
        return None
    try:
        size = int(TypeAdapter(ByteSize).validate_python(value))
    except ValidationError as exc:
        raise UserError(f"{name}: expected a size such as 80GiB, 24GB or 512MiB, got {value!r} "
                        f"({exc.errors()[0]['msg']})") from None
    if size < 1:
        raise UserError(f"{name}: expected a positive size, got {value!r}")
    return size


def write_capacity(cap: Capacity, *, csv: str | Path | None, json_path: str | Path | None) -> list[Path]:
    """The capacity plan's CSV and JSON files (atomically); the paths written."""
    from ampcert import capacity_planning as measured
    from ampcert.published import capacity as published

    text = (measured.csv_text(cap.plan) if isinstance(cap.plan, measured.CapacityPlan)
            else published.csv_text(cap.plan))
    return write_files([(csv, text), (json_path, cap.plan.model_dump_json(indent=1) + "\n")])
