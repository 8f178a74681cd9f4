"""The regression gate: is a candidate's set of results worse than a baseline's?

    from ampcert import gate
    result = gate.compare(gate.load_source("baseline/"), gate.load_source("report.json"),
                          gate.load_gate())
    result.status                       # Status.PASS or Status.FAIL (str: "PASS", "FAIL"); exit code 0 / 1

A *source* is a results folder (``ampcert run --out DIR``) or a report.json
(its ``runs``, ``certificate`` and ``suite``). Both sides must come from the
same suite and share at least one subject, else :class:`UserError` (exit 2).

Per subject (workload entry, backend, AMP, precision) and metric, a regression
needs both an effect beyond the metric's threshold and statistical support
over the repeated samples, so that noise alone does not fail a build (a single
threshold does: see DESIGN.md, "Regression gating"). The samples are the
per-step times within runs where they were recorded (``step_times_ms``) and
the runs (seeds) themselves; the test that decided (bootstrap interval or
Mann-Whitney U) is named in every row. Independently of speed, a subject or
required rule that FAILs now but did not in the baseline, and runs that fail
now, are regressions. Thresholds, directions and tests are data
(``configs/gate.yaml``).

The modules, in the order they build on each other:

- :mod:`~ampcert.gate.settings`: the gate YAML model and :func:`load_gate`
- :mod:`~ampcert.gate.result`: the result model (the ``--json`` schema)
- :mod:`~ampcert.gate.sources`: a results folder or report.json as a :class:`Source`
- :mod:`~ampcert.gate.subjects`: which runs count, grouped by subject, and matched
- :mod:`~ampcert.gate.samples`: each metric's samples, read from the runs
- :mod:`~ampcert.gate.significance`: effect sizes, bootstrap, Mann-Whitney U
- :mod:`~ampcert.gate.output`: number formats, table rows, Markdown, files
- :mod:`~ampcert.gate.metrics`: one metric of one subject, decided
- :mod:`~ampcert.gate.verdicts`: verdict changes and failed runs
- :mod:`~ampcert.gate.comparison`: :func:`compare`, which puts them together

This package re-exports their public names; its modules import each other
directly, never through this file.
"""

from __future__ import annotations

from ampcert.gate.comparison import compare
from ampcert.gate.metrics import UNITS, compare_metric
from ampcert.gate.output import (
    COLUMNS,
    HEADERS,
    fmt_change,
    fmt_threshold,
    fmt_value,
    table_rows,
    tests_used,
    to_markdown,
)
from ampcert.gate.result import (
    GateResult,
    MetricComparison,
    RowStatus,
    RunFailures,
    Side,
    SourceInfo,
    SubjectKey,
    VerdictChange,
)
from ampcert.gate.samples import Samples, collect_samples
from ampcert.gate.settings import (
    GATE_FILE,
    GateConfig,
    MetricGate,
    MetricName,
    VerdictGate,
    load_gate,
)
from ampcert.gate.significance import bootstrap_medians, change, mannwhitney_p
from ampcert.gate.sources import Source, describe, load_source
from ampcert.gate.subjects import (
    Key,
    as_subject,
    group_runs,
    is_replicate,
    match_subjects,
    subject_key,
)
from ampcert.gate.verdicts import compare_failures, compare_verdicts

__all__ = [
    "COLUMNS", "GATE_FILE", "HEADERS", "UNITS", "GateConfig", "GateResult", "Key", "MetricComparison", "MetricGate",
    "MetricName", "RowStatus", "RunFailures", "Samples", "Side", "Source", "SourceInfo", "SubjectKey",
    "VerdictChange", "VerdictGate", "as_subject", "bootstrap_medians", "change", "collect_samples", "compare",
    "compare_failures", "compare_metric", "compare_verdicts", "describe", "fmt_change", "fmt_threshold",
    "fmt_value", "group_runs", "is_replicate", "load_gate", "load_source", "mannwhitney_p", "match_subjects",
    "subject_key", "table_rows", "tests_used", "to_markdown",
]
