"""The statistics: effect sizes, the bootstrap and the Mann-Whitney U test.

A change is measured as candidate vs baseline, relative (c/b - 1) or absolute
(c - b) (:func:`change`). Its support is a percentile bootstrap interval of the
change in medians (of the runs' medians), hierarchical where samples are steps within runs
(:func:`bootstrap_medians`), or a one-sided Mann-Whitney U test
(:func:`mannwhitney_p`). Nothing here knows about runs or metrics: arrays in,
numbers out.
"""

from __future__ import annotations

import numpy as np


def bootstrap_medians(groups: list[np.ndarray], resamples: int, rng: np.random.Generator,
                      window: int = 1) -> np.ndarray:
    """The gate's estimate (the median over runs of each run's median) in
    ``resamples`` hierarchical bootstrap samples: draw the runs with
    replacement, then within each drawn run as many windows of ``window``
    consecutive steps as a run has (the median count) with replacement; each
    drawn run's median, then their median. Whole windows, as a run's own
    interval draws them (``ampcert.steady_state``): neighbouring steps are
    correlated (a slow phase of the machine lasts many steps), and drawing
    steps one by one would make the interval too narrow. With one value per
    run it is the ordinary bootstrap over runs."""
    m = len(groups)
    # each run cut into whole windows (narrower where a run has fewer steps than a window)
    width = max(min(window, *(len(g) for g in groups)), 1)
    counts = np.array([len(g) // width for g in groups])
    blocks = np.zeros((m, counts.max(), width))
    for j, g in enumerate(groups):
        blocks[j, : counts[j]] = np.asarray(g[: counts[j] * width], dtype=float).reshape(counts[j], width)
    draws = max(int(np.median(counts)), 1)
    out = np.empty(resamples)
    chunk = max(1, 2_000_000 // (m * draws * width))
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        picked = rng.integers(0, m, size=(b, m))
        which = (rng.random((b, m, draws)) * counts[picked][..., None]).astype(np.int64)
        values = blocks[picked[..., None], which]  # (b, m, draws, width)
        out[start:start + b] = np.median(np.median(values.reshape(b, m, -1), axis=2), axis=1)
    return out


def change(b: np.ndarray | float, c: np.ndarray | float, kind: str):
    """The change from ``b`` to ``c``: ``c - b`` (absolute) or ``c / b - 1`` (relative; inf/nan where b is 0)."""
    if kind == "absolute":
        return np.subtract(c, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(c, b) - 1.0


def mannwhitney_p(c: np.ndarray, b: np.ndarray, alternative: str) -> float:
    """One-sided Mann-Whitney U p-value of ``c`` against ``b`` (1.0 where every sample is equal)."""
    from scipy.stats import mannwhitneyu

    pooled = np.concatenate([b, c])
    if np.all(pooled == pooled[0]):  # (not np.ptp: inf - inf is nan)
        return 1.0  # every sample equal: no evidence of any shift
    return float(mannwhitneyu(c, b, alternative=alternative).pvalue)
