"""What is installed and shipped: workloads, suites, precisions, policies, rule packs, the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampcert.errors import UserError


def catalog(suites_dir: str | Path = "suites") -> dict[str, Any]:
    """Workloads, the shipped suites (name and description: ``ampcert run NAME``), suite
    files of this folder's ``suites_dir`` that are not the shipped ones, precisions,
    shipped policies and rule packs."""
    from ampcert.amp.precision import PRECISIONS
    from ampcert.resources import shipped_names, shipped_path
    from ampcert.workloads import registry

    workloads = []
    for name in registry.names():
        w = registry.get(name)
        workloads.append({"name": name, "metric": w.metric, "summary": w.summary})
    shipped = {name: shipped_path("suite", name) for name in shipped_names("suite")}
    own = {p.resolve() for p in shipped.values()}
    return {
        "workloads": workloads,
        "suites": [{"name": name, "description": _description(path)} for name, path in shipped.items()],
        # In a checkout, suites/ is a link to the shipped ones: listed once, by name.
        "suite_files": [str(p) for p in sorted(Path(suites_dir).glob("*.yaml")) if p.resolve() not in own],
        "precisions": list(PRECISIONS),
        "policies": list(shipped_names("policy")),
        "rules": list(shipped_names("rules")),
    }


def _description(path: Path) -> str:
    """A shipped suite's ``description:`` (its first line, for a one-line listing)."""
    from ampcert.configio import read_yaml

    data = read_yaml(path, "suite file")
    text = data.get("description") if isinstance(data, dict) else None
    return str(text).strip().splitlines()[0] if text else ""


def shipped_text(kind: str | None, name: str | None) -> str:
    """A shipped policy, rule pack or suite, byte for byte (`ampcert show KIND NAME`)."""
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
