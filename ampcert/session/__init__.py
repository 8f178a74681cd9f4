"""The session API: what each ``ampcert`` command does, as functions over folders.

The CLI parses its arguments, calls one function here and prints what it
returns; a notebook or another program calls the same functions::

    import ampcert

    done = ampcert.run_suite("suites/smoke.yaml", out="reports/smoke")
    print(done.certificate.status if done.certificate else done.summary["counts"])

One module per concept:

- :mod:`.folders`: a results folder brought up to date (``finish``: certify,
  summary, report, sign), ``certify``, ``report``, ``export_mlperf``;
- :mod:`.runs`: planning and running a suite (``plan_suite``, ``run_suite``,
  ``resume``, ``merge``), on this machine or a cluster (``fleet_options``);
- :mod:`.signing`: ``keygen``, ``sign``, ``verify``;
- :mod:`.compare`: the baseline gate (``compare``) and ``capacity``, and the
  one writer of their files;
- :mod:`.history`: the nightly history and its gate;
- :mod:`.audits`: ampcert's AMP against the frameworks' (``audit_torch``,
  ``audit_jax``), the FP8 screen, MLLOG compliance (``check_logs``);
- :mod:`.catalog`: what is installed and shipped;
- :mod:`.published`: published MLPerf Training results imported (``import_mlperf``),
  the training runs they plan for (``ampcert plan`` on an imported folder), and systems
  compared for one benchmark (``compare_systems``).

Every function runs under the one signal policy (:mod:`ampcert.runner.signals`):
a signal in any phase is :class:`~ampcert.errors.Interrupted`, with every file
whole. Bad input raises :class:`~ampcert.errors.UserError` (one line) before
anything is written; a bad argument, :class:`~ampcert.errors.BadArgument`,
which names the parameter as this API spells it.
"""

from __future__ import annotations

from ampcert.errors import NotVerified
from ampcert.runner.signals import closing, interruptible
from ampcert.session.audits import (
    Audit,
    Checked,
    JaxAudit,
    TorchAudit,
    audit_jax,
    audit_torch,
    check_logs,
    screen_fp8,
)
from ampcert.session.catalog import catalog, environment, shipped_text
from ampcert.session.compare import Capacity, capacity, compare, write_capacity, write_gate_outputs
from ampcert.session.folders import Finished, certify, export_mlperf, finish, report
from ampcert.session.history import (
    gate_history,
    history_add,
    history_plot,
    history_show,
    write_history_gate_outputs,
)
from ampcert.session.published import Imported, SystemsCompared, compare_systems, import_mlperf
from ampcert.session.runs import (
    PlannedRuns,
    check_key,
    fleet_options,
    merge,
    plan_resume,
    plan_suite,
    resume,
    run_suite,
)
from ampcert.session.signing import keygen, sign, verify

__all__ = [
    "Audit", "Capacity", "Checked", "Finished", "Imported", "JaxAudit", "NotVerified", "PlannedRuns", "SystemsCompared",
    "TorchAudit",
    "audit_jax", "audit_torch", "capacity", "catalog", "certify", "check_key", "check_logs", "closing", "compare", "compare_systems",
    "environment", "export_mlperf", "finish", "fleet_options", "gate_history", "history_add", "history_plot",
    "history_show", "import_mlperf", "interruptible", "keygen", "merge", "plan_resume", "plan_suite", "report", "resume",
    "run_suite", "screen_fp8", "shipped_text", "sign", "verify", "write_capacity", "write_gate_outputs",
    "write_history_gate_outputs",
]
