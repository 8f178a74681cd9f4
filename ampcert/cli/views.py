"""How the CLI shows what the session API returns: tables, certificates, gate results.

Presentation only: each function takes a result object and a console (or,
where it prints to both streams or depends on --json, the invocation's
:class:`~ampcert.console.Output`) and prints it. Where a fitted table cannot
be drawn (a narrow terminal, a pipe), ``print_table`` falls back to plain
whole lines that grep and CI logs keep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from ampcert import formats
from ampcert.console import Col, Output, print_pairs, print_table

STATUS_STYLE = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow", "INCOMPLETE": "bold red", "REGRESSION": "bold red",
                "IMPROVED": "green"}


def status_cell(status: str, bold: bool = False) -> tuple[str, str]:
    style = STATUS_STYLE.get(status, "")
    return status, (f"bold {style}" if bold and "bold" not in style else style).strip()


def line(console: Console, text: str) -> None:
    """One plain line: no markup, no highlighting, never cut."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


fmt = formats.number


# --------------------------------------------------------------------------- run, merge, report


#: Why the table's speedup and the dry run's capability ratio differ (both printed, so both named).
SPEEDUP_NOTE = ("speedup: this workload's samples/s over fp32's, measured; accel: the device's capability "
                "probe (one matmul), which a whole training step rarely matches")


def print_plan(console: Console, planned) -> None:
    """The run matrix of `ampcert run --dry-run`."""
    plan, rows = planned.plan, planned.rows
    if plan is not None:
        probes = f", then {planned.probes} speed-probe processes" if planned.probes else ""
        console.print(f"suite {plan.suite.name}: {len(rows) - planned.probes} runs on {plan.device}{probes}",
                      markup=False)
        for precision, cap in plan.capabilities.items():
            console.print(f"  {precision}: {cap['note']}", markup=False, soft_wrap=True)
        if len(plan.capabilities) > 1:
            console.print("  (a capability probe times one matmul; the runs measure each workload's speedup)",
                          markup=False, soft_wrap=True)
    # The run id names workload, precision, amp and seed: those columns go first when space is short;
    # the run id itself is never wrapped (logs are grepped for it).
    cols = [Col("run_id", whole=True), Col("workload", spare=True), Col("prec", spare=True), Col("amp", spare=True),
            Col("seed", "right", spare=True), Col("steps", "right"), Col("target", "right"), Col("note")]
    table = [[r["run_id"], r["workload"], r["precision"], r["amp"], str(r["seed"]), str(r["steps"]),
              "" if r["target"] is None else str(r["target"]), r["note"]] for r in rows]
    print_table(console, cols, table, hide_blank=True)
    if plan is not None and planned.shard:
        console.print(f"shard {planned.shard['index']}/{planned.shard['count']}: {len(rows)} of "
                      f"{planned.planned} runs", markup=False)


def print_summary(console: Console, rs, s: dict) -> None:
    """The per-group table of summary.json, then every run that did not complete."""
    groups = s["groups"]
    amps = {g["amp"] for g in groups}
    backends = {g.get("backend") for g in groups}
    one_amp, one_backend = len(amps) == 1, len(backends) <= 1
    # A note (e.g. "not comparable (capped at 30 steps)") is a marker in the row, its text below the table.
    notes: dict[str, str] = {}
    for g in groups:
        if g.get("note"):
            notes.setdefault(g["note"], f"[{len(notes) + 1}]")
    # Target and MFU go first where the table does not fit (summary.json and the report keep them).
    cols = [Col("workload")] + ([] if one_backend else [Col("backend")]) + ([] if one_amp else [Col("amp")]) + [
        Col("prec"), Col("runs", "right"), Col("metric", "right"), Col("target", "right", spare=True),
        Col("samples/s", "right"), Col("speedup", "right"), Col("MFU", "right", spare=True), Col("accel")] + (
        [Col("note")] if notes else [])
    rows = []
    for g in groups:
        rows.append([g["workload"]] + ([] if one_backend else [g["backend"]]) + ([] if one_amp else [g["amp"]]) + [
            g["precision"], f"{g['completed']}/{g['runs']}", fmt(g["final_metric"]), fmt(g["target_reached"]),
            fmt(g["samples_per_s"]), fmt(g["speedup_vs_fp32"], 3), fmt(g["mfu"], 3),
            "yes" if g["accelerated"] else ("NO", "bold red")] + ([notes.get(g.get("note") or "", "")] if notes else []))
    title = f"suite {s['suite']}" + (f", amp {next(iter(amps))}" if one_amp else "")
    footnotes = [f"{m} {text}" for text, m in notes.items()]
    if any(g["speedup_vs_fp32"] is not None for g in groups):
        footnotes.append(SPEEDUP_NOTE)
    print_table(console, cols, rows, title=title, footnotes=footnotes)
    for r in rs.runs:
        if r.status != "completed":
            console.print(f"  {r.run_id}: {r.status}: {r.reason}", markup=False, soft_wrap=True)
    if s.get("memory"):
        print_memory(console, s["memory"])


def print_memory(console: Console, fits: list[dict]) -> None:
    """The memory sweep's fits (summary.json's ``memory``): per subject, memory per sample
    and fixed, the largest batch per budget, the saving against fp32; the notes below."""
    from ampcert.formats import fine_size, size

    budgets = sorted({(b["budget_bytes"], b["source"]) for f in fits for b in f["budgets"]})
    cols = [Col("workload"), Col("prec"), Col("per sample", "right"), Col("fixed", "right")] + [
        Col(f"batch in {formats.budget(b)}" + (" (device)" if source == "device" else ""), "right") for b, source in budgets] + [
        Col("saving", "right")]
    rows, footnotes = [], []
    for f in fits:
        subject = f["subject"]
        largest = {(b["budget_bytes"], b["source"]): b["largest_batch"] for b in f["budgets"]}
        saving = f.get("saving") or {}
        rows.append([subject["workload"], subject["precision"], fine_size(f["bytes_per_sample"]),
                     size(f["fixed_bytes"]), *[fmt(largest.get(b)) for b in budgets],
                     "" if not saving else f"{saving['fraction']:.0%}"])
        notes = [f["note"]] if f.get("note") else []
        notes += [f"{formats.budget(b['budget_bytes'])}: {b['note']}" for b in f["budgets"] if b.get("note")]
        notes += [f"{formats.budget(b['budget_bytes'])}: {b['confirmation']['note']}" for b in f["budgets"]
                  if b.get("confirmation")]
        if notes:
            footnotes.append(f"{subject['workload']} {subject['precision']}: {'; '.join(notes)}")
    methods = sorted({f["method"] for f in fits if f.get("method")})
    footnotes += [f"peak: {m}" for m in methods]
    print_table(console, cols, rows, title="memory: peak = fixed + per sample x batch, fitted over the sweep",
                footnotes=footnotes)


def print_certificate(console: Console, cert, verdicts_file) -> None:
    from ampcert.certify import format_certificate
    from ampcert.certify.certificate import missing_line

    line(console, f"certificate: {cert.status}  (rules {cert.rules['name']}, sha256 {cert.rules['sha256'][:12]})")
    if (missing := missing_line(cert)) is not None:
        line(console, missing.strip())
    rows: list[list[Any]] = []
    for s in cert.subjects:
        rows.append([status_cell(s.status, bold=True), str(s.subject), ""])
        for v in cert.verdicts:
            if v.subject.key() == s.subject.key():
                rows.append([status_cell(v.status), f"  {v.rule}" + ("" if v.required else " (advisory)"), v.summary])
    # Where the table does not fit: the certificate's own indented text, whole lines.
    print_table(console, [Col("status"), Col("subject / rule"), Col("finding")], rows,
                fallback=format_certificate(cert).splitlines()[1:])
    console.print(f"verdicts: {verdicts_file}", markup=False, soft_wrap=True)


def print_finished(out: Output, done, *, folders: int = 0) -> None:
    """What run, resume and merge print after the runs (the signature first, where
    there is one): table, report, certificate, folder (with --json: no table, no certificate)."""
    from ampcert.results import ResultsDir

    if done.envelope is not None:
        print_signed(out, done.envelope, done.warnings)
    console = out.console
    if not out.as_json:
        print_summary(console, done.results, done.summary)
    if done.merged is not None:
        m = done.merged
        console.print(f"merged {m['merged']} of {m['runs']} runs from {folders} folders into {done.root}"
                      + (f"; {len(m['missing'])} without a result" if m["missing"] else ""), markup=False)
    console.print(f"report: {done.report_html}", markup=False)
    if done.certificate is not None and not out.as_json:
        print_certificate(console, done.certificate, ResultsDir(done.root).verdicts_file)
    console.print(f"results: {done.root}  (summary: {ResultsDir(done.root).summary_html})", markup=False)
    if done.shard:
        console.print(f"shard {done.shard['index']}/{done.shard['count']}: {done.ran} of {done.planned} runs; "
                      "join the shards' folders with `ampcert merge OUT DIR...`"
                      + (" and certify there" if done.certify_later else ""), markup=False, soft_wrap=True)


def print_signed(out: Output, envelope, warnings: list[str]) -> None:
    """The signature written; the signer's warnings on stderr."""
    for w in warnings:
        out.warning(w)
    out.console.print(f"signed: {envelope}", markup=False, soft_wrap=True)


def print_history_added(console: Console, done: list[tuple[Path, bool]]) -> None:
    for folder, added in done:
        line(console, f"{'added' if added else 'already in the store'}: {folder}")


def print_verified(console: Console, result) -> None:
    line(console, f"verified: DSSE signature by key {result.keyid} over {result.payload_type}")
    for name, digest in result.subjects:
        line(console, f"verified: {name} sha256 {digest}")
    pred = result.predicate
    line(console, f"statement: suite {pred.get('suite', {}).get('name')} "
                  f"(sha256 {str(pred.get('suite', {}).get('sha256'))[:16]}…), verdict {pred.get('verdict')}, "
                  f"tool {pred.get('tool', {}).get('name')} {pred.get('tool', {}).get('version')}")


# --------------------------------------------------------------------------- list, env


def _heading(console: Console, text: str) -> None:
    console.print(Text(text, style="bold"), soft_wrap=True)


def print_catalog(console: Console, data: dict[str, Any]) -> None:
    workloads = data["workloads"]
    _heading(console, "workloads")
    print_table(console, [Col("name"), Col("metric"), Col("summary")],
                [[w["name"], w["metric"], w["summary"]] for w in workloads],
                fallback=[f"  {w['name']:12} {w['summary']} (metric: {w['metric']})" for w in workloads])
    suites = data["suites"]
    _heading(console, "suites (ampcert run NAME; ampcert show suite NAME)")
    print_table(console, [Col("name"), Col("description")], [[s["name"], s["description"]] for s in suites],
                fallback=[f"  {s['name']:12} {s['description']}" for s in suites])
    if data["suite_files"]:
        _heading(console, "suite files in this folder (ampcert run PATH)")
        for path in data["suite_files"]:
            console.print(f"  {path}", markup=False, highlight=False)
    _heading(console, "precisions")
    console.print("  " + ", ".join(data["precisions"]), markup=False, highlight=False)
    _heading(console, "policies (ampcert show policy NAME)")
    console.print("  " + ", ".join(data["policies"]), markup=False, highlight=False)
    _heading(console, "rule packs (ampcert show rules NAME)")
    console.print("  " + ", ".join(data["rules"]), markup=False, highlight=False)


def print_environment(console: Console, fp: dict[str, Any]) -> None:
    cpu = fp["cpu"]
    pairs = [("python", f"{fp['python']}  ({fp['platform']})"),
             ("cpu", f"{cpu['model']}, {cpu['usable_cores']} usable of {cpu['logical_cores']} logical cores")]
    if isinstance(cpu["flags"], dict):
        pairs.append(("cpu flags", " ".join(f"{k}={'yes' if v else 'no'}" for k, v in cpu["flags"].items())))
    gpu = fp["gpu"]
    pairs.append(("cuda", f"torch build {gpu.get('torch_cuda')}, available: {gpu.get('cuda_available')}"))
    for d in gpu.get("devices", []):
        pairs.append((f"gpu {d['index']}", f"{d['name']} (sm {d['capability']}, {d['memory_bytes'] / 2**30:.1f} GiB)"))
    pairs.append(("driver", str(gpu.get("driver") or gpu.get("nvml"))))
    pairs.append(("packages", " ".join(f"{k}={v}" for k, v in fp["packages"].items() if v)))
    print_pairs(console, pairs)


# --------------------------------------------------------------------------- audit, check


def print_audit(console: Console, audit) -> None:
    """The audit tables; then, for a user policy, the ops where it differs from native on purpose."""
    p = audit.policy
    line(console, f"policy {p.name} ({p.source}), sha256 {p.sha256[:16]}..., {audit.framework} {audit.version}, "
                  f"{'device' if audit.framework == 'torch' else 'backend'} {audit.where}")


def print_audit_tables(console: Console, audit) -> None:
    if audit.framework == "torch":
        from ampcert.amp.audit import format_coverage, format_table

        rows = audit.rows
        table = format_table(rows).splitlines()  # the plain layout where a fitted table cannot be drawn
        print_table(console, [Col("op"), Col("family"), Col("agree"), Col("ampcert"), Col("native"), Col("note")],
                    [[r.op, r.family, "yes" if r.agree else ("NO", "bold red"), r.ampcert_dtype, r.native_dtype,
                      r.note] for r in rows], fallback=table[:-1], hide_blank=True)
        line(console, table[-1])
        print_table(console, [Col("family"), Col("ops", "right"), Col("audited", "right"), Col("agree", "right"),
                              Col("native", "right"), Col("covered", "right"), Col("missing")],
                    [[fam, str(c["ops"]), str(c["audited"]), str(c["agree"]), str(c["native"]), str(c["covered"]),
                      ", ".join(c["missing"])] for fam, c in audit.coverage.items()],
                    fallback=format_coverage(rows, audit.where, audit.policy).splitlines(), hide_blank=True)
        return
    from ampcert.amp.jax.audit import format_jax_table, format_region_table

    print_table(console, [Col("primitive"), Col("family"), Col("operands (observed)"), Col("expected"),
                          Col("err/max|ref|", "right"), Col("agree"), Col("note")],
                [[r.op, r.family, r.observed, r.expected,
                  f"{r.max_rel_err:.2e}" if r.max_rel_err is not None else "-",
                  "yes" if r.agree else ("NO", "bold red"), r.note] for r in audit.rows],
                fallback=format_jax_table(audit.rows).splitlines(), hide_blank=True)
    print_table(console, [Col("nested region"), Col("rewritten"), Col("matmul operands inside"), Col("note")],
                [[r.region, "yes" if r.rewritten else ("NO", "bold red"), r.matmul_dtypes, r.note]
                 for r in audit.regions],
                fallback=format_region_table(audit.regions).splitlines(), hide_blank=True)


def print_audit_verdict(console: Console, audit) -> None:
    bad = audit.disagreements
    if audit.framework == "jax":
        if bad:
            console.print(f"autocast disagrees with the policy on: {', '.join(bad)}", markup=False)
        else:
            console.print(f"all {len(audit.rows)} primitives and {len(audit.regions)} region kinds as the policy says",
                          markup=False)
    elif bad and not audit.shipped:
        # A user policy differs from native on purpose; the table shows where.
        console.print(f"{len(bad)} op(s) differ from native torch.autocast, as this policy "
                      f"chooses: {', '.join(bad)}", markup=False)
    elif bad:
        console.print(f"the shipped policy disagrees with torch {audit.version}'s autocast on: "
                      f"{', '.join(bad)}", markup=False)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def print_screen(console: Console, screen) -> None:
    """The eligibility map: one row per Linear layer."""
    line(console, f"{screen.workload}: {screen.precision} ({screen.implementation}), {screen.steps} step(s) "
                  f"on {screen.device}")
    print_fp8_layers(console, screen.layers)


def print_fp8_layers(console: Console, layers: list[dict[str, Any]]) -> None:
    colour = {"safe": "green", "review": "yellow", "unsafe": "bold red"}
    # Where 80 columns cannot hold the measurements, the shape, underflow and amax go (`why`
    # names the worst underflow, --json keeps every figure); `why` wraps.
    print_table(console, [Col("layer"), Col("in x out", "right", spare=True), Col("fp8"), Col("verdict"),
                          Col("rel err", "right"), Col("underflow i/w/g", "right", spare=True),
                          Col("amax i/w/g", "right", spare=True), Col("why")],
                [[layer["name"], f"{layer['in_features']}x{layer['out_features']}",
                  "yes" if layer["converted"] else "no",
                  (layer["verdict"], colour.get(layer["verdict"], "")),
                  fmt(layer["rel_error_vs_bf16"], 3),
                  " / ".join(_pct(layer["underflow"].get(r)) for r in ("input", "weight", "grad_output")),
                  " / ".join(fmt(layer["amax"][r][-1] if layer["amax"].get(r) else None, 3)
                             for r in ("input", "weight", "grad_output")),
                  layer["why"] if layer["converted"] else f"{layer['reason']}; what-if: {layer['why']}"]
                 for layer in layers],
                footnotes=["rel err: output against bf16's; i/w/g: input, weight, output gradient"])


def screen_json(screen) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(screen)


def print_violations(console: Console, checked) -> None:
    # One line per violation, as compilers print them: editors and grep read these.
    for _, violations in checked.logs:
        for v in violations:
            line(console, str(v))


def print_exported(console: Console, done) -> None:
    """One row per benchmark of each system: result files, MLPerf's score, and
    what MLPerf's checkers rejected (file:line first, as print_violations)."""
    for path, reasons in done.systems.items():
        for reason in reasons:
            line(console, f"{path}: {reason}")
    for path, problems in done.log_problems.items():
        for problem in problems:
            line(console, f"{path}: {problem}")
    for path, why in done.unscored.items():
        line(console, f"{path}: no time-to-train ({why})")
    scores = {(row.get("system_id"), b): row.get(b) for row in done.scores for b in row}
    rows = [[org, system, bench, str(n), fmt(scores.get((system, bench)))]
            for org, system, bench, n in done.benchmarks]
    print_table(console, [Col("org"), Col("system"), Col("benchmark"), Col("results", "right"),
                          Col("minutes", "right")], rows,
                title=f"MLPerf training layout in {done.out}",
                footnotes=["minutes: MLPerf's result summarizer, the olympic average of time-to-train "
                           "(run_start to run_stop; the fastest and slowest run dropped, so 3 runs or more); "
                           "none where a run did not reach its quality target"])
    bad = len([r for r in done.systems.values() if r]) + len(done.log_problems)
    line(console, f"{len(done.systems)} system description(s), "
                  f"{sum(n for *_, n in done.benchmarks)} result file(s) written; "
                  + ("MLPerf's checkers passed them all" if not bad else f"MLPerf's checkers rejected {bad} file(s)"))


def print_imported(console: Console, done) -> None:
    """`ampcert import mlperf`: one row per system and benchmark, MLPerf's score with what it leaves out,
    then each run the score dropped, with why."""
    rows = []
    for rec in done.records:
        s = rec.score
        interval = (f"{formats.number(s.interval_minutes[0], 4)}–{formats.number(s.interval_minutes[1], 4)}"
                    if s.interval_minutes else "—")
        counted = sum(r.minutes is not None for r in s.runs)
        rows.append([f"{rec.submitter} {rec.system}", rec.benchmark,
                     f"{rec.fingerprint.accelerators} x {rec.fingerprint.accelerator_model}",
                     f"{counted}/{len(s.runs)}", fmt(s.score_minutes) if s.score_minutes is not None else "no score",
                     interval, f"{s.cv:.1%}" if s.cv is not None else "—",
                     formats.number(s.accelerator_hours_per_run, 3)])
    print_table(console, [Col("system", whole=True), Col("benchmark"), Col("accelerators"),
                          Col("runs", "right"), Col("minutes", "right"), Col("95% interval", "right"),
                          Col("CV", "right", spare=True), Col("acc-hours/run", "right")], rows,
                title=f"MLPerf Training results imported into {done.out}"
                      + (f" (round {done.records[0].round})" if len({r.round for r in done.records}) == 1
                         and done.records[0].round else ""),
                footnotes=["minutes: MLPerf's score (olympic mean x scaling factor, as its result summarizer); "
                           "runs: counted/published; interval: bootstrap over the counted runs"])
    for folder, rec in zip(done.folders, done.records, strict=True):
        for run in rec.score.runs:
            if run.dropped:
                line(console, f"{folder}/logs/{run.file}: dropped from the score ({run.dropped})")
        if rec.score.no_score:
            line(console, f"{folder}: no score: {rec.score.no_score}")
        for run in rec.energy.runs:
            for note in run.outside_run:
                line(console, f"{folder}: {run.file}'s {note}: counted as MLPerf counts it; check its clock")
        if rec.score.discrete_note:
            line(console, f"{folder}: {rec.score.discrete_note}")
        line(console, f"{folder}: precision {rec.precision.disclosed}"
                      + (f" (sw_notes: {rec.precision.sw_notes!r})" if rec.precision.sw_notes else ""))
        _print_energy(console, folder, rec.energy)
        checked = rec.reverification
        if checked.reason:
            line(console, f"{folder}: MLPerf's checkers not run: {checked.reason}")
        else:
            line(console, f"{folder}: MLPerf's checkers (training {checked.ruleset}): "
                          + ", ".join(f"{c.name} {c.status}" for c in checked.checks))
        for check in checked.checks:
            if check.status == "failed":
                line(console, f"{folder}: {check.name} failed: {check.detail}")
            for file in check.files:
                for error in file.errors if not file.ok else []:
                    line(console, f"{folder}/logs/{file.file}: {check.name}: {error}")
    if done.records and not done.ok:
        line(console, f"rejected {sum(bool(r.rejected) for r in done.records)} of {len(done.records)} imported "
                      "folder(s), by MLPerf's checks or ampcert's findings (imported with their verdicts)")


def print_systems(console: Console, done) -> None:
    """`ampcert compare-systems`: a row per system, the notes, the files written."""
    cmp, table = done.comparison, done.rows
    print_table(console, [Col(k, "left" if k in ("system", "accelerators", "precision", "MLPerf checks") else "right",
                              whole=k == "system") for k in table[0]],
                [list(row.values()) for row in table],
                title=f"systems compared: {cmp.benchmark}; ranges: 95% bootstrap intervals")
    for row in cmp.rows:
        for note in row.notes:
            line(console, f"{row.name}: {note}")
        if row.compliance == "failed":
            line(console, f"{row.name}: MLPerf checks failed: {row.compliance_detail}")
    for path in [*done.written, *([done.envelope] if done.envelope else [])]:
        line(console, f"wrote {path}")
    for warning in done.warnings:
        line(console, f"warning: {warning}")


def _print_energy(console: Console, folder, energy) -> None:
    """Energy to train: the nodes alone, the nodes and switches, and MLPerf's figure, with why they
    differ; each run's where the benchmark has no figure, and why one is missing."""
    from ampcert.published.energy import against_mlperf

    if not energy.power_logs:
        return
    kinds = ", ".join(energy.measurement_types) or "measurement type not stated"
    rate = f"{1 / energy.sampling_interval_s:.2g} Hz" if energy.sampling_interval_s else "sampling rate unknown"
    no_figure = energy.per_run()[0] is None
    if no_figure:
        line(console, f"{folder}: energy to train: no figure ({energy.no_figure}); {kinds}, {rate}")
    else:
        line(console, f"{folder}: energy to train per run: {_energy_figures(energy)}; {kinds}, {rate}")
        line(console, f"{folder}: energy against MLPerf's figure: {energy.against_mlperf()}")
    for run in energy.runs:
        if run.refused and run.minutes is not None:
            line(console, f"{folder}: {run.file}: no energy: {run.refused}")
        elif no_figure and run.nodes_joules is not None:  # no benchmark figure: each run's
            why = against_mlperf(run.switches_measured, run.switches_estimated, run.switches_unknown)
            line(console, f"{folder}: {run.file}: energy {_energy_figures(run)} ({why})")


def _energy_figures(energy) -> str:
    """'nodes 0.494 kWh, nodes and switches 0.529 kWh, MLPerf's figure 0.507 kWh (+4.26%)' of a
    benchmark's or a run's energy (the nodes and switches 'unknown' where a switch log has no figure)."""
    def kwh(joules: float | None) -> str:
        return "unknown" if joules is None else f"{formats.number(joules / 3.6e6, 3)} kWh"

    difference = "" if energy.difference_pct is None else f" ({energy.difference_pct:+.2f}%)"
    return (f"nodes {kwh(energy.nodes_joules)}, nodes and switches {kwh(energy.nodes_and_switches_joules)}, "
            f"MLPerf's figure {kwh(energy.mlperf_joules)}{difference}")


# --------------------------------------------------------------------------- compare, plan


def print_gate(console: Console, result) -> None:
    from ampcert import gate

    b, c = result.baseline, result.candidate
    for name, side in (("baseline ", b), ("candidate", c)):
        cert = f", certificate {side.certificate}" if side.certificate else ""
        line(console, f"{name} {side.path} ({side.kind}, suite {side.suite}, {side.runs} runs, "
                      f"{', '.join(side.devices)}{cert})")
    # Short headers for a terminal; the Markdown summary keeps gate.HEADERS. Where 80 columns
    # cannot hold them all, n, the limit and the evidence go (each regression's evidence is
    # printed below the table) and the subject wraps at its slashes: a row is two lines.
    headers = {"n": "n", "threshold": "limit"}
    right = {"baseline", "candidate", "n", "change", "threshold"}
    spare, whole = {"n", "threshold", "evidence"}, {"status"}
    cols = [Col(headers.get(k, k), "right" if k in right else "left", spare=k in spare, whole=k in whole)
            for k in gate.COLUMNS]
    rows = [[row[k] for k in gate.COLUMNS[:-1]] + [status_cell(row["status"])] for row in gate.table_rows(result)]
    print_table(console, cols, rows, hide_blank=True,
                title=f"regression gate {result.gate['name']}: worse beyond the threshold AND significant",
                footnotes=["n: runs x samples per run, baseline / candidate; limit: worse by more than this "
                           "is a regression if significant"] if rows else [])
    for v in result.verdict_changes:
        tag = "REGRESSION " if v.regression else ""
        what = f"rule {v.rule}" if v.rule else "certificate"
        line(console, f"{tag}{v.subject}: {what} {v.baseline} -> {v.candidate}" + (f": {v.summary}" if v.rule else ""))
    for f in result.run_failures:
        line(console, f"{'REGRESSION ' if f.regression else ''}{f.subject}: {f.candidate_failed}/{f.runs} run(s) "
                      f"failed (baseline {f.baseline_failed}): {'; '.join(f.reasons)}")
    tests = gate.tests_used(result)
    if tests:
        line(console, "tests: " + "; ".join(tests))
    for note in result.notes:
        line(console, f"note: {note}")
    if result.status == "FAIL":
        console.print(f"[bold red]FAIL[/]: {len(result.regressions)} regression(s)", soft_wrap=True)
        for text in result.regressions:
            line(console, f"  {text}")
    else:
        console.print("[bold green]PASS[/]: no regression", soft_wrap=True)


def print_capacity(console: Console, cap) -> None:
    cp, rows = cap.plan, cap.rows
    if hasattr(cp, "training_runs"):  # imported MLPerf results: a row per system
        right = {"time to train min", "wall time", "accelerator-hours", f"cost {cp.currency}", "energy kWh"}
        print_table(console, [Col(k, "right" if k in right else "left", whole=k == "system") for k in rows[0]],
                    [list(row.values()) for row in rows],
                    title=f"{cp.training_runs:,} training run(s) per system; ranges: the score's 95% interval")
        return
    devices = sorted({row["device"] for row in rows})
    backends = sorted({row["backend/amp"] for row in rows})
    # One device or one backend/amp for every row: said once in the title, not in a column.
    columns = [k for k in rows[0] if (k != "device" or len(devices) > 1) and (k != "backend/amp" or len(backends) > 1)]
    right = {"seeds", "samples/s", "wall time", "GPU-hours", "device-hours", "energy kWh", f"cost {cp.currency}"}
    # Short headers, so that 80 columns hold the table (its cells wrap). The seeds and the
    # device-hours (wall time x the title's devices) go first where it does not fit.
    saved = "saved vs FP32 (time, energy, cost)"
    headers = {"precision": "prec", "wall time": "wall", "energy kWh": "kWh", saved: "saved"}
    spare = {"seeds", "GPU-hours", "device-hours"}
    print_table(console, [Col(headers.get(k, k), "right" if k in right else "left", spare=k in spare)
                          for k in columns],
                [[row[k] for k in columns] for row in rows],
                title=f"suite {cap.suite}: {cp.target_samples:,} samples on {cp.gpus} x "
                      f"{devices[0] if len(devices) == 1 else 'device'}"
                      + (f", {backends[0]}" if len(backends) == 1 else "") + "; ranges: slowest to fastest seed",
                footnotes=[f"saved: {saved.removeprefix('saved ')}"] if saved in columns else [])


def print_nights(console: Console, nights: list) -> None:
    """`ampcert history show`: one row per night."""
    if not nights:
        console.print("the history store holds no nights yet (`ampcert history add DIR`)")
        return
    print_table(console, ["night", "suite", "machine", "certificate", "folder"],
                [[n.created_at, n.suite, n.machine, n.certificate or "—", n.source] for n in nights])


def print_history_gate(console: Console, result) -> None:
    """`ampcert gate`: a row per series, then the verdict."""
    console.print(f"suite {result.suite} on {result.machine}, night {result.night}, store {result.store}",
                  markup=False, highlight=False, soft_wrap=True)
    # The subject stays whole (logs are grepped for it); `since` goes first where the table does not
    # fit (each regression's line below names its night).
    print_table(console, [Col("subject", whole=True), Col("metric"), Col("nights", "right"), Col("status"),
                          Col("value", "right"), Col("change", "right"), Col("since", spare=True)],
                [[r.subject, r.metric, str(r.nights),
                  status_cell(r.status) if r.gated else f"{r.status} (not gated)", formats.figure(r.metric, r.value),
                  formats.change(r.change) if r.change is not None else "", r.change_night or ""] for r in result.rows],
                hide_blank=True)
    if result.regressions:
        for r in result.regressions:
            console.print(f"FAIL: {r.subject} {r.metric}: {formats.change(r.change)} since {r.change_night}"
                          if r.change is not None else f"FAIL: {r.subject} {r.metric}: {r.detail}",
                          markup=False, highlight=False, soft_wrap=True)
    else:
        console.print("PASS: no regression in the history")
    for line in result.signals:
        console.print(f"signal: {line}", markup=False, highlight=False, soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
