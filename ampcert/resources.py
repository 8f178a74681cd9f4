"""The data ampcert ships inside its package: policies, rule packs, the standard
suites, device peaks, pricing, gate defaults and the report schema.

Everything lives under ``ampcert/configs/``, ``ampcert/suites/`` and
``ampcert/schemas/`` in the installed package and is found through
:mod:`importlib.resources`, never through the source checkout's layout, so a
wheel installed anywhere finds the same bytes as a checkout. (In the checkout,
the top-level ``configs/``, ``suites/`` and ``schemas/`` are links to these
folders: what users read and copy is what the wheel carries.)

    >>> from ampcert import resources
    >>> resources.shipped_names("policy")
    ('jax', 'torch-cpu', 'torch-cuda')
    >>> text = resources.shipped_text("rules", "default")   # copy, edit, pass with --rules
    >>> path = resources.shipped_path("suite", "smoke")      # what `ampcert run smoke` runs
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from ampcert.errors import UserError

__all__ = ["KINDS", "SHIPPED_PREFIX", "config_path", "from_label", "require_shipped", "schema_path", "shipped_label",
           "shipped_names", "shipped_path", "shipped_text"]


def _package_dir(name: str) -> Path:
    # ampcert is installed as plain files (wheels unpack; zip imports are not
    # supported), so the Traversable is a real directory; a Path keeps
    # globbing, stat-based caching and error messages simple.
    return Path(str(files("ampcert").joinpath(name)))


# How a shipped file is named in what ampcert writes (verdicts.json, plan.json, result.json,
# compare's JSON): by package and path inside it, with its digest beside it, never by the
# absolute path of one installation (which differs between machines and says nothing).
SHIPPED_PREFIX = "ampcert:"


def shipped_label(path: str | Path | None) -> str:
    """``ampcert:configs/rules/default.yaml`` for a file ampcert ships; any other path as it is."""
    if path is None:
        return ""
    p = Path(path)
    root = Path(str(files("ampcert")))
    try:
        return SHIPPED_PREFIX + p.resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        return str(path)


def from_label(ref: str) -> Path | None:
    """The shipped file an ``ampcert:...`` label names (None for anything else, or a label
    that leaves the package)."""
    if not ref.startswith(SHIPPED_PREFIX):
        return None
    root = Path(str(files("ampcert"))).resolve()
    p = (root / ref[len(SHIPPED_PREFIX):]).resolve()
    return p if p.is_relative_to(root) else None


def require_shipped(folder: Path) -> Path:
    """``folder`` if it exists; else the one-line error of a broken installation (rather
    than a later "expected one of []")."""
    if not folder.is_dir():
        raise UserError(f"{folder}: ampcert's shipped data is missing from this installation "
                        "(a wheel built without its package data?): reinstall ampcert")
    return folder


def config_path(*parts: str) -> Path:
    """A file under the shipped ``configs/`` folder, e.g. ``config_path("gate.yaml")``."""
    return _package_dir("configs").joinpath(*parts)


def schema_path(name: str) -> Path:
    """A file under the shipped ``schemas/`` folder."""
    return _package_dir("schemas").joinpath(name)


#: What ``ampcert show KIND NAME`` can print: kind -> its folder in the package (path parts).
#: ``mllog`` is a compliance rule file for ``ampcert check``, not a certification rule pack,
#: but it is shipped data a user copies the same way, so it is listed with the rules.
#: Suites sit beside ``configs/`` (not in it), as the checkout's ``suites/`` sits beside
#: its ``configs/``: a suite's relative reference resolves the same in both.
KINDS: dict[str, tuple[str, ...]] = {
    "policy": ("configs", "policies"),
    "rules": ("configs", "rules"),
    "suite": ("suites",),
}


def _kind_dir(kind: str) -> Path:
    if kind not in KINDS:
        raise UserError(f"show: kind: expected one of {sorted(KINDS)}, got {kind!r}")
    return require_shipped(Path(str(files("ampcert"))).joinpath(*KINDS[kind]))


def shipped_names(kind: str) -> tuple[str, ...]:
    """Names of the shipped files of ``kind`` (``policy``, ``rules`` or ``suite``), sorted."""
    return tuple(sorted(p.stem for p in _kind_dir(kind).glob("*.yaml")))


def shipped_path(kind: str, name: str) -> Path:
    """The shipped file ``name`` of ``kind``; UserError (one line) naming the choices otherwise."""
    names = shipped_names(kind)
    if name not in names:
        raise UserError(f"show {kind}: name: expected one of {list(names)}, got {name!r}")
    return _kind_dir(kind) / f"{name}.yaml"


def shipped_text(kind: str, name: str) -> str:
    """The exact text of a shipped file, to copy and edit."""
    return shipped_path(kind, name).read_text(encoding="utf-8")
