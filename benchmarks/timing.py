"""The benchmarks' one way to time: variants interleaved in rounds, the order rotating every
round, each slot timing K steps; ratios of medians with a bootstrap interval over paired
rounds (a round's load drift, shared by its variants, cancels); the table they print; the
JSON they write; and their exit (a measurement, never a failure: always 0).

Used by amp_overhead.py, compile_overhead.py, gpt_step_overhead.py, dispatch_overhead.py,
fp8_overhead.py, jax_autocast_overhead.py and telemetry_overhead.py.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def time_steps(step: Callable[[], None], k: int, sync: Callable[[], None] = lambda: None,
               cuda_events: bool = False) -> float:
    """ms per step over ``k`` back-to-back steps: perf_counter stopped after ``sync``, or
    (``cuda_events``) CUDA events around them, read once the device is done."""
    if cuda_events:
        import torch

        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(k):
            step()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / k
    t0 = time.perf_counter()
    for _ in range(k):
        step()
    sync()
    return (time.perf_counter() - t0) * 1e3 / k


def interleaved(variants: dict[str, Callable[[], None]], rounds: int, steps: int | dict[str, int], warmup: int = 0,
                budget_s: float | None = None, min_rounds: int = 5, sync: Callable[[], None] = lambda: None,
                around: Callable[[str], contextlib.AbstractContextManager] | None = None,
                cuda_events: bool = False) -> dict[str, list[float]]:
    """Per-step ms of each variant, one entry per round; the order rotates every round.

    ``steps``: K, or K per variant (calibrated by the caller). ``around(name)`` is entered
    around each slot, outside its clock (a region, a sampler started and stopped). With
    ``budget_s``, stops after the first complete round past the budget (but not before
    ``min_rounds``), so a loaded machine cannot stretch the run indefinitely. ``sync``
    runs before each clock stops (``torch.cuda.synchronize`` on a GPU).
    """
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name]()
    sync()
    per: dict[str, list[float]] = {n: [] for n in names}
    t_begin = time.perf_counter()
    for r in range(rounds):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            k_steps = steps[name] if isinstance(steps, dict) else steps
            with around(name) if around is not None else contextlib.nullcontext():
                sync()
                per[name].append(time_steps(variants[name], k_steps, sync, cuda_events))
        if budget_s is not None and r + 1 >= min_rounds and time.perf_counter() - t_begin > budget_s:
            break
    return per


def ratio_stats(base: list[float], other: list[float], n_boot: int = 2000, seed: int = 0) -> dict[str, float]:
    a, b = np.asarray(base), np.asarray(other)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    boots = np.median(b[idx], axis=1) / np.median(a[idx], axis=1)
    return {
        "ratio": float(np.median(b) / np.median(a)),
        "ci_lo": float(np.percentile(boots, 2.5)),
        "ci_hi": float(np.percentile(boots, 97.5)),
        "ratio_of_min": float(b.min() / a.min()),
        "paired_median_ratio": float(np.median(b / a)),
    }


def comparison(title: str, baseline: str, per: dict[str, list[float]], goals: dict[str, float | None]) -> dict[str, Any]:
    n_rounds = len(per[baseline])
    title = f"{title}, {n_rounds} rounds"
    rows = []
    for name, times in per.items():
        row: dict[str, Any] = {
            "variant": name,
            "median_ms": statistics.median(times),
            "min_ms": min(times),
            "rounds_ms": [round(t, 4) for t in times],
        }
        if name != baseline:
            row.update(ratio_stats(per[baseline], times))
            goal = goals.get(name)
            row["goal"] = goal
            if goal is not None:
                row["verdict"] = "PASS" if row["ratio"] <= goal else "MISS"
                row["ci_spans_goal"] = row["ci_lo"] <= goal <= row["ci_hi"]
        rows.append(row)
    return {"title": title, "baseline": baseline, "rounds": n_rounds, "rows": rows}


def format_table(comp: dict[str, Any]) -> str:
    lines = [f"## {comp['title']}  (ratio = variant / {comp['baseline']})",
             f"{'variant':<28}{'median ms':>10}{'min ms':>9}{'ratio':>8}  {'95% CI':<15}{'min-ratio':>9}"
             f"{'goal':>7}  verdict"]
    for r in comp["rows"]:
        if "ratio" in r:
            ci = f"[{r['ci_lo']:.3f},{r['ci_hi']:.3f}]"
            goal = f"<={r['goal']:.2f}" if r.get("goal") else "-"
            verdict = r.get("verdict", "-") + (" (CI spans goal)" if r.get("ci_spans_goal") else "")
            lines.append(f"{r['variant']:<28}{r['median_ms']:>10.3f}{r['min_ms']:>9.3f}{r['ratio']:>8.3f}  "
                         f"{ci:<15}{r['ratio_of_min']:>9.3f}{goal:>7}  {verdict}")
        else:
            lines.append(f"{r['variant']:<28}{r['median_ms']:>10.3f}{r['min_ms']:>9.3f}{'1':>8}  {'(baseline)':<15}"
                         f"{'1':>9}{'-':>7}  -")
    return "\n".join(lines)



def write_json(path: Path | None, results: Any, emit: Callable[[str], None] = print) -> None:
    """``results`` as indented JSON at ``path`` (None: nowhere); a failure to write is said, not raised."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        emit(f"wrote {path}")
    except OSError as exc:
        emit(f"could not write {path}: {exc}")


def run_measurement(main: Callable[[], Any]) -> None:
    """A benchmark's exit: argparse's errors keep their code; anything else is printed and the
    script exits 0 (a measurement, not a test)."""
    try:
        main()
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001 - a measurement: report and exit 0
        traceback.print_exc()
    sys.exit(0)
