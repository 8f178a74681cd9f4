"""Published MLPerf Training results: importing them (``import_mlperf``) and planning from
imported folders (``published_capacity``); see :mod:`ampcert.published`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampcert.errors import BadArgument, UserError
from ampcert.runner.signals import interruptible

if TYPE_CHECKING:
    from ampcert.published.importer import PublishedBenchmark
    from ampcert.published.plan import PublishedPlan


@dataclass(frozen=True)
class Imported:
    """What ``import_mlperf`` wrote: one folder per (system, benchmark), and each one's record."""

    out: Path
    folders: list[Path] = field(default_factory=list)
    records: list[PublishedBenchmark] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No MLPerf check failed on any imported folder."""
        return not any(rec.rejected for rec in self.records)

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
    """``source`` if it is an imported folder, else the imported folders below it (an import's ``out``)."""
    from ampcert.published.importer import PUBLISHED_FILE, is_imported

    if is_imported(source):
        return [source]
    return sorted(p.parent for p in source.glob(f"*/*/*/{PUBLISHED_FILE}")) if source.is_dir() else []


def published_capacity(folders: Sequence[Path], training_runs: int | None, *,
                       price_per_gpu_hour: float | None = None,
                       pricing: str | Path | None = None) -> PublishedPlan:
    """Wall time, accelerator-hours and cost of ``training_runs`` runs on each imported system."""
    from ampcert.published.importer import load_published
    from ampcert.published.plan import training_plan

    if training_runs is None:
        raise BadArgument("training_runs", "an imported MLPerf result is planned in training runs, not samples")
    with interruptible():
        return training_plan([load_published(f) for f in folders], training_runs,
                             price_per_gpu_hour=price_per_gpu_hour,
                             pricing=str(pricing) if pricing is not None else None)
