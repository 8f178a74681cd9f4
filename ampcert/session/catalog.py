"""What is installed and shipped: workloads, suites, precisions, policies, rule packs, the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampcert.errors import UserError


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
