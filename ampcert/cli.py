"""The ``ampcert`` command line: a thin shell over the library's functions.

Bad input anywhere becomes ``ampcert: error: <one line>`` and exit code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from ampcert.errors import UserError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Benchmark and certify automatic mixed precision training.",
)
console = Console()
err_console = Console(stderr=True)


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
) -> None:
    """Run a suite: every workload x precision x seed, each in its own process."""
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
            _print_plan(orch.dump_plan_table(runs))
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
            _print_plan(table, plan)
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
    _print_summary(result_set, written)
    console.print(f"report: {report_paths[1]}", markup=False)
    if cert is not None:
        _print_certificate(cert, root)
    console.print(f"results: {root}  (summary: {ResultsDir(root).summary_html})")
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
) -> None:
    """Join shard folders of one suite into one results folder (certified, if the suite says so).

    Refuses folders of different suites (suite_sha256) or run matrices, and a run
    with results in two folders. `ampcert certify`, `report` and `sign` then work on OUT."""
    from ampcert.report import summary
    from ampcert.results import ResultsDir, load
    from ampcert.runner import shard as sharding

    info = sharding.merge(out, dirs, partial=partial)
    with _folder_lock(out):
        result_set = load(out)
        cert = _certify(out, result_set, info["certify"]) if info["certify"] else None
        written = summary.write(result_set)
        report_paths = _write_report(result_set)
    _print_summary(result_set, written)
    console.print(f"merged {info['merged']} of {info['runs']} runs from {len(dirs)} folders into {out}"
                  + (f"; {len(info['missing'])} without a result" if info["missing"] else ""), markup=False)
    console.print(f"report: {report_paths[1]}", markup=False)
    if cert is not None:
        _print_certificate(cert, out)
    console.print(f"results: {out}  (summary: {ResultsDir(out).summary_html})", markup=False)


def _certify(root: Path, result_set, rules_ref: str | None):
    """Evaluate a rule pack on stored results and write verdicts.json atomically."""
    from ampcert.certify import evaluate, load_rules
    from ampcert.results import ResultsDir, atomic_write_json

    cert = evaluate(result_set.runs, load_rules(rules_ref))
    atomic_write_json(ResultsDir(root).verdicts_file, cert)
    return cert


def _print_certificate(cert, root: Path) -> None:
    from ampcert.certify import format_certificate
    from ampcert.results import ResultsDir

    console.print(format_certificate(cert), markup=False, highlight=False, soft_wrap=True)
    console.print(f"verdicts: {ResultsDir(root).verdicts_file}", markup=False)


@app.command()
def certify(
    results_dir: Path = typer.Argument(..., help="a results folder written by `ampcert run`"),
    rules: str | None = typer.Option(None, "--rules", help="rule pack: shipped name (default, procurement) or file"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 on INCONCLUSIVE too"),
) -> None:
    """Re-evaluate stored results against a rule pack, without re-running anything.

    Writes DIR/verdicts.json. Exit 0 when no required rule FAILs (and, with
    --strict, none is INCONCLUSIVE), 1 otherwise, 2 on bad input."""
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
) -> None:
    """Check MLLOG logs against declarative compliance rules; print every violation as file:line.

    Exit 0 when every log complies, 1 when any violation is found, 2 on bad input."""
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
    total = 0
    for f in files:
        violations = check_log(f, compliance)
        total += len(violations)
        for v in violations:
            console.print(str(v), markup=False, highlight=False, soft_wrap=True)
    console.print(f"{len(files)} log(s) checked against {compliance.name}: "
                  f"{total} violation(s)", markup=False)
    if total:
        raise typer.Exit(1)


def _print_plan(rows: list[dict], plan=None) -> None:
    if plan is not None:
        console.print(f"suite {plan.suite.name}: {len(rows)} runs on {plan.device}")
        for precision, cap in plan.capabilities.items():
            console.print(f"  {precision}: {cap['note']}", markup=False)
    table = Table("run_id", "workload", "precision", "amp", "seed", "steps", "target", "note")
    table.columns[0].no_wrap = True
    for r in rows:
        table.add_row(r["run_id"], r["workload"], r["precision"], r["amp"], str(r["seed"]),
                      str(r["steps"]), "" if r["target"] is None else str(r["target"]), r["note"])
    console.print(table)


def _print_summary(rs, s: dict) -> None:
    from ampcert.report import summary

    table = Table("workload", "amp", "precision", "runs", "metric", "target", "samples/s",
                  "speedup", "MFU", "accelerated", title=f"suite {s['suite']}")
    fmt = summary.fmt
    for g in s["groups"]:
        table.add_row(g["workload"], g["amp"], g["precision"], f"{g['completed']}/{g['runs']}",
                      fmt(g["final_metric_mean"]), fmt(g["target_reached"]), fmt(g["samples_per_s_mean"]),
                      fmt(g["speedup_vs_fp32"], 3), fmt(g["mfu_mean"], 3),
                      "yes" if g["accelerated"] else "NO")
    console.print(table)
    for r in rs.runs:
        if r.status != "completed":
            console.print(f"  {r.run_id}: {r.status}: {r.reason}", markup=False)


@app.command("list")
def list_cmd() -> None:
    """Workloads, suites and precisions that ampcert knows."""
    from ampcert.spec import PRECISIONS
    from ampcert.workloads import registry

    console.print("[bold]workloads[/bold]")
    for name in registry.names():
        w = registry.get(name)
        console.print(f"  {name:12} {w.summary} (metric: {w.metric})", markup=False)
    console.print("[bold]suites[/bold]")
    for path in sorted(Path("suites").glob("*.yaml")):
        console.print(f"  {path}")
    console.print("[bold]precisions[/bold]")
    console.print("  " + ", ".join(PRECISIONS))


@app.command()
def env(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """The environment fingerprint: Python, frameworks, CUDA, GPUs, CPU and its flags."""
    from ampcert.envinfo import fingerprint

    fp = fingerprint()
    if as_json:
        console.print_json(json.dumps(fp))
        return
    cpu = fp["cpu"]
    console.print(f"python      {fp['python']}  ({fp['platform']})", markup=False)
    console.print(f"cpu         {cpu['model']}, {cpu['usable_cores']} usable of {cpu['logical_cores']} "
                  "logical cores", markup=False)
    if isinstance(cpu["flags"], dict):
        flags = " ".join(f"{k}={'yes' if v else 'no'}" for k, v in cpu["flags"].items())
        console.print(f"cpu flags   {flags}", markup=False)
    gpu = fp["gpu"]
    console.print(f"cuda        torch build {gpu.get('torch_cuda')}, available: {gpu.get('cuda_available')}",
                  markup=False)
    for d in gpu.get("devices", []):
        console.print(f"gpu {d['index']}       {d['name']} (sm {d['capability']}, "
                      f"{d['memory_bytes'] / 2**30:.1f} GiB)", markup=False)
    console.print(f"driver      {gpu.get('driver') or gpu.get('nvml')}", markup=False)
    pk = " ".join(f"{k}={v}" for k, v in fp["packages"].items() if v)
    console.print(f"packages    {pk}", markup=False)


@app.command()
def report(
    results: Path = typer.Argument(..., help="results folder written by `ampcert run`"),
    csv: Path | None = typer.Option(None, "--csv", help="also write one row per run to this CSV file"),
) -> None:
    """Re-render the summary and report.json/report.html from stored results (same bytes every time)."""
    from ampcert.report import summary
    from ampcert.results import ResultsDir, load

    rs = load(results)
    with _folder_lock(results):
        written = summary.write(rs)
        paths = _write_report(rs)
    _print_summary(rs, written)
    console.print(f"wrote {ResultsDir(results).summary_json}, {paths[0]} and {paths[1]}", markup=False)
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
) -> None:
    """Compare ampcert's autocast with native torch.autocast, op by op, on real tensors.

    Exits 1 when a shipped (native-mirroring) policy disagrees with native, so
    CI catches a torch upgrade that changed autocast's lists; a user policy's
    intended differences are listed, not failed. Exits 2 on bad input."""
    if backend == "jax":
        _audit_jax(policy, dtype)
        return
    if backend != "torch":
        raise UserError(f"--backend: expected torch or jax, got {backend!r}")
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device: expected cpu or cuda, got {device!r}")
    import torch

    from ampcert.amp.audit import audit_torch, format_coverage, format_table
    from ampcert.spec import load_op_policy

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA device")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}
    if dtype not in dtypes:
        raise UserError(f"--dtype: expected bf16 or fp16, got {dtype!r}")
    op_policy = load_op_policy(policy, "--policy", device)
    rows = audit_torch(device, op_policy, dtypes[dtype])
    console.print(f"policy {op_policy.name} ({op_policy.source}), sha256 {op_policy.sha256[:16]}..., "
                  f"torch {torch.__version__}, device {device}", markup=False, highlight=False)
    console.print(format_table(rows), markup=False, highlight=False, soft_wrap=True)
    console.print(format_coverage(rows, device, op_policy), markup=False, highlight=False, soft_wrap=True)
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


def _audit_jax(policy: str | None, dtype: str | None) -> None:
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
                  f"jax {jax.__version__}, backend {jax.default_backend()}", markup=False, highlight=False)
    console.print(format_jax_table(rows), markup=False, highlight=False, soft_wrap=True)
    console.print(format_region_table(regions), markup=False, highlight=False, soft_wrap=True)
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
    json_out: Path | None = typer.Option(None, "--json", help="write the full result as JSON"),
    markdown: Path | None = typer.Option(None, "--markdown", help="write a Markdown summary (a CI job summary)"),
) -> None:
    """Regression gate: NEW against BASELINE, per workload, backend, AMP and precision.

    A metric regresses when it is worse by more than its threshold AND the change
    is significant over the repeated samples (steps within runs, seeds across runs);
    a verdict that FAILs now but did not before, or runs that fail now, regress too.
    Exit 0: no regression; 1: regression; 2: bad input (e.g. different suites)."""
    from ampcert import gate

    result = gate.compare(gate.load_source(baseline), gate.load_source(new), gate.load_gate(gate_file))
    _print_gate(result)
    for path in gate.write_outputs(result, json_out, markdown):
        console.print(f"wrote {path}", markup=False)
    if result.status == "FAIL":
        raise typer.Exit(1)


def _print_gate(result) -> None:
    from ampcert import gate

    b, c = result.baseline, result.candidate
    for name, side in (("baseline ", b), ("candidate", c)):
        cert = f", certificate {side.certificate}" if side.certificate else ""
        console.print(f"{name} {side.path} ({side.kind}, suite {side.suite}, {side.runs} runs, "
                      f"{', '.join(side.devices)}{cert})", markup=False, highlight=False, soft_wrap=True)
    table = Table(*[gate.HEADERS.get(k, k) for k in gate.COLUMNS],
                  title=f"regression gate {result.gate['name']}: worse beyond the threshold AND significant")
    style = {"REGRESSION": "bold red", "INCONCLUSIVE": "yellow", "IMPROVED": "green"}
    for row in gate.table_rows(result):
        cells = [row[k] for k in gate.COLUMNS]
        cells[-1] = f"[{style[row['status']]}]{row['status']}[/]" if row["status"] in style else row["status"]
        table.add_row(*cells)
    console.print(table)
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
        console.print(f"[bold red]FAIL[/]: {len(result.regressions)} regression(s)")
        for line in result.regressions:
            console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    else:
        console.print("[bold green]PASS[/]: no regression")


@app.command("plan")
def plan_cmd(
    report: Path = typer.Argument(..., help="a report.json or a results folder"),
    target_samples: int = typer.Option(..., "--target-samples", help="training samples to plan for (N)"),
    gpus: int = typer.Option(1, "--gpus", help="devices to spread them over (K); linear scaling assumed"),
    price_per_gpu_hour: float | None = typer.Option(None, "--price-per-gpu-hour", help="overrides the pricing table"),
    pricing: Path | None = typer.Option(None, "--pricing", help="price table (default configs/pricing.yaml)"),
    csv: Path | None = typer.Option(None, "--csv", help="also write the plan as CSV"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the plan as JSON"),
) -> None:
    """Capacity plan: wall time, GPU-hours, energy and cost of training N samples on K
    devices in each precision, from measured throughput and energy per sample."""
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
    table = Table(*columns, title=f"suite {source.suite_name}: {cp.target_samples:,} samples on {cp.gpus} x "
                  f"{devices[0] if len(devices) == 1 else 'device'}; ranges: slowest to fastest seed")
    for row in rows:
        table.add_row(*[row[k] for k in columns])
    console.print(table)
    for line in cp.assumptions + planning.notes(cp):
        console.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)
    for path, text in ((csv, planning.csv_text(cp)), (json_out, cp.model_dump_json(indent=1) + "\n")):
        if path is None:
            continue
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            raise UserError(f"{path}: cannot write ({type(exc).__name__}: {exc.strerror or exc})") from None
        console.print(f"wrote {path}", markup=False)


def main() -> None:
    try:
        app()
    except UserError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        err_console.print("ampcert: interrupted; finished runs are kept (continue with --resume)")
        sys.exit(130)
