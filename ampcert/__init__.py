"""ampcert: benchmark and certify automatic mixed precision training.

The AMP engine lives in :mod:`ampcert.amp` and is usable on its own. The
harness is driven by the ``ampcert`` command or, from a program or notebook,
by the same session API (docs/api.md)::

    import ampcert

    done = ampcert.run_suite("suites/smoke.yaml")   # run, certify, report
    done.summary["groups"], done.certificate, done.report_html

Importing ``ampcert`` is cheap: the session API is loaded on first use.
"""

from ampcert.version import __version__

# The session API, re-exported on first use (PEP 562): `import ampcert` stays
# light, and `ampcert.run_suite` is the same function as `ampcert.session.run_suite`.
_SESSION = ("run_suite", "resume", "merge", "certify", "report", "finish", "plan_suite", "compare",
            "capacity", "check_logs", "sign", "verify", "keygen")

__all__ = ["__version__", *_SESSION]


def __getattr__(name: str):
    if name in _SESSION:
        from ampcert import session

        return getattr(session, name)
    raise AttributeError(f"module 'ampcert' has no attribute {name!r}")
