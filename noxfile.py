"""Developer sessions: `nox -s tests`, `nox -s lint`, `nox -s gpu`, `nox -s browser`, `nox -s bench`."""

import nox

nox.options.sessions = ["tests", "lint"]
# torch==2.13.0 is pinned for CPU sessions because that build is on the CI
# machines' disk; a bare `torch` could pull a multi-GB CUDA build.
CPU_TORCH = "torch==2.13.0"


@nox.session
def tests(session: nox.Session) -> None:
    session.install(CPU_TORCH, "-e", ".[dev]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "ampcert", "tests", "benchmarks")


@nox.session
def gpu(session: nox.Session) -> None:
    """On a CUDA machine: the gpu-marked tests (torch as installed there, CUDA build)."""
    session.install("-e", ".[dev]")
    session.run("pytest", "-m", "gpu", *session.posargs)


@nox.session
def browser(session: nox.Session) -> None:
    """report.html in headless Chromium (needs `apt-get install chromium`): screenshot,
    no console errors, no network requests."""
    session.install(CPU_TORCH, "-e", ".[dev]")
    session.run("pytest", "-m", "browser", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    session.install(CPU_TORCH, "-e", ".[dev]")
    for script in sorted(__import__("pathlib").Path("benchmarks").glob("*.py")):
        session.run("python", str(script))
