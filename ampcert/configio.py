"""Reading config files: the one low module every ampcert file reader goes through.

Suites, rule packs, MLLOG compliance rules, gate settings and pricing tables
are all YAML written by people. Each reader wants the same three things:
parsing that cannot hang or crash (:func:`ampcert.amp.yamlio.load_yaml`, which
lives in ``amp`` because the policy loader needs it and ``amp`` imports
nothing of the harness), one line naming the file, field and expectation when
validation fails (:func:`validation_message`), and a :class:`UserError`
instead of a traceback for a missing, unreadable or malformed file
(:func:`read_yaml`). Nothing here knows what a suite or a rule is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ampcert.amp.yamlio import YAML_MAX_DEPTH, YAML_MAX_VALUES, load_yaml, yaml_size_problem
from ampcert.errors import UserError

__all__ = [
    "YAML_MAX_DEPTH", "YAML_MAX_VALUES", "canonical_json", "field_path", "load_yaml", "parse_model",
    "read_yaml", "validation_message", "yaml_problem", "yaml_size_problem",
]

M = TypeVar("M", bound=BaseModel)


def canonical_json(obj: Any) -> str:
    """Sorted keys, no spaces: the text that run ids and digests are taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def field_path(loc: tuple[Any, ...], data: Any) -> str:
    """`workloads[0].train.steps`, naming list items by their workload where possible."""
    parts: list[str] = []
    node = data
    for key in loc:
        if isinstance(key, int):
            label = ""
            if isinstance(node, list) and 0 <= key < len(node) and isinstance(node[key], dict):
                label = node[key].get("id") or node[key].get("workload") or ""
            parts.append(f"[{key}]" + (f"({label})" if label else ""))
        else:
            parts.append(("." if parts else "") + str(key))
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            node = None
    return "".join(parts) or "(top level)"


def validation_message(source: str, err: ValidationError, data: Any) -> str:
    """One line for the first problem pydantic found: file, field, expectation."""
    first = err.errors()[0]
    where = field_path(tuple(first["loc"]), data)
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "literal_error":
        shown = repr(first.get("input"))
        msg = f"got {shown if len(shown) <= 60 else shown[:57] + '...'}, {msg.lower()}"
    more = len(err.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {where}: {msg}{suffix}"


def parse_model(model: type[M], data: Any, source: str) -> M:
    """``model.model_validate(data)``, with a failure as one UserError line."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise UserError(validation_message(source, err, data)) from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error: the problem and, when known, its line."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    return " ".join(str(getattr(exc, "problem", None) or exc).split()) + where


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """Parse a YAML file, turning every way it can fail into a UserError."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: {what} not found")
    if p.is_dir():
        raise UserError(f"{p}: expected a {what}, found a folder")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: cannot read {what}: {exc}") from None
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{p}: malformed YAML{at}: {problem}") from None
