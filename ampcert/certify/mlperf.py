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

import re
from dataclasses import dataclass, field
from pathlib import Path

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


def check_common(path: str | Path) -> MlperfCheck:
    """Run MLPerf training 6.1.0's common rules over one MLLOG file."""
    import logging

    from mlperf_logging.compliance_checker import mlp_compliance as mc

    original = mc.enqueue_config
    # The checker also logs its findings through the root logger (to stderr);
    # they come back in the result instead, one line each.
    was_disabled = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    # Only the root config; the division hook loads per-benchmark files (see the module doc).
    mc.enqueue_config = lambda config: original(config) if config == ROOT else None
    try:
        mc.enqueued_configs.clear()  # module-level: a previous check's queue must not leak in
        checker = mc.make_checker(RULESET, VERSION, quiet=True, werror=False)
        ok = bool(checker.check_file(str(path), ROOT))
    finally:
        mc.enqueue_config = original
        mc.enqueued_configs.clear()
        logging.disable(was_disabled)
    errors = [str(msg) for msg in (*checker.overwritable.values(), *checker.not_overwritable)]
    warnings = [str(msg) for msg in checker.warnings.values()]
    if not ok and not errors:  # the checker failed without saying why (it prints when not quiet)
        errors = ["MLPerf common rules failed without a message"]
    return MlperfCheck(str(path), ok, errors, warnings)
