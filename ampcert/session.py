"""The session API: what each ``ampcert`` command does, as functions over folders.

The CLI parses its arguments, calls one function here and prints what it
returns; a notebook or another program calls the same functions::

    import ampcert

    done = ampcert.run_suite("suites/smoke.yaml", out="reports/smoke")
    print(done.certificate.status if done.certificate else done.summary["counts"])

Every command that leaves a results folder behind ends in :func:`finish`
(certify with the rule pack if there is one, write summary.json/html and
report.json/html, sign if a key is given), under the folder's lock, so run,
resume, merge, certify and report cannot drift apart. Bad input raises
:class:`ampcert.errors.UserError` (one line) before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampcert.errors import UserError, WriteFailed

if TYPE_CHECKING:
    from ampcert.certify.checks import Certificate
    from ampcert.certify.compliance import ComplianceRules, Violation
    from ampcert.gate import GateResult
    from ampcert.history.gate import HistoryGate
    from ampcert.history.store import NightRow
    from ampcert.plan import CapacityPlan
    from ampcert.report.mlperf_export import Exported
    from ampcert.report.sign import Verified
    from ampcert.results import ResultSet, RunResult
    from ampcert.runner.executors import FleetOptions
    from ampcert.runner.orchestrator import Plan

Event = dict[str, Any]
OnEvent = Callable[[Event], None]

__all__ = [
    "Finished", "NotVerified", "PlannedRuns", "audit_jax", "audit_torch", "capacity", "catalog", "certify", "check_key", "check_logs",
    "compare", "environment", "export_mlperf", "finish", "fleet_options", "gate_history", "history_add", "history_plot", "history_show", "keygen", "write_history_gate_outputs", "merge", "plan_resume", "plan_suite", "report", "resume",
    "run_suite", "shipped_text", "sign", "verify",
]


# --------------------------------------------------------------------------- results folders


@dataclass(frozen=True)
class Finished:
    """A results folder brought up to date: what it holds and what was written."""

    root: Path
    results: ResultSet
    summary: dict[str, Any]
    report_json: Path
    report_html: Path
    certificate: Certificate | None = None
    envelope: Path | None = None
    warnings: list[str] = field(default_factory=list)
    # Set by run/resume: the shard this folder holds, the runs planned in the whole
    # suite and run here, and whether certification waits for `merge`.
    shard: dict[str, Any] | None = None
    planned: int | None = None
    ran: int | None = None
    certify_later: bool = False
    # Set by merge: {"merged": n, "runs": n, "missing": [...]}.
    merged: dict[str, Any] | None = None

    @property
    def failed(self) -> list[RunResult]:
        return [r for r in self.results.runs if r.status == "failed"]

    @property
    def passed(self) -> bool:
        """The run's verdict for an exit code: the certificate decides where there is one
        (an fp16 run without loss scaling is expected to fail, as evidence); else no run failed."""
        if self.certificate is not None:
            return self.certificate.status != "FAIL"
        return not self.failed or self.certify_later

    def to_json(self) -> dict[str, Any]:
        """What `--json` prints: the folder, the summary and the certificate."""
        out: dict[str, Any] = {
            "results": str(self.root), "summary": self.summary,
            "certificate": self.certificate.model_dump(mode="json") if self.certificate is not None else None}
        if self.merged is not None:
            out["merged"] = self.merged
        return out


def _lock(root: Path):
    from ampcert.runner.orchestrator import FolderLock

    return FolderLock(root)


def _certify(root: Path, rs: ResultSet, rules: str | Path | None) -> Certificate:
    """Evaluate a rule pack on stored results and write verdicts.json atomically."""
    from ampcert.certify import evaluate, load_rules
    from ampcert.results import ResultsDir, atomic_write_json

    cert = evaluate(rs.runs, load_rules(rules))
    atomic_write_json(ResultsDir(root).verdicts_file, cert)
    return cert


def _finish_locked(root: Path, *, rules: str | Path | None, certify: bool, sign_key: str | Path | None) -> Finished:
    from ampcert.report import render, summary
    from ampcert.results import load

    rs = load(root)
    cert = _certify(root, rs, rules) if certify else None
    written = summary.write(rs)
    # The report shows the verdicts: it is rendered after them, from the folder alone.
    report_json, report_html = render.write(rs)
    envelope: Path | None = None
    warnings: list[str] = []
    if sign_key is not None:
        from ampcert.report.sign import sign_results

        envelope, warnings = sign_results(root, sign_key)
    return Finished(root=Path(root), results=rs, summary=written, report_json=report_json,
                    report_html=report_html, certificate=cert, envelope=envelope, warnings=warnings)


def finish(folder: str | Path, *, rules: str | Path | None = None, certify: bool | None = None,
           sign_key: str | Path | None = None) -> Finished:
    """Certify (when ``certify``, by default when ``rules`` is given), write the summary and
    the report, and sign them (with ``sign_key``): the end of every command that writes a folder."""
    from ampcert.runner import orchestrator as orch

    root = Path(folder)
    # A signal: Interrupted, one line, exit 128 + signum; the atomic writers leave every file whole.
    with orch.interruptible(), _lock(root):
        return _finish_locked(root, rules=rules, certify=rules is not None if certify is None else certify,
                              sign_key=sign_key)


def _existing_folder(folder: str | Path, what: str = "results folder") -> Path:
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"{root}: {what} not found")
    return root


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class PlannedRuns:
    """A run matrix before anything runs (`ampcert run --dry-run`)."""

    rows: list[dict[str, Any]]
    plan: Plan | None = None  # None for a resumed folder: its plan is stored
    shard: dict[str, Any] | None = None
    planned: int = 0

    def to_json(self) -> dict[str, Any]:
        if self.plan is None:
            return {"runs": self.rows}
        return {"suite": self.plan.suite.name, "device": self.plan.device,
                "capabilities": self.plan.capabilities, "shard": self.shard, "runs": self.rows}


def _shard_of(plan: Plan, shard: str | None):
    from ampcert.runner import shard as sharding

    if shard is None:
        return plan.runs, None
    index, count = sharding.parse_shard(shard)
    return sharding.select(plan.runs, index, count), sharding.record(plan.runs, index, count)


def plan_suite(suite: str | Path, *, shard: str | None = None) -> PlannedRuns:
    """The run matrix of a suite (validated, capabilities probed), without running it."""
    from ampcert.runner import orchestrator as orch
    from ampcert.runner import shard as sharding

    where = sharding.parse_shard(shard) if shard is not None else None  # a bad --shard before the probe
    plan = orch.plan_suite(suite)
    runs, info = _shard_of(plan, shard) if where else (plan.runs, None)
    return PlannedRuns(orch.dump_plan_table(runs), plan, info, len(plan.runs))


def _stored_plan(folder: str | Path) -> tuple[Path, dict[str, Any]]:
    from ampcert.results import ResultsDir

    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"--resume {root}: results folder not found")
    return root, ResultsDir(root).read_plan()


def plan_resume(folder: str | Path) -> PlannedRuns:
    """The runs a resumed folder is responsible for (its shard's, or all)."""
    from ampcert.results import check_path_limits
    from ampcert.runner import orchestrator as orch
    from ampcert.runner import shard as sharding

    root, stored = _stored_plan(folder)
    runs = sharding.shard_runs(stored)
    # What the resume itself checks before it writes (pending_runs): a dry run says it too.
    check_path_limits(root, [r.run_id for r in runs], "--resume")
    return PlannedRuns(orch.dump_plan_table(runs), None, stored.get("shard"), len(stored["runs"]))


# --------------------------------------------------------------------------- running


def check_key(sign_key: str | Path | None) -> None:
    """Refuse a bad signing key before an hour of training, not after."""
    if sign_key is not None:
        from ampcert.report.sign import load_private_key

        load_private_key(sign_key)


def fleet_options(**options: Any) -> FleetOptions:
    """Where runs train (``executor="local"|"ray"|"slurm"`` and that engine's
    options: see :class:`ampcert.runner.executors.FleetOptions`), checked: a
    bad combination is one line (UserError) before anything is planned."""
    from ampcert.runner.executors import FleetOptions

    fleet = FleetOptions(**options)
    fleet.check()
    return fleet


def _open_fleet(fleet: FleetOptions, root: Path, runs: list, suite_slurm: Any) -> Any:
    """The cluster engine, connected and checked against the runs, before
    anything is written: an engine that is missing, unreachable or too small
    for a run is one line (exit 2) with the folder as it was."""
    from ampcert.runner.fleet import check_runs

    check_runs(runs, fleet.executor)
    executor = fleet.open(root, suite_slurm)
    try:
        executor.check(runs, fleet.run_cpus)
    except BaseException:
        executor.close()
        raise
    return executor


def _execute(root: Path, runs: list, *, rules: str | None, shard: dict[str, Any] | None, planned: int,
             retry_failed: bool, sign_key: str | Path | None, on_event: OnEvent | None,
             fleet: FleetOptions, executor: Any = None) -> Finished:
    from ampcert.runner import orchestrator as orch

    # A rule pack judges the whole matrix: a shard's folder is certified once merged.
    certify_later = bool(shard and rules)
    emit = on_event or (lambda event: None)
    with _lock(root):
        try:
            if executor is None:
                orch.execute_plan(root, runs, retry_failed=retry_failed, on_event=emit)
            else:
                from ampcert.results import ResultsDir
                from ampcert.runner.fleet import run_fleet

                todo = orch.pending_runs(ResultsDir(root), runs, retry_failed, emit)
                run_fleet(root, todo, executor, retries=fleet.run_retries, cpus_per_run=fleet.run_cpus,
                          total=len(runs), on_event=emit)
            done = _finish_locked(root, rules=rules, certify=bool(rules) and not certify_later, sign_key=sign_key)
        except WriteFailed as exc:
            # Once runs have started, a write that fails (a full disk) fails the command as a
            # crashed run does: exit 1, not 2 (bad input). What was written stays whole, and
            # `--resume` goes on once there is space.
            exc.exit_code = 1
            raise
    return replace(done, shard=shard, planned=planned, ran=len(runs), certify_later=certify_later)


def run_suite(suite: str | Path, out: str | Path | None = None, *, shard: str | None = None,
              sign_key: str | Path | None = None, on_event: OnEvent | None = None,
              fleet: FleetOptions | None = None) -> Finished:
    """Run a suite into a new results folder and finish it (certify, report, sign).

    ``out`` defaults to ``reports/<suite>-<time>``; ``shard="i/n"`` runs only that
    shard's runs (join the folders with :func:`merge`); ``on_event`` receives the
    orchestrator's progress events (dicts with ``kind``: plan, start, step, retry, done);
    ``fleet`` places the runs on a Ray cluster or under Slurm (docs/fleet.md)."""
    from ampcert.runner import orchestrator as orch
    from ampcert.runner.executors import FleetOptions

    fleet = fleet or FleetOptions()
    # SIGINT, SIGTERM and SIGHUP end the command with Interrupted (finished runs
    # kept), naming the folder once its plan.json makes it resumable.
    with orch.interruptible():
        fleet.check()
        check_key(sign_key)
        planned = plan_suite(suite, shard=shard)
        assert planned.plan is not None
        plan = planned.plan
        root = Path(out) if out is not None else orch.default_out_dir(plan.suite.name)
        runs, _ = _shard_of(plan, shard)
        executor = None if fleet.local else _open_fleet(fleet, root, runs, plan.suite.slurm)
        try:
            orch.prepare_out_dir(root, [r.run_id for r in plan.runs])  # name and path limits, exactly
            with _lock(root):
                orch.write_plan(root, plan, planned.shard)
            with orch.interruptible(root):
                return _execute(root, runs, rules=plan.suite.certify, shard=planned.shard, planned=len(plan.runs),
                                retry_failed=False, sign_key=sign_key, on_event=on_event, fleet=fleet,
                                executor=executor)
        finally:
            if executor is not None:
                executor.close()


def resume(folder: str | Path, *, retry_failed: bool = False, sign_key: str | Path | None = None,
           on_event: OnEvent | None = None, fleet: FleetOptions | None = None) -> Finished:
    """Finish an interrupted results folder: run what has no result (and, with
    ``retry_failed``, what failed), then finish it as :func:`run_suite` does,
    with any executor (a folder started locally may be finished on a cluster)."""
    from ampcert.runner import orchestrator as orch
    from ampcert.runner import shard as sharding
    from ampcert.runner.executors import FleetOptions

    fleet = fleet or FleetOptions()
    with orch.interruptible(Path(folder)):  # a signal: Interrupted, as in run_suite
        fleet.check()
        check_key(sign_key)
        root, stored = _stored_plan(folder)
        runs = sharding.shard_runs(stored)
        executor = None if fleet.local else _open_fleet(fleet, root, runs, _stored_slurm(root, stored))
        try:
            return _execute(root, runs, rules=stored.get("certify"), shard=stored.get("shard"),
                            planned=len(stored["runs"]), retry_failed=retry_failed, sign_key=sign_key,
                            on_event=on_event, fleet=fleet, executor=executor)
        finally:
            if executor is not None:
                executor.close()


def _stored_slurm(root: Path, stored: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    from ampcert.spec import SlurmOptions

    try:
        return SlurmOptions.model_validate(stored.get("slurm") or {})
    except ValidationError as exc:
        raise UserError(f"{root / 'plan.json'}: slurm: {exc.errors()[0]['msg']}") from None


def merge(out: str | Path, folders: Sequence[str | Path], *, partial: bool = False) -> Finished:
    """Join the shard folders of one suite into ``out`` and finish it (certified if the suite says so)."""
    from ampcert.runner import orchestrator as orch
    from ampcert.runner import shard as sharding

    with orch.interruptible():
        info = sharding.merge(Path(out), [Path(f) for f in folders], partial=partial)
        done = finish(out, rules=info["certify"], certify=bool(info["certify"]))
    return replace(done, merged={k: info[k] for k in ("merged", "runs", "missing")})


def certify(folder: str | Path, rules: str | Path | None = None) -> Finished:
    """Re-evaluate stored results against a rule pack (default: ``default``), without
    re-running anything; writes verdicts.json and re-renders the report that shows them."""
    from ampcert.results import ResultsDir, load

    root = _existing_folder(folder)
    ResultsDir(root).read_plan()  # one clear line if this is not a results folder
    if not load(root).runs:
        raise UserError(f"{root}: no run results to certify")
    return finish(root, rules=rules, certify=True)


def report(folder: str | Path, *, csv: str | Path | None = None) -> Finished:
    """Re-render summary.json/html and report.json/html from stored results (same bytes
    every time); with ``csv``, also one row per run to that file."""
    from ampcert.results import load

    load(folder)  # one clear line for a folder that is not a results folder, before the lock
    done = finish(folder)
    if csv is not None:
        try:
            done.results.frame().to_csv(csv, index=False)
        except OSError as exc:
            raise UserError(f"--csv {csv}: cannot write ({type(exc).__name__}: {exc.strerror})") from None
    return done


def export_mlperf(folder: str | Path, out: str | Path) -> Exported:
    """Lay a results folder out as an MLPerf training submission under ``out``
    (``<org>/results/<system>/<benchmark>/result_N.txt``, ``<org>/systems/<system>.json``)
    and judge it with MLPerf's checkers; see :mod:`ampcert.report.mlperf_export`."""
    from ampcert.report.mlperf_export import export
    from ampcert.results import ResultsDir, load
    from ampcert.runner import orchestrator as orch
    from ampcert.version import __version__

    root = _existing_folder(folder)
    with orch.interruptible(), _lock(root):  # not while a run is writing the folder
        environment = ResultsDir(root).read_plan().get("environment") or {}
        return export(load(root), Path(out), environment if isinstance(environment, dict) else {},
                      f"ampcert {__version__}")


# --------------------------------------------------------------------------- signing


def keygen(key: str | Path, *, force: bool = False) -> tuple[Path, Path, str]:
    """Write an Ed25519 key pair (private key mode 0600); returns the paths and the keyid."""
    from ampcert.report.sign import keygen as make_keys
    from ampcert.report.sign import keyid, load_public_key

    private, public = make_keys(key, force=force)
    return private, public, keyid(load_public_key(public))


def sign(folder: str | Path, key: str | Path) -> tuple[Path, list[str]]:
    """Sign report.json and report.html: writes report.dsse.json; returns it and any warnings."""
    from ampcert.report.sign import sign_results

    root = _existing_folder(folder)
    with _lock(root):
        return sign_results(root, key)


class NotVerified(Exception):
    """A signed report that does not verify: the message says which check failed."""


def verify(envelope: str | Path, pubkey: str | Path) -> Verified:
    """Verify a signed report offline: signature, payload type, every subject's digest.

    Raises :class:`NotVerified` on any mismatch, UserError on unreadable input."""
    from ampcert.report.sign import VerificationError, load_public_key, verify_envelope

    key = load_public_key(pubkey)
    try:
        return verify_envelope(envelope, key)
    except VerificationError as exc:
        raise NotVerified(str(exc)) from None


# --------------------------------------------------------------------------- gate and plan


def compare(baseline: str | Path, new: str | Path, *, gate: str | Path | None = None) -> GateResult:
    """The regression gate: ``new`` against ``baseline`` (report.json files or results folders)."""
    from ampcert import gate as regression

    return regression.compare(regression.load_source(Path(baseline)), regression.load_source(Path(new)),
                              regression.load_gate(Path(gate) if gate is not None else None))


def write_gate_outputs(result: GateResult, json_path: Path | None, markdown: Path | None) -> list[Path]:
    from ampcert import gate as regression

    return regression.write_outputs(result, json_path, markdown)


@dataclass(frozen=True)
class Capacity:
    plan: CapacityPlan
    suite: str
    rows: list[dict[str, str]]
    notes: list[str]


def capacity(source: str | Path, target_samples: int, *, gpus: int = 1, price_per_gpu_hour: float | None = None,
             pricing: str | Path | None = None) -> Capacity:
    """Capacity plan from a report.json or a results folder: wall time, GPU-hours,
    energy and cost of ``target_samples`` samples on ``gpus`` devices per precision."""
    from ampcert import gate as regression
    from ampcert import plan as planning

    side = regression.load_source(Path(source))
    cp = planning.capacity_plan(side.runs, target_samples, gpus, price_per_gpu_hour, pricing)
    if not cp.rows:
        raise UserError(f"{source}: no run results to plan from")
    return Capacity(cp, side.suite_name, planning.table_rows(cp), cp.assumptions + planning.notes(cp))


def write_capacity(cap: Capacity, *, csv: Path | None, json_path: Path | None) -> list[Path]:
    from ampcert import plan as planning
    from ampcert.results import atomic_write_text

    written = []
    for path, text in ((csv, planning.csv_text(cap.plan)),
                       (json_path, cap.plan.model_dump_json(indent=1) + "\n")):
        if path is None:
            continue
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            raise UserError(f"{path}: cannot write ({type(exc).__name__}: {exc.strerror or exc})") from None
        written.append(path)
    return written


# --------------------------------------------------------------------------- compliance and audits


@dataclass(frozen=True)
class Checked:
    rules: ComplianceRules
    logs: list[tuple[Path, list[Violation]]]

    @property
    def violations(self) -> int:
        return sum(len(v) for _, v in self.logs)

    def to_json(self) -> dict[str, Any]:
        return {"rules": self.rules.name, "violations": self.violations, "logs": [
            {"log": str(f), "violations": [{"path": v.path, "line": v.line, "rule": v.rule, "message": v.message}
                                           for v in vs]} for f, vs in self.logs]}


def check_logs(paths: Sequence[str | Path], rules: str | Path | None = None, *, mlperf: bool = False) -> Checked:
    """MLLOG logs (files, or folders searched for ``*.mllog``) against compliance
    rules: ampcert's declarative ones, or with ``mlperf`` MLPerf's own checker
    (training 6.1.0, common rules only: ampcert's workloads are not MLPerf
    benchmarks, so no per-benchmark rules apply)."""
    from ampcert.certify.compliance import (
        ComplianceRules,
        Violation,
        check_log,
        load_compliance_rules,
    )

    if mlperf and rules is not None:
        raise UserError("--mlperf runs MLPerf's own rules; give it or --rules, not both")
    files = _mllog_files(paths)
    if mlperf:
        from ampcert.certify import mlperf as mlperf_rules

        def official(f: Path) -> list[Violation]:
            return [Violation(str(f), line, "mlperf", msg) for line, msg in mlperf_rules.check_common(f).violations()]

        name = f"MLPerf {mlperf_rules.RULESET} {mlperf_rules.VERSION} common rules"
        return Checked(ComplianceRules(name=name), [(f, official(f)) for f in files])
    compliance = load_compliance_rules(Path(rules) if rules is not None else None)
    return Checked(compliance, [(f, check_log(f, compliance)) for f in files])


def _mllog_files(paths: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for item in map(Path, paths):
        if item.is_dir():
            found = sorted(item.rglob("*.mllog"))
            if not found:
                raise UserError(f"{item}: no .mllog files in this folder")
            files += found
        elif item.is_file():
            files.append(item)
        else:
            raise UserError(f"{item}: no such log file or folder")
    return files


@dataclass(frozen=True)
class Audit:
    """ampcert's autocast against the reference, op by op (torch) or primitive by primitive (JAX)."""

    framework: str
    version: str
    where: str  # the device (torch) or JAX backend
    policy: Any
    rows: list[Any]
    regions: list[Any] = field(default_factory=list)
    coverage: dict[str, Any] | None = None
    shipped: bool = True  # a shipped policy mirrors native: any difference is a failure

    @property
    def disagreements(self) -> list[str]:
        if self.framework == "jax":
            return [r.op for r in self.rows if not r.agree] + [r.region for r in self.regions if not r.rewritten]
        return [r.op for r in self.rows if not r.agree]

    @property
    def passed(self) -> bool:
        return not self.disagreements or not self.shipped

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        out: dict[str, Any] = {"policy": {"name": self.policy.name, "source": str(self.policy.source),
                                          "sha256": self.policy.sha256},
                               self.framework: self.version,
                               "device" if self.framework == "torch" else "backend": self.where,
                               "rows": [asdict(r) for r in self.rows]}
        if self.framework == "torch":
            out["coverage"] = self.coverage
        else:
            out["regions"] = [asdict(r) for r in self.regions]
        return out


def audit_torch(device: str = "cpu", policy: str | None = None, dtype: str | None = None) -> Audit:
    """Compare ampcert's torch autocast with native torch.autocast on real tensors."""
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device: expected cpu or cuda, got {device!r}")
    if dtype not in ("bf16", "fp16", None):
        raise UserError(f"--dtype: expected bf16 or fp16, got {dtype!r}")
    from ampcert.spec import require_backend

    require_backend("torch", "audit --backend torch")
    import torch

    from ampcert.amp.audit import audit_modules, coverage
    from ampcert.amp.audit import audit_torch as run_audit
    from ampcert.amp.policy import POLICY_DIR
    from ampcert.amp.precision import dtype_name
    from ampcert.spec import load_op_policy

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA device")
    op_policy = load_op_policy(policy, "--policy", device)
    low = getattr(torch, dtype_name(dtype)) if dtype else None
    rows = run_audit(device, op_policy, low) + audit_modules(device, low)
    shipped = op_policy.source is not None and Path(op_policy.source).parent == POLICY_DIR
    return Audit("torch", torch.__version__, device, op_policy, rows, coverage=coverage(rows, device, op_policy),
                 shipped=shipped)


def screen_fp8(workload: str, params: str | None = None, precision: str = "fp8", recipe: str = "tensorwise",
               steps: int = 3, include: Sequence[str] = (), exclude: Sequence[str] = (), first_last: bool = False,
               device: str = "cpu", seed: int = 0) -> Any:
    """The per-layer FP8 eligibility map of a workload's model (``ampcert screen``):
    a few training steps with the policy's layers in FP8, every Linear layer measured."""
    if precision not in ("fp8", "mxfp8"):
        raise UserError(f"--precision: expected fp8 or mxfp8, got {precision!r}")
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device: expected cpu or cuda, got {device!r}")
    if steps < 1:
        raise UserError(f"--steps: expected a positive number of steps, got {steps}")
    import yaml
    from pydantic import ValidationError

    from ampcert.configio import load_yaml, validation_message, yaml_problem
    from ampcert.spec import Fp8, require_backend

    require_backend("torch", "screen")
    try:
        parsed = load_yaml(params) if params else {}
    except yaml.YAMLError as exc:
        raise UserError(f"--params: expected a YAML mapping such as '{{size: tiny}}', got {yaml_problem(exc)}") from None
    if not isinstance(parsed, dict):
        raise UserError(f"--params: expected a YAML mapping such as '{{size: tiny}}', got {type(parsed).__name__}")
    raw = {"recipe": recipe, "include": list(include), "exclude": list(exclude), "first_last": first_last}
    try:
        cfg = Fp8.model_validate(raw)
    except ValidationError as err:
        raise UserError(validation_message("fp8", err, raw)) from None
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA device")
    from ampcert.backends.torch_fp8 import screen

    return screen(workload, parsed, precision, cfg, steps=steps, seed=seed, device=device)


def audit_jax(policy: str | None = None, dtype: str | None = None) -> Audit:
    """ampcert's JAX autocast against its policy: per primitive, the operand dtypes it
    really got on real arrays; per nested region, whether the matmul inside was rewritten."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        raise UserError("--backend jax: JAX is not installed (pip install 'ampcert[jax]')") from None
    if dtype not in ("bf16", "fp16", None):
        raise UserError(f"--dtype: expected bf16 or fp16, got {dtype!r}")
    from ampcert.amp.jax.audit import audit_jax as run_audit
    from ampcert.amp.jax.audit import audit_regions
    from ampcert.amp.precision import dtype_name
    from ampcert.spec import load_op_policy

    low = jnp.dtype(dtype_name(dtype or "bf16"))
    op_policy = load_op_policy(policy, "--policy", framework="jax")
    rows = run_audit(op_policy, low, extra_ops=("tanh", "logistic", "reduce_max", "add", "mul"))
    return Audit("jax", jax.__version__, jax.default_backend(), op_policy, rows,
                 regions=audit_regions(op_policy, low))


# --------------------------------------------------------------------------- what is installed


def catalog(suites_dir: str | Path = "suites") -> dict[str, Any]:
    """Workloads, suites (in ``suites_dir``), precisions, shipped policies and rule packs."""
    from ampcert.amp.precision import PRECISIONS
    from ampcert.resources import shipped_names
    from ampcert.workloads import registry

    workloads = []
    for name in registry.names():
        w = registry.get(name)
        workloads.append({"name": name, "metric": w.metric, "summary": w.summary})
    return {
        "workloads": workloads,
        "suites": [str(p) for p in sorted(Path(suites_dir).glob("*.yaml"))],
        "precisions": list(PRECISIONS),
        "policies": list(shipped_names("policy")),
        "rules": list(shipped_names("rules")),
    }


def shipped_text(kind: str | None, name: str | None) -> str:
    """A shipped policy or rule pack, byte for byte (`ampcert show KIND NAME`)."""
    from ampcert.resources import KINDS, shipped_names
    from ampcert.resources import shipped_text as text_of

    if kind is None:
        raise UserError(f"show: give KIND and NAME, KIND one of {sorted(KINDS)} (e.g. ampcert show policy torch-cpu)")
    if name is None:
        raise UserError(f"show {kind}: give NAME, one of {list(shipped_names(kind))}")
    return text_of(kind, name)


def environment() -> dict[str, Any]:
    """The environment fingerprint: Python, frameworks, CUDA, GPUs, CPU and its flags."""
    from ampcert.envinfo import fingerprint

    return fingerprint()


# --------------------------------------------------------------------------- nightly history


def history_add(folders: Sequence[str | Path], *, store: str | None = None,
                machine: str | None = None) -> list[tuple[Path, bool]]:
    """Record each results folder as a night in the history store (default:
    ``$AMPCERT_HISTORY`` or ``./ampcert-history.sqlite``); (folder, added) per
    folder, added False where it was there already. Every folder is read and
    checked before the first is written."""
    from ampcert.history.records import read_night
    from ampcert.history.store import open_store

    nights = [read_night(folder, machine) for folder in folders]
    opened = open_store(store)
    return [(Path(folder), opened.add(night)) for folder, night in zip(folders, nights, strict=True)]


def history_show(*, store: str | None = None, suite: str | None = None) -> list[NightRow]:
    """The nights in the store (oldest first), of one suite if given."""
    from ampcert.history.store import open_store

    return open_store(store, create=False).nights(suite=suite)


def gate_history(new: str | Path, *, store: str | None = None, machine: str | None = None,
                 window: int | None = None, min_effect: float | None = None) -> HistoryGate:
    """The history gate: NEW's metrics against their series in the store (change
    points; accuracy by paired TOST). ``.status`` is PASS or FAIL (exit 0 / 1)."""
    from ampcert.gate.settings import load_gate
    from ampcert.history import changepoints
    from ampcert.history.gate import gate_night
    from ampcert.history.records import read_night
    from ampcert.history.store import open_store

    night = read_night(new, machine)
    final = load_gate().metrics["final_metric"]
    margins = {"*": final.threshold, **final.per_workload}
    return gate_night(open_store(store, create=False), night, window=window or changepoints.DEFAULT_WINDOW,
                      min_effect=changepoints.DEFAULT_MIN_EFFECT if min_effect is None else min_effect,
                      accuracy_margins=margins)


def write_history_gate_outputs(result: HistoryGate, json_path: str | Path | None,
                               markdown: str | Path | None, html: str | Path | None = None) -> list[Path]:
    """The history gate's JSON, Markdown and HTML files (atomically); the paths written."""
    import json

    from ampcert.history.gate import to_html, to_markdown
    from ampcert.results import atomic_write_text

    written = []
    if json_path is not None:
        atomic_write_text(json_path, json.dumps(result.to_json(), indent=1) + "\n")
        written.append(Path(json_path))
    if markdown is not None:
        atomic_write_text(markdown, to_markdown(result))
        written.append(Path(markdown))
    if html is not None:
        atomic_write_text(html, to_html(result))
        written.append(Path(html))
    return written


def history_plot(out: str | Path, *, store: str | None = None, suite: str | None = None,
                 machine: str | None = None, metric: str = "samples_per_s") -> Path:
    """One metric's series of every subject of a suite on a machine, with their change
    points, as an SVG file. Suite and machine may be left out where the store holds one."""
    from ampcert.history.changepoints import change_points
    from ampcert.history.records import METRICS
    from ampcert.history.store import open_store
    from ampcert.report.plots import history_series
    from ampcert.results import atomic_write_text

    if metric not in METRICS:
        raise UserError(f"--metric {metric}: expected one of {', '.join(METRICS)}")
    opened = open_store(store, create=False)
    nights = opened.nights(suite=suite, machine=machine)
    for what, values in (("--suite", {n.suite for n in nights}), ("--machine", {n.machine for n in nights})):
        if len(values) > 1:
            raise UserError(f"the store holds several: give {what} (one of {', '.join(sorted(values))})")
    if not nights:
        raise UserError(f"{opened.url}: no nights{' of suite ' + repr(suite) if suite else ''} to plot")
    suite_name, machine_name = nights[0].suite, nights[0].machine
    dates = [n.created_at for n in nights]
    series, cps = {}, {}
    for subject, m in opened.subjects(suite_name, machine_name):
        if m != metric:
            continue
        points = opened.series(suite_name, machine_name, subject, metric)
        name = "/".join(subject)
        series[name] = [p.value for p in points]
        cps[name] = change_points(series[name])
    svg = history_series(f"{suite_name}: {metric}", dates, series, cps, metric, f"history-{metric}")
    if svg is None:
        raise UserError(f"{opened.url}: suite {suite_name!r} has no {metric} values to plot")
    atomic_write_text(out, svg)
    return Path(out)
