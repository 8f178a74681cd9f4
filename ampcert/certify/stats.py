"""The statistics behind the verdicts, small and named.

- :func:`paired_tost`: two one-sided tests (Schuirmann 1987) that the mean
  paired difference lies within ``(-margin, +margin)``, via
  ``scipy.stats.ttest_1samp``; equivalently, the ``1 - 2 alpha`` confidence
  interval of the mean difference lies inside the margin.
- :func:`olympic_mean`: MLPerf's score over repeated runs (drop the fastest
  and the slowest, average the rest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Tost:
    n: int
    mean_diff: float
    sd_diff: float
    ci_low: float
    ci_high: float
    p_lower: float        # H0: mean <= -margin
    p_upper: float        # H0: mean >= +margin
    p_value: float        # max of the two: equivalence is shown when p < alpha
    margin: float
    alpha: float
    equivalent: bool      # the CI lies inside (-margin, margin)
    outside: bool         # the point estimate itself is outside the margin
    test: str = "paired TOST, two one-sided t-tests (scipy.stats.ttest_1samp)"

    def as_dict(self) -> dict:
        return asdict(self)


def paired_tost(low: Sequence[float], ref: Sequence[float], margin: float, alpha: float = 0.05) -> Tost:
    """Equivalence of ``low`` and ``ref`` paired values within ``margin``."""
    d = np.asarray(low, dtype=np.float64) - np.asarray(ref, dtype=np.float64)
    n = len(d)
    if n < 2:
        raise ValueError("paired TOST needs at least two pairs")
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        # Identical differences: the interval is the point; scipy would return nan.
        inside = abs(mean) < margin
        p_lo = 0.0 if mean > -margin else 1.0
        p_hi = 0.0 if mean < margin else 1.0
        return Tost(n, mean, 0.0, mean, mean, p_lo, p_hi, max(p_lo, p_hi), margin, alpha,
                    inside, not inside)
    # imported here: scipy.stats costs ~1 s of every command that loads a rule pack, most test nothing
    from scipy import stats

    p_lo = float(stats.ttest_1samp(d, -margin, alternative="greater").pvalue)
    p_hi = float(stats.ttest_1samp(d, margin, alternative="less").pvalue)
    half = float(stats.t.ppf(1 - alpha, n - 1)) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    return Tost(n, mean, sd, lo, hi, p_lo, p_hi, max(p_lo, p_hi), margin, alpha,
                -margin < lo and hi < margin, abs(mean) >= margin)


def olympic_mean(values: Sequence[float]) -> float:
    """Mean after dropping the lowest and the highest value (with >= 3 values;
    MLPerf's time-to-train score); the plain mean for fewer."""
    v = sorted(float(x) for x in values)
    if not v:
        raise ValueError("olympic_mean of nothing")
    if len(v) >= 3:
        v = v[1:-1]
    return sum(v) / len(v)
