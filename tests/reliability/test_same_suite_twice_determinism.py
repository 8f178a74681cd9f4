"""The same suite run from scratch three times, in separate processes: the
same run ids, bit-identical loss trajectories per seed, and report.json files
that differ only in fields that measure time, speed or the machine's
telemetry (listed below, one by one)."""

from __future__ import annotations

import json
import re

import pytest
from rel_lab import lab

from ampcert.results import load

# Every report.json field allowed to differ between two runs of one suite, each
# because it measures elapsed time, speed, memory or the machine's load, or
# stamps a moment. Anything else that differs fails the test.
TIMING_AND_TELEMETRY_FIELDS = [
    # when the plan was written
    "planned_at",
    # the capability probe times a 512x512 matmul per precision when planning; its
    # throughput, the speed-up it implies and the sentences that quote it
    "capabilities.*.measured_flops", "capabilities.*.peak_flops", "capabilities.*.speedup_vs_fp32",
    "capabilities.*.note", "capabilities.*.accelerated",
    "runs[*].spec.peak_flops", "runs[*].spec.capability_note", "runs[*].spec.accelerated",
    "runs[*].capability_note", "runs[*].accelerated", "runs[*].peak_flops.value",
    "table[*].capability_note", "table[*].accelerated", "not_measured[*].why",
    # ... and what follows from that verdict: which peak MFU is measured against (the
    # precision's own calibration where accelerated, fp32's where not) and whether its
    # speed-up is listed as not measured
    "capabilities.*.peak_source", "runs[*].spec.peak_source", "runs[*].peak_flops.method",
    "methods.peak_flops[*]", "not_measured[*].what",
    # wall-clock stamps and durations of each run
    "runs[*].started_at", "runs[*].finished_at", "runs[*].wall_s",
    "runs[*].phases.startup_s", "runs[*].phases.build_s", "runs[*].phases.train_s", "runs[*].phases.eval_s",
    "runs[*].phases.other_s", "runs[*].evals[*].train_time_s", "runs[*].time_to_target_s",
    "runs[*].data_time_s", "runs[*].data_share", "table[*].data_share", "table[*].time_to_target_s",
    # speed
    "runs[*].samples_per_s", "runs[*].achieved_flops", "runs[*].mfu",
    "runs[*].step_time.n", "runs[*].step_time.mean_ms", "runs[*].step_time.std_ms", "runs[*].step_time.p50_ms",
    "runs[*].step_time.p90_ms", "runs[*].step_time.p99_ms", "runs[*].step_time.min_ms",
    "runs[*].step_time.max_ms", "runs[*].step_times_ms[*]",
    "table[*].samples_per_s", "table[*].step_samples_per_s", "table[*].speedup_vs_fp32", "table[*].mfu",
    "table[*].paired_speedup_vs_fp32",
    # each run's steady state, read from its step times (where its warm-up ends moves with them too)
    "steady_state.*.samples_per_s", "steady_state.*.ci", "steady_state.*.ci[*]", "steady_state.*.cv",
    "steady_state.*.warmup_steps", "steady_state.*.steps", "steady_state.*.reached",
    # memory high-water marks (RSS)
    "runs[*].peak_memory.value", "table[*].peak_memory_bytes",
    # the telemetry sampler: its timing, and the load, memory and power it sampled
    "runs[*].telemetry.phases_s.*", "runs[*].telemetry.sampling.*",
    "runs[*].telemetry.peak_memory.*.value", "runs[*].telemetry.sources.*.stats.*",
    "runs[*].telemetry.energy.*", "table[*].energy_j_per_sample",
    # capacity planning: projections from the measured throughput (and the note quoting the probe)
    "capacity.rows[*].samples_per_s", "capacity.rows[*].samples_per_s_range[*]",
    "capacity.rows[*].speedup_vs_fp32", "capacity.rows[*].capability_note", "capacity.rows[*].accelerated",
    "capacity.rows[*].wall_time_h", "capacity.rows[*].wall_time_h_range[*]", "capacity.rows[*].device_hours",
    "capacity.rows[*].device_hours_range[*]", "capacity.rows[*].time_saving_vs_fp32",
    "capacity.rows[*].cost", "capacity.rows[*].cost_range[*]", "capacity.rows[*].cost_saving_vs_fp32",
    "capacity.rows[*].energy_kwh", "capacity.rows[*].energy_kwh_range[*]", "capacity.rows[*].energy_saving_vs_fp32",
]


def _listed(path: str) -> bool:
    """Whether ``path`` (list indices as ``[*]``) matches a listed field; ``*`` in a pattern: any characters."""
    return any(re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), path) for pattern in TIMING_AND_TELEMETRY_FIELDS)


def _leaves(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, node


def _differing_fields(x: dict, y: dict) -> set[str]:
    lx, ly = dict(_leaves(x)), dict(_leaves(y))
    return {re.sub(r"\[\d+\]", "[*]", p) for p in lx.keys() | ly.keys() if lx.get(p, KeyError) != ly.get(p, KeyError)}


@pytest.fixture(scope="module")
def the_lab(tmp_path_factory):
    return lab(tmp_path_factory).wait()


@pytest.mark.slow
def test_runs_from_scratch_agree_on_everything_but_timing(the_lab):
    """``a`` ran uninterrupted; each chain ran the same suite from scratch in
    other processes (and was SIGKILLed and resumed along the way, which must
    not show either)."""
    assert the_lab.procs["a"].returncode == 0, the_lab.procs["a"].stdout + the_lab.procs["a"].stderr
    a = load(the_lab.root / "a")
    ra = json.loads((the_lab.root / "a" / "report.json").read_text())
    assert len(a.runs) == 4
    fp32 = sorted((r for r in a.runs if r.spec.precision == "fp32"), key=lambda r: r.spec.seed)
    assert fp32[0].loss != fp32[1].loss  # seeds differ: equal trajectories below are not trivially equal
    for chain in the_lab.chains:
        assert chain.resumes_completed == 2, chain.violations
        b = load(chain.out)
        assert [s.run_id for s in a.plan] == [s.run_id for s in b.plan]
        assert {r.run_id for r in a.runs} == {r.run_id for r in b.runs}
        b_runs = {r.run_id: r for r in b.runs}
        for r in a.runs:
            other = b_runs[r.run_id]
            assert r.loss == other.loss and len(r.loss) == 6, r.run_id  # bit for bit, per seed
            assert r.weights_sha256 == other.weights_sha256
            assert [e.value for e in r.evals] == [e.value for e in other.evals]
        rb = json.loads((chain.out / "report.json").read_text())
        differing = _differing_fields(ra, rb)
        unexplained = {p for p in differing if not _listed(p)}
        assert unexplained == set(), f"report.json fields that differ between identical runs: {sorted(unexplained)}"
        assert ra["certificate"] == rb["certificate"] and ra["runs"] and ra["table"]
