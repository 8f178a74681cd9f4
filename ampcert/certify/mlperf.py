"""MLPerf's own tools (mlperf-logging) over ampcert's logs and over published results.

ampcert's workloads are not MLPerf benchmarks, so only the training
ruleset's COMMON rules apply (``training_6.1.0/common.yaml``): the
submission and run-config disclosure, the init/run interval order, block
and evaluation metadata, the precision disclosure. The checker's
submission_division rule enqueues a per-division file that in turn loads
``<division>_<benchmark>.yaml``, which exists only for MLPerf's own
benchmarks and crashes for ours; :func:`check_common` drops that hook for
the duration of one check. :func:`check_system_description` and
:func:`summarize` serve ampcert's MLPerf export.

:func:`reverify` re-verifies ONE published benchmark folder
(``<submitter>/results/<system>/<benchmark>/``) with the ruleset of its round
(``v5.1``: training 5.1.0), as MLPerf's tools judge it: the compliance checker
with the benchmark's full rules over each result file, the system-description
checker, the RCP check as MLPerf's RCP checker says it, then ampcert's own
finding beside it (``scaling factor (ampcert)``: the factor the RCP checker
computes against the published ``scaling.json``, 1.0 without one; MLPerf's
tools do not compare them, and its review may set another), the result
summarizer's score and the package checker over a package of that one system
and benchmark. Compliance passes as MLPerf accepts a folder: at most one file failing (four for unet3d),
dropped by olympic scoring. The RCP step deletes and rewrites ``scaling.json``
and the summarizer and package checker run it too, so those steps run on
copies in a temporary folder: the input is only read. The copies hold each
result log's ``:::MLLOG`` lines alone (:func:`_lean_copy`): every one of
MLPerf's checkers reads those lines and skips the rest, so the verdicts are the
same, while the rest of a job's output (framework warnings, NCCL's, progress)
may be hundreds of MB that each checker would read again. Over more than
:data:`MAX_CHECKED_EVENTS` of those lines the checkers are not run, which the
result says with the count (their memory grows with every event). What a checker finds
(its crash included) comes back as data (:class:`Reverification`), never as an
exception.

This module is the only one that imports mlperf_logging: its checkers keep
module-level state (the enqueued configs), log through the root logger, print
and warn, so every use is isolated by a lock-free, restore-always wrapper
(:func:`_common_rules_only`, :func:`_isolated`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import version as _package_version
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ampcert import mllog
from ampcert.errors import UserError
from ampcert.regular_files import CHUNK

RULESET = "training"
VERSION = "6.1.0"
ROOT = f"{RULESET}_{VERSION}/common.yaml"


@dataclass(frozen=True)
class MlperfCheck:
    """One log's verdict: ``errors`` make it fail, ``warnings`` do not."""

    path: str
    ok: bool
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def violations(self) -> list[tuple[int, str]]:
        """(line, one-line message) per error; line 0 where the rule is about
        the whole log (a key missing or repeated)."""
        return [one_line(msg) for msg in self.errors]


_LINE = re.compile(r"failed in line (\d+)")


def one_line(msg: str) -> tuple[int, str]:
    """The checker's multi-line message (the rule, the offending log line, the
    failed expression, its whole state) as the line it names and one line:
    the rule and the failed expression, which say what is wrong."""
    parts = msg.strip().splitlines()
    match = _LINE.search(parts[0]) if parts else None
    text = parts[0].rstrip(":") if parts else "MLPerf common rules failed"
    failed = next((p for p in parts if p.startswith("failed test:")), None)
    if failed:
        text += f" ({failed})"
    return (int(match.group(1)) if match else 0), " ".join(text.split())


@contextlib.contextmanager
def _common_rules_only() -> Iterator[Any]:
    """mlperf_logging's compliance module with the division hook dropped (see
    the module doc) and its root-logger chatter silenced, restored on exit."""
    from mlperf_logging.compliance_checker import mlp_compliance as mc

    original = mc.enqueue_config
    # The checker also logs its findings through the root logger (to stderr);
    # they come back in the result instead, one line each.
    was_disabled = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    # Only the root config; the division hook loads per-benchmark files (see the module doc).
    mc.enqueue_config = lambda config: original(config) if config == ROOT else None
    mc.enqueued_configs.clear()  # module-level: a previous check's queue must not leak in
    try:
        yield mc
    finally:
        mc.enqueue_config = original
        mc.enqueued_configs.clear()
        logging.disable(was_disabled)


def check_common(path: str | Path) -> MlperfCheck:
    """Run MLPerf training 6.1.0's common rules over one MLLOG file."""
    with _common_rules_only() as mc:
        checker = mc.make_checker(RULESET, VERSION, quiet=True, werror=False)
        ok = bool(checker.check_file(str(path), ROOT))
    errors = [str(msg) for msg in (*checker.overwritable.values(), *checker.not_overwritable)]
    warnings = [str(msg) for msg in checker.warnings.values()]
    if not ok and not errors:  # the checker failed without saying why (it prints when not quiet)
        errors = ["MLPerf common rules failed without a message"]
    return MlperfCheck(str(path), ok, errors, warnings)


class _Collect(logging.Handler):
    def __init__(self, level: int = logging.ERROR) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.messages.append(record.getMessage())


def check_system_description(path: str | Path, version: str = VERSION) -> list[str]:
    """MLPerf's system-description checker (training ``version``) over one
    ``systems/<name>.json``: the reasons it rejects the file (none when it
    passes). The checker says why only through the root logger, so its ERROR
    records are collected."""
    from mlperf_logging.system_desc_checker.system_desc_checker import check_system_desc

    collect = _Collect()
    logging.root.addHandler(collect)
    try:
        valid = check_system_desc(str(path), RULESET, version)[0]
    finally:
        logging.root.removeHandler(collect)
    if valid:
        return []
    return [" ".join(m.split()) for m in collect.messages] or ["MLPerf's system description checker failed"]


def summarize(org_folder: str | Path, benchmarks: list[str]) -> list[dict[str, Any]]:
    """MLPerf's result summarizer over one organisation's folder
    (``results/<system>/<benchmark>/result_N.txt`` and ``systems/<system>.json``):
    one row per system (``system_id``: its file's name), each benchmark's score in minutes (MLPerf's olympic
    average of time-to-train over the result files: the fastest and the
    slowest dropped; ``None`` with fewer than three).

    The summarizer's table has a column per MLPerf benchmark and reads each
    result through the common rules with the division hook; both are pointed
    at ``benchmarks`` and the common rules for the call. What it prints (its
    notices) is discarded: the rows say the same."""
    from mlperf_logging.result_summarizer import result_summarizer as rs

    allowed = rs.get_allowed_benchmarks
    rs.get_allowed_benchmarks = lambda usage, ruleset: list(benchmarks)
    try:
        with _common_rules_only(), contextlib.redirect_stdout(io.StringIO()):
            table = rs.summarize_results(str(org_folder), RULESET, VERSION)[0]
    finally:
        rs.get_allowed_benchmarks = allowed
    rows = []
    for row in table.to_dict(orient="records"):
        row = {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}  # NaN: no score
        # The row names the system by its pretty name; its details link ends in the file's name.
        row["system_id"] = str(row.get("details_url") or "").rsplit("/", 1)[-1].removesuffix(".json")
        rows.append(row)
    return rows


# --- Re-verification of one published benchmark folder --------------------------------

Status = Literal["passed", "failed", "not run"]
# The most MLLOG lines (a benchmark folder's result logs together) MLPerf's checkers are run
# over. They keep each event as Python objects, about 2 KB apiece, and parse every log about
# five times (49 parses for 10 logs): 960,000 events took 1.8 GB and 5 minutes
# (benchmarks/log_memory.py), against an import's bound of 300 MB and 60 s. Published logs
# hold 100-500 events each (the fixtures' largest: 503), so the cap is 100 times that.
MAX_CHECKED_EVENTS = 50_000
COMPLIANCE, SYSTEM, RCP, SUMMARIZER, PACKAGE = (
    "compliance", "system description", "rcp", "summarizer", "package")
# ampcert's own finding, not one of MLPerf's checks: the scaling factor the RCP checker
# computes against the one published (MLPerf's RCP check passes either way).
SCALING = "scaling factor (ampcert)"
CHECKS = (COMPLIANCE, SYSTEM, RCP, SCALING, SUMMARIZER, PACKAGE)
_ROUND = re.compile(r"(?:training_results_)?v?(\d+)\.(\d+)(?:\.(\d+))?")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileCheck(_Model):
    """The compliance checker's verdict on one result file, one line a message."""

    file: str
    ok: bool
    errors: list[str] = []
    warnings: list[str] = []


class Check(_Model):
    """One of MLPerf's tools over the folder: ``name`` (one of :data:`CHECKS`),
    its verdict, what it says in one line, its error and warning lines, and for
    the compliance check each result file's verdict."""

    name: str
    status: Status
    detail: str
    errors: list[str] = []
    warnings: list[str] = []
    files: list[FileCheck] = []


class Reverification(_Model):
    """What MLPerf's tools say about one published benchmark folder. ``reason``:
    why none of them ran (a round or benchmark this mlperf-logging does not know);
    ``rcp_scaling_factor``: the factor MLPerf's RCP step writes (1.0 where it writes
    none; None where it did not pass or run); ``published_scaling_factor``: the
    folder's ``scaling.json`` (1.0 without one; None when unreadable)."""

    folder: str
    submitter: str
    system: str
    benchmark: str
    round: str | None
    ruleset: str | None
    mlperf_logging: str
    reason: str | None = None
    checks: list[Check]
    rcp_scaling_factor: float | None = None
    published_scaling_factor: float | None = None
    summarizer_minutes: float | None = None

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    @property
    def passed(self) -> bool:
        return all(c.status == "passed" for c in self.checks)


def training_rulesets() -> list[str]:
    """The training rulesets this mlperf-logging ships (``5.1.0``), oldest first."""
    from mlperf_logging.compliance_checker import mlp_compliance as mc

    found = (re.fullmatch(r"training_(\d+\.\d+\.\d+)", p.name) for p in Path(mc.__file__).parent.iterdir())
    return sorted((m.group(1) for m in found if m), key=lambda v: tuple(map(int, v.split("."))))


def round_name(text: str) -> str | None:
    """An MLPerf Training round as ``X.Y`` from how it is written (``v5.1``, ``5.1``, ``5.1.0``,
    ``training_results_v5.1``), or None where ``text`` is not one."""
    m = _ROUND.fullmatch(text.strip())
    return f"{int(m.group(1))}.{int(m.group(2))}" if m else None


def round_of_folder(folder: Path) -> str | None:
    """The round of the ``training_results_vX.Y`` folder that ``folder`` is (or is in), or None."""
    folder = folder.resolve()
    return next((found for p in (folder, *folder.parents) if p.name.startswith("training_results_v")
                 and (found := round_name(p.name))), None)


def ruleset_for(round: str) -> tuple[str | None, str]:
    """The training ruleset of an MLPerf round (``v5.1`` -> ``5.1.0``), or None
    and why not."""
    m = _ROUND.fullmatch(round.strip())
    if not m:
        return None, f"round {round!r}: expected a training round such as v5.1"
    ruleset = f"{m.group(1)}.{m.group(2)}.{m.group(3) or 0}"
    shipped = training_rulesets()
    if ruleset not in shipped:
        return None, (f"round {round}: mlperf-logging {_mlperf_logging_version()} has no training "
                      f"ruleset {ruleset} (it ships {', '.join(shipped)})")
    return ruleset, ""


def _mlperf_logging_version() -> str:
    return _package_version("mlperf-logging")


@dataclass
class _Captured:
    log: _Collect
    out: io.StringIO
    warned: list[warnings.WarningMessage]

    def lines(self, low: int, high: int = logging.CRITICAL + 1) -> list[str]:
        return [_flat(r.getMessage()) for r in self.log.records if low <= r.levelno < high]


@contextlib.contextmanager
def _isolated() -> Iterator[_Captured]:
    """One checker call, isolated: its root-logger records (INFO and up) collected
    instead of reaching the root's handlers, its prints and warnings caught, the
    compliance checker's queue of configs empty before and after; all restored."""
    from mlperf_logging.compliance_checker import mlp_compliance as mc

    root = logging.root
    handlers, level, disabled = root.handlers[:], root.level, root.manager.disable
    captured = _Captured(_Collect(logging.INFO), io.StringIO(), [])
    root.handlers = [captured.log]  # a handler there also keeps logging.info() from calling basicConfig
    root.setLevel(logging.INFO)
    logging.disable(logging.NOTSET)
    mc.enqueued_configs.clear()
    try:
        with (contextlib.redirect_stdout(captured.out), contextlib.redirect_stderr(captured.out),
              warnings.catch_warnings(record=True) as warned):
            warnings.simplefilter("always")
            captured.warned = warned
            yield captured
    finally:
        root.handlers = handlers
        root.setLevel(level)
        logging.disable(disabled)
        mc.enqueued_configs.clear()


def _flat(text: str) -> str:
    return " ".join(str(text).split())


def _sort_key(path: Path) -> tuple[tuple[int, ...], str]:
    return tuple(int(n) for n in re.findall(r"\d+", path.name)), path.name


def _benchmark_parts(folder: Path) -> tuple[Path, str, str, list[Path]]:
    """(submitter folder, system, benchmark, result files) or UserError."""
    files = sorted(folder.glob("result_*.txt"), key=_sort_key) if folder.is_dir() else []
    if not files or folder.parent.parent.name != "results":
        raise UserError(f"{folder}: not an MLPerf benchmark folder (expected "
                        "<submitter>/results/<system>/<benchmark>/ with result_*.txt files)")
    return folder.parent.parent.parent, folder.parent.name, folder.name, files


def _lean_copy(folder: Path, files: list[Path], where: Path) -> tuple[Path, int]:
    """``folder`` copied to ``where/<its name>`` with each of ``files`` (its result logs) cut
    to the lines that hold MLPerf's marker, byte for byte: all that MLPerf's checkers read
    of a log (its parser and the RCP checker skip every other line, the summarizer and the
    package checker read through the parser). Read in pieces, so a log of any size is
    copied in bounded memory; a line longer than a piece that holds the marker is copied
    whole (read again from where it starts). Returns the copy and how many lines it holds."""
    lean = where / folder.name
    shutil.copytree(folder, lean, ignore=shutil.ignore_patterns(*(f.name for f in files)))
    params = folder.parent / "package_checker_params"  # beside the benchmark folder, where _package_copy looks
    if params.is_file():
        shutil.copy2(params, where)
    marker = mllog.PREFIX.encode()
    events = 0
    for path in files:
        with path.open("rb") as src, (lean / path.name).open("wb") as dst:
            while True:
                start = src.tell()
                piece = src.readline(CHUNK)
                if not piece:
                    break
                if piece.endswith(b"\n") or len(piece) < CHUNK:  # a whole line
                    if marker in piece:
                        dst.write(piece)
                        events += 1
                    continue
                found, tail = marker in piece, piece[-len(marker):]
                while not piece.endswith(b"\n") and (piece := src.readline(CHUNK)):
                    found, tail = found or marker in tail + piece, piece[-len(marker):]
                if found:  # copy the long line whole, from where it starts
                    events += 1
                    end = src.tell()
                    src.seek(start)
                    while src.tell() < end:
                        dst.write(src.read(min(CHUNK, end - src.tell())))
    return lean, events


def _published_scaling(folder: Path) -> tuple[float | None, str]:
    path = folder / "scaling.json"
    if not path.exists():
        return 1.0, ""
    try:
        return float(json.loads(path.read_text())["scaling_factor"]), ""
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return None, f"published scaling.json unreadable: {type(exc).__name__}: {exc}"


def _package_copy(where: Path, submitter: Path, system: str, folder: Path, *, keep_scaling: bool) -> Path:
    """A submission package of the one system and benchmark, copied under ``where``."""
    org = where / submitter.name
    (org / "systems").mkdir(parents=True)
    shutil.copy2(submitter / "systems" / f"{system}.json", org / "systems")
    params = folder.parent / "package_checker_params"
    (org / "results" / system).mkdir(parents=True)
    if params.is_file():
        shutil.copy2(params, org / "results" / system)
    ignore = None if keep_scaling else shutil.ignore_patterns("scaling.json")
    shutil.copytree(folder, org / "results" / system / folder.name, ignore=ignore)
    return org


_ALTERNATIVES = re.compile(r"'[^']*'(?: or '[^']*')+")


def _stable(messages: list[str]) -> list[str]:
    """The checker's messages in one order and each once, whatever the process's hash seed.
    It names the keys of an either-or rule in a set's order ("'eval_stop' or 'block_stop'"),
    keeps its messages in a dict filled in that order, and collects the either-or rules in a
    set of tuples made from sets: whether 'block_stop' or 'epoch_stop' and 'epoch_stop' or
    'block_stop' become one tuple or two (one message or the same message twice) depends on
    the seed too (PYTHONHASHSEED 10 against 29, Python 3.11). A stored verdict would differ by run."""
    return sorted({_stable_message(message) for message in messages})


def _stable_message(message: str) -> str:
    """One message in one order: an either-or rule's keys sorted, and the messages the checker
    joined with a rule of dashes (one per failed rule, in its dict's order) sorted, each once."""
    def sort_alternatives(match: re.Match[str]) -> str:
        return " or ".join(sorted(match.group(0).split(" or ")))

    parts = re.split(r" -{10,} ", _ALTERNATIVES.sub(sort_alternatives, message))
    return f" {'-' * 30} ".join(sorted(set(parts))) if len(parts) > 1 else parts[0]


def _stable_check(check: Check) -> Check:
    return check.model_copy(update={
        "detail": _stable_message(check.detail), "errors": [_stable_message(m) for m in check.errors],
        "warnings": [_stable_message(m) for m in check.warnings]})


def _compliance(files: list[Path], ruleset: str, benchmark: str) -> Check:
    from mlperf_logging.compliance_checker import mlp_compliance as mc

    verdicts = []
    for path in files:
        with _isolated():
            checker = mc.make_checker(RULESET, ruleset, quiet=False, werror=False)
            try:
                ok = bool(checker.check_file(str(path), f"{RULESET}_{ruleset}/common.yaml"))
                errors = [one_line(str(m))[1] for m in (*checker.overwritable.values(), *checker.not_overwritable)]
            except Exception as exc:  # a crash on this file is its verdict
                ok, errors = False, [f"the compliance checker crashed: {type(exc).__name__}: {_flat(str(exc))}"]
            if "Log lines had parsing errors." in errors:
                bad = mc.mlp_parser.parse_file(str(path), ruleset=ruleset)[1]
                errors += [f"unparsable MLLOG line ({_flat(e)}): {_flat(line)[:160]}" for line, e in bad[:5]]
        if not ok and not errors:
            errors = ["the compliance checker failed without a message"]
        warned = [one_line(str(m))[1] for m in checker.warnings.values()]
        verdicts.append(FileCheck(file=path.name, ok=ok, errors=_stable(errors), warnings=_stable(warned)))
    failing = [v.file for v in verdicts if not v.ok]
    accepted = 4 if benchmark == "unet3d" else 1  # the package checker's olympic allowance
    detail = f"{len(files) - len(failing)} of {len(files)} result files comply with training {ruleset}"
    if failing:
        detail += f"; not {', '.join(failing)}"
        detail += (" (MLPerf accepts this under olympic scoring)" if len(failing) <= accepted
                   else f" (MLPerf accepts at most {accepted})")
    status: Status = "passed" if len(failing) <= accepted else "failed"
    return Check(name=COMPLIANCE, status=status, detail=detail, files=verdicts)


def _system(path: Path, ruleset: str) -> Check:
    if not path.is_file():
        return Check(name=SYSTEM, status="failed", detail=f"no systems/{path.name}")
    with _isolated():
        reasons = check_system_description(path, ruleset)
    if reasons:
        return Check(name=SYSTEM, status="failed", detail=reasons[0], errors=reasons)
    return Check(name=SYSTEM, status="passed", detail=f"systems/{path.name} passes training {ruleset}")


def _rcp(copy: Path, ruleset: str, benchmark: str) -> tuple[Check, float | None]:
    """MLPerf's RCP check, as its checker says it (and the scaling factor it writes)."""
    from mlperf_logging.rcp_checker import rcp_checker

    if not (Path(rcp_checker.__file__).parent / f"{RULESET}_{ruleset}" / f"rcps_{benchmark}.json").is_file():
        return Check(name=RCP, status="not run",
                     detail=f"mlperf-logging has no RCPs for {benchmark} in training {ruleset}"), None
    with _isolated() as cap:
        ok, msg, norm = rcp_checker.check_directory(
            str(copy), RULESET, ruleset, False, False, rcp_pass="pruned_rcps", rcp_bypass=False, set_scaling=True)
    said = cap.lines(logging.WARNING)
    if not ok:
        return Check(name=RCP, status="failed", detail=_flat(msg), warnings=said), None
    written = copy / "scaling.json"
    factor = float(json.loads(written.read_text())["scaling_factor"]) if written.exists() else 1.0
    return Check(name=RCP, status="passed", detail=f"{_flat(msg)}: scaling factor {factor:.6g}", warnings=said), factor


def _scaling(rcp: Check, factor: float | None, published: float | None, unreadable: str) -> Check:
    """ampcert's finding beside MLPerf's RCP check: does the published ``scaling.json`` hold
    the factor the RCP checker computes? (MLPerf's review may set another, and its summarizer
    scores with the published one; MLPerf's own checks do not compare them.)"""
    if factor is None:
        why = "MLPerf's RCP check did not pass" if rcp.status == "failed" else rcp.detail
        return Check(name=SCALING, status="not run", detail=f"no factor to compare: {why}")
    if published is None:
        return Check(name=SCALING, status="not run", detail=unreadable)
    detail = (f"ampcert's recomputation: the RCP checker's scaling factor {factor:.6g}, "
              f"published {published:.6g} (scaling.json, 1 without one)")
    if not math.isclose(factor, published, rel_tol=1e-6):
        return Check(name=SCALING, status="failed", detail=f"{detail}: they differ")
    return Check(name=SCALING, status="passed", detail=f"{detail}: the same")


def _summarizer(org: Path, system: str, benchmark: str, ruleset: str) -> tuple[Check, float | None]:
    from mlperf_logging.result_summarizer import result_summarizer as rs

    with _isolated() as cap:
        table = rs.summarize_results(str(org), RULESET, ruleset)[0]
    said = [_flat(line) for line in cap.out.getvalue().splitlines() if line.strip()] + cap.lines(logging.WARNING)
    rows = table.to_dict(orient="records")
    minutes = rows[0].get(benchmark) if rows else None
    if not isinstance(minutes, float) or minutes != minutes:  # NaN: no score
        return Check(name=SUMMARIZER, status="failed", detail=(said or ["no score"])[-1], warnings=said), None
    return Check(name=SUMMARIZER, status="passed",
                 detail=f"{benchmark} on {system}: {minutes:.4f} minutes", warnings=said), minutes


def _package(org: Path, ruleset: str) -> Check:
    from mlperf_logging.package_checker import package_checker as pc

    with _isolated() as cap:  # it returns nothing: its verdict is its last log line
        pc.check_training_package(str(org), RULESET, ruleset, False, False, False, False, False, "(not written)")
    verdict = next((m for m in reversed(cap.lines(logging.INFO)) if "PACKAGE CHECKER FOUND" in m),
                   "the package checker gave no verdict")
    errors = cap.lines(logging.ERROR)
    said = cap.lines(logging.WARNING, logging.ERROR) + [_flat(str(w.message)) for w in cap.warned]
    status: Status = "passed" if "FOUND NO ERRORS" in verdict and not errors else "failed"
    return Check(name=PACKAGE, status=status, detail=verdict, errors=errors, warnings=said)


def _guard(name: str, step: Callable[[], Check]) -> Check:
    """Run one checker; its crash is a finding about the folder, never an exception."""
    try:
        return step()
    except Exception as exc:
        return Check(name=name, status="failed", detail=f"MLPerf's {name} check crashed: {type(exc).__name__}: {_flat(str(exc))}")


def _relocated(check: Check, copy: Path, real: Path) -> Check:
    """The check's messages with the temporary copy's paths read as the input's."""
    def fix(text: str) -> str:
        return text.replace(str(copy), str(real))
    return check.model_copy(update={"detail": fix(check.detail), "errors": [fix(e) for e in check.errors],
                                    "warnings": [fix(w) for w in check.warnings]})


def _none_run(found: dict[str, Any], reason: str) -> Reverification:
    """A re-verification where no checker ran: every check "not run", for ``reason``."""
    return Reverification(**found, reason=reason,
                          checks=[Check(name=n, status="not run", detail=reason) for n in CHECKS])


def reverify(folder: str | Path, round: str | None = None) -> Reverification:
    """MLPerf's own tools over one published benchmark folder
    (``<submitter>/results/<system>/<benchmark>/``, its system described in
    ``<submitter>/systems/<system>.json``) with the ruleset of ``round`` (``v5.1``,
    ``5.1`` or ``5.1.0``; None: read from a ``training_results_v5.1`` folder above).

    Raises UserError only for a folder that is not a benchmark folder; a round or
    benchmark this mlperf-logging does not know is the returned ``reason``, and
    whatever a checker finds (a crash included) is its check's verdict."""
    folder = Path(folder).resolve()
    submitter, system, benchmark, files = _benchmark_parts(folder)
    if round is None:
        named = round_of_folder(folder)
        round = f"v{named}" if named else None
    ruleset, reason = ruleset_for(round) if round else (None, f"{folder}: no round given, and no training_results_vX.Y folder above it")
    if ruleset:
        from mlperf_logging.benchmark_meta import get_allowed_benchmarks

        if benchmark not in get_allowed_benchmarks(RULESET, ruleset):
            ruleset, reason = None, f"{benchmark} is not a benchmark of training {ruleset} (round {round})"
    published, unreadable = _published_scaling(folder)
    found: dict[str, Any] = dict(
        folder=str(folder), submitter=submitter.name, system=system, benchmark=benchmark,
        round=round, ruleset=ruleset, mlperf_logging=_mlperf_logging_version(), published_scaling_factor=published)
    if ruleset is None:
        return _none_run(found, reason)
    desc = submitter / "systems" / f"{system}.json"
    try:
        division = json.loads(desc.read_text()).get("division")
    except (OSError, ValueError, AttributeError):
        division = None
    with tempfile.TemporaryDirectory(prefix="ampcert-reverify-") as tmp:
        where = Path(tmp)
        real, (folder, events) = folder, _lean_copy(folder, files, where / "lean")
        if events > MAX_CHECKED_EVENTS:
            reason = (f"its result logs hold {events:,} MLLOG lines; MLPerf's checkers hold every event in "
                      f"memory (about 2 KB each) and parse each log about five times, so ampcert runs them "
                      f"over at most {MAX_CHECKED_EVENTS:,} (published logs hold hundreds)")
            return _none_run(found, reason)
        lean_files = [folder / f.name for f in files]
        checks = [_relocated(_guard(COMPLIANCE, lambda: _compliance(lean_files, ruleset, benchmark)), folder, real),
                  _guard(SYSTEM, lambda: _system(desc, ruleset))]
        if division == "open":
            checks.append(Check(name=RCP, status="not run", detail="open division: MLPerf checks RCPs in the closed division only"))
        else:
            copy = where / "rcp" / benchmark
            shutil.copytree(folder, copy)

            def rcp() -> Check:
                check, found["rcp_scaling_factor"] = _rcp(copy, ruleset, benchmark)
                return check
            checks.append(_relocated(_guard(RCP, rcp), copy, real))
        checks.append(_scaling(checks[-1], found.get("rcp_scaling_factor"), published, unreadable))
        if not desc.is_file():
            checks += [Check(name=n, status="not run", detail=f"no systems/{system}.json") for n in (SUMMARIZER, PACKAGE)]
        else:
            summary = _package_copy(where / "summarizer", submitter, system, folder, keep_scaling=True)

            def summarize_one() -> Check:
                check, found["summarizer_minutes"] = _summarizer(summary, system, benchmark, ruleset)
                return check
            checks.append(_relocated(_guard(SUMMARIZER, summarize_one), summary, submitter))
            # As the submitter ran it: before its RCP step wrote scaling.json.
            package = _package_copy(where / "package", submitter, system, folder, keep_scaling=False)
            checks.append(_relocated(_guard(PACKAGE, lambda: _package(package, ruleset)), package, submitter))
    return Reverification(**found, checks=[_stable_check(check) for check in checks])
