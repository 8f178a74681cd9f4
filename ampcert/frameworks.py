"""Which frameworks can train here: installed (found without importing them, as
torch takes seconds to import and the answer is needed before any run), and a
release inside the range ampcert is tested on (the installed package's own
extras say which). Asked when a suite is read, and again by a worker before
its run starts, so nothing is planned, written or trained that could only fail."""

from __future__ import annotations

import functools
import importlib.util
import os

from ampcert.errors import UserError

# What each backend imports to train, with the name a person would look for,
# and the extra that installs it (pyproject.toml's optional dependencies).
BACKEND_MODULES: dict[str, tuple[tuple[str, str], ...]] = {
    "torch": (("torch", "PyTorch"),),
    "jax": (("jax", "JAX"), ("optax", "optax")),
}


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it (torch
    takes seconds to import, and the answer is needed before any run)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked import, or a module whose __spec__ is None
        return False


def missing_framework(backend: str) -> str | None:
    """The name of the first framework ``backend`` needs that is not
    installed, or None when it can train here."""
    for module, name in BACKEND_MODULES.get(backend, ()):
        if not _installed(module):
            return name
    return None


#: Set to 1 to train on a framework release outside the tested range (unsupported_framework).
ALLOW_UNSUPPORTED_ENV = "AMPCERT_ALLOW_UNSUPPORTED"


@functools.cache
def unsupported_framework(backend: str) -> str | None:
    """Why the installed framework of ``backend`` is outside the range ampcert is tested on,
    or None. The range is the one the installed ampcert's extra asks for (pyproject.toml's
    ``torch = ["torch>=2.11,<2.16"]``, read back from the package's metadata, so it is
    written once); the version is the installed distribution's, read without importing it.
    A source tree that is not installed has no metadata, and is not checked."""
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    try:
        requires = metadata.requires("ampcert") or []
    except metadata.PackageNotFoundError:
        return None
    names = {module for module, _ in BACKEND_MODULES.get(backend, ())}
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name not in names or req.marker is None or not req.marker.evaluate({"extra": backend}):
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            continue
        if not req.specifier.contains(installed, prereleases=True):
            supported = ",".join(sorted(map(str, req.specifier), key=lambda spec: not spec.startswith(">")))
            return (f"{req.name} {installed} is installed; ampcert supports {req.name}{supported} "
                    f"(pip install 'ampcert[{backend}]' keeps to that range)")
    return None


def require_backend(backend: str, where: str) -> None:
    """Raise the one-line UserError naming the extra to install when the
    framework ``backend`` trains with is not installed, or is a release outside
    the tested range (:func:`unsupported_framework`; ``AMPCERT_ALLOW_UNSUPPORTED=1``
    lets it train); checked when a suite is read (and before a resumed folder's runs
    start), so nothing is planned, written or trained that could only fail."""
    name = missing_framework(backend)
    if name is not None:
        raise UserError(f"{where}: backend {backend} needs {name}, which is not installed: "
                        f"pip install 'ampcert[{backend}]'")
    why = unsupported_framework(backend)
    if why is not None and os.environ.get(ALLOW_UNSUPPORTED_ENV) != "1":
        raise UserError(f"{where}: {why}; or set {ALLOW_UNSUPPORTED_ENV}=1 to train on it untested")


def installed_release(dist: str) -> tuple[int, int] | None:
    """(major, minor) of the installed distribution ``dist``, read without importing it; None
    where it is not installed."""
    from importlib import metadata

    from ampcert.amp.torch.support import release

    try:
        return release(metadata.version(dist))
    except (metadata.PackageNotFoundError, ValueError):
        return None
