"""Gate settings files (`ampcert compare --gate FILE`) and the run grouping, without runs.

Everything a gate file can set is validated when it is loaded: a value the
comparison cannot use, or a field the loader computes, is one `ampcert: error:`
line and exit 2, before any comparison (the sources here hold no runs: a gate
file that loaded would fail later, on "no run results to compare").
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import assert_one_line_error, run_cli

from ampcert import gate
from ampcert.configio import parse_model
from ampcert.errors import UserError
from ampcert.vocabulary import Subject


@pytest.fixture
def empty_report(tmp_path) -> Path:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"suite": {"name": "s"}, "runs": []}))
    return path


BAD_GATE_FILES = {
    # computed by the loader (which files, their digest): a file must not set them
    "sha256": ("sha256: 0000000000000000\n", ["sha256", "unknown field"]),
    "source": ("source: configs/gate.yaml\n", ["source", "unknown field"]),
    # numpy takes no negative seed: this crashed the comparison with a traceback
    "negative seed": ("seed: -1\n", ["seed", "greater than or equal to 0"]),
    # the format's version: there is one
    "version": ("version: 2\n", ["version", "got 2"]),
    # a threshold per workload is a threshold: > 0 and finite like the metric's own
    "negative per-workload threshold": ("metrics:\n  samples_per_s: {per_workload: {digits: -0.1}}\n",
                                        ["metrics.samples_per_s.per_workload.digits", "greater than 0"]),
    "zero per-workload threshold": ("metrics:\n  final_metric: {per_workload: {gpt: 0}}\n",
                                    ["metrics.final_metric.per_workload.gpt", "greater than 0"]),
    "NaN per-workload threshold": ("metrics:\n  final_metric: {per_workload: {gpt: .nan}}\n",
                                   ["metrics.final_metric.per_workload.gpt"]),
    "infinite threshold": ("metrics:\n  samples_per_s: {threshold: .inf}\n",
                           ["metrics.samples_per_s.threshold", "expected a finite threshold"]),
    # only the final metric's better direction is the workload's (accuracy up, bits per byte down)
    "workload direction of a speed metric": ("metrics:\n  samples_per_s: {direction: workload}\n",
                                             ["metrics", "samples_per_s.direction", "'higher' or 'lower'"]),
    "workload direction of memory": ("metrics:\n  peak_memory_bytes: {direction: workload}\n",
                                     ["peak_memory_bytes.direction"]),
}


@pytest.mark.parametrize("name", list(BAD_GATE_FILES))
def test_bad_gate_file_is_one_line_exit_2(name, empty_report, tmp_path):
    text, fragments = BAD_GATE_FILES[name]
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    proc = run_cli("compare", "--gate", bad, empty_report, empty_report)
    assert_one_line_error(proc, str(bad), *fragments)


def test_a_gate_file_that_loads_reaches_the_comparison(empty_report, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("seed: 7\nmetrics:\n  final_metric: {direction: higher, per_workload: {gpt: 0.1}}\n")
    assert_one_line_error(run_cli("compare", "--gate", good, empty_report, empty_report),
                          "no run results to compare")


def test_provenance_is_computed_not_read():
    cfg = gate.load_gate()
    assert cfg.source == "ampcert:configs/gate.yaml" and len(cfg.sha256) == 64  # by package path, not install path
    assert "source" not in cfg.model_dump() and "sha256" not in cfg.model_dump()
    with pytest.raises(AttributeError):
        cfg.sha256 = "x"  # a property: only load_gate sets it
    data = cfg.model_dump() | {"sha256": "x"}
    with pytest.raises(UserError, match="sha256: unknown field"):
        parse_model(gate.GateConfig, data, "here")


def test_the_shipped_gate_and_an_overlay_load(tmp_path):
    loose = tmp_path / "loose.yaml"
    loose.write_text("metrics:\n  final_metric: {per_workload: {digits: 0.5}}\n")
    cfg = gate.load_gate(loose)
    assert cfg.metrics["final_metric"].per_workload == {"gpt": 0.05, "digits": 0.5}
    assert cfg.source == f"ampcert:configs/gate.yaml + {loose}" and cfg.name == "default + loose.yaml"
    assert cfg.sha256 != gate.load_gate().sha256


def _run(label="w", precision="fp32", amp="native", seed=0, repeat=0, status="completed", run_id=None):
    spec = SimpleNamespace(label=label, backend="torch", amp=amp, precision=precision, seed=seed, repeat=repeat)
    return SimpleNamespace(spec=spec, status=status, run_id=run_id or f"{label}-{precision}-s{seed}-r{repeat}")


def test_group_runs_leaves_out_repeats_and_skipped_runs_and_orders_by_seed():
    runs = [_run(seed=2), _run(seed=0), _run(seed=0, repeat=1), _run(seed=1, status="skipped"),
            _run(seed=1, status="failed"), _run(precision="bf16", seed=3), _run(precision="bf16", seed=0, repeat=None)]
    groups = gate.group_runs(runs)
    fp32, bf16 = Subject("w", "torch", "native", "fp32"), Subject("w", "torch", "native", "bf16")
    assert set(groups) == {fp32, bf16}
    assert [r.spec.seed for r in groups[fp32]] == [0, 1, 2]
    assert [r.spec.seed for r in groups[bf16]] == [0, 3]
    assert gate.subject_key(runs[0]) == fp32


def test_subjects_match_across_one_amp_change():
    def s(workload: str, amp: str, precision: str) -> Subject:
        return Subject(workload, "torch", amp, precision)

    pairs, only_b, only_c, notes = gate.match_subjects(
        [s("w", "native", "fp32"), s("w", "native", "bf16"), s("x", "native", "fp32")],
        [s("w", "native", "fp32"), s("w", "ampcert", "bf16")])
    assert pairs == [(s("w", "native", "bf16"), s("w", "ampcert", "bf16")),
                     (s("w", "native", "fp32"), s("w", "native", "fp32"))]
    assert only_b == [s("x", "native", "fp32")] and only_c == []
    assert notes == ["w/torch/bf16: AMP implementation changed from native to ampcert; compared"]
