"""What each supported torch release can do, as data, importable without torch.

The harness reads it before any run (planning imports no torch: it takes seconds), the
engine where it acts. One entry per limit, each with the release it was measured on.
"""

from __future__ import annotations

import itertools

__all__ = ["REGION_IN_TRACE_MIN", "release", "release_name"]

#: The first torch whose Dynamo traces an ampcert.autocast region entered *inside* a
#: torch.compile'd function. torch 2.11's does not trace the region's entry (the direct
#: ``_enter_autocast`` call), and its failed trace left the global autocast state changed
#: ("Global autocast(cpu)_enabled state changed while dynamo tracing"); 2.13 is tested, 2.12
#: is not. A region entered around the compiled call works on every supported torch.
REGION_IN_TRACE_MIN = (2, 13)


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string (``2.11.0+cu130`` -> ``(2, 11)``)."""
    major, minor = version.split("+", 1)[0].split(".")[:2]
    return int(major), int("".join(itertools.takewhile(str.isdigit, minor)) or 0)


def release_name(release: tuple[int, int]) -> str:
    """``(2, 13)`` as ``2.13``."""
    return ".".join(map(str, release))
