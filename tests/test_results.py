"""Atomic writes, what counts as a trustworthy result, loading into pandas."""

from __future__ import annotations

import json
import os

import pytest

from ampcert import mllog
from ampcert.errors import UserError
from ampcert.results import ResultsDir, RunResult, atomic_write_json, atomic_write_text, load
from ampcert.spec import expand, parse_suite


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
    events = list(mllog.read(path))
    assert [e.key for e in events] == ["run_start", "eval_accuracy", "loss_scale", "run_stop"]
    assert events[0].event_type == mllog.INTERVAL_START and events[-1].event_type == mllog.INTERVAL_END
    assert events[1].value == 0.97 and events[1].metadata == {"step": 10}
    assert events[2].value == "inf"
    assert all(line.startswith(":::MLLOG {") for line in path.read_text().splitlines())
    with path.open("a") as fh:
        fh.write(':::MLLOG {"key": broken\n')
    with pytest.raises(ValueError, match=r"run.mllog:5: malformed MLLOG event"):
        list(mllog.read(path))
