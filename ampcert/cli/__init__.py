"""The ``ampcert`` command line: parse, call one function of :mod:`ampcert.session`, print.

Each command body maps its options onto a session call, prints the result
through :mod:`ampcert.cli.views` and turns the outcome into an exit code: 0
done, 1 a negative finding (a FAIL certificate, a regression, a violation,
a failed run), 2 bad input or a file that could not be written (``ampcert:
error: <one line>``, from UserError/WriteFailed and click's usage errors; a
session's BadArgument names the option that fed the parameter; 1 for a write
that fails once runs have started), 128 + signum when SIGINT, SIGTERM or
SIGHUP stopped it (``ampcert: interrupted by ...``, from Interrupted).

Each invocation prints through one :class:`ampcert.console.Output` (made by
:func:`main`, passed as the click context's ``obj``): its stdout and stderr
consoles and the command's ``--json`` / ``--json-out FILE``. No console lives
in this module.
"""

from __future__ import annotations

import atexit
import gc
import signal
import sys
from pathlib import Path
from typing import NoReturn, cast

import typer

from ampcert import session
from ampcert.cli import views
from ampcert.cli.history import STORE_HELP, history_app
from ampcert.cli.mlperf import compare_systems, export_app, import_app
from ampcert.cli.options import (
    JSON_HELP,
    Device,
    Executor,
    Fp8Precision,
    Fp8Recipe,
    Framework,
    LowDtype,
    NoArgsIsHelpError,
    Typer,
    bad_argument_line,
    click_errors,
    json_out_option,
    output_of,
    usage_line,
)
from ampcert.cli.process_exit import ending_without_triton_teardown
from ampcert.console import Output
from ampcert.errors import BadArgument, Interrupted, UserError, WriteFailed, one_line

app = Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Benchmark and certify automatic mixed precision training.",
)


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
    pass


@app.command()
def run(
    ctx: typer.Context,
    suite: Path | None = typer.Argument(None, help="suite file (YAML), or the name of a shipped suite "
                                        "(`ampcert list`: smoke, vision, ...); a file of that name wins"),
    out: Path | None = typer.Option(None, "--out", help="results folder (default reports/<suite>-<time>)"),
    resume: Path | None = typer.Option(None, "--resume", help="finish an interrupted results folder"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="with --resume: redo failed runs too"),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and print the run matrix only"),
    sign_key: Path | None = typer.Option(None, "--sign-key", help="sign the report with this Ed25519 key"),
    shard: str | None = typer.Option(None, "--shard", help="i/n: run only shard i of n (counted from 1: the runs "
                                     "at plan positions i-1, i-1+n, ...); join the folders with `ampcert merge`"),
    as_json: bool = typer.Option(False, "--json", help="print the summary and certificate (with --dry-run: the "
                                 "run matrix) as JSON on stdout; progress and messages go to stderr"),
    json_out: Path | None = json_out_option(),
    executor: Executor = typer.Option(Executor.local, "--executor", help="where runs train: local (this machine, "
                                      "one after another), ray (a Ray cluster), slurm (a Slurm job array); see "
                                      "docs/fleet.md"),
    address: str | None = typer.Option(None, "--address", help="--executor ray: the cluster's HOST:PORT, "
                                       "ray://HOST:PORT or auto (default: start a Ray instance on this machine)"),
    retries: int | None = typer.Option(None, "--retries", help="ray, slurm: submit a run whose worker or node was "
                                       "lost again, up to this many times (default 2); a run that fails by itself "
                                       "is never retried"),
    cpus_per_run: int | None = typer.Option(None, "--cpus-per-run", help="ray, slurm: CPUs each run asks for "
                                            "(default 1); GPUs come from the run's spec"),
    partition: str | None = typer.Option(None, "--partition", help="slurm: the partition (default: the suite's "
                                         "slurm.partition, else Slurm's default)"),
    account: str | None = typer.Option(None, "--account", help="slurm: the account to charge"),
    time_min: int | None = typer.Option(None, "--time-min", help="slurm: each task's time limit in minutes "
                                        "(default: the longest run timeout + 5)"),
    slurm_local: bool = typer.Option(False, "--slurm-local", help="slurm: run the job arrays through submitit's "
                                     "local executor on this machine (no Slurm needed)"),
) -> None:
    """Run a suite: every workload x precision x seed, each in its own process (or on a cluster: --executor)."""
    output = output_of(ctx, as_json, json_out)
    fleet = session.fleet_options(executor=executor.value, address=address, retries=retries, cpus_per_run=cpus_per_run,
                                  partition=partition, account=account, time_min=time_min, slurm_local=slurm_local)
    if resume is not None:
        if suite is not None or out is not None:
            raise UserError("--resume DIR continues that folder's own suite: give no SUITE or --out")
        if shard is not None:
            raise UserError("--resume DIR continues that folder's own shard: give no --shard")
    elif suite is None:
        raise UserError("give a SUITE (a file, or a shipped suite's name: `ampcert list`), or --resume DIR")
    elif retry_failed:
        raise UserError("--retry-failed goes with --resume DIR")
    if dry_run:
        if sign_key is not None:
            session.check_key(sign_key)
        planned = session.plan_resume(resume) if resume is not None else session.plan_suite(cast(Path, suite), shard=shard)
        output.data(planned.to_json(), lambda console: views.print_plan(console, planned))
        return
    from ampcert.cli.progress import RunProgress

    with RunProgress(output) as progress:
        if resume is not None:
            done = session.resume(resume, retry_failed=retry_failed, sign_key=sign_key, on_event=progress.handle,
                                  fleet=fleet)
        else:
            done = session.run_suite(cast(Path, suite), out, shard=shard, sign_key=sign_key, on_event=progress.handle,
                                     fleet=fleet)
    _print_finished(output, done)
    if not done.passed:
        raise typer.Exit(1)


def _print_finished(output: Output, done: session.Finished, folders: int = 0) -> None:
    output.data(done.to_json())  # the table comes with the rest of what print_finished says
    views.print_finished(output, done, folders=folders)


@app.command()
def merge(
    ctx: typer.Context,
    out: Path = typer.Argument(..., help="the merged results folder to write (new or empty)"),
    dirs: list[Path] = typer.Argument(..., help="results folders of the shards (`ampcert run --shard i/n`)"),
    partial: bool = typer.Option(False, "--partial", help="merge even if some planned runs have no result"),
    as_json: bool = typer.Option(False, "--json", help="print the summary and certificate as JSON on stdout "
                                 "instead of the table (messages go to stderr)"),
    json_out: Path | None = json_out_option(),
) -> None:
    """Join shard folders of one suite into one results folder (certified, if the suite says so).

    Refuses folders of different suites (suite_sha256) or run matrices, and a run
    with results in two folders. `ampcert certify`, `report` and `sign` then work on OUT."""
    output = output_of(ctx, as_json, json_out)
    _print_finished(output, session.merge(out, dirs, partial=partial), folders=len(dirs))


@app.command()
def certify(
    ctx: typer.Context,
    results_dir: Path = typer.Argument(..., help="a results folder written by `ampcert run`"),
    rules: str | None = typer.Option(None, "--rules", help="rule pack: shipped name (default, procurement) or file"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 on INCONCLUSIVE too"),
    out: Path | None = typer.Option(None, "--out", help="write the re-evaluation to this new folder (a copy of DIR, "
                                    "certified and re-rendered, unsigned); DIR is left as it is"),
    force: bool = typer.Option(False, "--force", help="rewrite a signed DIR anyway: its signature would no longer "
                               "verify, so its report.dsse.json is removed"),
    as_json: bool = typer.Option(False, "--json", help="print the certificate (as in verdicts.json) on stdout "
                                 "instead of the table (messages go to stderr)"),
    json_out: Path | None = json_out_option(),
) -> None:
    """Re-evaluate stored results against a rule pack, without re-running anything.

    Writes DIR/verdicts.json and re-renders DIR's report. A signed DIR (report.dsse.json)
    is a what-if: the verdicts are printed and nothing in DIR is written, so its signature
    still verifies; --out NEW writes them to a copy of DIR, --force rewrites DIR and removes
    its envelope. Exit 0 when no required rule FAILs (and, with --strict, none is
    INCONCLUSIVE), 1 otherwise, 2 on bad input."""
    output = output_of(ctx, as_json, json_out)
    done = session.certify(results_dir, rules, out=out, force=force)
    cert = done.certificate
    assert cert is not None
    verdicts = (f"not written ({results_dir} is signed: a what-if, the folder is left as it was)" if done.what_if
                else done.root / "verdicts.json")
    output.data(cert, lambda console: views.print_certificate(console, cert, verdicts))
    if as_json:
        output.line(f"verdicts: {verdicts}")
    if done.what_if:
        output.line(f"note: --out NEW writes this re-evaluation to a copy of {results_dir}; --force rewrites "
                    f"{results_dir} itself (its signature would no longer verify: report.dsse.json is removed)")
    if done.source is not None:
        output.line(f"report: {done.report_html} ({done.source} is left as it was)")
    if done.removed_envelope is not None:
        output.line(f"note: removed {done.removed_envelope}: it signed the report as it was, and no longer "
                    f"verifies; sign again with `ampcert sign {results_dir} --key KEY`")
    if cert.status in ("FAIL", "INCOMPLETE") or (strict and cert.status == "INCONCLUSIVE"):
        raise typer.Exit(1)


@app.command()
def check(
    ctx: typer.Context,
    logs: list[Path] = typer.Argument(..., help="MLLOG files (run.mllog), or results folders"),
    rules: Path | None = typer.Option(None, "--rules", help="compliance rule file (default configs/rules/mllog.yaml)"),
    mlperf: bool = typer.Option(False, "--mlperf", help="check with MLPerf's own compliance checker "
                                "(mlperf-logging, training 6.1.0 common rules) instead"),
    as_json: bool = typer.Option(False, "--json", help="print the logs and their violations as JSON on stdout "
                                 "(messages go to stderr)"),
    json_out: Path | None = json_out_option(),
) -> None:
    """Check MLLOG logs against declarative compliance rules; print every violation as file:line.

    Exit 0 when every log complies, 1 when any violation is found, 2 on bad input."""
    output = output_of(ctx, as_json, json_out)
    checked = session.check_logs(logs, rules, mlperf=mlperf)
    output.data(checked.to_json(), lambda console: views.print_violations(console, checked))
    output.console.print(f"{len(checked.logs)} log(s) checked against {checked.rules.name}: "
                         f"{checked.violations} violation(s)", markup=False)
    if checked.violations:
        raise typer.Exit(1)


app.add_typer(export_app, name="export")
app.add_typer(import_app, name="import")
app.command("compare-systems")(compare_systems)


@app.command("list")
def list_cmd(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    json_out: Path | None = json_out_option(),
) -> None:
    """Workloads, the shipped suites (`ampcert run NAME`), precisions, policies and rule packs (`ampcert show KIND NAME`)."""
    output = output_of(ctx, as_json, json_out)
    data = session.catalog()
    output.data(data, lambda console: views.print_catalog(console, data))


@app.command()
def show(
    ctx: typer.Context,
    kind: str | None = typer.Argument(None, help="policy, rules or suite", show_default=False),
    name: str | None = typer.Argument(None, help="a shipped name (`ampcert list` names them)", show_default=False),
) -> None:
    """Print a shipped policy, rule pack or suite exactly as shipped, to copy and edit:
    `ampcert show policy torch-cpu > my-policy.yaml`, then `--policy my-policy.yaml`;
    `ampcert show suite vision > my-suite.yaml`, then `ampcert run my-suite.yaml`."""
    output_of(ctx)
    sys.stdout.write(session.shipped_text(kind, name))
    sys.stdout.flush()


@app.command()
def env(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    json_out: Path | None = json_out_option(),
) -> None:
    """The environment fingerprint: Python, frameworks, CUDA, GPUs, CPU and its flags."""
    output = output_of(ctx, as_json, json_out)
    fp = session.environment()
    output.data(fp, lambda console: views.print_environment(console, fp))


@app.command()
def report(
    ctx: typer.Context,
    results: Path = typer.Argument(..., help="results folder written by `ampcert run`"),
    csv: Path | None = typer.Option(None, "--csv", help="also write one row per run to this CSV file"),
    as_json: bool = typer.Option(False, "--json", help="print the summary (as in summary.json) on stdout "
                                 "instead of the table (messages go to stderr)"),
    json_out: Path | None = json_out_option(),
) -> None:
    """Re-render the summary and report.json/report.html from stored results (same bytes every time)."""
    output = output_of(ctx, as_json, json_out)
    done = session.report(results, csv=csv)
    output.data({"results": str(results), "summary": done.summary},
                lambda console: views.print_summary(console, done.results, done.summary))
    output.console.print(f"wrote {results / 'summary.json'}, {done.report_json} and {done.report_html}",
                         markup=False, soft_wrap=True)
    if csv is not None:
        output.console.print(f"wrote {csv}", markup=False)


@app.command()
def keygen(
    ctx: typer.Context,
    key: Path = typer.Argument(..., help="private key file to write (KEY; the public key goes to KEY.pub)"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing key pair"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    json_out: Path | None = json_out_option(),
) -> None:
    """Write an Ed25519 key pair for signing reports (private key mode 0600)."""
    output = output_of(ctx, as_json, json_out)
    private, public, keyid = session.keygen(key, force=force)
    output.data({"private_key": str(private), "public_key": str(public), "keyid": keyid},
                lambda console: console.print(f"private key: {private} (mode 600, keep it secret)\npublic key:  "
                                              f"{public} (keyid {keyid})", markup=False, soft_wrap=True))


@app.command()
def sign(
    ctx: typer.Context,
    results: Path = typer.Argument(..., help="results folder with report.json and report.html"),
    key: Path = typer.Option(..., "--key", help="Ed25519 private key (from `ampcert keygen`)"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    json_out: Path | None = json_out_option(),
) -> None:
    """Sign report.json and report.html: writes report.dsse.json (DSSE, in-toto Statement v1)."""
    output = output_of(ctx, as_json, json_out)
    envelope, warnings = session.sign(results, key)
    views.print_signed(output, envelope, warnings)  # a message: on stderr under --json
    output.data({"envelope": str(envelope), "warnings": warnings})


@app.command()
def verify(
    ctx: typer.Context,
    envelope: Path = typer.Argument(..., help="report.dsse.json (its subject files must sit beside it)"),
    pubkey: Path = typer.Option(..., "--pubkey", help="the signer's Ed25519 public key (KEY.pub)"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    json_out: Path | None = json_out_option(),
) -> None:
    """Verify a signed report offline: signature, payload type and the digest of every subject file.

    Exit 0 when everything verifies, 1 on any mismatch (with the reason; with --json,
    ``{"verified": false, "reason": ...}`` too), 2 on bad input (an envelope or key that
    cannot be read: not found, a folder, no permission)."""
    output = output_of(ctx, as_json, json_out)
    try:
        result = session.verify(envelope, pubkey)
    except session.NotVerified as exc:
        output.stderr.print(f"ampcert: NOT VERIFIED: {exc}", markup=False, soft_wrap=True)
        output.data({"verified": False, "reason": str(exc)})
        raise typer.Exit(1) from None
    output.data({"verified": True, "keyid": result.keyid, "payload_type": result.payload_type,
                 "subjects": [{"name": name, "sha256": digest} for name, digest in result.subjects],
                 "predicate": result.predicate},
                lambda console: views.print_verified(console, result))


@app.command()
def audit(
    ctx: typer.Context,
    backend: Framework = typer.Option(Framework.torch, "--backend", help="framework to audit"),
    device: Device = typer.Option(Device.cpu, "--device", help="the device to audit on"),
    policy: str | None = typer.Option(None, "--policy", help="policy file or shipped name (default: the device's shipped policy)"),
    dtype: LowDtype | None = typer.Option(None, "--dtype", help="autocast's low precision (default: bf16 on cpu, "
                                          "fp16 on cuda)"),
    as_json: bool = typer.Option(False, "--json", help="print the audit rows as JSON on stdout instead of the "
                                 "tables (messages go to stderr)"),
    json_out: Path | None = json_out_option(),
) -> None:
    """Compare ampcert's autocast with native torch.autocast, op by op, on real tensors.

    Exits 1 when a shipped (native-mirroring) policy disagrees with native, so
    CI catches a torch upgrade that changed autocast's lists; a user policy's
    intended differences are listed, not failed. With --backend jax: each
    primitive's operand dtypes and each nested region against the policy.
    Exits 2 on bad input."""
    output = output_of(ctx, as_json, json_out)
    low = None if dtype is None else dtype.value
    result = (session.audit_jax(policy, low) if backend is Framework.jax
              else session.audit_torch(device.value, policy, low))
    views.print_audit(output.console, result)
    output.data(result.to_json(), lambda console: views.print_audit_tables(console, result))
    views.print_audit_verdict(output.console, result)
    if not result.passed:
        raise typer.Exit(1)


@app.command()
def screen(
    ctx: typer.Context,
    workload: str = typer.Argument(..., help="workload name (built-in, plugin) or import path 'pkg.mod:attr'"),
    params: str | None = typer.Option(None, "--params", help="the workload's params as YAML, e.g. '{size: tiny}'"),
    precision: Fp8Precision = typer.Option(Fp8Precision.fp8, "--precision", help="the FP8 format to screen"),
    recipe: Fp8Recipe = typer.Option(Fp8Recipe.tensorwise, "--recipe", help="fp8's scaling recipe (mxfp8 has its "
                                     "own)"),
    steps: int = typer.Option(3, "--steps", help="training steps to measure (each one recorded)"),
    include: list[str] = typer.Option([], "--include", help="module-name pattern to convert (repeatable)"),
    exclude: list[str] = typer.Option([], "--exclude", help="module-name pattern to keep in bf16 (repeatable)"),
    first_last: bool = typer.Option(False, "--first-last", help="let the first and last Linear layers convert"),
    device: Device = typer.Option(Device.cpu, "--device", help="the device to train on"),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="print the map as JSON on stdout (messages go to stderr)"),
    json_out: Path | None = json_out_option(),
) -> None:
    """The per-layer FP8 eligibility map of a workload's model, without a run.

    Trains a few steps with the policy's Linear layers in FP8 (emulated where
    the device has no FP8 units) and measures every Linear layer: amax,
    underflow and saturation of its FP8 operands, its output's relative error
    against bf16, and a verdict (safe, review, unsafe). Exit 2 on bad input."""
    output = output_of(ctx, as_json, json_out)
    result = session.screen_fp8(workload, params, precision.value, recipe.value, steps, include, exclude,
                                first_last, device.value, seed)
    output.data(views.screen_json(result), lambda console: views.print_screen(console, result))


@app.command()
def compare(
    ctx: typer.Context,
    baseline: Path = typer.Argument(..., help="the baseline: a report.json or a results folder"),
    new: Path = typer.Argument(..., help="the candidate: a report.json or a results folder"),
    gate_file: Path | None = typer.Option(None, "--gate", help="gate settings laid over configs/gate.yaml"),
    as_json: bool = typer.Option(False, "--json", help="print the full result as JSON on stdout instead of the "
                                 "table (messages go to stderr)"),
    json_out: Path | None = json_out_option("also write the full result as JSON to FILE"),
    markdown: Path | None = typer.Option(None, "--markdown", help="write a Markdown summary (a CI job summary)"),
) -> None:
    """Gate against a baseline: NEW against BASELINE (two results folders or report.json files).

    Per workload, backend, AMP and precision, a metric regresses when it is
    worse by more than its threshold AND the change is significant over the
    repeated samples (steps within runs, seeds across runs); a verdict that
    FAILs now but did not before, or runs that fail now, regress too. For the
    gate against the nightly history, see `ampcert gate`.
    Exit 0: no regression; 1: regression; 2: bad input (e.g. different suites)."""
    output = output_of(ctx, as_json, json_out)
    result = session.compare(baseline, new, gate=gate_file)
    output.data(result, lambda console: views.print_gate(console, result), write=False)
    for path in session.write_gate_outputs(result, output.json_out, markdown):
        output.console.print(f"wrote {path}", markup=False, soft_wrap=True)
    if result.status == "FAIL":
        raise typer.Exit(1)


app.add_typer(history_app, name="history")


@app.command("gate")
def gate_cmd(
    ctx: typer.Context,
    new: Path = typer.Argument(..., help="the new night: a results folder"),
    store: str | None = typer.Option(None, "--store", help=STORE_HELP),
    machine: str | None = typer.Option(None, "--machine", help="the series' machine name (as given to history add)"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON on stdout instead of the table "
                                 "(messages go to stderr)"),
    json_out: Path | None = json_out_option("also write the result as JSON to FILE"),
    markdown: Path | None = typer.Option(None, "--markdown", help="write a Markdown summary (a CI comment)"),
    html: Path | None = typer.Option(None, "--html", help="write a page with each series, its change points "
                                     "and the nights they point to"),
) -> None:
    """Gate against the nightly history: NEW against its suite's series in the history store.

    Change points in each metric's series (ruptures' PELT) within the newest
    3 nights, worse by at least 1%, regress; accuracy is judged by paired TOST
    against the nights before. For the gate against one baseline, see
    `ampcert compare`. Exit 0: no regression; 1: regression; 2: bad input."""
    output = output_of(ctx, as_json, json_out)
    result = session.gate_history(new, store=store, machine=machine)
    output.data(result.to_json(), lambda console: views.print_history_gate(console, result), write=False)
    for path in session.write_history_gate_outputs(result, output.json_out, markdown, html):
        output.console.print(f"wrote {path}", markup=False, soft_wrap=True)
    if result.status == "FAIL":
        raise typer.Exit(1)


@app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    report: Path = typer.Argument(..., help="a report.json, a results folder, or imported MLPerf results"),
    target_samples: int | None = typer.Option(None, "--target-samples", help="training samples to plan for (N)"),
    training_runs: int | None = typer.Option(None, help="training runs to plan for (imported MLPerf results)"),
    gpus: int = typer.Option(1, "--gpus", help="devices to spread them over (K); linear scaling assumed"),
    price_per_gpu_hour: float | None = typer.Option(None, "--price-per-gpu-hour", help="overrides the pricing table"),
    pricing: Path | None = typer.Option(None, "--pricing", help="price table (default configs/pricing.yaml)"),
    csv: Path | None = typer.Option(None, "--csv", help="also write the plan as CSV"),
    global_batch: int | None = typer.Option(None, help="devices each precision needs for this batch (memory sweep)"),
    device_memory: str | None = typer.Option(None, help="each device's memory, e.g. 80GiB (default: see docs)"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON on stdout instead of the table "
                                 "(messages go to stderr)"),
    json_out: Path | None = json_out_option("also write the plan as JSON to FILE"),
) -> None:
    """Capacity plan per precision: wall time, GPU-hours, energy, cost of N samples on K devices; or, from
    `ampcert import mlperf`'s folders, of N training runs per published system."""
    output = output_of(ctx, as_json, json_out)
    cap = session.capacity(report, target_samples, gpus=gpus, price_per_gpu_hour=price_per_gpu_hour,
                           pricing=pricing, global_batch=global_batch, device_memory=device_memory,
                           training_runs=training_runs)
    output.data(cap.plan, lambda console: views.print_capacity(console, cap), write=False)
    for note in cap.notes:
        output.console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    for path in session.write_capacity(cap, csv=csv, json_path=output.json_out):
        output.console.print(f"wrote {path}", markup=False)


# --------------------------------------------------------------------------- errors

def main() -> None:
    with ending_without_triton_teardown():
        _main()


def _main() -> None:
    # At exit the interpreter collects every object torch, pandas and matplotlib made:
    # seconds of CPU after the last line, for memory the process is about to give back.
    # Frozen objects are skipped; atexit handlers and finalizers still run. (At exit, not
    # here: a caller that runs main() in its own process keeps its collector.)
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    out = Output.make()  # this invocation's consoles; the commands set its JSON options
    # The one signal policy over the whole invocation, parsing and printing included; once
    # the exit code is known, a signal ends the process at once with the same one line.
    with session.interruptible():
        code = _invoke(out)
        session.closing()
    sys.exit(code)


def _invoke(out: Output) -> int:
    """Run the command; its exit code (errors printed as one line)."""
    try:
        code = app(obj=out, standalone_mode=False)
    except OSError as exc:  # WriteFailed is one
        # A file that could not be written (a full disk): one line naming it and the errno,
        # raised after the atomic writers left every file whole. Exit 2, as for any command
        # that could not do what it was asked, or 1 where the session says runs had started
        # (WriteFailed.exit_code). A bare OSError (a writer that does not name its file)
        # gets the same line with what it says.
        out.error(str(exc) if isinstance(exc, WriteFailed) else one_line(str(exc)))
        return exc.exit_code if isinstance(exc, WriteFailed) else 2
    except BadArgument as exc:  # a session function's parameter: named as the option that fed it
        out.error(bad_argument_line(out.command, exc))
        return exc.exit_code
    except UserError as exc:
        out.error(str(exc))
        return exc.exit_code
    except NoArgsIsHelpError as exc:  # `ampcert` alone: the help is already printed
        return exc.exit_code
    except click_errors.ClickException as exc:  # a missing or extra argument, a bad option value
        out.error(usage_line(exc))
        return exc.exit_code
    except Interrupted as exc:  # SIGINT, SIGTERM or SIGHUP, turned into this by the runner
        _interrupted(out, exc)
    except KeyboardInterrupt:  # Ctrl-C that typer did not see (outside the runner's handlers)
        _interrupted(out, Interrupted(signal.SIGINT))
    if code == 130:  # typer's exit for a KeyboardInterrupt: Ctrl-C where the runner has no handlers
        _interrupted(out, Interrupted(signal.SIGINT))
    return code if isinstance(code, int) else 0


def _interrupted(out: Output, exc: Interrupted) -> NoReturn:
    """One line on stderr, exit 128 + signum (130 SIGINT, 143 SIGTERM, 129 SIGHUP)."""
    exc.report(lambda line: out.stderr.print(line, markup=False, highlight=False, soft_wrap=True))
    sys.exit(exc.exit_code)
