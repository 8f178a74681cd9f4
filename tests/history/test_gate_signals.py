"""Which signal the history gate decides each question on (history/gate.py, QUESTIONS).

Nights are built as the store keeps them (records.Night and its Points), with a
noisy whole-run throughput and a steady steady-state one, so which series the
gate trusts, and that it fails only on that one, is known.
"""

from __future__ import annotations

import numpy as np

from ampcert.history.gate import gate_night
from ampcert.history.records import Night, Point
from ampcert.history.store import open_store
from ampcert.vocabulary import Subject

BF16 = Subject("digits", "torch", "ampcert", "bf16")


def night(day: int, samples_per_s: float, step_samples_per_s: float, speedup: float) -> Night:
    values = {"samples_per_s": samples_per_s, "step_samples_per_s": step_samples_per_s,
              "paired_speedup_vs_fp32": speedup}
    return Night(digest=f"{day:064x}", suite="nightly", suite_sha256=None,
                 created_at=f"2026-10-{day + 1:02d}T02:00:00+00:00", machine="runner", source=f"night-{day}",
                 tool="ampcert test", certificate=None, fingerprint={},
                 points=[Point(BF16, metric, value, [value], True) for metric, value in values.items()])


def gate(tmp_path, levels: list[tuple[float, float, float]], seed: int = 0):
    """Nights at these (whole-run, steady-state, speed-up) levels, whole-run throughput
    with 3% noise, the others with 0.3%; the last night gated against the others."""
    rng = np.random.default_rng(seed)
    nights = [night(d, 5000 * a * (1 + 0.03 * rng.standard_normal()), 6000 * b * (1 + 0.003 * rng.standard_normal()),
                    1.8 * c * (1 + 0.003 * rng.standard_normal())) for d, (a, b, c) in enumerate(levels)]
    store = open_store(str(tmp_path / "h.sqlite"))
    for n in nights[:-1]:
        store.add(n)
    return gate_night(store, nights[-1])


def rows(result):
    return {r.metric: r for r in result.rows}


def test_speed_is_gated_on_the_steadier_throughput_and_the_other_is_shown_not_gated(tmp_path):
    # The whole-run figure drops 25% for three nights (startup or evaluation got slower,
    # say), the steady state does not move.
    result = gate(tmp_path, [(1, 1, 1)] * 10 + [(0.75, 1, 1)] * 3)
    by_metric = rows(result)
    assert by_metric["samples_per_s"].status == "REGRESSION" and not by_metric["samples_per_s"].gated
    assert by_metric["step_samples_per_s"].gated and by_metric["step_samples_per_s"].status == "OK"
    assert result.status == "PASS" and not result.regressions
    assert [line.split(" (")[0] for line in result.signals] == [f"{BF16} speed: gated on step_samples_per_s"]
    noise = dict(part.rsplit(" ", 1) for part in result.signals[0].split("noise: ")[1].split(")")[0].split(", "))
    assert float(noise["step_samples_per_s"].rstrip("%")) < 1 < float(noise["samples_per_s"].rstrip("%")), noise


def test_a_step_in_the_gated_throughput_fails(tmp_path):
    result = gate(tmp_path, [(1, 1, 1)] * 10 + [(1, 0.95, 1)] * 3)
    assert result.status == "FAIL"
    assert [(r.metric, r.question) for r in result.regressions] == [("step_samples_per_s", "speed")]


def test_a_lost_gain_fails_on_the_paired_speedup(tmp_path):
    result = gate(tmp_path, [(1, 1, 1)] * 10 + [(1, 1, 0.95)] * 2)
    assert [(r.metric, r.question) for r in result.regressions] == [("paired_speedup_vs_fp32", "gain")]


def test_too_few_nights_to_measure_noise_prefers_the_steady_state(tmp_path):
    result = gate(tmp_path, [(1, 1, 1)] * 4)
    assert rows(result)["step_samples_per_s"].gated and not rows(result)["samples_per_s"].gated
    assert "fewer than 5 nights before" in result.signals[0]


def probe_nights(tmp_path, series: dict[str, list[float]], noise: dict[str, float], seed: int = 0):
    """Nights of these metrics' levels (each with its relative noise), the last gated;
    a metric's list may be shorter: it joins the store at its last nights."""
    rng = np.random.default_rng(seed)
    count = max(len(v) for v in series.values())
    nights = []
    for d in range(count):
        points = []
        for metric, levels in series.items():
            at = d - (count - len(levels))
            if at >= 0:
                value = levels[at] * (1 + noise[metric] * rng.standard_normal())
                points.append(Point(BF16, metric, value, [value], metric.endswith("speedup_vs_fp32")
                                    or metric.endswith("samples_per_s")))
        nights.append(Night(digest=f"{d:064x}", suite="nightly", suite_sha256=None,
                            created_at=f"2026-10-{d + 1:02d}T02:00:00+00:00", machine="runner", source=f"night-{d}",
                            tool="ampcert test", certificate=None, fingerprint={}, points=points))
    store = open_store(str(tmp_path / "h.sqlite"))
    for n in nights[:-1]:
        store.add(n)
    return gate_night(store, nights[-1])


def test_the_gain_is_gated_on_the_probe_where_it_is_steadier_and_a_lost_gain_fails_there(tmp_path):
    # The whole runs' paired speed-up moves 4% a night (two runs a second apart on a busy
    # VM), the probe's 0.4%; bf16 loses 5% of its gain at night 11.
    levels = [1.0] * 10 + [0.95] * 2
    result = probe_nights(tmp_path, {"paired_speedup_vs_fp32": levels, "probe_speedup_vs_fp32": levels},
                          {"paired_speedup_vs_fp32": 0.04, "probe_speedup_vs_fp32": 0.004})
    assert [(r.metric, r.question) for r in result.regressions] == [("probe_speedup_vs_fp32", "gain")]
    assert not rows(result)["paired_speedup_vs_fp32"].gated
    assert any(line.startswith(f"{BF16} gain: gated on probe_speedup_vs_fp32") for line in result.signals)


def test_a_signal_new_to_the_store_waits_until_its_noise_is_known(tmp_path):
    # The probe joins at the ninth night: with three nights of its own, the runs' speed-up
    # (ten nights, steady here) still decides, and the probe's short series is shown.
    result = probe_nights(tmp_path, {"paired_speedup_vs_fp32": [1.0] * 10, "probe_speedup_vs_fp32": [1.0] * 3},
                          {"paired_speedup_vs_fp32": 0.004, "probe_speedup_vs_fp32": 0.004})
    assert rows(result)["paired_speedup_vs_fp32"].gated and not rows(result)["probe_speedup_vs_fp32"].gated
    line = next(line for line in result.signals if " gain: " in line)
    assert "probe_speedup_vs_fp32" not in line.split("noise: ")[1], line  # not measured: not a candidate


def test_speed_gated_in_kernel_units_says_what_that_figure_cannot_see(tmp_path):
    flat = [1.0] * 10
    result = probe_nights(tmp_path, {"step_samples_per_s": flat, "probe_step_ms": flat, "probe_step_kernel_units": flat},
                          {"step_samples_per_s": 0.03, "probe_step_ms": 0.03, "probe_step_kernel_units": 0.003})
    assert rows(result)["probe_step_kernel_units"].gated
    line = next(line for line in result.signals if " speed: " in line)
    assert "gated on probe_step_kernel_units" in line and "slows the kernel's library as well" in line, line
