"""Published MLPerf Training results: importing them (``import_mlperf``) and planning from
imported folders (``published_capacity``); see :mod:`ampcert.published`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampcert.errors import BadArgument, UserError
from ampcert.runner.signals import interruptible

if TYPE_CHECKING:
    from ampcert.published.capacity import PublishedCapacity
    from ampcert.published.importer import PublishedBenchmark
    from ampcert.published.system_comparison import SystemComparison


@dataclass(frozen=True)
class Imported:
    """What ``import_mlperf`` wrote: one folder per (system, benchmark), and each one's record."""

    out: Path
    folders: list[Path] = field(default_factory=list)
    records: list[PublishedBenchmark] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No MLPerf check failed on any imported folder, and every folder has a score (one
        without, its runs all dropped or too few counted, is imported with its reason)."""
        return not any(rec.rejected or rec.score.score_minutes is None for rec in self.records)

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out), "ok": self.ok, "imported": [
            {"folder": str(folder), "submitter": rec.submitter, "system": rec.system, "benchmark": rec.benchmark,
             "round": rec.round, "division": rec.division, "availability": rec.availability,
             "accelerators": rec.fingerprint.accelerators, "accelerator": rec.fingerprint.accelerator_model,
             "precision": rec.precision.disclosed, "logs": len(rec.logs),
             "score": rec.score.model_dump(exclude={"runs"}),
             "energy": rec.energy.model_dump(exclude={"runs"}),
             "mlperf_checks": {c.name: c.status for c in rec.reverification.checks},
             "ruleset": rec.reverification.ruleset, "rejected": rec.rejected}
            for folder, rec in zip(self.folders, self.records, strict=True)]}


def import_mlperf(paths: Sequence[str | Path], out: str | Path, *, round: str | None = None) -> Imported:  # noqa: A002
    """Import published MLPerf Training results (a round, a submitter's folder or a system's
    benchmark folder, each of ``paths``) into ``out``: one folder per (system, benchmark) with
    the original logs, their digests, the system fingerprint and MLPerf's score. Every path is
    read and checked before anything is written."""
    from ampcert.published.importer import find_benchmarks, read_benchmark, write_planned

    if not paths:
        raise BadArgument("paths", "expected at least one folder to import")
    with interruptible():
        found = [b for p in paths for b in find_benchmarks(Path(p), round)]
        seen: dict[tuple[str, str, str], Path] = {}
        planned = []
        for where in found:
            key = (where.submitter_dir.name, where.system, where.benchmark)
            if key in seen and seen[key] != where.folder.resolve():
                raise UserError(f"{where.folder}: {'/'.join(key)} is also at {seen[key]}; import them into "
                                "separate folders")
            if key not in seen:
                seen[key] = where.folder.resolve()
                planned.append(read_benchmark(where))
        folders = write_planned(planned, Path(out))
        return Imported(Path(out), folders, [p.record for p in planned])


def imported_folders(source: Path) -> list[Path]:
    """``source`` if it is an imported folder, else the imported folders below it: an import's ``out``
    (``<submitter>/<system>/<benchmark>/``), a submitter's or a system's folder in it."""
    from ampcert.published.importer import PUBLISHED_FILE, is_imported

    if is_imported(source):
        return [source]
    if not source.is_dir():
        return []
    # Hidden folders are not imports: an import builds each folder under a hidden name first.
    return sorted(p.parent for depth in (1, 2, 3) for p in source.glob("*/" * depth + PUBLISHED_FILE)
                  if not any(part.startswith(".") for part in p.relative_to(source).parts))


def published_capacity(folders: Sequence[Path], training_runs: int | None, *,
                       price_per_gpu_hour: float | None = None,
                       pricing: str | Path | None = None) -> PublishedCapacity:
    """Wall time, accelerator-hours and cost of ``training_runs`` runs on each imported system."""
    from ampcert.published.capacity import training_plan
    from ampcert.published.importer import load_published

    if training_runs is None:
        raise BadArgument("training_runs", "an imported MLPerf result is planned in training runs, not samples")
    with interruptible():
        return training_plan([load_published(f) for f in folders], training_runs,
                             price_per_gpu_hour=price_per_gpu_hour,
                             pricing=str(pricing) if pricing is not None else None)


@dataclass(frozen=True)
class SystemsCompared:
    """What ``compare_systems`` wrote: the comparison, its files and, when signed, the envelope."""

    comparison: SystemComparison
    rows: list[dict[str, str]]   # the table's cells, as the Markdown and HTML show them
    written: list[Path]
    envelope: Path | None = None
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"written": [str(p) for p in self.written], "envelope": str(self.envelope) if self.envelope else None,
                "comparison": self.comparison.model_dump(mode="json")}


def compare_systems(folders: Sequence[str | Path], out: str | Path, *, benchmark: str | None = None,
                    pricing: str | Path | None = None, price_per_gpu_hour: float | None = None,
                    sign_key: str | Path | None = None) -> SystemsCompared:
    """Compare systems for one benchmark: imported MLPerf results (``import_mlperf``'s folders, or its
    ``out``) and ampcert's own results folders, side by side; writes comparison.json, .md and .html in
    ``out`` (and comparison.dsse.json with ``sign_key``)."""
    from ampcert.capacity_planning import load_pricing
    from ampcert.published.importer import load_published
    from ampcert.published.system_comparison import compare
    from ampcert.report import systems
    from ampcert.results import ResultsDir, load

    if not folders:
        raise BadArgument("folders", "expected at least one folder to compare")
    if price_per_gpu_hour is not None and not price_per_gpu_hour > 0:
        raise BadArgument("price_per_gpu_hour", "expected a positive price", price_per_gpu_hour)
    with interruptible():
        published, measured = [], []
        for given in map(Path, folders):
            if imported := imported_folders(given):
                published += [(f, load_published(f)) for f in imported]
            elif ResultsDir(given).plan_file.is_file():
                rs = load(given)
                verdicts = ResultsDir(given).verdicts_file
                certificate = _certificate(verdicts) if verdicts.is_file() else None
                measured.append((given, rs, certificate))
            else:
                raise UserError(f"{given}: neither imported MLPerf results (`ampcert import mlperf`) nor an ampcert "
                                "results folder")
        target = Path(out)

        def shown(folder: Path) -> str:  # relative to the output: the same however the paths were typed
            return Path(os.path.relpath(folder.resolve(), target.resolve())).as_posix()

        comparison = compare(_once(published), measured, benchmark, load_pricing(pricing), price_per_gpu_hour,
                             shown)
        if target.exists() and not target.is_dir():
            raise UserError(f"{target}: exists and is not a folder")
        rows = [systems.cells(row, comparison.currency) for row in comparison.rows]
        if sign_key is not None:
            from ampcert.report.sign import load_private_key

            load_private_key(sign_key)  # a key that cannot sign is bad input, found before anything is written
        written = systems.write(comparison, target)
        if sign_key is None:
            (target / systems.ENVELOPE).unlink(missing_ok=True)  # an older signature would not match these files
            return SystemsCompared(comparison, rows, written)
        envelope, warnings = systems.sign(comparison, target, sign_key)
        return SystemsCompared(comparison, rows, written, envelope, warnings)


def _certificate(path: Path) -> str | None:
    """The certificate's verdict in a folder's verdicts.json (None where it does not say)."""
    import json

    try:
        status = json.loads(path.read_text(encoding="utf-8")).get("status")
    except (OSError, ValueError, AttributeError):
        return None
    return status if isinstance(status, str) else None


def _once(published: list[tuple[Path, PublishedBenchmark]]) -> list[tuple[Path, PublishedBenchmark]]:
    """Each imported system once: the same import named twice (a folder and its ``out``) counts once; two
    different imports of one system and benchmark are refused (which would the comparison show?)."""
    seen: dict[tuple[str, str, str, str | None], tuple[Path, PublishedBenchmark]] = {}
    for folder, rec in published:
        key = (rec.submitter, rec.system, rec.benchmark, rec.round)
        if key in seen and seen[key][1] != rec:
            raise UserError(f"{folder}: {rec.submitter} {rec.system} {rec.benchmark} is also imported, differently, "
                            f"at {seen[key][0]}; compare one import of it")
        seen.setdefault(key, (folder, rec))
    return list(seen.values())
