"""The speed probe (backends/speed_probe.py) through ``ampcert run``: what it records, what
it sees, that a suite can turn it off, that it changes no certified run, and that a
resumed folder finds it done; and the hardware counters' plumbing
(telemetry/perf_counters.py) where this kernel lets it be exercised."""

from __future__ import annotations

import json
import statistics
import time

import pytest
import yaml

from ampcert import session
from ampcert.backends.speed_probe import MIN_ROUNDS
from ampcert.probe_summary import probe_summaries
from ampcert.results import load
from ampcert.telemetry.perf_counters import HARDWARE, SOFTWARE, open_counters

SUITE = {
    "name": "probe", "device": "cpu", "amp": "native", "precisions": ["fp32", "bf16"], "seeds": [0, 1],
    "train": {"steps": 40, "eval_every": 40},
    "speed_probe": {"share": 1.0, "processes": 2},
    "workloads": [{"workload": "digits"}],
}


def run(tmp_path, name: str, **changes):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**SUITE, **changes}))
    return session.run_suite(path, out=tmp_path / name)


def test_a_probe_alternates_both_models_with_the_kernel_and_reports_its_speedup(tmp_path):
    done = run(tmp_path, "on")
    rs = load(done.root)
    assert len(rs.runs) == 4 and all(r.status == "completed" for r in rs.runs)
    assert [r.status for r in rs.probe_runs] == ["completed", "completed"] and not rs.probe_missing
    for r in rs.probe_runs:
        probe = r.speed_probe
        assert r.spec.is_speed_probe and r.spec.seed == 0 and r.spec.precision == "bf16"
        assert probe.rounds >= MIN_ROUNDS and probe.window_steps == 2
        assert probe.reference_first == [i % 2 == 0 for i in range(probe.rounds)]  # the order alternates
        assert min(probe.reference_step_ms + probe.step_ms + probe.kernel_ms) > 0
        assert "1 intra-op thread" in probe.threads and "256x256 matmul" in probe.kernel
        assert probe.counters is not None or "not counted" in probe.counters_note
        assert r.final_metric is None and not r.evals  # speed only: no verdict reads a probe
    # Its budget: the pair's runs' time (share 1.0), split over its two processes.
    pair_s = sum(r.wall_s for r in rs.runs)
    assert rs.probe_runs[0].spec.probe.probe_seconds == pytest.approx(max(pair_s / 2, 0.1), rel=0.01, abs=0.002)
    [summary] = probe_summaries(rs.probe_runs)
    assert summary.processes == 2 and summary.low <= summary.speedup <= summary.high
    # Each process's median over its rounds of fp32's step time over bf16's; the median of those.
    assert summary.per_process == pytest.approx(
        [statistics.median(a / b for a, b in zip(r.speed_probe.reference_step_ms, r.speed_probe.step_ms, strict=True))
         for r in rs.probe_runs], rel=1e-9)
    assert summary.speedup == pytest.approx(statistics.median(summary.per_process), rel=1e-9)
    report = json.loads((done.root / "report.json").read_text())
    [row] = report["speed_probe"]
    assert row["subject"]["precision"] == "bf16" and row["reference"]["precision"] == "fp32"
    assert "Speed probe: the gain measured in one process" in (done.root / "report.html").read_text()

    # Turned off: the same certified runs (ids), and no probe.
    off = run(tmp_path, "off", speed_probe={"enabled": False})
    assert sorted(r.run_id for r in load(off.root).runs) == sorted(r.run_id for r in rs.runs)
    assert not load(off.root).probe_runs and "speed_probe" not in json.loads((off.root / "report.json").read_text())

    # A resumed folder finds its probes done: nothing is run again.
    stamps = {r.run_id: r.finished_at for r in rs.probe_runs}
    session.resume(done.root)
    assert {r.run_id: r.finished_at for r in load(done.root).probe_runs} == stamps


def test_the_probe_sees_the_low_precision_path_slowed_and_fp32_not(tmp_path):
    clean = probe_summaries(load(run(tmp_path, "clean").root).probe_runs)[0]
    slowed = probe_summaries(load(run(tmp_path, "slowed", inject_slowdown={"bf16": 0.3}).root).probe_runs)[0]
    # bf16's steps 30% longer: its speed-up over fp32 falls by about 1/1.3 (-23%).
    assert 0.65 < slowed.speedup / clean.speedup < 0.88, (slowed.speedup, clean.speedup)
    assert slowed.high < clean.low


def test_counters_count_this_process_or_say_why_not():
    counters, note = open_counters(HARDWARE)
    if counters is None:  # most VMs: no hardware PMU
        assert note.startswith("instructions, cycles: not counted: ") and len(note.splitlines()) == 1
    else:
        before = counters.read()
        sum(i * i for i in range(200_000))
        after = counters.read()
        counters.close()
        assert after["instructions"] - before["instructions"] > 200_000
    # The plumbing itself, on a software event every Linux kernel has.
    counters, note = open_counters(SOFTWARE)
    if counters is None:
        pytest.skip(note)
    before, start = counters.read(), time.process_time()
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:
        pass
    spent_ns = (time.process_time() - start) * 1e9  # the CPU time the kernel gave this process
    after = counters.read()
    counters.close()
    counted = after["task_clock_ns"] - before["task_clock_ns"]
    assert 0.7 * spent_ns - 2e7 <= counted <= 1.3 * spent_ns + 2e7, (counted, spent_ns)


def test_a_jax_probe_times_both_models_past_the_runs_budget(tmp_path):
    # JAX's learning rate is a table of the budget's steps: the probe's steps go on past
    # the 12 of the runs (warm-up and 8 rounds of 2-step windows: 22), numbered within it.
    done = run(tmp_path, "jax", backend="jax", amp="ampcert", seeds=[0], train={"steps": 12, "eval_every": 12},
               speed_probe={"share": 1.0, "processes": 1, "max_seconds": 0.2},
               workloads=[{"workload": "resnet", "params": {"size": "tiny"}}])
    [probe] = load(done.root).probe_runs
    assert probe.status == "completed", probe.reason
    assert probe.spec.backend == "jax" and probe.speed_probe.rounds >= MIN_ROUNDS and probe.steps > 12
    assert "jax: an fp32 256x256 matmul" in probe.speed_probe.kernel
    [summary] = probe_summaries([probe])
    assert summary.low <= summary.speedup <= summary.high and summary.path.kernel_units > 0


def test_what_a_feature_does_once_a_probe_does_once_however_often_its_steps_come_round(tmp_path):
    # The precision probe watches every op of step 1; a probe's steps number within the runs'
    # budget (4 here), but the features count on: step 1 is watched once per model, at warm-up.
    from ampcert.backends import torch_precision

    entered = []
    original = torch_precision.PrecisionProbe.__enter__

    def counting(self):
        entered.append(1)
        return original(self)

    torch_precision.PrecisionProbe.__enter__ = counting
    try:
        from ampcert.backends import torch_backend

        spec = load(run(tmp_path, "once", seeds=[0], train={"steps": 4, "eval_every": 4},
                        speed_probe={"share": 1.0, "processes": 1}).root).probe_runs[0].spec
        outcome = torch_backend.train(spec, None)
    finally:
        torch_precision.PrecisionProbe.__enter__ = original
    assert outcome.speed_probe.rounds >= MIN_ROUNDS and outcome.steps > 4 * 3
    assert len(entered) == 2, entered  # FP32's step 1 and bf16's, not one per lap of the budget
