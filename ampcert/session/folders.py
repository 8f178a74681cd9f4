"""A results folder brought up to date: certify, summary, report, sign; and re-certify, re-render, export.

Every command that leaves a results folder behind ends in :func:`finish`
(certify with the rule pack if there is one, write summary.json/html and
report.json/html, sign if a key is given), under the folder's lock, so run,
resume, merge, certify and report cannot drift apart.

Imports of the layers below are inside the functions: ``import ampcert.session``
(and so ``ampcert --help``) stays fast, and commands that do not train import
neither torch nor JAX (tests/cli/test_cli_imports.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampcert.errors import BadArgument, UserError
from ampcert.runner.signals import interruptible

if TYPE_CHECKING:
    from ampcert.certify.checks import Certificate
    from ampcert.report.mlperf_export import Exported
    from ampcert.results import ResultSet, RunResult
    from ampcert.runner.folder_lock import FolderLock


@dataclass(frozen=True)
class Finished:
    """A results folder brought up to date: what it holds and what was written."""

    root: Path
    results: ResultSet
    summary: dict[str, Any]
    report_json: Path
    report_html: Path
    certificate: Certificate | None = None
    envelope: Path | None = None
    warnings: list[str] = field(default_factory=list)
    # Set by run/resume: the shard this folder holds, the runs planned in the whole
    # suite and run here, and whether certification waits for `merge`.
    shard: dict[str, Any] | None = None
    planned: int | None = None
    ran: int | None = None
    certify_later: bool = False
    # Set by merge: {"merged": n, "runs": n, "missing": [...]}.
    merged: dict[str, Any] | None = None

    @property
    def failed(self) -> list[RunResult]:
        return [r for r in self.results.runs if r.status == "failed"]

    @property
    def passed(self) -> bool:
        """The run's verdict for an exit code: the certificate decides where there is one
        (an fp16 run without loss scaling is expected to fail, as evidence); else no run failed."""
        if self.certificate is not None:
            return self.certificate.status != "FAIL"
        return not self.failed or self.certify_later

    def to_json(self) -> dict[str, Any]:
        """What `--json` prints: the folder, the summary and the certificate."""
        out: dict[str, Any] = {
            "results": str(self.root), "summary": self.summary,
            "certificate": self.certificate.model_dump(mode="json") if self.certificate is not None else None}
        if self.merged is not None:
            out["merged"] = self.merged
        return out


def folder_lock(root: Path) -> FolderLock:
    """The results folder's lock (one invocation per folder)."""
    from ampcert.runner.folder_lock import FolderLock

    return FolderLock(root)


def existing_folder(folder: str | Path, what: str = "results folder") -> Path:
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"{root}: {what} not found")
    return root


def _certify(root: Path, rs: ResultSet, rules: str | Path | None) -> Certificate:
    """Evaluate a rule pack on stored results and write verdicts.json atomically."""
    from ampcert.certify import evaluate, load_rules
    from ampcert.results import ResultsDir, atomic_write_json

    cert = evaluate(rs.runs, load_rules(rules))
    atomic_write_json(ResultsDir(root).verdicts_file, cert)
    return cert


def finish_locked(root: Path, *, rules: str | Path | None, certify: bool, sign_key: str | Path | None) -> Finished:
    """:func:`finish` for a caller that holds the folder's lock already."""
    from ampcert.report import render, summary
    from ampcert.results import load

    rs = load(root)
    cert = _certify(root, rs, rules) if certify else None
    written = summary.write(rs)
    # The report shows the verdicts: it is rendered after them, from the folder alone.
    report_json, report_html = render.write(rs)
    envelope: Path | None = None
    warnings: list[str] = []
    if sign_key is not None:
        from ampcert.report.sign import sign_results

        envelope, warnings = sign_results(root, sign_key)
    return Finished(root=Path(root), results=rs, summary=written, report_json=report_json,
                    report_html=report_html, certificate=cert, envelope=envelope, warnings=warnings)


def finish(folder: str | Path, *, rules: str | Path | None = None, certify: bool | None = None,
           sign_key: str | Path | None = None) -> Finished:
    """Certify (when ``certify``, by default when ``rules`` is given), write the summary and
    the report, and sign them (with ``sign_key``): the end of every command that writes a folder."""
    root = Path(folder)
    # A signal: Interrupted, one line, exit 128 + signum; the atomic writers leave every file whole.
    with interruptible(), folder_lock(root):
        return finish_locked(root, rules=rules, certify=rules is not None if certify is None else certify,
                             sign_key=sign_key)


def certify(folder: str | Path, rules: str | Path | None = None) -> Finished:
    """Re-evaluate stored results against a rule pack (default: ``default``), without
    re-running anything; writes verdicts.json and re-renders the report that shows them."""
    from ampcert.results import ResultsDir, load

    with interruptible():
        root = existing_folder(folder)
        ResultsDir(root).read_plan()  # one clear line if this is not a results folder
        if not load(root).runs:
            raise UserError(f"{root}: no run results to certify")
        return finish(root, rules=rules, certify=True)


def report(folder: str | Path, *, csv: str | Path | None = None) -> Finished:
    """Re-render summary.json/html and report.json/html from stored results (same bytes
    every time); with ``csv``, also one row per run to that file."""
    from ampcert.results import load

    with interruptible():
        load(folder)  # one clear line for a folder that is not a results folder, before the lock
        done = finish(folder)
        if csv is not None:
            try:
                done.results.frame().to_csv(csv, index=False)
            except OSError as exc:
                raise BadArgument("csv", f"cannot write ({type(exc).__name__}: {exc.strerror})", csv) from None
        return done


def export_mlperf(folder: str | Path, out: str | Path) -> Exported:
    """Lay a results folder out as an MLPerf training submission under ``out``
    (``<org>/results/<system>/<benchmark>/result_N.txt``, ``<org>/systems/<system>.json``)
    and judge it with MLPerf's checkers; see :mod:`ampcert.report.mlperf_export`."""
    from ampcert.report.mlperf_export import export
    from ampcert.results import ResultsDir, load
    from ampcert.version import __version__

    with interruptible():
        root = existing_folder(folder)
        with folder_lock(root):  # not while a run is writing the folder
            environment = ResultsDir(root).read_plan().environment or {}
            return export(load(root), Path(out), environment, f"ampcert {__version__}")
