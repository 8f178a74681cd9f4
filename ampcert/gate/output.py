"""The result as people read it: formatted numbers, table rows, Markdown, files.

:func:`table_rows` turns each comparison into strings under :data:`COLUMNS`
(the CLI prints them as a terminal table, :func:`to_markdown` as a CI job
summary with :data:`HEADERS`; ``ampcert.session.compare`` writes the files).
The number formats live here too, since the rows' summaries in the result use
the same ones as the table.
"""

from __future__ import annotations

from ampcert import formats
from ampcert.gate.result import GateResult
from ampcert.vocabulary import Status

COLUMNS = ["subject", "metric", "baseline", "candidate", "n", "change", "threshold", "evidence", "status"]
HEADERS = {"n": "runs x samples", "threshold": "worse by >"}


def fmt_change(x: float | None, kind: str) -> str:
    return formats.change(x, kind)


def fmt_threshold(t: float, kind: str) -> str:
    return f"{100 * t:g}%" if kind == "relative" else f"{t:g}"


def fmt_value(metric: str, v: float | None) -> str:
    return formats.figure(metric, v)


def table_rows(result: GateResult) -> list[dict[str, str]]:
    """One row of strings per comparison (terminal table and Markdown)."""
    rows = []
    for c in result.comparisons:
        evidence = ""
        if c.test is not None:
            if c.test.startswith("none"):
                evidence = "too few runs"
            elif c.test.startswith("Mann"):
                evidence = f"MWU p={c.p_value:.3g}"
            elif c.ci is not None:
                evidence = f"CI [{fmt_change(c.ci[0], c.kind)}, {fmt_change(c.ci[1], c.kind)}]"
        elif c.status == "N/A":
            evidence = "not compared (see notes)"
        rows.append({
            "subject": str(c.subject) + (f" -> {c.candidate_subject.amp}" if c.candidate_subject else ""),
            "metric": c.metric,
            "baseline": fmt_value(c.metric, c.baseline.value),
            "candidate": fmt_value(c.metric, c.candidate.value),
            "n": f"{c.baseline.runs}x{c.baseline.samples // max(c.baseline.runs, 1)}"
                 f" / {c.candidate.runs}x{c.candidate.samples // max(c.candidate.runs, 1)}"
            if c.baseline.runs else "",
            "change": fmt_change(c.change, c.kind),
            "threshold": ("+" if c.direction == "lower" else "-") + fmt_threshold(c.threshold, c.kind),
            "evidence": evidence,
            "status": c.status,
        })
    return rows


def tests_used(result: GateResult) -> list[str]:
    """The tests that decided, in words (each once)."""
    return list(dict.fromkeys(
        c.test.split(" (")[0] if c.test.startswith(("bootstrap", "none")) else c.test.split(" (n=")[0]
        for c in result.comparisons if c.test))


def to_markdown(result: GateResult) -> str:
    """A CI job summary ($GITHUB_STEP_SUMMARY)."""
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    head = ("### :x: ampcert gate: FAIL, " + f"{len(result.regressions)} regression(s)"
            if result.status == Status.FAIL else "### :white_check_mark: ampcert gate: PASS, no regression")
    b, c = result.baseline, result.candidate
    lines = [head, "",
             f"- baseline: `{b.path}` ({b.kind}, suite `{b.suite}`, {b.runs} runs, {', '.join(b.devices)}"
             + (f", certificate {b.certificate}" if b.certificate else "") + ")",
             f"- candidate: `{c.path}` ({c.kind}, suite `{c.suite}`, {c.runs} runs, {', '.join(c.devices)}"
             + (f", certificate {c.certificate}" if c.certificate else "") + ")",
             f"- gate: `{result.gate['name']}` (sha256 {result.gate['sha256'][:12]}): a regression needs an "
             "effect beyond the threshold **and** statistical support", ""]
    if result.regressions:
        lines += ["**Regressions**", ""] + [f"- {esc(r)}" for r in result.regressions] + [""]
    lines.append("| " + " | ".join(HEADERS.get(k, k) for k in COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for row in table_rows(result):
        cells = [row[k] for k in COLUMNS]
        if row["status"] == "REGRESSION":
            cells[-1] = "**REGRESSION**"
        lines.append("| " + " | ".join(esc(x) for x in cells) + " |")
    if result.verdict_changes:
        lines += ["", "**Verdict changes**", ""]
        lines += [f"- {'**regression**: ' if v.regression else ''}`{v.subject}` "
                  f"{'rule ' + v.rule if v.rule else 'certificate'}: {v.baseline} -> {v.candidate}"
                  f"{': ' + esc(v.summary) if v.rule else ''}" for v in result.verdict_changes]
    if result.run_failures:
        lines += ["", "**Failed runs**", ""]
        lines += [f"- `{f.subject}`: {f.candidate_failed}/{f.runs} failed (baseline {f.baseline_failed})"
                  + (f": {esc('; '.join(f.reasons))}" if f.reasons else "") for f in result.run_failures]
    tests = tests_used(result)
    if tests:
        lines += ["", "Tests: " + "; ".join(tests) + "."]
    if result.notes:
        lines += ["", "Notes:", ""] + [f"- {esc(n)}" for n in result.notes]
    return "\n".join(lines) + "\n"
