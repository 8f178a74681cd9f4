"""A run's steady-state throughput: where its warm-up ends, its median, an interval, its spread.

The first steps of a run are slower than the rest (allocations, caches, lazy
initialisation, compilation), by an amount and for a number of steps that
differ by workload and device, so a fixed number of skipped steps either
keeps some warm-up or throws good steps away. The warm-up is found in the
series itself, by MSER-5, the truncation rule of simulation output analysis
(White 1997; Franklin and White 2008): the steps in batches of 5, and the
truncation point, searched over the first half, that minimises the marginal
standard error of the mean of what remains. Where that minimum lies at the
end of the search, the series had not settled by half-way: the run never
reached a steady state, and :class:`SteadyState` says so (its figures are
then those of the second half).

After the warm-up the steps are cut into windows of :data:`WINDOW` steps
(fewer, down to 5, where that leaves under 4 windows: :func:`window_for`).
The estimate is the median of the remaining steps; its interval is a
percentile bootstrap over whole windows (resampling windows, not steps,
keeps the correlation between neighbouring steps, which makes a step-level
interval too narrow); the coefficient of variation is that of the steps.
Numbers in, numbers out: nothing here knows about runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

BATCH = 5           # MSER-5: the warm-up is found in batches of this many steps
WINDOW = 10         # steps per window of the bootstrap
MIN_STEPS = 20      # fewer steps: no warm-up can be told from the rest
RESAMPLES = 2000
METHOD = (f"MSER-{BATCH} warm-up; median of the steps after it; 95% percentile bootstrap over "
          f"windows of {BATCH}-{WINDOW} steps; CV of those steps")


class SteadyState(BaseModel):
    """A run's steady-state throughput (samples/s), as :func:`steady_state` estimates it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples_per_s: float = Field(description="median of the steps after the warm-up")
    ci: list[float] | None = Field(description="95% bootstrap interval over step windows; null with fewer than 4 windows "
                                                "of 5 steps")
    cv: float = Field(description="coefficient of variation of the steps after the warm-up")
    warmup_steps: int = Field(description="timed steps left out as warm-up (MSER-5)")
    steps: int = Field(description="steps the estimate is taken over")
    reached: bool = Field(description="false where the series had not settled by half-way (or was too short to tell)")
    method: str = METHOD


def window_for(steps: int) -> int:
    """The window of a series of ``steps`` steps: :data:`WINDOW`, or narrower (not
    under :data:`BATCH`) where that would leave fewer than 4 windows to resample."""
    return max(BATCH, min(WINDOW, steps // 4))


def warmup_steps(values: Sequence[float] | np.ndarray) -> tuple[int, bool]:
    """MSER-5's truncation point of ``values`` in steps, and whether it lies
    inside the search (the series settled); (0, False) for a short series."""
    x = np.asarray(values, dtype=float)
    m = len(x) // BATCH
    if len(x) < MIN_STEPS or m < 4:
        return 0, False
    means = x[: m * BATCH].reshape(m, BATCH).mean(axis=1)
    last = m // 2
    # the marginal standard error of what remains after d batches: its variance / its count
    mser = [float(np.var(means[d:])) / (m - d) for d in range(last + 1)]
    best = int(np.argmin(mser))
    return best * BATCH, best < last


def steady_state(values: Sequence[float] | np.ndarray, seed: int = 0) -> SteadyState | None:
    """The steady state of a run's per-step throughputs ``values`` (in order);
    None for no values. Deterministic: the bootstrap draws from ``seed``."""
    x = np.asarray(values, dtype=float)
    if not len(x):
        return None
    skip, reached = warmup_steps(x)
    rest = x[skip:]
    window = window_for(len(rest))
    n_windows = len(rest) // window
    ci = None
    if n_windows >= 4:
        windows = rest[: n_windows * window].reshape(n_windows, window)
        picks = np.random.default_rng(seed).integers(0, n_windows, size=(RESAMPLES, n_windows))
        medians = np.median(windows[picks].reshape(RESAMPLES, -1), axis=1)
        ci = [float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))]
    mean = float(rest.mean())
    return SteadyState(samples_per_s=float(np.median(rest)), ci=ci,
                       cv=float(rest.std(ddof=1) / mean) if len(rest) > 1 and mean > 0 else 0.0,
                       warmup_steps=skip, steps=len(rest), reached=reached)


def steady_steps(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """``values`` after their warm-up: the steps :func:`steady_state` is taken over."""
    x = np.asarray(values, dtype=float)
    return x[warmup_steps(x)[0]:]
