"""A run's steady-state throughput: the warm-up found in its step times, an interval, a CV."""

from __future__ import annotations

import json

import numpy as np
import pytest
from factories import completed, plan, write_results

from ampcert import session
from ampcert.gate.significance import bootstrap_medians
from ampcert.steady_state import steady_state, warmup_steps


def _series(warmup: int, steady: int, level: float = 10_000.0, cv: float = 0.02, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0.3 * level, 0.9 * level, warmup)  # slow first steps: allocations, caches
    return np.concatenate([ramp, level * (1 + cv * rng.standard_normal(steady))])


@pytest.mark.parametrize("warmup", [0, 10, 25])
def test_the_warm_up_is_found_where_it_ends(warmup):
    found = steady_state(_series(warmup, 120))
    assert found.reached and abs(found.warmup_steps - warmup) <= 5
    assert found.samples_per_s == pytest.approx(10_000, rel=0.01)
    assert found.ci[0] < 10_000 < found.ci[1] and found.ci[1] - found.ci[0] < 0.02 * 10_000
    assert found.cv == pytest.approx(0.02, rel=0.25)


def test_a_series_that_never_settles_says_so():
    ramp = np.linspace(5_000, 10_000, 100)  # still speeding up at the end
    found = steady_state(ramp)
    assert not found.reached and found.warmup_steps == 50  # figures from the second half
    assert found.samples_per_s > 8_500
    assert steady_state(_series(0, 10)).reached is False and steady_state(_series(0, 10)).ci is None  # too short
    assert steady_state([]) is None


def test_a_fixed_skip_would_keep_a_long_warm_up():
    # a warm-up of 30 steps: the first 5 steps skipped would leave 25 slow ones in the median
    x = _series(30, 60)
    assert warmup_steps(x)[0] >= 25
    assert steady_state(x).samples_per_s > float(np.median(x[5:]))


def test_windows_widen_the_interval_where_neighbouring_steps_are_correlated():
    # slow phases of the machine that last ~10 steps: steps one by one look more certain than they are
    # (within one run: across runs, the runs' own spread dominates either way)
    rng = np.random.default_rng(3)
    runs = [10_000 * np.repeat(1 + 0.05 * rng.standard_normal(12), 10) * (1 + 0.001 * rng.standard_normal(120))]
    by_step = bootstrap_medians(runs, 2000, np.random.default_rng(0), window=1)
    by_window = bootstrap_medians(runs, 2000, np.random.default_rng(0), window=10)
    width = lambda b: np.percentile(b, 97.5) - np.percentile(b, 2.5)  # noqa: E731
    assert width(by_window) > 3 * width(by_step)


def test_reports_show_each_runs_interval(tmp_path):
    specs = plan({"name": "steady", "precisions": ["fp32"], "seeds": [0, 1],
                  "train": {"steps": 60, "eval_every": 30}, "workloads": [{"workload": "digits"}]})
    runs = []
    for spec in specs:
        steps_ms = [1000 * 64 / v for v in _series(10, 50, seed=spec.seed)]
        runs.append(completed(spec, final_metric=0.9, step_times_ms=steps_ms))
    folder = write_results(tmp_path / "out", runs, suite="steady")
    session.report(folder)
    report = json.loads((folder / "report.json").read_text())
    for r in runs:
        found = report["steady_state"][r.run_id]
        assert found["reached"] and abs(found["warmup_steps"] - 10) <= 5 and found["ci"][0] < found["ci"][1]
    rows = json.loads((folder / "summary.json").read_text())["runs"]
    assert all(row["step_samples_per_s_ci"] and row["warmup_steps"] is not None for row in rows)
    assert "steady samples/s" in (folder / "summary.html").read_text()
    assert "Throughput per run" in (folder / "report.html").read_text()
