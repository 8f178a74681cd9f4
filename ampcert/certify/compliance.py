"""`ampcert check`: MLLOG compliance against a declarative rule file.

MLPerf's compliance checker evaluates rule strings as Python; these rules are
data (``configs/rules/mllog.yaml``)::

    keys:   [{key: run_stop, count: exactly_one, event_type: INTERVAL_END}, ...]
    order:  [[init_start, init_stop, run_start, run_stop]]      # first occurrences
    within: [{keys: [eval_start], after: run_start, before: run_stop}]
    values: [{key: run_stop, field: metadata.status, one_of: [success]}]

Every violation is reported as ``file:line: rule: message``; a missing key
points at the log's last line. The log is read by ampcert's one MLLOG reader
(:mod:`ampcert.mllog.reader`, its tolerant mode): the marker anywhere in a line, as
MLPerf's tools find it; a marked line that is not a whole event (no valid JSON, no
``time_ms``, ``key`` or known ``event_type``) is itself a violation, and the check
goes on with the next line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ampcert.errors import UserError
from ampcert.mllog.reader import LogError, LogEvent, iter_events, lines_of
from ampcert.resources import config_path

DEFAULT_RULES = config_path("rules", "mllog.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KeyRule(_Strict):
    key: str = Field(min_length=1)
    count: Literal["exactly_one", "at_least_one", "at_most_one", "none"]
    event_type: Literal["INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"] | None = None


class WithinRule(_Strict):
    keys: list[str] = Field(min_length=1)
    after: str
    before: str


class ValueRule(_Strict):
    key: str
    field: str = Field(pattern=r"^(value|metadata(\.[A-Za-z0-9_]+)+)$")
    one_of: list[Any] | None = None
    type: Literal["integer", "number", "string", "boolean"] | None = None
    min: float | None = None
    max: float | None = None


class ComplianceRules(_Strict):
    name: str
    version: Literal[1] = 1
    keys: list[KeyRule] = Field(default_factory=list)
    order: list[list[str]] = Field(default_factory=list)
    within: list[WithinRule] = Field(default_factory=list)
    values: list[ValueRule] = Field(default_factory=list)


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message}"


def load_compliance_rules(path: str | Path | None = None) -> ComplianceRules:
    from ampcert.configio import read_yaml_file, validation_message

    p = Path(path) if path else DEFAULT_RULES
    data, _ = read_yaml_file(p, "compliance rule file", mapping="rules")
    try:
        return ComplianceRules.model_validate(data)
    except ValidationError as err:
        raise UserError(validation_message(str(p), err, data)) from None


def _parse(path: Path) -> tuple[list[LogEvent], list[Violation], int]:
    """The log's events, read by ampcert's MLLOG reader in its tolerant mode (a marked line that
    is not a whole event is a ``format`` violation and the check goes on), the violations, and
    the log's last line number."""
    bad: list[Violation] = []
    last = 0

    def note(err: LogError) -> None:
        bad.append(Violation(str(path), err.line or 0, "format", f"not a valid MLLOG event: {err.detail}"))

    def counted(lines: Iterator[str]) -> Iterator[str]:
        nonlocal last
        for last, line in enumerate(lines, start=1):  # noqa: B007 - the count is what is kept
            yield line

    with lines_of(path) as lines:
        events = list(iter_events(counted(lines), str(path), in_order=False, on_bad=note))
    return events, bad, last


def _field(ev: LogEvent, field: str) -> tuple[bool, Any]:
    if field == "value":
        return True, ev.value
    cur: Any = ev.metadata
    for part in field.split(".")[1:]:
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


_TYPES = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool)}


def check_log(path: str | Path, rules: ComplianceRules) -> list[Violation]:
    p = Path(path)
    events, out, last = _parse(p)
    where = str(p)
    by_key: dict[str, list[LogEvent]] = {}
    for ev in events:
        by_key.setdefault(ev.key, []).append(ev)
    for kr in rules.keys:
        found = by_key.get(kr.key, [])
        n = len(found)
        want = {"exactly_one": n == 1, "at_least_one": n >= 1, "at_most_one": n <= 1, "none": n == 0}[kr.count]
        if not want:
            line = found[1].line if n > 1 and kr.count in ("exactly_one", "at_most_one") else \
                found[0].line if n and kr.count == "none" else last
            out.append(Violation(where, line, f"keys.{kr.key}",
                                 f"expected {kr.count.replace('_', ' ')} {kr.key}, found {n}"
                                 + (f" (the log ends at line {last})" if n == 0 else "")))
        if kr.event_type:
            for ev in found:
                if ev.event_type != kr.event_type:
                    out.append(Violation(where, ev.line, f"keys.{kr.key}",
                                         f"expected event_type {kr.event_type}, got {ev.event_type}"))
    for chain in rules.order:
        firsts = [(k, by_key[k][0].line) for k in chain if k in by_key]
        for (a, la), (b, lb) in zip(firsts, firsts[1:], strict=False):
            if lb < la:
                out.append(Violation(where, lb, "order", f"{b} (line {lb}) comes before {a} (line {la}); "
                                     f"expected the order {' < '.join(chain)}"))
    for wr in rules.within:
        lo = by_key.get(wr.after, [None])[0]
        hi = by_key.get(wr.before, [None])[0]
        for k in wr.keys:
            for ev in by_key.get(k, []):
                if lo is not None and ev.line < lo.line:
                    out.append(Violation(where, ev.line, "within", f"{k} before {wr.after} (line {lo.line})"))
                elif hi is not None and ev.line > hi.line:
                    out.append(Violation(where, ev.line, "within", f"{k} after {wr.before} (line {hi.line})"))
    for vr in rules.values:
        for ev in by_key.get(vr.key, []):
            present, val = _field(ev, vr.field)
            rule = f"values.{vr.key}.{vr.field}"
            if not present:
                out.append(Violation(where, ev.line, rule, f"expected {vr.field} on {vr.key}, found none"))
                continue
            if vr.type and not _TYPES[vr.type](val):
                out.append(Violation(where, ev.line, rule, f"expected a {vr.type}, got {val!r}"))
                continue
            if vr.one_of is not None and val not in vr.one_of:
                out.append(Violation(where, ev.line, rule, f"expected one of {vr.one_of}, got {val!r}"))
            if isinstance(val, (int, float)) and not isinstance(val, bool):
                if vr.min is not None and val < vr.min:
                    out.append(Violation(where, ev.line, rule, f"expected >= {vr.min:g}, got {val!r}"))
                if vr.max is not None and val > vr.max:
                    out.append(Violation(where, ev.line, rule, f"expected <= {vr.max:g}, got {val!r}"))
    return sorted(out, key=lambda v: (v.line, v.rule))


def rules_digest(path: str | Path | None) -> str:
    return hashlib.sha256(Path(path or DEFAULT_RULES).read_bytes()).hexdigest()
