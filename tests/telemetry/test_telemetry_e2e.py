"""Telemetry through the real CLI: one tiny CPU run's result.json and series."""

from __future__ import annotations

import json

import pandas as pd
from conftest import run_cli

from ampcert.mllog import reader as mllog_reader
from ampcert.results import ResultsDir, load
from ampcert.spec import expand, parse_suite

SUITE = """
name: telemetry
device: cpu
precisions: [fp32]
seeds: [0]
train: {steps: 20, eval_every: 10}
timeout_s: 300
telemetry: {rate_hz: 20}
workloads:
  - workload: resnet
    params: {size: tiny}
"""


def test_sampling_rate_is_not_part_of_the_run_id():
    import yaml

    data = yaml.safe_load(SUITE)
    fast = expand(parse_suite(data), "cpu")
    data.pop("telemetry")
    default = expand(parse_suite(data), "cpu")
    assert [r.run_id for r in fast] == [r.run_id for r in default]
    assert fast[0].telemetry_rate_hz == 20 and default[0].telemetry_rate_hz == 10


def test_a_cpu_run_reports_host_telemetry_and_why_gpu_telemetry_is_missing(tmp_path, write_suite):
    out = tmp_path / "out"
    proc = run_cli("run", write_suite(SUITE), "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (r,) = load(out).runs
    assert r.status == "completed" and r.peak_memory.value > 0  # the existing field still works
    tel = r.telemetry
    assert tel["device"] == "cpu" and tel["sampling"]["requested_hz"] == 20
    assert tel["sampling"]["samples"] > 0 and tel["train_samples"] == r.train_samples
    # Host memory, always.
    assert tel["peak_memory"]["host.rss_bytes"]["value"] > 0
    assert tel["peak_memory"]["host.ru_maxrss"]["value"] > 0
    # RAPL energy where readable, else null with the reason (never zero).
    energy = tel["energy"]
    if tel["host_energy"]["available"]:
        assert energy["train_j"] > 0 and energy["train_j_per_sample"] > 0 and "RAPL" in energy["method"]
    else:
        assert energy["train_j"] is None and energy["train_j_per_sample"] is None
        assert tel["host_energy"]["reason"] and energy["reason"]
    # A plain statement that GPU telemetry is unavailable, and why.
    assert tel["gpu"]["available"] is False
    assert tel["gpu"]["statement"].startswith("GPU telemetry unavailable: the run uses the CPU")
    # The series beside result.json, readable by pandas, phases tagged.
    rd = ResultsDir(out)
    assert tel["series_file"] == "telemetry.csv"
    df = pd.read_csv(rd.telemetry_file(r.run_id))
    assert {"init", "train", "eval"} <= set(df.phase) and "host.rss_bytes" in df.columns
    assert tel["phases_s"]["train"] > 0 and tel["phases_s"]["eval"] > 0
    # MLLOG carries energy_j (null with the reason where unmeasured) before run_stop.
    keys = [e.key for e in mllog_reader.read(rd.mllog_file(r.run_id))]
    assert keys[-2:] == ["energy_j", "run_stop"]
    summary = json.loads((out / "summary.json").read_text())
    assert "energy_j_per_sample" in summary["runs"][0] and "J/sample" in (out / "summary.html").read_text()
