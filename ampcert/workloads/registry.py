"""Find workloads by name.

A suite names a workload in one of three ways, all resolved here:

- a built-in name (``resnet``, ``gpt``, ...), imported only when used, so
  listing them or validating a suite stays cheap;
- a name that an installed package registers in the ``ampcert.workloads``
  entry-point group (``[project.entry-points."ampcert.workloads"]`` in its
  pyproject.toml: ``mymodel = "mypkg.models:WORKLOAD"``);
- an import path, ``package.module:attribute``.

The object must meet :class:`~ampcert.workloads.base.Workload`. A name that
resolves to nothing, a path that does not import, or an object that lacks
the protocol is a one-line error naming the workload, found when the suite
is planned (exit code 2, before any training); an exception inside the
workload's own ``build`` fails that run, with the reason, and the suite goes
on.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from ampcert.errors import UserError

if TYPE_CHECKING:
    from ampcert.workloads.base import Budget, Workload

BUILTIN: dict[str, str] = {
    "digits": "ampcert.workloads.digits:WORKLOAD",
    "resnet": "ampcert.workloads.resnet:WORKLOAD",
    "gpt": "ampcert.workloads.gpt:WORKLOAD",
    "underflow": "ampcert.workloads.numerics:UNDERFLOW",
    "overflow": "ampcert.workloads.numerics:OVERFLOW",
    "stagnation": "ampcert.workloads.numerics:STAGNATION",
}


ENTRY_POINT_GROUP = "ampcert.workloads"


class WorkloadRef(Protocol):
    """What the registry reads of a suite's workload entry: the workload's
    name and its params as written. :class:`ampcert.spec.WorkloadEntry` meets
    it; the registry sits below the suite model and never imports it."""

    @property
    def workload(self) -> str | None: ...  # None: a command entry (a team's own job)

    @property
    def params(self) -> Mapping[str, Any]: ...


def plugins() -> dict[str, str]:
    """Workloads registered by installed packages: name -> 'module:attribute'."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in BUILTIN}


def names() -> list[str]:
    return sorted({*BUILTIN, *plugins()})


def get(name: str) -> Workload:
    """The workload object for a built-in name, an entry-point name or an import path.

    Raises UserError with one line when the name is unknown, the import
    fails, or the object does not meet the protocol.
    """
    from ampcert.workloads.base import Workload

    target = BUILTIN.get(name) or (plugins().get(name) if ":" not in name else None)
    if target is None:
        if ":" not in name:
            raise UserError(
                f"unknown workload {name!r}: expected one of {', '.join(names())}, a name registered "
                f"in the {ENTRY_POINT_GROUP!r} entry-point group, or an import path 'package.module:attribute'"
            )
        target = name
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        obj = getattr(module, attr)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to fix
        raise UserError(f"workload {name!r} does not import: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, Workload):
        missing = [a for a in ("name", "summary", "metric", "higher_is_better", "Params", "build",
                               "default_budget") if not hasattr(obj, a)]
        raise UserError(
            f"workload {name!r} is a {type(obj).__name__}, which lacks the workload protocol "
            f"(missing: {', '.join(missing) or 'a callable build/default_budget'}; "
            "see docs/workloads.md)"
        )
    return obj


def validate_entry(entry: WorkloadRef, where: str) -> None:
    """Check an entry's workload and params, and (cheaply) its data sources."""
    from ampcert.workloads.base import DataError

    workload = get_for(entry, where)
    try:
        params = workload.Params.model_validate(entry.params)
    except ValidationError as err:
        raise UserError(_params_message(f"{where}.params", err, entry, workload)) from None
    check = getattr(workload, "check", None)
    if check is not None:
        try:
            check(params)
        except DataError as exc:
            raise UserError(f"{where}: data: {exc}") from None


def _params_message(source: str, err: ValidationError, entry: WorkloadRef, workload: Workload) -> str:
    """One line for a params problem; an unknown parameter gets the closest one and the
    workload's parameters (or that it takes none), not the suite's field words."""
    from difflib import get_close_matches

    from ampcert.configio import valid_fields, validation_message

    first = err.errors()[0]
    if first["type"] != "extra_forbidden" or len(first["loc"]) != 1:
        return validation_message(source, err, entry.params, workload.Params)
    name, known = str(first["loc"][0]), valid_fields(workload.Params)
    label = _name(entry)
    if not known:
        return f"{source}: {name}: unknown parameter; workload {label} takes no parameters"
    close = get_close_matches(name, known, n=1)
    more = len(err.errors()) - 1
    return (f"{source}: {name}: unknown parameter" + (f"; did you mean `{close[0]}`?" if close else "")
            + f" (the parameters of workload {label}: {', '.join(known)})"
            + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""))


def _name(entry: WorkloadRef) -> str:
    if entry.workload is None:
        raise UserError("a `command` entry runs a team's own job, not one of ampcert's workloads")
    return entry.workload


def get_for(entry: WorkloadRef, where: str) -> Workload:
    try:
        return get(_name(entry))
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


def resolve(entry: WorkloadRef) -> tuple[dict[str, Any], Budget]:
    """The entry's params with the workload's defaults filled in (so that a
    default changing in a later release changes the run id too), and the
    workload's declared budget for those params."""
    workload = get(_name(entry))
    params = workload.Params.model_validate(entry.params)
    return params.model_dump(mode="json"), workload.default_budget(params)
