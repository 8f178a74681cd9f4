"""MLPerf's own compliance checker (mlperf-logging) over ampcert's logs.

ampcert's workloads are not MLPerf benchmarks, so only the training
ruleset's COMMON rules apply (``training_6.1.0/common.yaml``): the
submission and run-config disclosure, the init/run interval order, block
and evaluation metadata, the precision disclosure. The checker's
submission_division rule enqueues a per-division file that in turn loads
``<division>_<benchmark>.yaml``, which exists only for MLPerf's own
benchmarks and crashes for ours; :func:`check_common` drops that hook for
the duration of one check. This module is the only one that imports
mlperf_logging: its checker keeps module-level state (the enqueued configs)
and a patched function, so every use goes through the one lock-free,
restore-always function below.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_system_description(path: str | Path) -> list[str]:
    """MLPerf's system-description checker over one ``systems/<name>.json``:
    the reasons it rejects the file (none when it passes). The checker says
    why only through the root logger, so its ERROR records are collected."""
    from mlperf_logging.system_desc_checker.system_desc_checker import check_system_desc

    collect = _Collect()
    logging.root.addHandler(collect)
    try:
        valid = check_system_desc(str(path), RULESET, VERSION)[0]
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
