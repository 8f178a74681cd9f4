"""The ``ampcert`` command line: a thin shell over the library's functions.

Bad input anywhere becomes ``ampcert: error: <one line>`` and exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from ampcert.console import Col, make_console, print_json, print_table
from ampcert.errors import UserError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Benchmark and certify automatic mixed precision training.",
)
# Messages and tables go to `console` (stdout), or to stderr when a command
# prints JSON on stdout (--json); both are made again for each invocation,
# for the streams and environment (NO_COLOR, COLUMNS) of that invocation.
console = make_console()
err_console = make_console(stderr=True)

JSON_HELP = "print the data as JSON on stdout instead of the table (messages go to stderr)"


def _setup_output(as_json: bool = False) -> None:
    """Fresh consoles for this invocation; with --json, messages go to stderr."""
    global console, err_console
    err_console = make_console(stderr=True)
    console = err_console if as_json else make_console()


def _version(value: bool) -> None:
    if value:
        from ampcert.version import __version__

        sys.stdout.write(f"ampcert {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="print the version and exit"),
) -> None:
    _setup_output()


def _fail(message: str) -> None:
    err_console.print(f"ampcert: error: {message}", markup=False, highlight=False, soft_wrap=True)
    sys.exit(2)


@app.command()
def run(
    suite: Path | None = typer.Argument(None, help="suite file (YAML)"),
    out: Path | None = typer.Option(None, "--out", help="results folder (default reports/<suite>-<time>)"),
    resume: Path | None = typer.Option(None, "--resume", help="finish an interrupted results folder"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="with --resume: redo failed runs too"),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and print the run matrix only"),
    sign_key: Path | None = typer.Option(None, "--sign-key", help="sign the report with this Ed25519 key"),
    shard: str | None = typer.Option(None, "--shard", help="i/n: run only shard i of n (counted from 1: the runs "
                                     "at plan positions i-1, i-1+n, ...); join the folders with `ampcert merge`"),
    as_json: bool = typer.Option(False, "--json", help="print the summary and certificate (with --dry-run: the "
                                 "run matrix) as JSON on stdout; progress and messages go to stderr"),
) -> None:
    """Run a suite: every workload x precision x seed, each in its own process."""
    _setup_output(as_json)
    from ampcert.results import ResultsDir, load
    from ampcert.runner import orchestrator as orch
    from ampcert.runner import shard as sharding
    from ampcert.runner.progress import RunProgress

    if sign_key is not None:  # a bad key is found before an hour of training, not after
        from ampcert.report.sign import load_private_key

        load_private_key(sign_key)
    if resume is not None:
        if suite is not None or out is not None:
            raise UserError("--resume DIR continues that folder's own suite: give no SUITE or --out")
        if shard is not None:
            raise UserError("--resume DIR continues that folder's own shard: give no --shard")
        if not resume.is_dir():
            raise UserError(f"--resume {resume}: results folder not found")
        root = resume
        stored = ResultsDir(root).read_plan()
        shard_info = stored.get("shard")
        runs, certify_rules = sharding.shard_runs(stored), stored.get("certify")
        planned = len(stored["runs"])
        if dry_run:
            _print_plan(orch.dump_plan_table(runs), as_json=as_json)
            return
    else:
        if suite is None:
            raise UserError("give a SUITE file, or --resume DIR")
        if retry_failed:
            raise UserError("--retry-failed goes with --resume DIR")
        where = sharding.parse_shard(shard) if shard is not None else None
        plan = orch.plan_suite(suite)
        runs = sharding.select(plan.runs, *where) if where else plan.runs
        shard_info = sharding.record(plan.runs, *where) if where else None
        planned = len(plan.runs)
        table = orch.dump_plan_table(runs)
        if dry_run:
            _print_plan(table, plan, as_json=as_json, shard=shard_info)
            if where:
                console.print(f"shard {where[0]}/{where[1]}: {len(runs)} of {len(plan.runs)} runs", markup=False)
            return
        root = out or orch.default_out_dir(plan.suite.name)
        orch.prepare_out_dir(root)
        with orch.FolderLock(root):
            orch.write_plan(root, plan, shard_info)
        certify_rules = plan.suite.certify
    # A rule pack judges the whole matrix: a shard's folder is certified once merged.
    certify_later = bool(shard_info and certify_rules)
    if certify_later:
        certify_rules = None

    with orch.FolderLock(root), RunProgress(console) as progress:
        orch.execute_plan(root, runs, retry_failed=retry_failed, on_event=progress.handle)
        from ampcert.report import summary

        result_set = load(root)
        cert = _certify(root, result_set, certify_rules) if certify_rules else None
        written = summary.write(result_set)
        report_paths = _write_report(result_set)
        if sign_key is not None:
            _sign(root, sign_key)
    if as_json:
        print_json({"results": str(root), "summary": written,
                    "certificate": cert.model_dump(mode="json") if cert is not None else None})
    else:
        _print_summary(result_set, written)
    console.print(f"report: {report_paths[1]}", markup=False)
    if cert is not None and not as_json:
        _print_certificate(cert, root)
    console.print(f"results: {root}  (summary: {ResultsDir(root).summary_html})", markup=False)
    if shard_info:
        console.print(f"shard {shard_info['index']}/{shard_info['count']}: {len(runs)} of {planned} runs; "
                      "join the shards' folders with `ampcert merge OUT DIR...`"
                      + (" and certify there" if certify_later else ""), markup=False, soft_wrap=True)
    failed = [r for r in result_set.runs if r.status == "failed"]
    # With a rule pack, failed runs are evidence for the verdicts (an fp16 run
    # without loss scaling is expected to fail); the certificate decides.
    if (cert.status == "FAIL") if cert is not None else (failed and not certify_later):
        raise typer.Exit(1)


@app.command()
def merge(
    out: Path = typer.Argument(..., help="the merged results folder to write (new or empty)"),
    dirs: list[Path] = typer.Argument(..., help="results folders of the shards (`ampcert run --shard i/n`)"),
    partial: bool = typer.Option(False, "--partial", help="merge even if some planned runs have no result"),
    as_json: bool = typer.Option(False, "--json", help="print the summary and certificate as JSON on stdout "
                                 "instead of the table (messages go to stderr)"),
) -> None:
    """Join shard folders of one suite into one results folder (certified, if the suite says so).

    Refuses folders of different suites (suite_sha256) or run matrices, and a run
    with results in two folders. `ampcert certify`, `report` and `sign` then work on OUT."""
    _setup_output(as_json)
    from ampcert.report import summary
    from ampcert.results import ResultsDir, load
    from ampcert.runner import shard as sharding

    info = sharding.merge(out, dirs, partial=partial)
    with _folder_lock(out):
        result_set = load(out)
        cert = _certify(out, result_set, info["certify"]) if info["certify"] else None
        written = summary.write(result_set)
        report_paths = _write_report(result_set)
    if as_json:
        print_json({"results": str(out), "summary": written,
                    "certificate": cert.model_dump(mode="json") if cert is not None else None,
                    "merged": {k: info[k] for k in ("merged", "runs", "missing")}})
    else:
        _print_summary(result_set, written)
    console.print(f"merged {info['merged']} of {info['runs']} runs from {len(dirs)} folders into {out}"
                  + (f"; {len(info['missing'])} without a result" if info["missing"] else ""), markup=False)
    console.print(f"report: {report_paths[1]}", markup=False)
    if cert is not None and not as_json:
        _print_certificate(cert, out)
    console.print(f"results: {out}  (summary: {ResultsDir(out).summary_html})", markup=False)


def _certify(root: Path, result_set, rules_ref: str | None):
    """Evaluate a rule pack on stored results and write verdicts.json atomically."""
    from ampcert.certify import evaluate, load_rules
    from ampcert.results import ResultsDir, atomic_write_json

    cert = evaluate(result_set.runs, load_rules(rules_ref))
    atomic_write_json(ResultsDir(root).verdicts_file, cert)
    return cert


STATUS_STYLE = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow", "REGRESSION": "bold red",
                "IMPROVED": "green"}


def _status(status: str, bold: bool = False) -> tuple[str, str]:
    style = STATUS_STYLE.get(status, "")
    return status, (f"bold {style}" if bold and "bold" not in style else style).strip()


def _print_certificate(cert, root: Path) -> None:
    from ampcert.certify import format_certificate
    from ampcert.results import ResultsDir

    console.print(f"certificate: {cert.status}  (rules {cert.rules['name']}, sha256 {cert.rules['sha256'][:12]})",
                  markup=False, highlight=False, soft_wrap=True)
    rows = []
    for s in cert.subjects:
        rows.append([_status(s.status, bold=True), str(s.subject), ""])
        for v in cert.verdicts:
            if v.subject.key() == s.subject.key():
                rows.append([_status(v.status), f"  {v.rule}" + ("" if v.required else " (advisory)"), v.summary])
    # Where the table does not fit: the certificate's own indented text, whole lines.
    print_table(console, [Col("status"), Col("subject / rule"), Col("finding")], rows,
                fallback=format_certificate(cert).splitlines()[1:])
    console.print(f"verdicts: {ResultsDir(root).verdicts_file}", markup=False, soft_wrap=True)


@app.command()
def certify(
    results_dir: Path = typer.Argument(..., help="a results folder written by `ampcert run`"),
    rules: str | None = typer.Option(None, "--rules", help="rule pack: shipped name (default, procurement) or file"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 on INCONCLUSIVE too"),
    as_json: bool = typer.Option(False, "--json", help="print the certificate (as in verdicts.json) on stdout "
                                 "instead of the table (messages go to stderr)"),
) -> None:
    """Re-evaluate stored results against a rule pack, without re-running anything.

    Writes DIR/verdicts.json. Exit 0 when no required rule FAILs (and, with
    --strict, none is INCONCLUSIVE), 1 otherwise, 2 on bad input."""
    _setup_output(as_json)
    from ampcert.results import ResultsDir, load

    if not results_dir.is_dir():
        raise UserError(f"{results_dir}: results folder not found")
    ResultsDir(results_dir).read_plan()  # one clear line if this is not a results folder
    result_set = load(results_dir)
    if not result_set.runs:
        raise UserError(f"{results_dir}: no run results to certify")
    with _folder_lock(results_dir):
        cert = _certify(results_dir, result_set, rules)
        # The report shows the verdicts, so it is re-rendered with the new ones
        # (a signature over the old report no longer covers it, as it should not).
        _write_report(result_set)
    if as_json:
        print_json(cert)
        from ampcert.results import ResultsDir

        console.print(f"verdicts: {ResultsDir(results_dir).verdicts_file}", markup=False, soft_wrap=True)
    else:
        _print_certificate(cert, results_dir)
    if (results_dir / "report.dsse.json").exists():
        console.print("note: report.json/report.html were re-rendered; sign them again "
                      f"(ampcert sign {results_dir} --key KEY)", markup=False, soft_wrap=True)
    if cert.status == "FAIL" or (strict and cert.status == "INCONCLUSIVE"):
        raise typer.Exit(1)


def _folder_lock(root: Path):
    from ampcert.runner import orchestrator as orch

    return orch.FolderLock(root)


@app.command()
def check(
    logs: list[Path] = typer.Argument(..., help="MLLOG files (run.mllog), or results folders"),
    rules: Path | None = typer.Option(None, "--rules", help="compliance rule file (default configs/rules/mllog.yaml)"),
    as_json: bool = typer.Option(False, "--json", help="print the logs and their violations as JSON on stdout "
                                 "(messages go to stderr)"),
) -> None:
    """Check MLLOG logs against declarative compliance rules; print every violation as file:line.

    Exit 0 when every log complies, 1 when any violation is found, 2 on bad input."""
    _setup_output(as_json)
    from ampcert.certify.compliance import check_log, load_compliance_rules

    compliance = load_compliance_rules(rules)
    files: list[Path] = []
    for item in logs:
        if item.is_dir():
            found = sorted(item.rglob("*.mllog"))
            if not found:
                raise UserError(f"{item}: no .mllog files in this folder")
            files += found
        elif item.is_file():
            files.append(item)
        else:
            raise UserError(f"{item}: no such log file or folder")
    total, checked = 0, []
    for f in files:
        violations = check_log(f, compliance)
        total += len(violations)
        checked.append({"log": str(f), "violations": [
            {"path": v.path, "line": v.line, "rule": v.rule, "message": v.message} for v in violations]})
        if not as_json:  # one line per violation, as compilers print them: editors and grep read these
            for v in violations:
                console.print(str(v), markup=False, highlight=False, soft_wrap=True)
    if as_json:
        print_json({"rules": compliance.name, "logs": checked, "violations": total})
    console.print(f"{len(files)} log(s) checked against {compliance.name}: "
                  f"{total} violation(s)", markup=False)
    if total:
        raise typer.Exit(1)


def _print_plan(rows: list[dict], plan=None, *, as_json: bool = False, shard: dict | None = None) -> None:
    if as_json:
        data: dict = {"runs": rows}
        if plan is not None:
            data = {"suite": plan.suite.name, "device": plan.device, "capabilities": plan.capabilities,
                    "shard": shard, **data}
        print_json(data)
        return
    if plan is not None:
        console.print(f"suite {plan.suite.name}: {len(rows)} runs on {plan.device}", markup=False)
        for precision, cap in plan.capabilities.items():
            console.print(f"  {precision}: {cap['note']}", markup=False, soft_wrap=True)
    # The run id names workload, precision, amp and seed: those columns go first when space is short.
    cols = [Col("run_id"), Col("workload", spare=True), Col("prec", spare=True), Col("amp", spare=True),
            Col("seed", "right", spare=True), Col("steps", "right"), Col("target", "right"), Col("note")]
    table = [[r["run_id"], r["workload"], r["precision"], r["amp"], str(r["seed"]), str(r["steps"]),
              "" if r["target"] is None else str(r["target"]), r["note"]] for r in rows]
    print_table(console, cols, table, hide_blank=True)


def _samples_per_s(v) -> str:
    from ampcert.report.summary import fmt

    return f"{v:,.0f}" if isinstance(v, float) and v >= 100 else fmt(v)


def _print_summary(rs, s: dict) -> None:
    from ampcert.report.summary import fmt

    groups = s["groups"]
    amps = {g["amp"] for g in groups}
    one_amp = len(amps) == 1
    # A note (e.g. "not comparable (capped at 30 steps)") is a marker in the row, its text below the table.
    notes: dict[str, str] = {}
    for g in groups:
        if g.get("note"):
            notes.setdefault(g["note"], f"[{len(notes) + 1}]")
    cols = [Col("workload")] + ([] if one_amp else [Col("amp")]) + [
        Col("prec"), Col("runs", "right"), Col("metric", "right"), Col("target", "right"),
        Col("samples/s", "right"), Col("speedup", "right"), Col("MFU", "right"), Col("accel")] + (
        [Col("note")] if notes else [])
    rows = []
    for g in groups:
        rows.append([g["workload"]] + ([] if one_amp else [g["amp"]]) + [
            g["precision"], f"{g['completed']}/{g['runs']}", fmt(g["final_metric_mean"]), fmt(g["target_reached"]),
            _samples_per_s(g["samples_per_s_mean"]), fmt(g["speedup_vs_fp32"], 3), fmt(g["mfu_mean"], 3),
            "yes" if g["accelerated"] else ("NO", "bold red")] + ([notes.get(g.get("note") or "", "")] if notes else []))
    title = f"suite {s['suite']}" + (f", amp {next(iter(amps))}" if one_amp else "")
    print_table(console, cols, rows, title=title, footnotes=[f"{m} {text}" for text, m in notes.items()])
    for r in rs.runs:
        if r.status != "completed":
            console.print(f"  {r.run_id}: {r.status}: {r.reason}", markup=False, soft_wrap=True)


def _heading(text: str) -> None:
    from rich.text import Text

    console.print(Text(text, style="bold"), soft_wrap=True)


@app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Workloads, suites, precisions, and the shipped policies and rule packs (`ampcert show KIND NAME`)."""
    _setup_output(as_json)
    from ampcert.resources import shipped_names
    from ampcert.spec import PRECISIONS
    from ampcert.workloads import registry

    workloads = []
    for name in registry.names():
        w = registry.get(name)
        workloads.append({"name": name, "metric": w.metric, "summary": w.summary})
    data = {
        "workloads": workloads,
        "suites": [str(p) for p in sorted(Path("suites").glob("*.yaml"))],
        "precisions": list(PRECISIONS),
        "policies": list(shipped_names("policy")),
        "rules": list(shipped_names("rules")),
    }
    if as_json:
        print_json(data)
        return
    _heading("workloads")
    print_table(console, [Col("name"), Col("metric"), Col("summary")],
                [[w["name"], w["metric"], w["summary"]] for w in workloads],
                fallback=[f"  {w['name']:12} {w['summary']} (metric: {w['metric']})" for w in workloads])
    _heading("suites")
    for path in data["suites"] or ["(no suites/*.yaml in this folder)"]:
        console.print(f"  {path}", markup=False, highlight=False)
    _heading("precisions")
    console.print("  " + ", ".join(data["precisions"]), markup=False, highlight=False)
    _heading("policies (ampcert show policy NAME)")
    console.print("  " + ", ".join(data["policies"]), markup=False, highlight=False)
    _heading("rule packs (ampcert show rules NAME)")
    console.print("  " + ", ".join(data["rules"]), markup=False, highlight=False)


@app.command()
def show(
    kind: str | None = typer.Argument(None, help="policy or rules", show_default=False),
    name: str | None = typer.Argument(None, help="a shipped name (`ampcert list` names them)", show_default=False),
) -> None:
    """Print a shipped policy or rule pack exactly as shipped, to copy and edit:
    `ampcert show policy torch-cpu > my-policy.yaml`, then `--policy my-policy.yaml`."""
    from ampcert.resources import KINDS, shipped_names, shipped_text

    if kind is None:
        raise UserError(f"show: give KIND and NAME, KIND one of {sorted(KINDS)} (e.g. ampcert show policy torch-cpu)")
    if name is None:
        raise UserError(f"show {kind}: give NAME, one of {list(shipped_names(kind))}")
    text = shipped_text(kind, name)
    sys.stdout.write(text)
    sys.stdout.flush()


@app.command()
def env(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """The environment fingerprint: Python, frameworks, CUDA, GPUs, CPU and its flags."""
    from ampcert.console import print_pairs
    from ampcert.envinfo import fingerprint

    fp = fingerprint()
    if as_json:
        print_json(fp)
        return
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


@app.command()
def report(
    results: Path = typer.Argument(..., help="results folder written by `ampcert run`"),
    csv: Path | None = typer.Option(None, "--csv", help="also write one row per run to this CSV file"),
    as_json: bool = typer.Option(False, "--json", help="print the summary (as in summary.json) on stdout "
                                 "instead of the table (messages go to stderr)"),
) -> None:
    """Re-render the summary and report.json/report.html from stored results (same bytes every time)."""
    _setup_output(as_json)
    from ampcert.report import summary
    from ampcert.results import ResultsDir, load

    rs = load(results)
    with _folder_lock(results):
        written = summary.write(rs)
        paths = _write_report(rs)
    if as_json:
        print_json({"results": str(results), "summary": written})
    else:
        _print_summary(rs, written)
    console.print(f"wrote {ResultsDir(results).summary_json}, {paths[0]} and {paths[1]}", markup=False, soft_wrap=True)
    if csv is not None:
        try:
            rs.frame().to_csv(csv, index=False)
        except OSError as exc:
            raise UserError(f"--csv {csv}: cannot write ({type(exc).__name__}: {exc.strerror})") from None
        console.print(f"wrote {csv}", markup=False)


def _write_report(rs):
    from ampcert.report import render

    return render.write(rs)


def _sign(root: Path, key: Path) -> None:
    from ampcert.report.sign import sign_results

    envelope, warnings = sign_results(root, key)
    for w in warnings:
        err_console.print(f"ampcert: warning: {w}", markup=False, soft_wrap=True)
    console.print(f"signed: {envelope}", markup=False, soft_wrap=True)


@app.command()
def keygen(
    key: Path = typer.Argument(..., help="private key file to write (KEY; the public key goes to KEY.pub)"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing key pair"),
) -> None:
    """Write an Ed25519 key pair for signing reports (private key mode 0600)."""
    from ampcert.report.sign import keygen as make_keys
    from ampcert.report.sign import keyid, load_public_key

    private, public = make_keys(key, force=force)
    console.print(f"private key: {private} (mode 600, keep it secret)\npublic key:  {public} "
                  f"(keyid {keyid(load_public_key(public))})", markup=False, soft_wrap=True)


@app.command()
def sign(
    results: Path = typer.Argument(..., help="results folder with report.json and report.html"),
    key: Path = typer.Option(..., "--key", help="Ed25519 private key (from `ampcert keygen`)"),
) -> None:
    """Sign report.json and report.html: writes report.dsse.json (DSSE, in-toto Statement v1)."""
    if not results.is_dir():
        raise UserError(f"{results}: results folder not found")
    with _folder_lock(results):
        _sign(results, key)


@app.command()
def verify(
    envelope: Path = typer.Argument(..., help="report.dsse.json (its subject files must sit beside it)"),
    pubkey: Path = typer.Option(..., "--pubkey", help="the signer's Ed25519 public key (KEY.pub)"),
) -> None:
    """Verify a signed report offline: signature, payload type and the digest of every subject file.

    Exit 0 when everything verifies, 1 on any mismatch (with the reason), 2 on bad input."""
    from ampcert.report.sign import VerificationError, load_public_key, verify_envelope

    key = load_public_key(pubkey)
    try:
        result = verify_envelope(envelope, key)
    except VerificationError as exc:
        err_console.print(f"ampcert: NOT VERIFIED: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"verified: DSSE signature by key {result.keyid} over {result.payload_type}", markup=False, soft_wrap=True)
    for name, digest in result.subjects:
        console.print(f"verified: {name} sha256 {digest}", markup=False, soft_wrap=True)
    pred = result.predicate
    console.print(f"statement: suite {pred.get('suite', {}).get('name')} "
                  f"(sha256 {str(pred.get('suite', {}).get('sha256'))[:16]}…), verdict {pred.get('verdict')}, "
                  f"tool {pred.get('tool', {}).get('name')} {pred.get('tool', {}).get('version')}", markup=False, soft_wrap=True)


@app.command()
def audit(
    backend: str = typer.Option("torch", "--backend", help="framework to audit: torch or jax"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    policy: str | None = typer.Option(None, "--policy", help="policy file or shipped name (default: the device's shipped policy)"),
    dtype: str | None = typer.Option(None, "--dtype", help="bf16 or fp16 (default: bf16 on cpu, fp16 on cuda)"),
    as_json: bool = typer.Option(False, "--json", help="print the audit rows as JSON on stdout instead of the "
                                 "tables (messages go to stderr)"),
) -> None:
    """Compare ampcert's autocast with native torch.autocast, op by op, on real tensors.

    Exits 1 when a shipped (native-mirroring) policy disagrees with native, so
    CI catches a torch upgrade that changed autocast's lists; a user policy's
    intended differences are listed, not failed. Exits 2 on bad input."""
    _setup_output(as_json)
    if backend == "jax":
        _audit_jax(policy, dtype, as_json)
        return
    if backend != "torch":
        raise UserError(f"--backend: expected torch or jax, got {backend!r}")
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device: expected cpu or cuda, got {device!r}")
    import torch

    from ampcert.amp.audit import audit_torch, coverage, format_coverage, format_table
    from ampcert.spec import load_op_policy

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA device")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}
    if dtype not in dtypes:
        raise UserError(f"--dtype: expected bf16 or fp16, got {dtype!r}")
    op_policy = load_op_policy(policy, "--policy", device)
    rows = audit_torch(device, op_policy, dtypes[dtype])
    console.print(f"policy {op_policy.name} ({op_policy.source}), sha256 {op_policy.sha256[:16]}..., "
                  f"torch {torch.__version__}, device {device}", markup=False, highlight=False, soft_wrap=True)
    cov = coverage(rows, device, op_policy)
    if as_json:
        from dataclasses import asdict

        print_json({"policy": {"name": op_policy.name, "source": str(op_policy.source), "sha256": op_policy.sha256},
                    "torch": torch.__version__, "device": device, "rows": [asdict(r) for r in rows],
                    "coverage": cov})
    else:
        table = format_table(rows).splitlines()  # the plain layout where a fitted table cannot be drawn
        print_table(console, [Col("op"), Col("family"), Col("agree"), Col("ampcert"), Col("native"), Col("note")],
                    [[r.op, r.family, "yes" if r.agree else ("NO", "bold red"), r.ampcert_dtype, r.native_dtype,
                      r.note] for r in rows], fallback=table[:-1], hide_blank=True)
        console.print(table[-1], markup=False, highlight=False, soft_wrap=True)
        print_table(console, [Col("family"), Col("ops", "right"), Col("audited", "right"), Col("agree", "right"),
                              Col("native", "right"), Col("covered", "right"), Col("missing")],
                    [[fam, str(c["ops"]), str(c["audited"]), str(c["agree"]), str(c["native"]), str(c["covered"]),
                      ", ".join(c["missing"])] for fam, c in cov.items()],
                    fallback=format_coverage(rows, device, op_policy).splitlines(), hide_blank=True)
    differ = [r.op for r in rows if not r.agree]
    from ampcert.amp.policy import POLICY_DIR

    shipped = op_policy.source is not None and Path(op_policy.source).parent == POLICY_DIR
    if differ and not shipped:
        # A user policy differs from native on purpose; the table shows where.
        console.print(f"{len(differ)} op(s) differ from native torch.autocast, as this policy "
                      f"chooses: {', '.join(differ)}", markup=False)
    elif differ:
        console.print(f"the shipped policy disagrees with torch {torch.__version__}'s autocast on: "
                      f"{', '.join(differ)}", markup=False)
        raise typer.Exit(1)


def _audit_jax(policy: str | None, dtype: str | None, as_json: bool = False) -> None:
    """ampcert's JAX autocast against its policy: per primitive, the operand
    dtypes it really got on real arrays; per nested region, whether the
    matmul inside was rewritten. Exit 1 when any row disagrees."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        raise UserError("--backend jax: JAX is not installed (pip install 'ampcert[jax]')") from None
    from ampcert.amp.jax.audit import (
        audit_jax,
        audit_regions,
        format_jax_table,
        format_region_table,
    )
    from ampcert.spec import load_op_policy

    dtypes = {"bf16": jnp.bfloat16, "fp16": jnp.float16, None: jnp.bfloat16}
    if dtype not in dtypes:
        raise UserError(f"--dtype: expected bf16 or fp16, got {dtype!r}")
    op_policy = load_op_policy(policy, "--policy", framework="jax")
    rows = audit_jax(op_policy, dtypes[dtype], extra_ops=("tanh", "logistic", "reduce_max", "add", "mul"))
    regions = audit_regions(op_policy, dtypes[dtype])
    console.print(f"policy {op_policy.name} ({op_policy.source}), sha256 {op_policy.sha256[:16]}..., "
                  f"jax {jax.__version__}, backend {jax.default_backend()}", markup=False, highlight=False,
                  soft_wrap=True)
    if as_json:
        from dataclasses import asdict

        print_json({"policy": {"name": op_policy.name, "source": str(op_policy.source), "sha256": op_policy.sha256},
                    "jax": jax.__version__, "backend": jax.default_backend(),
                    "rows": [asdict(r) for r in rows], "regions": [asdict(r) for r in regions]})
    else:
        print_table(console, [Col("primitive"), Col("family"), Col("operands (observed)"), Col("expected"),
                              Col("err/max|ref|", "right"), Col("agree"), Col("note")],
                    [[r.op, r.family, r.observed, r.expected,
                      f"{r.max_rel_err:.2e}" if r.max_rel_err is not None else "-",
                      "yes" if r.agree else ("NO", "bold red"), r.note] for r in rows],
                    fallback=format_jax_table(rows).splitlines(), hide_blank=True)
        print_table(console, [Col("nested region"), Col("rewritten"), Col("matmul operands inside"), Col("note")],
                    [[r.region, "yes" if r.rewritten else ("NO", "bold red"), r.matmul_dtypes, r.note]
                     for r in regions],
                    fallback=format_region_table(regions).splitlines(), hide_blank=True)
    bad = [r.op for r in rows if not r.agree] + [r.region for r in regions if not r.rewritten]
    if bad:
        console.print(f"autocast disagrees with the policy on: {', '.join(bad)}", markup=False)
        raise typer.Exit(1)
    console.print(f"all {len(rows)} primitives and {len(regions)} region kinds as the policy says", markup=False)


@app.command()
def compare(
    baseline: Path = typer.Argument(..., help="the baseline: a report.json or a results folder"),
    new: Path = typer.Argument(..., help="the candidate: a report.json or a results folder"),
    gate_file: Path | None = typer.Option(None, "--gate", help="gate settings laid over configs/gate.yaml"),
    json_out: Path | None = typer.Option(None, "--json", help="write the full result as JSON to this file; "
                                         "`--json -` prints it on stdout instead of the table (messages go to stderr)"),
    markdown: Path | None = typer.Option(None, "--markdown", help="write a Markdown summary (a CI job summary)"),
) -> None:
    """Regression gate: NEW against BASELINE, per workload, backend, AMP and precision.

    A metric regresses when it is worse by more than its threshold AND the change
    is significant over the repeated samples (steps within runs, seeds across runs);
    a verdict that FAILs now but did not before, or runs that fail now, regress too.
    Exit 0: no regression; 1: regression; 2: bad input (e.g. different suites)."""
    to_stdout = _is_stdout(json_out)
    _setup_output(to_stdout)
    from ampcert import gate

    result = gate.compare(gate.load_source(baseline), gate.load_source(new), gate.load_gate(gate_file))
    if to_stdout:
        print_json(result)
    else:
        _print_gate(result)
    for path in gate.write_outputs(result, None if to_stdout else json_out, markdown):
        console.print(f"wrote {path}", markup=False, soft_wrap=True)
    if result.status == "FAIL":
        raise typer.Exit(1)


def _is_stdout(path: Path | None) -> bool:
    """`--json -`: the JSON goes to stdout, not to a file named '-'."""
    return path is not None and str(path) == "-"


def _print_gate(result) -> None:
    from ampcert import gate

    b, c = result.baseline, result.candidate
    for name, side in (("baseline ", b), ("candidate", c)):
        cert = f", certificate {side.certificate}" if side.certificate else ""
        console.print(f"{name} {side.path} ({side.kind}, suite {side.suite}, {side.runs} runs, "
                      f"{', '.join(side.devices)}{cert})", markup=False, highlight=False, soft_wrap=True)
    # Short headers for a terminal; the Markdown summary keeps gate.HEADERS.
    headers = {"n": "n", "threshold": "limit"}
    right = {"baseline", "candidate", "n", "change", "threshold"}
    cols = [Col(headers.get(k, k), "right" if k in right else "left") for k in gate.COLUMNS]
    rows = [[row[k] for k in gate.COLUMNS[:-1]] + [_status(row["status"])] for row in gate.table_rows(result)]
    print_table(console, cols, rows, hide_blank=True,
                title=f"regression gate {result.gate['name']}: worse beyond the threshold AND significant",
                footnotes=["n: runs x samples per run, baseline / candidate; limit: worse by more than this "
                           "is a regression if significant"] if rows else [])
    for v in result.verdict_changes:
        tag = "REGRESSION " if v.regression else ""
        what = f"rule {v.rule}" if v.rule else "certificate"
        console.print(f"{tag}{v.subject}: {what} {v.baseline} -> {v.candidate}" + (f": {v.summary}" if v.rule else ""),
                      markup=False, highlight=False, soft_wrap=True)
    for f in result.run_failures:
        console.print(f"{'REGRESSION ' if f.regression else ''}{f.subject}: {f.candidate_failed}/{f.runs} run(s) "
                      f"failed (baseline {f.baseline_failed}): {'; '.join(f.reasons)}",
                      markup=False, highlight=False, soft_wrap=True)
    tests = gate.tests_used(result)
    if tests:
        console.print("tests: " + "; ".join(tests), markup=False, highlight=False, soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    if result.status == "FAIL":
        console.print(f"[bold red]FAIL[/]: {len(result.regressions)} regression(s)", soft_wrap=True)
        for line in result.regressions:
            console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    else:
        console.print("[bold green]PASS[/]: no regression", soft_wrap=True)


@app.command("plan")
def plan_cmd(
    report: Path = typer.Argument(..., help="a report.json or a results folder"),
    target_samples: int = typer.Option(..., "--target-samples", help="training samples to plan for (N)"),
    gpus: int = typer.Option(1, "--gpus", help="devices to spread them over (K); linear scaling assumed"),
    price_per_gpu_hour: float | None = typer.Option(None, "--price-per-gpu-hour", help="overrides the pricing table"),
    pricing: Path | None = typer.Option(None, "--pricing", help="price table (default configs/pricing.yaml)"),
    csv: Path | None = typer.Option(None, "--csv", help="also write the plan as CSV"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the plan as JSON to this file; `--json -` "
                                         "prints it on stdout instead of the table (messages go to stderr)"),
) -> None:
    """Capacity plan: wall time, GPU-hours, energy and cost of training N samples on K
    devices in each precision, from measured throughput and energy per sample."""
    to_stdout = _is_stdout(json_out)
    _setup_output(to_stdout)
    from ampcert import gate
    from ampcert import plan as planning
    from ampcert.results import atomic_write_text

    source = gate.load_source(report)
    cp = planning.capacity_plan(source.runs, target_samples, gpus, price_per_gpu_hour, pricing)
    if not cp.rows:
        raise UserError(f"{report}: no run results to plan from")
    rows = planning.table_rows(cp)
    devices = sorted({row["device"] for row in rows})
    columns = [k for k in rows[0] if k != "device" or len(devices) > 1]
    if to_stdout:
        print_json(cp)
    else:
        right = {"seeds", "samples/s", "wall time", "GPU-hours", "energy kWh", f"cost {cp.currency}"}
        print_table(console, [Col(k, "right" if k in right else "left") for k in columns],
                    [[row[k] for k in columns] for row in rows],
                    title=f"suite {source.suite_name}: {cp.target_samples:,} samples on {cp.gpus} x "
                          f"{devices[0] if len(devices) == 1 else 'device'}; ranges: slowest to fastest seed")
    for line in cp.assumptions + planning.notes(cp):
        console.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)
    for path, text in ((csv, planning.csv_text(cp)),
                       (None if to_stdout else json_out, cp.model_dump_json(indent=1) + "\n")):
        if path is None:
            continue
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            raise UserError(f"{path}: cannot write ({type(exc).__name__}: {exc.strerror or exc})") from None
        console.print(f"wrote {path}", markup=False)


def _usage_error(exc: Exception) -> bool:
    """click's (typer's) errors about the command line: a missing or extra argument, a bad option value."""
    return any(k.__name__ == "ClickException" for k in type(exc).__mro__) and hasattr(exc, "format_message")


def main() -> None:
    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        _fail(str(exc))
    except Exception as exc:
        if not _usage_error(exc):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # `ampcert` alone: the help is already printed
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        ctx = getattr(exc, "ctx", None)
        sub = ctx.command_path.removeprefix(ctx.find_root().info_name or "").strip() if ctx else ""
        where = f"{sub}: " if sub else ""
        hint = f" (see {ctx.command_path} --help)" if ctx else ""
        err_console.print(f"ampcert: error: {where}{exc.format_message()}{hint}",  # type: ignore[attr-defined]
                          markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        code = 130
    if code == 130:  # typer turns Ctrl-C into exit code 130
        err_console.print("ampcert: interrupted; finished runs are kept (continue with --resume)")
    sys.exit(code if isinstance(code, int) else 0)
