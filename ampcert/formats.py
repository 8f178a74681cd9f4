"""How every command writes a number: one formatter per kind of figure.

The console tables, summary.html, report.html, ``compare``, ``gate``,
``history`` and ``plan`` all write figures through these functions, so one
value reads the same everywhere: 16,036 samples/s (never ``1.604e+04`` in one
command and ``16,036`` in another), 299.0 MiB, +3.1%. A missing value is an
em dash, never 0 or a guess. :func:`figure` picks the format from the figure's
name (``ampcert.aggregate.FIGURES``) or its unit.
"""

from __future__ import annotations

import math
from typing import Any

MISSING = "—"


def number(value: Any, digits: int = 4) -> str:
    """A plain number: thousands separated from 1,000 up (no exponent where a
    reader expects a count), else ``digits`` significant digits."""
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}g}"


def size(n_bytes: float | None) -> str:
    """Bytes as MiB (GiB from 10 GiB up: device memory reads in GiB)."""
    if n_bytes is None:
        return MISSING
    if abs(n_bytes) >= 10 * 2**30:
        return f"{n_bytes / 2**30:,.1f} GiB"
    return f"{n_bytes / 2**20:,.1f} MiB"


def fine_size(n_bytes: float | None) -> str:
    """:func:`size`, in KiB below a MiB: a memory sweep's bytes per sample, residuals and
    standard errors are often below one, and one decimal of a MiB would read 70 KiB as 0.1 MiB."""
    if n_bytes is not None and abs(n_bytes) < 2**20:
        return f"{number(n_bytes / 2**10)} KiB"
    return size(n_bytes)


def budget(n_bytes: float | None) -> str:
    """A memory budget as a suite writes it (24 GiB, 80 GB: ``memory.budgets`` takes either),
    else as :func:`size`; one spelling in the console, the reports and ``ampcert plan``."""
    if n_bytes is not None and n_bytes > 0 and float(n_bytes).is_integer():
        for unit, name in ((2**30, "GiB"), (10**9, "GB")):
            if int(n_bytes) % unit == 0:
                return f"{int(n_bytes) // unit:,} {name}"
    return size(n_bytes)


def seconds(s: float | None) -> str:
    return MISSING if s is None else f"{number(s, 3)} s"


def hours(h: float | None) -> str:
    """A duration given in hours, in the unit that reads best: min, h or d."""
    if h is None:
        return MISSING
    if h < 1:
        return f"{h * 60:.3g} min"
    if h < 48:
        return f"{h:.3g} h"
    return f"{h / 24:,.1f} d"


def change(x: float | None, kind: str = "relative") -> str:
    """A change from a baseline: ``+3.1%`` (relative) or ``+0.0123`` (absolute)."""
    if x is None:
        return MISSING
    if not math.isfinite(x):
        return "+inf" if x > 0 else "-inf"
    return f"{100 * x:+.1f}%" if kind == "relative" else f"{x:+.4f}"


def percent(x: float | None) -> str:
    """A share or a saving as a signed whole percent: ``+47%`` (a saving is positive when it saves)."""
    return MISSING if x is None else f"{100 * x:+.0f}%"


def figure(name: str, value: float | None) -> str:
    """``value`` of the figure ``name`` in that figure's format."""
    if value is None:
        return MISSING
    if name.endswith("_bytes"):
        return size(value)
    if name.endswith("_s") and not name.endswith("per_s"):
        return seconds(value)
    if name.startswith("energy_j"):
        return f"{number(value, 4)} J"
    return number(value)
