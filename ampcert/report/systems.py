"""The systems comparison (:mod:`ampcert.published.system_comparison`) as files: ``comparison.json``
(canonical JSON), ``comparison.md`` and ``comparison.html`` (one self-contained file: inline
CSS and SVG plots, a Content-Security-Policy that forbids any fetch, every string escaped),
signed like every report (``comparison.dsse.json``: a DSSE envelope over the three,
verified by ``ampcert verify``). The same comparison always renders to the same bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from ampcert import formats
from ampcert.published.system_comparison import SystemComparison, SystemRow
from ampcert.report import plots
from ampcert.results import atomic_write_text

JSON, MARKDOWN, HTML, ENVELOPE = "comparison.json", "comparison.md", "comparison.html", "comparison.dsse.json"
FILES = (JSON, MARKDOWN, HTML)

_env = Environment(loader=PackageLoader("ampcert", "report/templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True))


def _range(values: list[float] | None, digits: int = 3) -> str:
    return f" ({formats.number(values[0], digits)}–{formats.number(values[1], digits)})" if values else ""


def cells(row: SystemRow, currency: str) -> dict[str, str]:
    """A row's figures as text, the same in Markdown and HTML."""
    return {
        "system": row.name + ("" if row.source == "published" else " (measured)"),
        "accelerators": f"{row.accelerators} x {row.accelerator}" if row.accelerators else row.accelerator,
        "precision": row.precision,
        "runs": f"{row.counted}/{row.runs}",
        "time to train (min)": formats.number(row.time_to_train_minutes, 4) + _range(row.interval_minutes, 4),
        "accelerator-hours/run": formats.number(row.accelerator_hours_per_run, 3) + _range(row.accelerator_hours_range),
        "energy/run (kWh)": (formats.number(row.energy_kwh_per_run, 3) + f" ({row.energy_scope})"
                             if row.energy_kwh_per_run is not None else "not published" if row.source == "published"
                             else "not measured"),
        f"cost/run ({currency})": formats.number(row.cost_per_run, 3) + _range(row.cost_range)
        if row.cost_per_run is not None else "—",
        "MLPerf checks": row.compliance,
    }


def _notes(cmp: SystemComparison) -> list[str]:
    out = []
    for row in cmp.rows:
        out += [f"{row.name}: {note}" for note in row.notes]
        if row.precision_note:
            out.append(f"{row.name}: precision {row.precision} ({row.precision_note})")
        if row.discrete_note:
            out.append(f"{row.name}: {row.discrete_note}")
        out.append(f"{row.name}: MLPerf checks {row.compliance}: {row.compliance_detail}")
    return out


def to_markdown(cmp: SystemComparison) -> str:
    table = [cells(row, cmp.currency) for row in cmp.rows]
    head = list(table[0])

    def md(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [f"# Systems compared: {cmp.benchmark}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(md(row[k]) for k in head) + " |" for row in table]
    lines += ["", "Ranges: 95% bootstrap intervals over the counted runs.", "", "## Notes", ""]
    lines += [f"- {md(n)}" for n in _notes(cmp)]
    lines += ["", "## Assumptions", ""] + [f"- {md(a)}" for a in cmp.assumptions]
    lines += ["", "## Inputs", ""] + [f"- `{i.folder}` sha256 {i.sha256}" for i in cmp.inputs]
    return "\n".join(lines) + "\n"


def _plots(cmp: SystemComparison) -> list[str]:
    labels = [row.name for row in cmp.rows]
    salt = cmp.benchmark
    found = [plots.intervals(f"{cmp.benchmark}: time to train", labels,
                             [r.time_to_train_minutes for r in cmp.rows], [r.interval_minutes for r in cmp.rows],
                             "minutes", salt + "-time"),
             plots.intervals("accelerator-hours per training run", labels,
                             [r.accelerator_hours_per_run for r in cmp.rows],
                             [r.accelerator_hours_range for r in cmp.rows], "accelerator-hours", salt + "-hours"),
             plots.intervals(f"cost per training run ({cmp.currency})", labels, [r.cost_per_run for r in cmp.rows],
                             [r.cost_range for r in cmp.rows], cmp.currency, salt + "-cost")]
    return [svg for svg in found if svg]


def to_html(cmp: SystemComparison) -> str:
    table = [cells(row, cmp.currency) for row in cmp.rows]
    return _env.get_template("systems.html.j2").render(c=cmp, head=list(table[0]), table=table, plots=_plots(cmp),
                                                       notes=_notes(cmp))


def write(cmp: SystemComparison, out: Path) -> list[Path]:
    """comparison.json, .md and .html in ``out`` (created), atomically; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    texts: dict[str, Any] = {JSON: cmp.model_dump_json(indent=1) + "\n", MARKDOWN: to_markdown(cmp),
                             HTML: to_html(cmp)}
    for name, text in texts.items():
        atomic_write_text(out / name, text)
    return [out / name for name in FILES]


def sign(cmp: SystemComparison, out: Path, key_path: str | Path) -> tuple[Path, list[str]]:
    """comparison.dsse.json over the three files in ``out``: what was compared (the inputs'
    digests) and MLPerf's checkers' verdicts as the statement's suite and verdict."""
    import hashlib
    import json

    from ampcert.report.sign import files_statement, sign_statement

    counts = {status: sum(r.compliance == status for r in cmp.rows) for status in ("passed", "failed", "not run")}
    inputs = json.dumps([i.model_dump() for i in cmp.inputs], sort_keys=True).encode()
    predicate = {"suite": {"name": f"systems compared: {cmp.benchmark}", "sha256": hashlib.sha256(inputs).hexdigest()},
                 "verdict": "MLPERF CHECKS " + ", ".join(f"{n} {status.upper()}" for status, n in counts.items()),
                 "systems": [{"name": r.name, "source": r.source, "compliance": r.compliance} for r in cmp.rows]}
    return sign_statement(files_statement(out, FILES, predicate), out / ENVELOPE, key_path)
