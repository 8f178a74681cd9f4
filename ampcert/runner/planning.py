"""Planning: a suite file becomes the runs to do, and a results folder is made ready for them.

``plan_suite`` reads and validates the suite, its rule pack (seeds, repeats),
resolves the device, probes what it accelerates and expands the matrix into
``RunSpec``s with content-hashed run ids; ``prepare_out_dir`` and
``write_plan`` make the results folder resumable (plan.json); ``pending_runs``
is what a folder still needs, the same question for a first run and a resume.
Nothing here imports a framework at module level.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ampcert.amp.precision import REFERENCE
from ampcert.errors import UserError
from ampcert.resources import SHIPPED_PREFIX, shipped_label
from ampcert.results import (
    ResultsDir,
    RunResult,
    atomic_write_json,
    atomic_write_text,
    check_path_limits,
)
from ampcert.spec import RunSpec, Suite, apply_capabilities, expand, load_suite
from ampcert.stored_plan import StoredPlan
from ampcert.version import __version__
from ampcert.vocabulary import OnEvent

if TYPE_CHECKING:
    from ampcert.certify.rules import RulePack


def resolve_device(requested: str, backend: str = "torch") -> Literal["cpu", "cuda"]:
    """``auto`` becomes ``cuda`` where the backend's framework sees a GPU;
    ``cuda`` where it sees none is a one-line error."""
    if backend == "jax":
        found, detail = _jax_gpu()
    else:
        import torch

        found = torch.cuda.is_available()
        detail = f"torch {torch.__version__}, CUDA build: {torch.version.cuda}"
    if requested == "auto":
        return "cuda" if found else "cpu"
    if requested == "cuda" and not found:
        raise UserError(f"device: cuda was requested but {backend} sees no CUDA device ({detail})")
    if requested not in ("cpu", "cuda"):
        raise UserError(f"device: expected auto, cpu or cuda, got {requested!r}")
    return "cuda" if requested == "cuda" else "cpu"


def _jax_gpu() -> tuple[bool, str]:
    import jax

    try:
        return bool(jax.devices("gpu")), f"jax {jax.__version__}"
    except RuntimeError as exc:  # no GPU backend in this jaxlib, or no device
        return False, f"jax {jax.__version__}: {' '.join(str(exc).split())[:120]}"


@dataclass
class SuitePlan:
    """A suite as planned, before its folder exists: the suite, its runs (capabilities
    applied), what the device accelerates, and the rule pack's digest; written as
    plan.json (:class:`~ampcert.stored_plan.StoredPlan`, the same plan as stored)."""

    suite: Suite
    suite_path: Path
    runs: list[RunSpec]
    capabilities: dict[str, Any]
    device: str
    certify_sha256: str | None = None  # the rule pack's digest, as planned


def check_fp8_layers(runs: list[RunSpec]) -> None:
    """Refuse, before any run, an FP8 layer policy that names a layer its
    recipe cannot take: each fp8/mxfp8 entry's model is built once (on the
    CPU, seed 0: only its shapes matter) and its layers planned."""
    seen: set[tuple[str, str]] = set()
    for run in runs:
        if run.fp8 is None or (run.label, run.precision) in seen:
            continue
        seen.add((run.label, run.precision))
        from ampcert.backends import torch_fp8
        from ampcert.workloads import registry

        if run.amp == "native" and not torch_fp8.torchao_installed():
            # The other way out, in the same line: ampcert's own FP8 layers need nothing beyond torch.
            raise UserError(f"workload {run.label!r}, precision {run.precision}: `amp: native` trains torchao's "
                            "FP8 layers, and torchao is not installed: `pip install 'ampcert[fp8]'`, or use "
                            "`amp: ampcert`, whose FP8 layers need only torch")

        workload = registry.get(run.workload)
        task = workload.build(workload.Params.model_validate(run.params), 0, "cpu")
        torch_fp8.check_layers(task.model, run.precision, run.fp8, f"workload {run.label!r}, precision {run.precision}")


def check_memory_sweep(runs: list[RunSpec], suite_path: Path) -> None:
    """Refuse, before any run, a memory sweep a workload cannot train: one that streams its
    batches from its own loader, or a batch larger than its training set. Each swept entry's
    task is built once, on the CPU, for its data only."""
    from ampcert.backends.loop import sweep_problem
    from ampcert.workloads import registry

    sizes: dict[tuple[str, str], int | None] = {}
    for run in runs:
        if not run.is_memory_sweep:
            continue
        key = (run.label, run.backend)
        if key not in sizes:
            workload = registry.get(run.workload)
            params = workload.Params.model_validate(run.params)
            build = workload.build if run.backend == "torch" else getattr(workload, "build_jax")  # noqa: B009
            task = build(params, run.seed, "cpu")  # planning refused a JAX suite of a workload without build_jax
            sizes[key] = None if task.train_x is None else len(task.train_x)
        assert run.sweep.batch_size is not None
        problem = sweep_problem(run.sweep.batch_size, sizes[key])
        if problem is not None:
            raise UserError(f"{suite_path}: memory: workload {run.label!r}: {problem}")


# The checks that judge a precision against FP32 runs of the same entry, backend and amp
# (accuracy_parity with its default `reference: fp32`; the others always).
_FP32_CHECKS = ("accuracy_parity", "convergence", "speedup", "memory_ratio", "memory_saving")


def check_fp32_reference(pack: RulePack, runs: list[RunSpec], suite_path: Path) -> None:
    """Refuse, before any run, a suite whose rule pack compares a precision with FP32
    where the suite runs no FP32 for that entry (``precisions: [bf16]`` with ``certify:
    default``): every such verdict could only come back INCONCLUSIVE, after the runs."""
    reference = {(r.label, r.backend, r.amp) for r in runs if r.precision == REFERENCE}
    for rule in pack.rules:
        if rule.check not in _FP32_CHECKS or getattr(rule, "reference", REFERENCE) != REFERENCE:
            continue
        for r in runs:
            if r.precision == REFERENCE or (r.label, r.backend, r.amp) in reference:
                continue
            if rule.check == "convergence" and r.target is None:
                continue  # a fixed step budget has no target to converge to: the check does not apply
            if rule.applies_to.matches(r.label, r.workload, r.backend, r.amp, r.precision, r.device):
                raise UserError(
                    f"{suite_path}: certify: rule pack {pack.name!r} compares {r.precision} with fp32 (rule "
                    f"{rule.id}, {rule.check}), but workload {r.label!r} runs no fp32: add fp32 to its "
                    "precisions (or the suite's), or certify with a pack that does not compare with fp32")


def plan_suite(suite_path: str | Path) -> SuitePlan:
    from ampcert.backends.capability import probe

    path = Path(suite_path)
    suite = load_suite(path)
    min_seeds, repeats = 1, 0
    resumes: tuple[int, ...] = ()
    certify_sha256 = None
    pack: RulePack | None = None
    if suite.certify is not None:
        from ampcert.certify.rules import load_rules

        pack = load_rules(suite.certify)
        suite = suite.model_copy(update={"certify": pack.source})
        certify_sha256 = pack.sha256
        min_seeds, repeats, resumes = pack.min_seeds(), pack.repeats(), pack.resumes()
    device = resolve_device(suite.device, suite.backend)
    runs = expand(suite, device, min_seeds=min_seeds, repeats=repeats, resumes=resumes)
    if pack is not None:
        check_fp32_reference(pack, runs, path)
    check_fp8_layers(runs)
    check_memory_sweep(runs, path)
    precisions: list[str] = sorted({r.precision for r in runs})
    capabilities = probe(device, precisions, backend=suite.backend)
    submission = suite.submission
    if submission.platform is None:
        submission = submission.model_copy(update={"platform": platform_name(device)})
    runs = [r.model_copy(update={"submission": submission, "config_filename": path.name}) for r in runs]
    return SuitePlan(suite, path, apply_capabilities(suite, runs, capabilities), capabilities, device, certify_sha256)


def platform_name(device: str) -> str:
    """MLPerf's submission_platform when a suite names none: what the
    environment fingerprint says the runs train on (the first GPU's name on
    cuda, the CPU model otherwise)."""
    from ampcert.envinfo import cpu_info, gpu_info

    if device == "cuda":
        devices = gpu_info().get("devices") or []
        if devices:
            return str(devices[0]["name"])
    return str(cpu_info()["model"]) or "unknown CPU"


def default_out_dir(suite_name: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("reports") / f"{suite_name}-{stamp}"


def prepare_out_dir(out: Path, run_ids: Iterable[str] | None = None) -> None:
    """Create the folder, refusing one that already holds anything (results
    are never overwritten; --resume continues a folder). A folder left by an
    invocation killed before it wrote plan.json (its dead lock, the suite
    copy, temp files) holds no results and is taken over. ``run_ids``, where
    known, make the path-length check exact (see check_path_limits)."""
    # Before anything touches the path: a name longer than the file system
    # allows would otherwise be an OSError traceback here, and a folder too
    # deep for its runs' files a failure in the middle of the suite.
    check_path_limits(out, run_ids, "--out")
    try:
        if out.exists() and not out.is_dir():
            raise UserError(f"--out {out}: exists and is not a folder")
        if out.is_dir() and any(out.iterdir()) and not _interrupted_before_plan(out):
            raise UserError(f"--out {out}: folder is not empty; use `ampcert run --resume {out}` "
                            "to continue it, or choose another folder")
    except OSError as exc:  # a parent that cannot be searched or listed
        raise UserError(f"--out {out}: cannot use this folder: {exc.strerror or exc}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe_file = out / f".write-test-{os.getpid()}"
        probe_file.write_text("")
        probe_file.unlink()
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write there: {exc.strerror or exc}") from None


# What an invocation leaves in its folder before plan.json exists: the lock,
# the write probe, the suite copy and atomic-write temp files.
_PRE_PLAN = re.compile(r"^(\.lock|\.write-test(-\d+)?|suite\.yaml|rules\.yaml|\.(suite\.yaml|rules\.yaml|plan\.json)\.[^/]*\.tmp)$")


def _interrupted_before_plan(out: Path) -> bool:
    names = {p.name for p in out.iterdir()}
    # The lock is removed on every normal exit: a suite copy beside a lock
    # is ours, never a user's file.
    return (all(_PRE_PLAN.match(n) for n in names) and ("suite.yaml" not in names or ".lock" in names))


def write_plan(out: Path, plan: SuitePlan, shard: dict[str, Any] | None = None) -> None:
    from ampcert.envinfo import fingerprint
    from ampcert.runner.code_identity import code_identity

    raw = plan.suite_path.read_bytes()
    rd = ResultsDir(out)
    if rd.plan_file.exists():  # (under the folder lock) another invocation planned here first
        raise UserError(f"--out {out}: another ampcert invocation has started writing to this folder")
    atomic_write_text(rd.suite_file, raw.decode("utf-8"))
    if plan.suite.certify is not None and not plan.suite.certify.startswith(SHIPPED_PREFIX):
        # The suite's own pack, as planned: --resume certifies with this copy (held to its
        # digest), never with a file plan.json names.
        atomic_write_text(rd.rules_file, Path(plan.suite.certify).read_text(encoding="utf-8"))
    slurm = plan.suite.slurm.model_dump(exclude_defaults=True)
    stored = StoredPlan.model_validate({
        "tool": f"ampcert {__version__}",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "suite": plan.suite.name,
        # A shipped suite (`ampcert run smoke`) by its label, ampcert:suites/smoke.yaml, not the path
        # of one installation; a user's suite file as given.
        "suite_source": shipped_label(plan.suite_path),
        "suite_sha256": hashlib.sha256(raw).hexdigest(),
        "device": plan.device,
        "capabilities": plan.capabilities,
        "certify": plan.suite.certify,
        **({"certify_sha256": plan.certify_sha256} if plan.certify_sha256 else {}),
        "environment": fingerprint(),
        "code": code_identity(plan.runs),
        "runs": plan.runs,
        **({"shard": shard} if shard else {}),  # run --shard i/n: the complete plan, and this shard's runs
        # The suite's `slurm:` block, for `--resume --executor slurm` (not part of any run).
        **({"slurm": slurm} if slurm else {}),
        **({"speed_probe": plan.suite.speed_probe} if plan.suite.speed_probe.enabled else {}),
    })
    atomic_write_json(rd.plan_file, stored.to_json())


def skipped_result(spec: RunSpec) -> RunResult:
    return RunResult(run_id=spec.run_id, spec=spec, status="skipped", reason=spec.skip_reason,
                     accelerated=spec.accelerated, capability_note=spec.capability_note)


def pending_runs(rd: ResultsDir, runs: list[RunSpec], retry_failed: bool,
                 on_event: OnEvent = lambda e: None) -> list[RunSpec]:
    """Runs without a trustworthy result (and failed ones, if asked). A result
    file that is there but cannot be trusted (truncated, not a RunResult,
    another run's) is reported with an ``invalid`` event, and its run redone.

    Before anything is written: a run folder that is a link out of the folder,
    or paths the file system cannot hold, are refused with one line (a
    resumed folder may come from elsewhere; read_plan checked it as well)."""
    ids = [spec.run_id for spec in runs]
    rd.check_run_dirs(ids)
    check_path_limits(rd.root, ids, "results folder")
    todo = []
    for spec in runs:
        result, problem = rd.check_result(spec.run_id)
        if problem is not None:
            on_event({"kind": "invalid", "run_id": spec.run_id,
                      "path": str(rd.result_file(spec.run_id)), "reason": problem})
        if result is None or (retry_failed and result.status == "failed"):
            todo.append(spec)
    return todo


def dump_plan_table(runs: list[RunSpec]) -> list[dict[str, Any]]:
    return [
        {"run_id": r.run_id, "workload": r.label, "precision": r.precision, "amp": r.amp,
         "seed": r.seed, "device": r.device, "steps": r.step_limit,
         "target": r.target, "accelerated": r.accelerated,
         "note": "; ".join(filter(None, [("skipped: " if r.skip_reason else "") + ("" if r.accelerated else "not accelerated"),
                                         f"slowed {r.fault.injected_slowdown:.0%} on purpose" if r.fault.injected_slowdown else "",
                                         f"memory sweep at batch {r.sweep.batch_size}" if r.is_memory_sweep else "",
                                         "speed probe against fp32, after the runs" if r.is_speed_probe else ""]))}
        for r in runs
    ]
