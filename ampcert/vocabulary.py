"""The words every layer shares, declared once: a progress event, a subject, a verdict's state.

A leaf: it imports nothing of ampcert, so the runner, the session, the
report and the gates can all speak it without reaching into each other.

- :data:`Event`: a progress event from the driver to whoever watches;
- :class:`Subject`: what a table row, a verdict, a gate comparison and a
  history series speak about: (workload entry, backend, AMP, precision);
- :class:`Status`: the state of a verdict (PASS, FAIL, INCONCLUSIVE), for
  certification, the regression gate and the history gate alike, and
  :func:`worst`, how verdicts combine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, ClassVar

# A progress event from the driver to whoever watches (the CLI's progress bar, a
# notebook): a dict with ``kind`` (plan, start, step, retry, invalid, done) and
# that kind's fields. Plain data, so it crosses processes and cluster channels as is.
Event = dict[str, Any]
OnEvent = Callable[[Event], None]


# One workload entry (its label), backend, AMP implementation and precision, across
# its seeds. Frozen, hashable and ordered field by field (workload, backend, amp,
# precision), so it keys groups and sorts them as the tuple it replaces did; iterable,
# so ``"/".join(subject)`` and ``workload, backend, amp, precision = subject`` read it.
# ``str(subject)`` is its name, ``digits/torch/native/bf16``. In JSON (pydantic fields
# of this type) it is an object with those four keys, no others. (Comments, not a
# docstring: pydantic would write a docstring into report.v1.schema.json.)
@dataclass(frozen=True, order=True)
class Subject:
    workload: str  # the entry's label
    backend: str
    amp: str
    precision: str

    # pydantic reads this for a plain dataclass: a stored subject with another key is refused
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    def __str__(self) -> str:
        return "/".join(self)

    def __iter__(self) -> Iterator[str]:
        return iter((self.workload, self.backend, self.amp, self.precision))

    def with_precision(self, precision: str) -> Subject:
        """The same entry, backend and AMP in another precision (its FP32 reference, say)."""
        return replace(self, precision=precision)

    def key(self) -> tuple[str, str, str, str]:
        """The four parts as a plain tuple (what subjects were before there was this class)."""
        return (self.workload, self.backend, self.amp, self.precision)


class Status(str, Enum):
    """The state of a verdict: one rule on one subject, a subject, a certificate, a gate.

    A ``str`` enum: it compares equal to, prints, formats and is written to JSON
    as its name, so files and pages read the same as when these were plain strings.
    (``enum.StrEnum`` does the same from Python 3.11; ampcert runs on 3.10.)"""

    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    # A certificate's alone: planned runs have no readable result, so what they would
    # have shown was never judged (never a PASS; a FAIL among what was judged still wins).
    INCOMPLETE = "INCOMPLETE"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        # Validated as the three strings, then made members: the JSON schema lists them
        # inline (``{"enum": [...], "type": "string"}``) as the Literal it replaces did.
        from pydantic_core import core_schema

        return core_schema.no_info_after_validator_function(cls, core_schema.literal_schema([s.value for s in cls]))


# The worst first: a certificate is its subjects' worst required verdict, a subject its rules'.
_SEVERITY = (Status.FAIL, Status.INCOMPLETE, Status.INCONCLUSIVE, Status.PASS)


def worst(statuses: Iterable[str]) -> Status:
    """The worst of ``statuses`` (FAIL, INCOMPLETE, INCONCLUSIVE, then PASS); PASS for none."""
    found = [Status(s) for s in statuses]
    return min(found, key=_SEVERITY.index) if found else Status.PASS
