"""Audits of ampcert's AMP against the frameworks', the FP8 screen, and MLLOG compliance.

One audit type per framework: :class:`TorchAudit` (ampcert's torch autocast
against ``torch.autocast``, op by op, with the policy's coverage) and
:class:`JaxAudit` (ampcert's JAX rewriter against its policy, primitive by
primitive, and the nested regions it must rewrite).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ampcert.amp.precision import Precision
from ampcert.errors import BadArgument, UserError
from ampcert.resources import shipped_label
from ampcert.runner.signals import interruptible

if TYPE_CHECKING:
    from ampcert.backends.torch_fp8 import Screen
    from ampcert.certify.compliance import ComplianceRules, Violation

DEVICES = ("cpu", "cuda")
DTYPES = ("bf16", "fp16")


def check_choice(param: str, value: str | None, choices: Sequence[str], *, optional: bool = False) -> None:
    """One line (BadArgument) for a value that is not one of ``choices``."""
    if (value is None and optional) or value in choices:
        return
    raise BadArgument(param, f"expected {' or '.join(choices)}, got {value!r}")


def _op_policy(policy: str | None, **where: str) -> Any:
    """The policy to audit (a file, or the shipped one for the device or framework)."""
    from ampcert.spec import load_op_policy

    try:
        return load_op_policy(policy, "policy", **where)
    except UserError as exc:
        raise BadArgument("policy", str(exc).removeprefix("policy: ")) from None


def require_cuda(torch: Any, device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise BadArgument("device", "torch sees no CUDA device", "cuda")


@dataclass(frozen=True)
class Audit:
    """ampcert's autocast against the reference: what both framework audits share."""

    framework: ClassVar[str]
    version: str
    where: str  # the device (torch) or the JAX backend
    policy: Any
    rows: list[Any]
    shipped: bool = True  # a shipped policy mirrors native: any difference is a failure

    @property
    def disagreements(self) -> list[str]:
        return [r.op for r in self.rows if not r.agree]

    @property
    def passed(self) -> bool:
        return not self.disagreements or not self.shipped

    def to_json(self) -> dict[str, Any]:
        return {"policy": {"name": self.policy.name, "source": shipped_label(self.policy.source),
                           "sha256": self.policy.sha256},
                self.framework: self.version}


@dataclass(frozen=True)
class TorchAudit(Audit):
    """Op by op against native ``torch.autocast`` on real tensors, with the policy's coverage."""

    framework: ClassVar[Literal["torch"]] = "torch"
    coverage: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "device": self.where, "rows": [asdict(r) for r in self.rows],
                "coverage": self.coverage}


@dataclass(frozen=True)
class JaxAudit(Audit):
    """Primitive by primitive against the policy; per nested region, whether the matmul inside was rewritten."""

    framework: ClassVar[Literal["jax"]] = "jax"
    regions: list[Any] = field(default_factory=list)

    @property
    def disagreements(self) -> list[str]:
        return super().disagreements + [r.region for r in self.regions if not r.rewritten]

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "backend": self.where, "rows": [asdict(r) for r in self.rows],
                "regions": [asdict(r) for r in self.regions]}


def audit_torch(device: str = "cpu", policy: str | None = None, dtype: str | None = None) -> TorchAudit:
    """Compare ampcert's torch autocast with native torch.autocast on real tensors."""
    check_choice("device", device, DEVICES)
    check_choice("dtype", dtype, DTYPES, optional=True)
    from ampcert.frameworks import require_backend

    with interruptible():
        require_backend("torch", "audit --backend torch")
        import torch

        from ampcert.amp.audit import audit_modules, coverage
        from ampcert.amp.audit import audit_torch as run_audit
        from ampcert.amp.policy import POLICY_DIR
        from ampcert.amp.precision import dtype_name
        require_cuda(torch, device)
        op_policy = _op_policy(policy, device=device)
        low = getattr(torch, dtype_name(dtype)) if dtype else None
        rows = run_audit(device, op_policy, low) + audit_modules(device, low)
        shipped = op_policy.source is not None and Path(op_policy.source).parent == POLICY_DIR
        return TorchAudit(torch.__version__, device, op_policy, rows, shipped=shipped,
                          coverage=coverage(rows, device, op_policy))


def audit_jax(policy: str | None = None, dtype: str | None = None) -> JaxAudit:
    """ampcert's JAX autocast against its policy: per primitive, the operand dtypes it
    really got on real arrays; per nested region, whether the matmul inside was rewritten."""
    check_choice("dtype", dtype, DTYPES, optional=True)
    with interruptible():
        try:
            import jax
            import jax.numpy as jnp
        except ImportError:
            raise UserError("backend jax: JAX is not installed (pip install 'ampcert[jax]')") from None
        from ampcert.amp.jax.audit import audit_jax as run_audit
        from ampcert.amp.jax.audit import audit_regions
        from ampcert.amp.precision import dtype_name

        low = jnp.dtype(dtype_name(dtype or "bf16"))
        op_policy = _op_policy(policy, framework="jax")
        rows = run_audit(op_policy, low, extra_ops=("tanh", "logistic", "reduce_max", "add", "mul"))
        return JaxAudit(jax.__version__, jax.default_backend(), op_policy, rows,
                        regions=audit_regions(op_policy, low))


def screen_fp8(workload: str, params: str | None = None, precision: Precision = "fp8", recipe: str = "tensorwise",
               steps: int = 3, include: Sequence[str] = (), exclude: Sequence[str] = (), first_last: bool = False,
               device: str = "cpu", seed: int = 0) -> Screen:
    """The per-layer FP8 eligibility map of a workload's model (``ampcert screen``):
    a few training steps with the policy's layers in FP8, every Linear layer measured."""
    check_choice("precision", precision, ("fp8", "mxfp8"))
    check_choice("device", device, DEVICES)
    if steps < 1:
        raise BadArgument("steps", f"expected a positive number of steps, got {steps}")
    import yaml
    from pydantic import ValidationError

    from ampcert.configio import load_yaml, validation_message, yaml_problem
    from ampcert.frameworks import require_backend
    from ampcert.spec import Fp8

    with interruptible():
        require_backend("torch", "screen")
        try:
            parsed = load_yaml(params) if params else {}
        except yaml.YAMLError as exc:
            raise BadArgument("params", f"expected a YAML mapping such as '{{size: tiny}}', got {yaml_problem(exc)}"
                              ) from None
        if not isinstance(parsed, dict):
            raise BadArgument("params", f"expected a YAML mapping such as '{{size: tiny}}', got {type(parsed).__name__}")
        raw = {"recipe": recipe, "include": list(include), "exclude": list(exclude), "first_last": first_last}
        try:
            cfg = Fp8.model_validate(raw)
        except ValidationError as err:
            raise UserError(validation_message("fp8", err, raw)) from None
        import torch

        require_cuda(torch, device)
        from ampcert.backends.torch_fp8 import screen

        return screen(workload, parsed, precision, cfg, steps=steps, seed=seed, device=device)


# --------------------------------------------------------------------------- MLLOG compliance


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
        raise BadArgument("mlperf", "runs MLPerf's own rules; give it or rules, not both")
    with interruptible():
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
