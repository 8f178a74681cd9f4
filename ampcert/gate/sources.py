"""The two sides of a comparison: a results folder or a report.json, loaded alike.

A *source* is what ``ampcert run --out DIR`` wrote (runs, plan, verdicts) or a
report.json (its ``runs``, ``certificate`` and ``suite``). Either becomes a
:class:`Source`: the runs, the certificate if there is one, and the suite's
name and digest, which is all the comparison reads. Anything that is neither
is one :class:`UserError` line naming the file and what was expected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ampcert.certify.checks import Certificate
from ampcert.configio import parse_model
from ampcert.envinfo import stack_changes
from ampcert.errors import UserError
from ampcert.gate.result import SourceInfo
from ampcert.results import ResultsDir, RunResult, load


@dataclass
class Source:
    """What one side of a comparison holds: runs, certificate, suite identity, and the
    software stack they ran on (:func:`stack`)."""

    path: Path
    kind: Literal["results folder", "report"]
    suite_name: str
    suite_sha256: str | None
    runs: list[RunResult]
    certificate: Certificate | None
    stack: dict[str, str] = field(default_factory=dict)


def _one(values: set[str]) -> str | None:
    values.discard("")
    return None if not values else next(iter(values)) if len(values) == 1 else " / ".join(sorted(values))


def stack(runs: list[RunResult], plan_environment: dict | None = None, plan_code: dict | None = None) -> dict[str, str]:
    """The software a side ran on, by name: torch, CUDA, the NVIDIA driver, ampcert, and
    each own job's commit (several values joined where the runs differ)."""
    env = [r.environment or {} for r in runs if r.status == "completed"]
    gpu = (plan_environment or {}).get("gpu") or {}
    found: dict[str, str | None] = {
        "torch": _one({str(e["torch"]) for e in env if e.get("torch")}),
        "jax": _one({str(e["jax"]) for e in env if e.get("jax")}),
        "CUDA": str(gpu["torch_cuda"]) if gpu.get("torch_cuda") else None,
        "driver": str(gpu["driver"]) if gpu.get("driver") else None,
        "ampcert": _one({str(e["ampcert"]) for e in env if e.get("ampcert")})
        or ((plan_code or {}).get("ampcert") and str((plan_code or {})["ampcert"])),
    }
    for r in runs:
        git = (((r.environment or {}).get("code") or {}).get("git") or {}) if r.spec.command else {}
        if git.get("commit"):
            key = f"job {r.spec.label} commit"
            commit = str(git["commit"])[:12] + ("+dirty" if git.get("dirty") else "")
            found[key] = _one({commit, *(found.get(key) or "").split(" / ")})
    return {k: v for k, v in found.items() if v}


def stack_differences(baseline: Source, candidate: Source) -> list[str]:
    """One phrase per stack entry that differs between the two sides."""
    b, c = baseline.stack, candidate.stack
    return stack_changes(b, c)


def load_source(path: str | Path) -> Source:
    """A results folder or a report.json (``runs``, ``certificate``, ``suite``), as a Source."""
    p = Path(path)
    if p.is_dir():
        rd = ResultsDir(p)
        rs = load(p)  # one clear line if this is not a results folder
        plan = rd.read_plan()
        cert = None
        if rd.verdicts_file.exists():
            try:
                cert = Certificate.model_validate_json(rd.verdicts_file.read_bytes())
            except (OSError, ValueError) as exc:
                raise UserError(f"{rd.verdicts_file}: unreadable verdicts: {str(exc).splitlines()[0]}") from None
        return Source(p, "results folder", rs.suite_name, plan.suite_sha256, rs.runs, cert,
                      stack(rs.runs, plan.environment, plan.code))
    if not p.exists():
        raise UserError(f"{p}: no such report file or results folder")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: expected a readable report.json, got {type(exc).__name__}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{p}: expected a report.json or a results folder, got invalid JSON "
                        f"(line {exc.lineno}: {exc.msg})") from None
    if isinstance(data, dict) and "payloadType" in data and "payload" in data:
        raise UserError(f"{p}: a signed envelope (DSSE): compare the report.json it signs "
                        "(verify it first with `ampcert verify`)")
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or not isinstance(data.get("suite"), dict):
        raise UserError(f"{p}: not an ampcert report: expected a JSON object with `runs` (list) and `suite` (object)")
    suite = data["suite"]
    if not isinstance(suite.get("name"), str):
        raise UserError(f"{p}: suite.name: expected the suite's name (string)")
    runs = [parse_model(RunResult, item, f"{p}: runs[{i}]") for i, item in enumerate(data["runs"])]
    cert = None
    if data.get("certificate") is not None:
        cert = parse_model(Certificate, data["certificate"], f"{p}: certificate")
    return Source(p, "report", suite["name"], suite.get("sha256"), runs, cert, stack(runs))


def describe(source: Source) -> SourceInfo:
    """The source as the result names it: path, kind, suite, runs, devices, certificate."""
    devices = sorted({str((r.environment or {}).get("device_name") or r.spec.device) for r in source.runs})
    return SourceInfo(path=str(source.path), kind=source.kind, suite=source.suite_name,
                      suite_sha256=source.suite_sha256, runs=len(source.runs), devices=devices,
                      certificate=source.certificate.status if source.certificate else None)
