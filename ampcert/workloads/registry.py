"""Find workloads by name.

Built-in workloads are registered by name and imported only when used, so
listing them or validating a suite stays cheap. A suite may also name any
object that meets :class:`~ampcert.workloads.base.Workload` by import path,
``package.module:attribute``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ampcert.errors import UserError

if TYPE_CHECKING:
    from ampcert.spec import WorkloadEntry
    from ampcert.workloads.base import Budget, Workload

BUILTIN: dict[str, str] = {
    "digits": "ampcert.workloads.digits:WORKLOAD",
    "resnet": "ampcert.workloads.resnet:WORKLOAD",
    "gpt": "ampcert.workloads.gpt:WORKLOAD",
    "underflow": "ampcert.workloads.numerics:UNDERFLOW",
    "overflow": "ampcert.workloads.numerics:OVERFLOW",
}


def names() -> list[str]:
    return sorted(BUILTIN)


def get(name: str) -> Workload:
    """The workload object for a registered name or an import path.

    Raises UserError with one line when the name is unknown, the import
    fails, or the object does not meet the protocol.
    """
    from ampcert.workloads.base import Workload

    target = BUILTIN.get(name)
    if target is None:
        if ":" not in name:
            raise UserError(
                f"unknown workload {name!r}: expected one of {', '.join(names())} "
                "or an import path 'package.module:attribute'"
            )
        target = name
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        obj = getattr(module, attr)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to fix
        raise UserError(f"workload {name!r} does not import: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, Workload):
        raise UserError(
            f"workload {name!r} is a {type(obj).__name__}, which lacks the workload protocol "
            "(name, summary, metric, higher_is_better, Params, build)"
        )
    return obj


def validate_entry(entry: WorkloadEntry, where: str) -> None:
    """Check an entry's workload and params, and (cheaply) its data sources."""
    from ampcert.workloads.base import DataError

    workload = get_for(entry, where)
    try:
        params = workload.Params.model_validate(entry.params)
    except ValidationError as err:
        from ampcert.spec import validation_message

        raise UserError(validation_message(f"{where}.params", err, entry.params)) from None
    check = getattr(workload, "check", None)
    if check is not None:
        try:
            check(params)
        except DataError as exc:
            raise UserError(f"{where}: data: {exc}") from None


def get_for(entry: WorkloadEntry, where: str) -> Workload:
    try:
        return get(entry.workload)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


def resolve(entry: WorkloadEntry) -> tuple[dict[str, Any], Budget]:
    """The entry's params with the workload's defaults filled in (so that a
    default changing in a later release changes the run id too), and the
    workload's declared budget for those params."""
    workload = get(entry.workload)
    params = workload.Params.model_validate(entry.params)
    return params.model_dump(mode="json"), workload.default_budget(params)
