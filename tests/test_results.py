"""Atomic writes, what counts as a trustworthy result, loading into pandas; the
fields a backend's outcome gives its result."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from ampcert import mllog
from ampcert.backends import loop
from ampcert.backends.contract import PhaseTimes, TrainOutcome
from ampcert.backends.training_loop import Tally
from ampcert.errors import UserError
from ampcert.mllog import reader as mllog_reader
from ampcert.results import (
    EvalPoint,
    Measured,
    ResultsDir,
    RunResult,
    TrainedFields,
    atomic_write_json,
    atomic_write_text,
    load,
)
from ampcert.spec import expand, parse_suite
from ampcert.workloads import registry

GOLDEN_RUNS = Path(__file__).resolve().parent / "data" / "golden" / "folder" / "runs"


def _spec():
    suite = parse_suite({"name": "t", "train": {"steps": 10}, "precisions": ["fp32"],
                         "workloads": [{"workload": "digits"}]})
    return expand(suite, "cpu")[0]


def test_atomic_write_leaves_old_content_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "result.json"
    atomic_write_text(target, "old")

    def boom(src, dst):
        raise OSError("disk vanished mid-rename")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_text(target, "new" * 1000)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temp file left behind


def test_atomic_write_json_roundtrip_and_permissions(tmp_path):
    target = tmp_path / "a" / "b.json"
    atomic_write_json(target, {"x": 1})
    assert json.loads(target.read_text()) == {"x": 1}
    assert oct(target.stat().st_mode & 0o777) != oct(0o600)


def test_read_result_trusts_only_valid_results_for_that_run(tmp_path):
    spec = _spec()
    rd = ResultsDir(tmp_path)
    assert rd.read_result(spec.run_id) is None
    good = RunResult(run_id=spec.run_id, spec=spec, status="completed", steps=10)
    atomic_write_json(rd.result_file(spec.run_id), good)
    assert rd.read_result(spec.run_id) == good

    text = rd.result_file(spec.run_id).read_text()
    rd.result_file(spec.run_id).write_text(text[: len(text) // 2])  # truncated
    assert rd.read_result(spec.run_id) is None
    rd.result_file(spec.run_id).write_text('{"hello": "world"}')  # foreign JSON
    assert rd.read_result(spec.run_id) is None
    other = good.model_copy(update={"run_id": "someone-else"})
    rd.result_file(spec.run_id).write_text(other.model_dump_json())  # another run's result
    assert rd.read_result(spec.run_id) is None


def test_load_gives_runs_missing_and_frame(tmp_path):
    spec = _spec()
    rd = ResultsDir(tmp_path)
    atomic_write_json(rd.plan_file, {"suite": "t", "runs": [spec.model_dump(mode="json")]})
    rs = load(tmp_path)
    assert rs.missing == [spec.run_id] and rs.runs == []
    atomic_write_json(rd.result_file(spec.run_id),
                      RunResult(run_id=spec.run_id, spec=spec, status="completed", final_metric=0.5))
    rs = load(tmp_path)
    df = rs.frame()
    assert list(df.run_id) == [spec.run_id] and df.final_metric.iloc[0] == 0.5
    assert df.precision.iloc[0] == "fp32"


def test_load_rejects_non_results_folders(tmp_path):
    with pytest.raises(UserError, match="results folder not found"):
        load(tmp_path / "nope")
    with pytest.raises(UserError, match="no plan.json"):
        load(tmp_path)
    (tmp_path / "plan.json").write_text("{not json")
    with pytest.raises(UserError, match="unreadable plan"):
        load(tmp_path)


def test_mllog_roundtrip_and_non_finite_values(tmp_path):
    path = tmp_path / "run.mllog"
    log = mllog.MLLogger.open(path, namespace="r1")
    log.start(mllog.RUN_START)
    log.event(mllog.EVAL_ACCURACY, 0.97, {"step": 10})
    log.event(mllog.LOSS_SCALE, float("inf"))
    log.end(mllog.RUN_STOP, metadata={"status": "success"})
    log.close()
    events = list(mllog_reader.read(path))
    assert [e.key for e in events] == ["run_start", "eval_accuracy", "loss_scale", "run_stop"]
    assert events[0].event_type == mllog.INTERVAL_START and events[-1].event_type == mllog.INTERVAL_END
    assert events[1].value == 0.97 and events[1].metadata == {"step": 10}
    assert events[2].value == "inf"
    assert all(line.startswith(":::MLLOG {") for line in path.read_text().splitlines())
    with path.open("a") as fh:
        fh.write(':::MLLOG {"key": broken\n')
    with pytest.raises(mllog_reader.LogError, match=r"run.mllog line 5: MLLOG event is not valid JSON"):
        list(mllog_reader.read(path))


def test_stored_results_read_back_to_the_same_bytes():
    """result.json's key order is RunResult's field order: a stored result,
    read and written again, gives its bytes back."""
    stored = sorted(GOLDEN_RUNS.glob("*/result.json"))
    assert len(stored) == 8
    for path in stored:
        text = path.read_text(encoding="utf-8")
        assert RunResult.model_validate_json(text).model_dump_json(indent=1) + "\n" == text, path.parent.name


def test_a_result_is_its_record_then_the_trained_fields_an_outcome_is():
    trained = list(TrainedFields.model_fields)
    record = ["schema_version", "run_id", "spec", "status", "reason", "failure", "started_at", "finished_at",
              "wall_s", "phases"]
    assert list(RunResult.model_fields) == record + trained
    assert list(TrainOutcome.model_fields) == [*trained, "phases", "telemetry_series"]
    assert trained[:2] == ["steps", "train_samples"] and trained[-1] == "environment"


def _outcome(spec, **changes):
    tallies = dict(
        steps=4, losses=[2.0, math.nan, 1.5, math.inf],
        evals=[EvalPoint(step=2, samples=128, train_time_s=1.0, value=0.5),
               EvalPoint(step=4, samples=256, train_time_s=2.0, value=0.75)],
        reached=None, scaling=loop.NoLossScaling(), build_s=1.0, train_s=2.0, eval_s=0.5, data_s=0.5,
        durations=[0.5, 0.5, 0.5, 0.5], timing="perf_counter around each step", flops_per_step=1e6,
        peak=Measured(value=1e9, unit="FLOP/s", method="given"), telemetry={"notes": []}, series=None,
        amp_policy={"name": "none (fp32)"}, determinism={"seed": 0}, environment={"data": "digits"},
        peak_memory=Measured(value=1.0, unit="bytes", method="test"), weights_sha256="0" * 64,
        data_info={}, lowest_precision=None)
    return Tally(batch_size=64, **{**tallies, **changes}).outcome(spec, registry.get("digits"))


def test_the_outcome_builder_derives_the_fields_alike_for_both_backends():
    spec = _spec()
    out = _outcome(spec)
    assert (out.steps, out.train_samples, out.metric, out.final_metric) == (4, 256, "accuracy", 0.75)
    assert out.loss == [2.0, None, 1.5, None] and out.data_info is None
    assert out.target_reached is None and out.steps_to_target is None  # no target
    assert out.samples_per_s == 128.0 and out.achieved_flops == 2e6 and out.mfu == 2e6 / 1e9
    assert out.data_share == 0.25 and out.step_time.n == 4 and out.step_times_ms == [500.0] * 4
    assert out.loss_scale is None and out.skipped_steps is None
    assert (out.accelerated, out.capability_note) == (spec.accelerated, spec.capability_note)
    assert out.phases == PhaseTimes(build_s=1.0, train_s=2.0, eval_s=0.5)
    # JAX: the first step, traced and compiled, timed apart (its batch's data time is in data_s).
    jax = _outcome(spec, compile_s=1.5, durations=[0.5, 0.5, 1.0])
    assert jax.phases == PhaseTimes(build_s=2.5, train_s=2.0, eval_s=0.5)
    assert jax.samples_per_s == 96.0 and jax.achieved_flops == 1.5e6 and jax.data_share == 0.5 / 3.5
    # The worker's result holds every trained field as the outcome gave it.
    result = RunResult(run_id=spec.run_id, spec=spec, status="completed", **out.trained_fields())
    assert result.trained_fields() == out.trained_fields()
