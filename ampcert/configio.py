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
import re
from difflib import get_close_matches
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from ampcert.amp.yamlio import YAML_MAX_DEPTH, YAML_MAX_VALUES, load_yaml, yaml_size_problem
from ampcert.errors import UserError

__all__ = [
    "YAML_MAX_DEPTH", "YAML_MAX_VALUES", "canonical_json", "field_path", "load_yaml", "parse_model",
    "read_yaml", "read_yaml_file", "valid_fields", "validation_message", "yaml_problem", "yaml_size_problem",
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


def validation_message(source: str, err: ValidationError, data: Any, model: type[BaseModel] | None = None) -> str:
    """One line for the first problem pydantic found: file, field, expectation, in plain words.

    An unknown field names the closest valid one ("did you mean") and lists the
    valid fields; a value of the wrong type says what was expected and what was
    given. ``model`` is the model ``data`` was validated against; without it, the
    model is found by the name pydantic gives the error (its ``title``)."""
    errors = err.errors()
    first = errors[0]
    if first["type"] == "missing":  # a misspelled field beside it is why it is missing: name that one
        first = next((e for e in errors if e["type"] == "extra_forbidden"
                      and tuple(e["loc"][:-1]) == tuple(first["loc"][:-1])), first)
    loc = tuple(first["loc"])
    where = field_path(loc, data)
    msg = first["msg"].removeprefix("Value error, ")
    kind = first["type"]
    if kind == "extra_forbidden":
        fields = valid_fields(model or _model_named(err.title, loc, data), loc[:-1])
        msg = "unknown field" + (_suggestion(str(loc[-1]), fields, "valid fields") if fields else "")
    elif kind in ("literal_error", "enum"):
        expected = str((first.get("ctx") or {}).get("expected", ""))
        msg = f"got {_shown(first.get('input'))}, expected {expected}"
        choices = re.findall(r"'([^']*)'", expected)
        close = get_close_matches(str(first.get("input")), choices, n=1) if isinstance(first.get("input"), str) else []
        if close:
            msg += f"; did you mean {close[0]!r}?"
    elif kind == "missing":
        msg = "required, but missing"
    elif kind in _EXPECTED:
        msg = f"expected {_EXPECTED[kind]}, got {_shown(first.get('input'))}"
        value = first.get("input")
        if kind == "list_type" and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            msg += f"; write [{value}] for a list of one"
    more = len(err.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {where}: {msg}{suffix}"


# What a value of the wrong type should have been, by pydantic's error type: the
# words a person writing YAML knows (pydantic's own say "Input should be a valid ...").
_EXPECTED = {
    "list_type": "a list", "tuple_type": "a list", "set_type": "a list", "frozen_set_type": "a list",
    "dict_type": "a mapping (key: value)", "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
    "string_type": "text", "string_unicode": "text",
    "int_type": "a whole number", "int_parsing": "a whole number", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number",
    "bool_type": "true or false", "bool_parsing": "true or false",
}


def _shown(value: Any) -> str:
    """A given value for a message: what it is, on one line, cut short."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    shown = " ".join(repr(value).split())
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _suggestion(name: str, fields: list[str], what: str) -> str:
    """``; did you mean `x`? <what>: a, b, c`` for an unknown ``name``."""
    close = get_close_matches(name, fields, n=1) or [
        f for f in fields if len(name) >= 3 and (f.startswith(name) or name.startswith(f))][:1]
    return (f"; did you mean `{close[0]}`?" if close else "") + f" ({what}: {', '.join(fields)})"


def valid_fields(model: type[BaseModel] | None, path: tuple[Any, ...] = ()) -> list[str]:
    """The field names a file may write at ``path`` inside ``model`` (list items and
    mapping values stepped through; a tagged union by its tag), in the model's order;
    [] where that cannot be told. Fields the file may not set (``exclude=True``:
    recorded by ampcert, such as a rule pack's sha256) are left out."""
    node: Any = model
    for key in path:
        node = _step(node, key)
        if node is None:
            return []
    found = [m for m in _members(node) if _is_model(m)]
    if len(found) != 1:
        return []
    return [f.alias or name for name, f in found[0].model_fields.items() if not f.exclude]


def _members(tp: Any) -> list[Any]:
    """The types a (possibly Annotated, Optional or Union) annotation may be."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, UnionType):
        return [m for arg in get_args(tp) for m in _members(arg)]
    return [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _step(tp: Any, key: Any) -> Any:
    """The annotation one step of an error's location further in, or None."""
    members = _members(tp)
    for m in members:
        origin, args = get_origin(m), get_args(m)
        if isinstance(key, int) and origin in (list, tuple, set, frozenset) and args:
            return args[0]
        if isinstance(key, str):
            if _is_model(m) and key in m.model_fields:
                return m.model_fields[key].annotation
            if _is_model(m):
                alias = next((f.annotation for f in m.model_fields.values() if f.alias == key), None)
                if alias is not None:
                    return alias
            if origin is dict and len(args) == 2:
                return args[1]
    if isinstance(key, str):  # a tagged union: pydantic's location names the tag
        tagged = [m for m in members if _is_model(m) and any(
            get_origin(f.annotation) is Literal and key in get_args(f.annotation) for f in m.model_fields.values())]
        if len(tagged) == 1:
            return tagged[0]
    return None


def _model_named(title: str, loc: tuple[Any, ...], data: Any) -> type[BaseModel] | None:
    """The model class pydantic called ``title``: the one defined with that name whose
    fields hold what ``data`` writes beside the unknown field (None if not one)."""
    found, todo, seen = [], [BaseModel], set()
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                if sub.__name__ == title:
                    found.append(sub)
    if len(found) > 1:
        node = data
        for key in loc[:-1]:
            try:
                node = node[key]
            except (KeyError, IndexError, TypeError):
                return None
        written = set(node) - {loc[-1]} if isinstance(node, dict) else set()
        found = [m for m in found if written <= set(valid_fields(m, loc[:-1]))]
    return found[0] if len(found) == 1 else None


def parse_model(model: type[M], data: Any, source: str) -> M:
    """``model.model_validate(data)``, with a failure as one UserError line."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise UserError(validation_message(source, err, data, model)) from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error: the problem and, when known, its line."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    return " ".join(str(getattr(exc, "problem", None) or exc).split()) + where


def read_json_file(path: Path, *, missing: str, what: str) -> Any:
    """An untrusted JSON file, parsed: a missing file is the one line ``missing``; one
    that cannot be read or parsed (a folder, a 5000-digit integer, nesting deeper than
    Python's json recurses) is ``PATH: not WHAT (the error)``."""
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise UserError(missing) from None
    except (OSError, ValueError, RecursionError) as exc:
        raise UserError(f"{path}: not {what} ({type(exc).__name__}: {exc})") from None


def read_yaml(path: str | Path, what: str = "file") -> Any:
    """Parse a YAML file, turning every way it can fail into a UserError."""
    return read_yaml_file(path, what)[0]


def read_yaml_file(path: str | Path, what: str = "file", *, mapping: str | None = None) -> tuple[Any, bytes]:
    """The one YAML file reader: the parsed data and the file's bytes (what a digest is
    taken over), every way it can fail a UserError naming the file (missing, a folder, not
    readable UTF-8, malformed at line and column, or, with ``mapping``, a top level that is
    not a mapping: ``mapping`` says what it should hold)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: {what} not found")
    if p.is_dir():
        raise UserError(f"{p}: expected a {what}, found a folder")
    try:
        raw = p.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: cannot read {what}: {exc}") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{p}: malformed YAML{at}: {problem}") from None
    if mapping is not None and not isinstance(data, dict):
        raise UserError(f"{p}: expected a mapping of {mapping} at the top level, got {type(data).__name__}")
    return data, raw
