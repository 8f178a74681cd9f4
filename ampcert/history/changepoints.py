"""Change points in a metric's nightly series, and whether the newest nights regressed.

The detector is ruptures' PELT with the l2 cost (a change in the mean), chosen
over the alternatives the issue weighed: ruptures needs only numpy and scipy
and ships wheels; MongoDB's signal-processing-algorithms (E-Divisive means)
ships as an sdist only; apache-otava pins numpy 2.2 and pulls cloud and chat
SDKs, which no library should impose on its users.

The penalty is the BIC-like ``penalty_scale * sigma**2 * log(n)``, where sigma is
the night-to-night noise estimated robustly from the series itself (the median
absolute first difference, scaled to a standard deviation): a step does not
inflate it, an outlier night barely does. ``min_size`` nights per segment (2 by
default) means one odd night is never a change on its own: a step is seen at
its second night at the earliest. ``benchmarks/gate_power.py`` measures the false
alarms and the detection delay this gives on synthetic histories.

A series *regresses* when its last change point lies within the newest
``window`` nights and the segment after it is worse than the segment before by
at least ``min_effect`` (relative), in the metric's direction, and by more than
the noise explains (a two-sided t-test of the newest segment against the
:data:`MIN_BEFORE` or more nights before it, p < ``max_p``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_PENALTY_SCALE = 4.0
DEFAULT_MIN_SIZE = 2
DEFAULT_WINDOW = 3
DEFAULT_MIN_EFFECT = 0.01
# The two levels must differ beyond the noise: a two-sided t-test of the newest segment
# against the level before it (at least MIN_BEFORE nights), p below this.
DEFAULT_MAX_P = 0.0001
MIN_BEFORE = 6
_MAD_TO_SD = 1.4826


def noise_sigma(values: Sequence[float] | np.ndarray) -> float:
    """Night-to-night noise: the median absolute first difference, as a standard deviation."""
    x = np.asarray(values, dtype=float)
    if len(x) < 3:
        return 0.0
    return float(np.median(np.abs(np.diff(x))) * _MAD_TO_SD / math.sqrt(2))


def change_points(values: Sequence[float] | np.ndarray, *, penalty_scale: float = DEFAULT_PENALTY_SCALE,
                  min_size: int = DEFAULT_MIN_SIZE) -> list[int]:
    """Indices where a new segment starts (empty: one level throughout)."""
    import ruptures

    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2 * min_size:
        return []
    sigma = noise_sigma(x)
    scale = max(float(np.median(np.abs(x))), 1e-300)
    sigma = max(sigma, 1e-9 * scale)  # a noiseless series: any real step is a change
    penalty = penalty_scale * sigma ** 2 * math.log(n)
    ends = ruptures.Pelt(model="l2", min_size=min_size, jump=1).fit(x.reshape(-1, 1)).predict(pen=penalty)
    return [int(e) for e in ends[:-1]]


def _p_value(before: np.ndarray, after: np.ndarray) -> float:
    """Two-sided Student's t-test of the two levels (pooled variance)."""
    from scipy import stats

    if len(before) < 2 or len(after) < 1:
        return 1.0
    pooled = np.concatenate([before - before.mean(), after - after.mean()])
    dof = len(pooled) - 2
    if dof < 1:
        return 1.0
    sd = math.sqrt(float(np.sum(pooled ** 2)) / dof)
    if sd == 0:
        return 0.0 if after.mean() != before.mean() else 1.0
    t = abs(float(after.mean() - before.mean())) / (sd * math.sqrt(1 / len(before) + 1 / len(after)))
    return float(2 * stats.t.sf(t, dof))


@dataclass(frozen=True)
class SeriesVerdict:
    status: str                  # "REGRESSION", "IMPROVEMENT", "OK", "SHORT" (too few nights to tell)
    change_points: list[int]     # segment starts, indices into the series
    change: float | None         # relative change of the newest segment against the one before
    at: int | None               # the index of the change point that decided, if any
    sigma: float


def judge(values: Sequence[float] | np.ndarray, higher_is_better: bool, *, window: int = DEFAULT_WINDOW,
          min_effect: float = DEFAULT_MIN_EFFECT, penalty_scale: float = DEFAULT_PENALTY_SCALE,
          min_size: int = DEFAULT_MIN_SIZE, min_nights: int = 6, max_p: float = DEFAULT_MAX_P) -> SeriesVerdict:
    """Did the newest ``window`` nights of this series move, and which way?"""
    x = np.asarray(values, dtype=float)
    sigma = noise_sigma(x)
    if len(x) < min_nights:
        return SeriesVerdict("SHORT", [], None, None, sigma)
    cps = change_points(x, penalty_scale=penalty_scale, min_size=min_size)
    recent = [c for c in cps if c >= len(x) - window]
    if not recent:
        return SeriesVerdict("OK", cps, None, None, sigma)
    at = recent[-1]
    start = max([c for c in cps if c < at], default=0)
    # The level before, over at least MIN_BEFORE nights: a short segment (PELT may split a
    # noisy stretch) says little about where the series was.
    start = min(start, max(at - MIN_BEFORE, 0))
    before, after = x[start:at], x[at:]
    base = float(np.mean(before))
    change = (float(np.mean(after)) - base) / abs(base) if base else math.inf
    worse = change < 0 if higher_is_better else change > 0
    if abs(change) < min_effect or _p_value(before, after) >= max_p:
        # Too small to matter, or too small for this series' noise: PELT's penalty bounds
        # false change points over the whole series; this bounds them at its newest end.
        return SeriesVerdict("OK", cps, change, at, sigma)
    return SeriesVerdict("REGRESSION" if worse else "IMPROVEMENT", cps, change, at, sigma)
