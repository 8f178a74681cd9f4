"""The sampler: integration on known series, summaries of hand-built
recordings, and the live thread's timing and phase tags."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest

from ampcert.telemetry import Telemetry, integrate_trapezoid, summarize
from ampcert.telemetry.summary import Edge, Recording, SourceInfo

# --------------------------------------------------------------------------- integration


def test_trapezoid_is_exact_on_a_ramp_and_interpolates_window_edges():
    t = np.arange(0, 11, 1.0)
    p = t.copy()  # p(t) = t: linear, so the trapezoidal rule is exact
    assert integrate_trapezoid(t, p, 0, 10) == pytest.approx(50.0)
    # Window edges between samples are interpolated, not snapped to a sample.
    assert integrate_trapezoid(t, p, 2.5, 7.5) == pytest.approx((7.5**2 - 2.5**2) / 2)
    assert integrate_trapezoid(t, p, 3.2, 3.7) == pytest.approx((3.7**2 - 3.2**2) / 2)


def test_trapezoid_holds_flat_beyond_the_samples_and_skips_gaps():
    t = [1.0, 2.0, 3.0]
    assert integrate_trapezoid(t, [5.0, 5.0, 5.0], 0.0, 4.0) == pytest.approx(20.0)
    # An unreadable sample (None/NaN) is dropped, not read as 0 W.
    assert integrate_trapezoid([0, 1, 2], [10.0, math.nan, 10.0], 0, 2) == pytest.approx(20.0)
    # A step from 100 W to 300 W between samples at 1 s and 2 s: the trapezoid
    # spreads it linearly over that interval.
    assert integrate_trapezoid([0, 1, 2, 3], [100, 100, 300, 300], 0, 3) == pytest.approx(100 + 200 + 300)
    assert integrate_trapezoid([], [], 0, 1) is None
    assert integrate_trapezoid([0, 1], [math.nan, math.nan], 0, 1) is None


# --------------------------------------------------------------------------- summaries of known recordings


def _gpu_like(name="gpu0", reasons=None, energy_reason=None) -> SourceInfo:
    return SourceInfo(name, "nvml", ("power_w", "mem_used_bytes"), "power_w", False,
                      {"power_method": "test power"}, reasons or {}, energy_reason, "test counter")


def _recording(counters, power, mem=1e9, device="cuda") -> Recording:
    """Phases init [0,1], train [1,5], eval [5,6], train [6,8]; stop at 8.
    Power sampled every 0.5 s from ``power(t)``."""
    edges = [Edge(0.0, "init", {}), Edge(1.0, "train", {}), Edge(5.0, "eval", {}),
             Edge(6.0, "train", {}), Edge(8.0, None, {})]
    for e, c in zip(edges, counters, strict=True):
        e.energy["gpu0"] = c
    rows = []
    for t in np.arange(0, 8.01, 0.5):
        phase = "init" if t < 1 else "eval" if 5 <= t < 6 else "train"
        rows.append((float(t), phase, t in (0, 1, 5, 6, 8), {"gpu0": (power(t), mem)}))
    return Recording(device, 2.0, [_gpu_like()], edges, rows)


def test_counter_energy_per_phase_and_per_training_sample():
    # Counter (J): init 50, train 400 + 200, eval 90.
    rec = _recording([1000.0, 1050.0, 1450.0, 1540.0, 1740.0], lambda t: 100.0)
    s = summarize(rec, train_samples=600)
    g = s["sources"]["gpu0"]
    assert g["energy_method"] == "counter: test counter"
    assert g["energy_j"] == {"init": 50.0, "train": 600.0, "eval": 90.0, "total": 740.0}
    assert s["phases_s"] == {"init": 1.0, "train": 6.0, "eval": 1.0, "total": 8.0}
    assert g["avg_w"]["train"] == pytest.approx(100.0) and g["avg_w"]["eval"] == pytest.approx(90.0)
    # Joules per training sample use the train phase only.
    assert g["train_j_per_sample"] == pytest.approx(1.0)
    assert s["energy"]["train_j_per_sample"] == pytest.approx(1.0)
    assert s["energy"]["train_j"] == 600.0 and s["energy"]["scope"] == "gpu0"
    # The integrated power is reported beside the counter as a cross-check.
    cc = g["cross_check"]
    assert cc["integrated_total_j"] == pytest.approx(800.0) and cc["counter_total_j"] == 740.0
    assert cc["relative_difference"] == pytest.approx(60 / 740)
    assert s["peak_memory"]["gpu0.mem_used_bytes"]["value"] == 1e9


def test_without_a_counter_power_is_integrated_and_the_method_says_why():
    # 200 W until t=3, then 400 W: exact energy per phase is known.
    rec = _recording([None] * 5, lambda t: 200.0 if t < 3 else 400.0)
    rec.sources[0].energy_reason = "nvmlDeviceGetTotalEnergyConsumption: Not Supported (NVML error 3)"
    s = summarize(rec, train_samples=100)
    g = s["sources"]["gpu0"]
    assert g["energy_method"].startswith("trapezoid: ") and "Not Supported (NVML error 3)" in g["energy_method"]
    # Samples every 0.5 s: the step at t=3 is spread over [2.5, 3] (trapezoid).
    assert g["energy_j"]["init"] == pytest.approx(200.0)
    assert g["energy_j"]["train"] == pytest.approx(200 * 1.5 + 150 + 400 * 2 + 400 * 2)
    assert g["energy_j"]["eval"] == pytest.approx(400.0)
    assert "cross_check" not in g
    assert g["peak_w"] == {"init": 200.0, "train": 400.0, "eval": 400.0, "total": 400.0}


def test_a_source_without_counter_or_power_is_null_with_its_reason_never_zero():
    rec = _recording([None] * 5, lambda t: None)
    rec.sources[0].reasons["power_w"] = "nvmlDeviceGetPowerUsage: Not Supported (NVML error 3)"
    s = summarize(rec, train_samples=100)
    g = s["sources"]["gpu0"]
    assert g["energy_j"] is None and g["avg_w"] is None and g["peak_w"] is None
    assert g["train_j_per_sample"] is None
    assert "Not Supported" in g["unavailable"]["energy_j"]
    assert "Not Supported" in g["unavailable"]["power_w"]
    assert s["energy"]["train_j_per_sample"] is None and "Not Supported" in s["energy"]["reason"]


def test_a_missing_counter_at_one_edge_falls_back_to_integration():
    rec = _recording([1000.0, 1050.0, None, 1540.0, 1740.0], lambda t: 100.0)
    g = summarize(rec, 10)["sources"]["gpu0"]
    assert g["energy_method"].startswith("trapezoid: ") and "1 of 5 phase edges" in g["energy_method"]
    assert g["energy_j"]["total"] == pytest.approx(800.0)


def test_an_interval_mean_power_is_not_integrated():
    # RAPL-style package_w (mean since the previous sample) needs the counter.
    info = SourceInfo("host", "host", ("package_w",), "package_w", True, {}, {}, "RAPL unavailable: test")
    rec = Recording("cpu", 2.0, [info], [Edge(0.0, "train", {"host": None}), Edge(2.0, None, {"host": None})],
                    [(0.0, "train", True, {"host": (None,)}), (1.0, "train", False, {"host": (50.0,)}),
                     (2.0, "train", True, {"host": (60.0,)})])
    s = summarize(rec, 10)
    assert s["sources"]["host"]["energy_j"] is None
    assert s["energy"]["scope"] == "host" and s["energy"]["reason"] == "host: RAPL unavailable: test"
    assert s["sources"]["host"]["peak_w"]["train"] == 60.0
    assert s["host_energy"] == {"available": False, "reason": "RAPL unavailable: test"}


def test_sampling_rate_counts_background_samples_only():
    rec = _recording([0.0, 1.0, 2.0, 3.0, 4.0], lambda t: 1.0)
    s = summarize(rec)
    assert s["sampling"]["samples"] == 17 - 5 and s["sampling"]["edge_samples"] == 5
    assert s["sampling"]["achieved_hz"] == pytest.approx(12 / 8)
    assert s["energy"]["train_j_per_sample"] is None and s["energy"]["reason"] == "no training samples"


# --------------------------------------------------------------------------- the live thread


class SyntheticSource:
    """A source with a known power signal and no energy counter."""

    kind = "synthetic"
    columns = ("power_w",)
    power_column = "power_w"
    power_is_interval_mean = False

    def __init__(self, name="syn", watts=100.0):
        self.name, self.watts, self.reasons, self.calls = name, watts, {}, 0

    def describe(self):
        return {"kind": self.kind, "power_method": "synthetic constant", "energy_method": None}

    def energy_j(self, t):
        return None

    def energy_unavailable_reason(self):
        return "synthetic: no counter"

    def sample(self, t):
        self.calls += 1
        return (self.watts,)

    def extra_summary(self):
        return {}

    def close(self):
        pass


def test_thread_keeps_its_rate_and_tags_phases(tmp_path):
    src = SyntheticSource()
    tel = Telemetry("cpu", 50.0, [src]).begin("init")
    time.sleep(0.2)
    tel.phase("train")
    tel.phase("train")  # repeating the current phase is not an edge
    time.sleep(0.6)
    tel.phase("eval")
    time.sleep(0.2)
    s = tel.stop(train_samples=1000)
    assert tel.stop() is s  # computed once
    samp = s["sampling"]
    # 50 Hz for ~1 s on a busy 2-core machine: allow slack, but not a lost thread.
    assert 35 <= samp["achieved_hz"] <= 52 and samp["edge_samples"] == 4
    assert 15 <= samp["interval_ms"]["p50"] <= 25
    assert s["phases_s"]["train"] == pytest.approx(0.6, abs=0.1)
    assert sum(s["phases_s"][p] for p in ("init", "train", "eval")) == pytest.approx(s["phases_s"]["total"])
    # Constant 100 W integrated over each phase (no counter): 100 J/s exactly.
    g = s["sources"]["syn"]
    assert g["energy_method"].startswith("trapezoid")
    for p in ("init", "train", "eval", "total"):
        assert g["energy_j"][p] == pytest.approx(100.0 * s["phases_s"][p], rel=1e-9)
    assert g["train_j_per_sample"] == pytest.approx(100.0 * s["phases_s"]["train"] / 1000)
    # Every row is tagged with the phase it was taken in.
    rows = tel.recording.rows
    edges = tel.recording.edges
    for t, phase, _edge, _ in rows:
        current = [e.phase for e in edges if e.t <= t and e.phase is not None][-1]
        assert phase == current
    with pytest.raises(RuntimeError):
        tel.phase("train")
    # The series file reads back with pandas.
    path = tel.write_series(tmp_path / "telemetry.csv")
    df = pd.read_csv(path)
    assert list(df.columns) == ["t_s", "phase", "edge", "syn.power_w"]
    assert set(df.phase) == {"init", "train", "eval"} and df.edge.sum() == 4
    assert (df["syn.power_w"] == 100.0).all() and df.t_s.is_monotonic_increasing


def test_a_failing_source_does_not_stop_the_others():
    class Broken(SyntheticSource):
        def sample(self, t):
            raise RuntimeError("sensor fell off")

    good, bad = SyntheticSource("good"), Broken("bad")
    tel = Telemetry("cpu", 100.0, [good, bad]).begin()
    time.sleep(0.1)
    s = tel.stop(10)
    assert good.calls >= 5
    assert s["sources"]["bad"]["energy_j"] is None
    assert "sensor fell off" in s["sources"]["bad"]["unavailable"]["power_w"]
    assert s["sources"]["good"]["energy_j"]["total"] > 0


def test_close_stops_the_thread_without_a_summary_and_rate_is_validated():
    tel = Telemetry("cpu", 20.0, [SyntheticSource()]).begin()
    tel.close()
    tel.close()
    assert not tel._thread.is_alive()
    for bad in (0, -1, float("nan"), 5000):
        with pytest.raises(ValueError):
            Telemetry("cpu", bad, [])


def test_start_on_cpu_states_why_there_is_no_gpu_telemetry(tmp_path):
    import fake_pynvml

    nvml = fake_pynvml.make([], init_error=fake_pynvml.LIBRARY_NOT_FOUND)
    tel = Telemetry.start("cpu", 10.0, nvml=nvml, powercap_root=tmp_path / "nope",
                          framework_memory={"fw.peak": 123})
    s = tel.stop(train_samples=5)
    assert s["gpu"]["available"] is False
    assert s["gpu"]["statement"].startswith("GPU telemetry unavailable: the run uses the CPU")
    assert "NVML Shared Library Not Found (NVML error 12)" in s["gpu"]["statement"]
    assert s["peak_memory"]["fw.peak"] == {"value": 123.0, "unit": "bytes", "method": "fw.peak"}
    assert s["peak_memory"]["host.rss_bytes"]["value"] > 0
    assert s["peak_memory"]["host.ru_maxrss"]["value"] > 0
    assert s["host_energy"]["available"] is False and "not present" in s["host_energy"]["reason"]
