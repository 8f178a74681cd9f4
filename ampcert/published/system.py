"""A published system description (``<submitter>/systems/<system>.json``) read as the
environment fingerprint of every run it describes.

MLPerf's system descriptions are loosely typed across rounds: counts are numbers in
some files and digit strings in others (``"number_of_nodes": 8`` and ``"8"`` both
occur in v5.0), and ``other_software_stack`` is text, a list or a mapping. This
module accepts each of those spellings and nothing looser: a count must be a
whole number (``8`` or ``"8"``, at least 1, or 0 accelerators per node for a CPU-only
system; not ``"8x"``, ``8.5``, ``true`` or ``""``; an optional count that is not one,
the host's processors per node or cores, is left unknown), a text
field must be text (a number in ``accelerator_model_name`` is a broken file, not a
name). The accelerator count is what accelerator-hours multiply by, so a file that
cannot say it refuses the import with one line naming the file, the field and the
value, before anything is written.

>>> fp = read_system(Path("AMD/systems/MI355X_EPYC_9575F_pytorch.json"))  # doctest: +SKIP
>>> fp.accelerator_model, fp.accelerators, fp.nodes  # doctest: +SKIP
('AMD Instinct MI355X', 8, 1)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ampcert.configio import read_json_file
from ampcert.errors import UserError

# Fields read as counts; the first two are required (accelerator-hours need them).
REQUIRED_COUNTS = ("number_of_nodes", "accelerators_per_node")
OPTIONAL_COUNTS = ("host_processors_per_node", "host_processor_core_count")
TEXT_FIELDS = ("submitter", "division", "status", "system_name", "system_type", "accelerator_model_name",
               "accelerator_memory_capacity", "host_processor_model_name", "framework", "operating_system",
               "sw_notes")


class SystemFingerprint(BaseModel):
    """What a published system is: the environment its runs ran in, as its description says."""

    model_config = ConfigDict(extra="forbid")

    file: str = Field(description="the description's file name, systems/<system>.json")
    submitter: str
    division: str = Field(description="closed or open, as the description says")
    status: str = Field(description="availability: Available on-premise, Available cloud, Preview, Research")
    system_name: str
    system_type: str = ""
    nodes: int
    accelerators_per_node: int
    accelerators: int = Field(description="nodes x accelerators per node: what accelerator-hours multiply by "
                                          "(0: a CPU-only system)")
    accelerator_model: str
    accelerator_memory: str = ""
    host_cpu: str = ""
    host_processors_per_node: int | None = None
    host_processor_core_count: int | None = None
    framework: str = ""
    software_stack: str = Field(default="", description="other_software_stack, as one line")
    operating_system: str = ""
    sw_notes: str = Field(default="", description="the submitter's free-text software notes, verbatim")


def _count(path: Path, data: dict[str, Any], name: str, required: bool) -> int | None:
    """A whole number the file gives as a number or in ASCII digits. A required count that is
    not one refuses the file; an optional one (the host's processors) that is not, such as
    "N/A" or "2 (big); 4 (LITTLE)", is None: it multiplies nothing."""
    # A CPU-only system has 0 accelerators per node (ampcert's own export writes "0"); nothing else may be 0.
    least = 0 if name == "accelerators_per_node" else 1
    value = data.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and least <= value < 10**9:
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value.strip()) and int(value) >= least:
        return int(value)
    if not required:
        return None
    if value is None:
        raise UserError(f"{path}: {name} is missing: a system description must say it")
    raise UserError(f"{path}: {name} {_shown(value)} is not a whole number of at least {least} (8 or \"8\")")


def _shown(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _text(path: Path, data: dict[str, Any], name: str) -> str:
    """A text field, on one line (``sw_notes`` as written: it is quoted, never parsed)."""
    value = data.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UserError(f"{path}: {name} {_shown(value)} is not text")
    return value if name == "sw_notes" else " ".join(value.split())


def _stack(value: Any) -> str:
    """other_software_stack as one line, whichever spelling the round used."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" if v not in (None, "") else str(k) for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return " ".join(str(value or "").split())


def read_system(path: Path) -> SystemFingerprint:
    """The fingerprint of ``path``; :class:`UserError` (one line) where the file cannot say it."""
    data = read_json_file(path, what="a JSON system description", missing=f"{path}: no system description "
                          "(every results/<system>/ has systems/<system>.json)")
    if not isinstance(data, dict):
        raise UserError(f"{path}: a system description is a JSON object, found {type(data).__name__}")
    text = {name: _text(path, data, name) for name in TEXT_FIELDS}
    nodes, per_node = (_count(path, data, name, required=True) for name in REQUIRED_COUNTS)
    assert nodes is not None and per_node is not None  # required counts raise instead
    if not text["accelerator_model_name"]:
        raise UserError(f"{path}: accelerator_model_name is missing: a system description must say it")
    return SystemFingerprint(
        file=f"systems/{path.name}", submitter=text["submitter"], division=text["division"],
        status=text["status"], system_name=text["system_name"], system_type=text["system_type"],
        nodes=nodes, accelerators_per_node=per_node, accelerators=nodes * per_node,
        accelerator_model=text["accelerator_model_name"], accelerator_memory=text["accelerator_memory_capacity"],
        host_cpu=text["host_processor_model_name"],
        **{name: _count(path, data, name, required=False) for name in OPTIONAL_COUNTS},
        framework=text["framework"], software_stack=_stack(data.get("other_software_stack")),
        operating_system=text["operating_system"], sw_notes=text["sw_notes"])
