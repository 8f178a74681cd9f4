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

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampcert.errors import BadArgument, UserError
from ampcert.runner.signals import interruptible
from ampcert.vocabulary import Status

if TYPE_CHECKING:
    from ampcert.certify.checks import Certificate
    from ampcert.certify.rules import RulePack
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
    # Set by certify. what_if: nothing was written (a signed folder, re-evaluated as a
    # what-if: every file is as it was, so its signature still verifies; the summary is
    # computed, and report_json/report_html are the folder's own, unchanged). source: the
    # folder judged, where the re-evaluation went to a new folder (``out``, this root).
    # removed_envelope: the envelope that ``force`` removed, as the rewrite voided it.
    what_if: bool = False
    source: Path | None = None
    removed_envelope: Path | None = None

    @property
    def failed(self) -> list[RunResult]:
        return [r for r in self.results.runs if r.status == "failed"]

    @property
    def passed(self) -> bool:
        """The run's verdict for an exit code: the certificate decides where there is one
        (an fp16 run without loss scaling is expected to fail, as evidence); else no run failed."""
        if self.certificate is not None:
            return self.certificate.status not in (Status.FAIL, Status.INCOMPLETE)
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


def _certify(root: Path, rs: ResultSet, rules: str | Path | RulePack | None) -> Certificate:
    """Evaluate a rule pack (a reference, or a pack already read) on stored results and
    write verdicts.json atomically."""
    from ampcert.certify import evaluate, load_rules
    from ampcert.certify.rules import RulePack
    from ampcert.results import ResultsDir, atomic_write_json

    cert = evaluate(rs.runs, rules if isinstance(rules, RulePack) else load_rules(rules), rs.memory_runs,
                    rs.missing)
    atomic_write_json(ResultsDir(root).verdicts_file, cert)
    return cert


def finish_locked(root: Path, *, rules: str | Path | RulePack | None, certify: bool,
                  sign_key: str | Path | None) -> Finished:
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


def finish(folder: str | Path, *, rules: str | Path | RulePack | None = None, certify: bool | None = None,
           sign_key: str | Path | None = None) -> Finished:
    """Certify (when ``certify``, by default when ``rules`` is given), write the summary and
    the report, and sign them (with ``sign_key``): the end of every command that writes a folder."""
    root = Path(folder)
    # A signal: Interrupted, one line, exit 128 + signum; the atomic writers leave every file whole.
    with interruptible(), folder_lock(root):
        return finish_locked(root, rules=rules, certify=rules is not None if certify is None else certify,
                             sign_key=sign_key)


def certify(folder: str | Path, rules: str | Path | None = None, *, out: str | Path | None = None,
            force: bool = False) -> Finished:
    """Re-evaluate stored results against a rule pack (default: ``default``), without
    re-running anything.

    An unsigned folder: writes verdicts.json and re-renders the summary and the report
    that show them. A signed folder (report.dsse.json beside the report) is a what-if:
    nothing in it is written, so its signature still verifies, and the certificate is
    returned (``what_if``). With ``out``, the re-evaluation of either kind of folder is
    written to a new results folder there (a copy of the folder, certified and
    re-rendered, unsigned), and the folder is left as it was. With ``force``, a signed
    folder is rewritten anyway; its envelope, which would no longer verify, is removed."""
    from ampcert.certify import load_rules
    from ampcert.report.sign import ENVELOPE
    from ampcert.results import ResultsDir, load

    with interruptible():
        root = existing_folder(folder)
        plan = ResultsDir(root).read_plan()  # one clear line if this is not a results folder
        if not load(root).runs:
            raise UserError(f"{root}: no run results to certify")
        if out is not None:
            if force:
                raise BadArgument("force", "rewrites the results folder itself, and out leaves it as it is: "
                                  "give one of the two")
            load_rules(rules)  # a bad pack: one line, before the new folder is made
            return _certify_into(root, Path(out), rules, [r.run_id for r in plan.runs])
        envelope = root / ENVELOPE
        if not envelope.exists():
            return finish(root, rules=rules, certify=True)
        with _reading(root):
            if not force:
                rs = load(root)
                return _what_if(root, rs, _evaluate(rs, rules))
            done = finish_locked(root, rules=rules, certify=True, sign_key=None)
            # Last, once the new files are whole: an interrupted rewrite leaves the envelope,
            # and `verify` then says that the report changed, which is true.
            envelope.unlink(missing_ok=True)
            return replace(done, removed_envelope=envelope)


def _evaluate(rs: ResultSet, rules: str | Path | None) -> Certificate:
    """The certificate of a rule pack on loaded results, nothing written."""
    from ampcert.certify import evaluate, load_rules

    return evaluate(rs.runs, load_rules(rules), rs.memory_runs, rs.missing)


def _what_if(root: Path, rs: ResultSet, cert: Certificate) -> Finished:
    from ampcert.report import summary

    return Finished(root=root, results=rs, summary=summary.build(rs), report_json=root / "report.json",
                    report_html=root / "report.html", certificate=cert, what_if=True)


def _reading(root: Path) -> Any:
    """The folder's lock, so that no run writes while it is read; none for a folder this
    user cannot write (an archived, read-only copy: nothing can be writing it either)."""
    import contextlib
    import os

    return folder_lock(root) if os.access(root, os.W_OK) else contextlib.nullcontext()


def _certify_into(root: Path, out: Path, rules: str | Path | None, run_ids: list[str]) -> Finished:
    """Copy ``root`` to the new folder ``out`` (all but its envelope and lock), certify
    and render it there; ``root`` is only read."""
    import shutil

    from ampcert.report.sign import ENVELOPE
    from ampcert.runner.planning import prepare_out_dir

    try:
        inside = out.resolve().is_relative_to(root.resolve())
    except OSError as exc:
        raise BadArgument("out", f"cannot use this folder: {exc.strerror or exc}", out) from None
    if inside:
        raise BadArgument("out", f"is inside the results folder {root}; choose a folder outside it", out)
    try:
        used = out.is_dir() and any(out.iterdir())
    except OSError as exc:
        raise BadArgument("out", f"cannot use this folder: {exc.strerror or exc}", out) from None
    if used:
        raise BadArgument("out", "is not empty; the re-evaluation goes to a new (or empty) folder", out)
    prepare_out_dir(out, run_ids)  # new or empty, writable, its paths within the file system's limits

    def left_out(folder: str, names: list[str]) -> set[str]:
        top = {ENVELOPE, ".lock"} if Path(folder) == root else set()
        return {n for n in names if n in top or (n.startswith(".") and n.endswith(".tmp"))}

    with _reading(root), folder_lock(out):
        try:
            # symlinks=True: a link is copied as a link, never what it points to (and
            # the copy's runs are then refused as a folder holding one, as any folder's).
            shutil.copytree(root, out, symlinks=True, ignore=left_out, dirs_exist_ok=True)
        except shutil.Error as exc:  # every file that could not be copied: the first, in words
            first = exc.args[0][0] if exc.args and isinstance(exc.args[0], list) and exc.args[0] else None
            why = f"{first[0]}: {first[2]}" if isinstance(first, tuple) and len(first) == 3 else str(exc)
            raise UserError(f"{root}: cannot copy it to {out} ({' '.join(why.split())})") from None
        done = finish_locked(out, rules=rules, certify=True, sign_key=None)
    return replace(done, source=root)


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
