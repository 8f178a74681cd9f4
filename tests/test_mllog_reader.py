"""ampcert.mllog.reader on real logs: mlperf_logging's, ampcert's own, and what launchers make of them."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import pickle
from pathlib import Path

import pytest

from ampcert import mllog
from ampcert.errors import UserError
from ampcert.mllog.reader import (
    MAX_LINE,
    MAX_POINT_KEYS,
    Eval,
    LogError,
    LogEvent,
    TrainingLog,
    parse,
    read,
    read_text,
    read_training_log,
    scan,
    summarize,
)

GOLDEN_RUNS = Path(__file__).resolve().parent / "data" / "golden" / "folder" / "runs"
T0 = 1_700_000_000_000


def line(key: str, t: float, event_type: str = mllog.POINT_IN_TIME, value=None, metadata=None,
         namespace: str = "") -> str:
    """One event as mllog writes it (its field order)."""
    return mllog.PREFIX + json.dumps({"namespace": namespace, "time_ms": t, "event_type": event_type,
                                      "key": key, "value": value, "metadata": metadata or {}})


def start(key: str, t: float, **meta) -> str:
    return line(key, t, mllog.INTERVAL_START, metadata=meta)


def end(key: str, t: float, **meta) -> str:
    return line(key, t, mllog.INTERVAL_END, metadata=meta)


def acc(t: float, value, **meta) -> str:
    return line(mllog.EVAL_ACCURACY, t, value=value, metadata=meta)


def run_lines(*middle: str, status: str = "success") -> list[str]:
    """A whole small run: run_start at T0, ``middle``, run_stop at T0 + 10 s."""
    return [start(mllog.RUN_START, T0), *middle, end(mllog.RUN_STOP, T0 + 10_000, status=status)]


def failure(lines: list[str], source: str = "run.mllog") -> LogError:
    with pytest.raises(LogError) as info:
        summarize(parse(lines, source), source)
    return info.value


# --------------------------------------------------------------------------- real writers


@pytest.fixture
def official_mllog(tmp_path):
    """mlperf_logging's shared logger writing to a file in tmp_path (its state restored after)."""
    from mlperf_logging import mllog as official

    path = tmp_path / "theirs.mllog"
    shared = official.get_mllogger()
    saved = shared.logger, shared.default_namespace
    logger = logging.getLogger("ampcert-test-mllog-reader")
    logger.propagate, logger.handlers = False, []
    logger.setLevel(logging.INFO)
    official.config(logger=logger, filename=str(path), default_namespace="")  # whatever a test before set
    try:
        yield shared, path
    finally:
        for handler in logger.handlers:
            handler.close()
        logger.handlers = []
        shared.logger, shared.default_namespace = saved


def test_reads_back_exactly_what_mlperf_logging_writes(official_mllog):
    from mlperf_logging.mllog import constants

    logger, path = official_mllog
    logger.start(constants.INIT_START, time_ms=T0)
    logger.event(constants.SEED, 1234, time_ms=T0 + 1)
    logger.event(constants.GLOBAL_BATCH_SIZE, 256, time_ms=T0 + 2)
    logger.event(constants.SUBMISSION_ORG, "mlcommons", time_ms=T0 + 3)
    logger.end(constants.INIT_STOP, time_ms=T0 + 5)
    logger.start(constants.RUN_START, time_ms=T0 + 10)
    logger.end(constants.BLOCK_STOP, metadata={"first_epoch_num": 1, "samples_count": 2048}, time_ms=T0 + 500)
    logger.event(constants.EVAL_ACCURACY, 0.5, metadata={"epoch_num": 1, "samples_count": 2048}, time_ms=T0 + 600)
    logger.event(constants.EVAL_ACCURACY, 0.76, metadata={"epoch_num": 2, "samples_count": 4096}, time_ms=T0 + 1200)
    logger.event(mllog.LOWEST_PRECISION_LINEAR, "fp8", metadata={"ops": ["mm"]}, time_ms=T0 + 1201)
    logger.end(constants.RUN_STOP, metadata={constants.STATUS: constants.SUCCESS}, time_ms=T0 + 1300)

    events = read(path)
    assert [(e.line, e.key, e.event_type, e.time_ms, e.value) for e in events] == [
        (1, "init_start", "INTERVAL_START", T0, None), (2, "seed", "POINT_IN_TIME", T0 + 1, 1234),
        (3, "global_batch_size", "POINT_IN_TIME", T0 + 2, 256),
        (4, "submission_org", "POINT_IN_TIME", T0 + 3, "mlcommons"), (5, "init_stop", "INTERVAL_END", T0 + 5, None),
        (6, "run_start", "INTERVAL_START", T0 + 10, None), (7, "block_stop", "INTERVAL_END", T0 + 500, None),
        (8, "eval_accuracy", "POINT_IN_TIME", T0 + 600, 0.5), (9, "eval_accuracy", "POINT_IN_TIME", T0 + 1200, 0.76),
        (10, "lowest_numerical_precision_in_linear", "POINT_IN_TIME", T0 + 1201, "fp8"),
        (11, "run_stop", "INTERVAL_END", T0 + 1300, None),
    ]
    # mllog notes its caller in every event's metadata: this file.
    assert {e.namespace for e in events} == {""}
    assert all(e.metadata["file"] == __file__ and isinstance(e.metadata["lineno"], int) for e in events)
    assert events[7].metadata["epoch_num"] == 1 and events[7].metadata["samples_count"] == 2048

    log = summarize(events, str(path))
    assert (log.run_start_ms, log.run_stop_ms, log.status) == (T0 + 10, T0 + 1300, "success")
    assert (log.init_start_ms, log.init_stop_ms, log.run_start_line, log.run_stop_line) == (T0, T0 + 5, 6, 11)
    assert log.evals == (Eval(T0 + 600, 0.5, 2048, 1.0, 8), Eval(T0 + 1200, 0.76, 4096, 2.0, 9))
    assert (log.samples, log.seed, log.global_batch_size) == (4096, 1234, 256)
    assert log.submission == {"org": "mlcommons"}
    # the precision's metadata without mllog's caller fields
    assert log.lowest_precision == {"linear": "fp8"} and log.lowest_precision_detail == {"linear": {"ops": ["mm"]}}
    assert log.duration_s == pytest.approx(1.29)
    assert log.first_reaching(0.75, higher_is_better=True) == log.evals[1]
    assert log.seconds_at(log.evals[1]) == pytest.approx(1.19)
    assert read_training_log(path) == log


def test_reads_what_ampcert_mllogger_writes(tmp_path):
    path = tmp_path / "runs" / "r1" / "run.mllog"
    log = mllog.MLLogger.open(path, namespace="r1")
    log.event(mllog.CACHE_CLEAR, True, {"scope": "fresh worker"})
    log.start(mllog.INIT_START)
    for key, value in [(mllog.SUBMISSION_BENCHMARK, "gpt"), (mllog.SUBMISSION_ORG, "acme"),
                       (mllog.SUBMISSION_PLATFORM, "8xH100"), (mllog.SUBMISSION_DIVISION, "open"),
                       (mllog.SUBMISSION_STATUS, "research"), (mllog.SEED, 7), (mllog.GLOBAL_BATCH_SIZE, 32),
                       (mllog.TRAIN_SAMPLES, 1438), (mllog.EVAL_SAMPLES, 359), ("max_steps", 40)]:
        log.event(key, value)
    log.end(mllog.INIT_STOP)
    log.start(mllog.RUN_START)
    log.start(mllog.BLOCK_START, metadata={"first_step": 1, "samples_count": 0, "first_epoch_num": 0, "epoch_count": 1})
    for part, key in [("linear", mllog.LOWEST_PRECISION_LINEAR), ("attn", mllog.LOWEST_PRECISION_ATTN),
                      ("comm", mllog.LOWEST_PRECISION_COMM)]:
        log.event(key, "bfloat16" if part != "comm" else "fp32", {"observed": True, "part": part})
    log.end(mllog.BLOCK_STOP, metadata={"first_step": 1, "samples_count": 640, "first_epoch_num": 0, "epoch_count": 1})
    meta = {"step": 20, "samples_count": 640, "epoch_num": 0, "samples": 640}
    log.event("eval_bits_per_byte", 2.5, meta)
    log.event(mllog.EVAL_ACCURACY, 2.5, {**meta, "metric": "bits_per_byte"})
    log.event(mllog.EVAL_ACCURACY, 1.9, {**meta, "samples_count": 1280, "metric": "bits_per_byte"})
    log.event(mllog.LOSS_SCALE, 65536.0, {"step": 10})
    log.event(mllog.LOSS_SCALE, 32768.0, {"step": 20})
    log.end(mllog.RUN_STOP, metadata={"status": "aborted", "reason": "loss became NaN at step 21"})
    log.close()

    got = read_training_log(path)
    assert got.status == "aborted" and got.run_stop_metadata["reason"] == "loss became NaN at step 21"
    assert {e.namespace for e in read(path)} == {"r1"} and got.event_count == 25
    assert got.run_start_line == 14 and got.run_stop_line == 25
    assert got.init_start_ms is not None and got.init_start_ms <= got.init_stop_ms <= got.run_start_ms
    assert got.submission == {"benchmark": "gpt", "org": "acme", "platform": "8xH100", "division": "open",
                              "status": "research"}
    assert (got.seed, got.global_batch_size, got.train_samples, got.eval_samples) == (7, 32, 1438, 359)
    assert got.lowest_precision == {"linear": "bfloat16", "attn": "bfloat16", "comm": "fp32"}
    assert got.lowest_precision_detail["attn"] == {"observed": True, "part": "attn"}
    assert [(e.value, e.samples_count, e.epoch_num, e.line, e.metric) for e in got.evals] == [
        (2.5, 640, 0.0, 21, "bits_per_byte"), (1.9, 1280, 0.0, 22, "bits_per_byte")]
    assert got.metric == "bits_per_byte" and got.samples == 1280
    assert got.first_reaching(2.0, higher_is_better=False) == got.evals[1]
    assert got.first_reaching(1.0, higher_is_better=False) is None
    # Every other point is there, the last value winning; the named fields are not repeated.
    assert got.points["loss_scale"] == 32768.0 and got.points["eval_bits_per_byte"] == 2.5
    assert got.points["cache_clear"] is True and got.points["max_steps"] == 40
    assert mllog.SEED not in got.points and mllog.EVAL_ACCURACY not in got.points


def test_a_nan_evaluation_as_ampcert_and_json_write_it_reads_as_nan_and_reaches_nothing(tmp_path):
    path = tmp_path / "run.mllog"
    log = mllog.MLLogger.open(path)
    log.start(mllog.RUN_START)
    log.event(mllog.EVAL_ACCURACY, float("nan"), {"samples_count": 64})  # ampcert writes "nan"
    log.end(mllog.RUN_STOP, metadata={"status": "success"})
    log.close()
    assert '"value": "nan"' in path.read_text()
    (ev,) = read_training_log(path).evals
    assert math.isnan(ev.value)
    # Python's json (so mlperf_logging) writes a bare NaN / -Infinity.
    got = summarize(parse(run_lines(acc(T0 + 1, math.nan), acc(T0 + 2, -math.inf)), "x"), "x")
    assert math.isnan(got.evals[0].value) and got.evals[1].value == -math.inf
    assert got.first_reaching(0.0, higher_is_better=True) is None


@pytest.mark.parametrize("run", sorted(p.name for p in GOLDEN_RUNS.iterdir()))
def test_the_stored_golden_runs_logs_say_what_their_results_say(run):
    """Real run.mllog files, written by ampcert's training loop, against the result.json beside them."""
    result = json.loads((GOLDEN_RUNS / run / "result.json").read_text())
    got = read_training_log(GOLDEN_RUNS / run / "run.mllog")
    assert got.status == "success" and result["status"] == "completed"
    assert {e.namespace for e in read(GOLDEN_RUNS / run / "run.mllog")} == {result["run_id"]}
    assert [e.value for e in got.evals] == [e["value"] for e in result["evals"]]
    assert [e.samples_count for e in got.evals] == [e["samples"] for e in result["evals"]]
    assert got.samples == result["train_samples"]
    assert got.seed == result["determinism"]["seed"]
    lowest = result["lowest_precision"]
    assert got.lowest_precision == {p: lowest[p] for p in ("linear", "attn", "comm")}
    assert got.lowest_precision_detail == lowest["detail"]
    assert 0 < got.duration_s < result["wall_s"]


# --------------------------------------------------------------------------- what is skipped


def test_rank_prefixes_and_noise_lines_are_skipped_and_lines_keep_their_numbers(tmp_path):
    text = "\n".join([
        "WARNING: framework says hello",                                   # 1
        "0: " + start(mllog.RUN_START, T0),                                 # 2
        "",                                                                 # 3
        "[1,0]<stdout>:" + line(mllog.SEED, T0 + 1, value=3),              # 4  mpirun --tag-output
        "Epoch 1:  50%|#####     | 5/10 [00:01<00:01]\r"
        + acc(T0 + 2, 0.4, samples_count=64, epoch_num=1),                 # 5  the remains of a progress bar
        "2024-05-01 12:00:00,123 INFO " + acc(T0 + 3, 0.8, samples_count=128, epoch_num=2),  # 6
        "a line that mentions MLLOG and :::MLL without the marker",         # 7
        "  1: [rank1] a byte that is not UTF-8: \udcff",                   # 8
        "0: " + end(mllog.RUN_STOP, T0 + 9, status="success") + "\r",       # 9  CRLF
        "Traceback-free shutdown",                                          # 10
    ]) + "\n"
    path = tmp_path / "job.log"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))  # one byte that is not UTF-8, in noise
    events = read(path)
    assert [(e.line, e.key) for e in events] == [(2, "run_start"), (4, "seed"), (5, "eval_accuracy"),
                                                (6, "eval_accuracy"), (9, "run_stop")]
    got = summarize(events, str(path))
    assert [(e.value, e.samples_count, e.epoch_num, e.line) for e in got.evals] == [(0.4, 64, 1.0, 5), (0.8, 128, 2.0, 6)]
    assert got.seed == 3 and got.samples == 128 and got.status == "success"
    assert read_text(text.replace("\udcff", "?"), str(path)) == events


def test_parse_takes_lines_not_a_text():
    with pytest.raises(TypeError, match="read_text"):
        parse(start(mllog.RUN_START, T0), "x")


# --------------------------------------------------------------------------- what is strict: events


@pytest.mark.parametrize("bad, message", [
    ('{"namespace": "", "time_ms": 5, "event_type": "POINT_IN',
     "MLLOG event is not valid JSON (the line is cut short: a truncated log?): Unterminated string starting at (column 59)"),
    ('{"namespace": "", "time_ms": 1700000000005, "event_type": "POINT_IN_TIME", "key": "eval_ac',
     "MLLOG event is not valid JSON (the line is cut short: a truncated log?)"),
    ('{"namespace": "", "time_ms": 17000000',
     "MLLOG event is not valid JSON (the line is cut short: a truncated log?): Expecting ',' delimiter (column 50)"),
    ('{"time_ms": 5, key: 1}', "MLLOG event is not valid JSON: Expecting property name enclosed in double quotes (column 28)"),
    ('{"time_ms": 5, "key": "k", "event_type": "POINT_IN_TIME"} trailing', "MLLOG event is not valid JSON: Extra data"),
    ("[1, 2]", "MLLOG event is a JSON list, not an object"),
    ('{"key": "k", "event_type": "POINT_IN_TIME"}', "MLLOG event has no time_ms"),
    ('{"time_ms": 5, "event_type": "POINT_IN_TIME"}', "MLLOG event has no key"),
    ('{"time_ms": 5, "key": "k"}', "MLLOG event has no event_type"),
    ('{"time_ms": 5, "key": 3, "event_type": "POINT_IN_TIME"}', "MLLOG event key 3 is not a name"),
    ('{"time_ms": 5, "key": "k", "event_type": "INSTANT"}',
     "k: unknown event_type 'INSTANT' (expected INTERVAL_START, INTERVAL_END, POINT_IN_TIME)"),
    ('{"time_ms": "5", "key": "k", "event_type": "POINT_IN_TIME"}', "k: time_ms '5' is not a finite number"),
    ('{"time_ms": NaN, "key": "k", "event_type": "POINT_IN_TIME"}', "k: time_ms nan is not a finite number"),
    ('{"time_ms": true, "key": "k", "event_type": "POINT_IN_TIME"}', "k: time_ms True is not a finite number"),
    ('{"time_ms": 5, "key": "k", "event_type": "POINT_IN_TIME", "metadata": [1]}', "k: metadata [1] is not an object"),
    ('{"time_ms": 5, "key": "k", "event_type": "POINT_IN_TIME", "namespace": 0}', "k: namespace 0 is not a string"),
])
def test_an_event_that_is_not_whole_names_its_line(bad, message):
    lines = ["noise", "0: " + start(mllog.RUN_START, 1), "more noise", "0: " + mllog.PREFIX + bad]
    with pytest.raises(LogError) as info:
        parse(lines, "run.mllog")
    assert str(info.value).startswith("run.mllog line 4: " + message), str(info.value)
    assert info.value.line == 4 and info.value.source == "run.mllog"


def test_a_truncated_last_line_of_a_file_names_its_line(tmp_path):
    path = tmp_path / "run.mllog"
    whole = "\n".join(run_lines(acc(T0 + 1, 0.5, samples_count=8)))
    path.write_text(whole[: whole.rindex('"status"') + 4])  # the crash cut run_stop mid-key
    with pytest.raises(LogError) as info:
        read(path)
    assert str(info.value).startswith(f"{path} line 3: MLLOG event is not valid JSON (the line is cut short")


def test_timestamps_that_go_backwards_name_the_line():
    lines = run_lines(acc(T0 + 5000, 0.5), "noise", acc(T0 + 4999.5, 0.6))
    with pytest.raises(LogError) as info:
        parse(lines, "run.mllog")
    assert str(info.value) == ("run.mllog line 4: time_ms 1700000004999.5 is before the previous event's "
                               "1700000005000 (line 2): timestamps go backwards")
    # equal times are no step back
    assert len(parse(run_lines(acc(T0, 0.5), acc(T0, 0.6)), "x")) == 4


@pytest.mark.parametrize("make", [lambda p: p, lambda p: p.parent])
def test_a_file_that_cannot_be_read_is_one_line(tmp_path, make):
    path = make(tmp_path / "missing.mllog")
    with pytest.raises(LogError) as info:
        read(path)
    reason = "No such file or directory" if path.name == "missing.mllog" else "not a regular file"
    assert str(info.value) == f"cannot read {path}: {reason}"
    with pytest.raises(LogError, match="cannot read"):
        read_training_log(path)


# --------------------------------------------------------------------------- what is strict: the run


@pytest.mark.parametrize("lines, message", [
    ([start(mllog.RUN_START, T0), acc(T0 + 1, 0.5, samples_count=8), "Killed"],
     "run.mllog: no run_stop: the job never logged its end (truncated log?); the last event is eval_accuracy at line 2"),
    ([line(mllog.SEED, T0, value=1), end(mllog.RUN_STOP, T0 + 1, status="success")],
     "run.mllog line 2: run_stop before any run_start"),
    ([line(mllog.SEED, T0, value=1)], "run.mllog: no run_start: this log holds no training run"),
    (["just noise", "no events"], "run.mllog: no :::MLLOG events: not an MLLOG log, or an empty one"),
    (run_lines(start(mllog.RUN_START, T0 + 5)), "run.mllog line 2: a second run_start (the first is at line 1): two runs in one log?"),
    (run_lines() + [end(mllog.RUN_STOP, T0 + 20_000, status="success")],
     "run.mllog line 3: a second run_stop (the first is at line 2)"),
    ([end(mllog.INIT_STOP, T0), end(mllog.INIT_STOP, T0), *run_lines()],
     "run.mllog line 2: a second init_stop (the first is at line 1)"),
    ([start(mllog.RUN_START, T0), end(mllog.RUN_STOP, T0 + 1)],
     "run.mllog line 2: run_stop has no status in its metadata (expected success or aborted)"),
    (run_lines(status="done"), "run.mllog line 2: run_stop status 'done' is not success or aborted"),
    (run_lines(acc(T0 + 1, "abc", samples_count=8)), "run.mllog line 2: eval_accuracy value 'abc' is not a number"),
    (run_lines(acc(T0 + 1, True)), "run.mllog line 2: eval_accuracy value True is not a number"),
    (run_lines(acc(T0 + 1, None)), "run.mllog line 2: eval_accuracy value None is not a number"),
    (run_lines(acc(T0 + 1, 0.5, samples_count="64")),
     "run.mllog line 2: eval_accuracy samples_count '64' is not a whole number"),
    (run_lines(acc(T0 + 1, 0.5, samples_count=6.5)),
     "run.mllog line 2: eval_accuracy samples_count 6.5 is not a whole number"),
    (run_lines(end(mllog.BLOCK_STOP, T0 + 1, samples_count=-1)), "run.mllog line 2: block_stop samples_count -1 is below 0"),
    (run_lines(acc(T0 + 1, 0.5, epoch_num="one")), "run.mllog line 2: eval_accuracy epoch_num 'one' is not a number"),
    (run_lines(acc(T0 + 1, 0.5, metric=3)), "run.mllog line 2: eval_accuracy metric 3 is not a name"),
    ([acc(T0 - 1, 0.5), *run_lines()],
     "run.mllog line 1: eval_accuracy before run_start (line 2): an evaluation outside the run"),
    ([*run_lines(), acc(T0 + 20_000, 0.5)],
     "run.mllog line 3: eval_accuracy after run_stop (line 2): an evaluation outside the run"),
    ([line(mllog.SEED, T0 - 2, value=1), line(mllog.SEED, T0 - 1, value=2), *run_lines()],
     "run.mllog line 2: seed 2 differs from 1 logged at line 1"),
    (run_lines(line(mllog.SEED, T0 + 1, value="s")), "run.mllog line 2: seed 's' is not a whole number"),
    (run_lines(line(mllog.GLOBAL_BATCH_SIZE, T0 + 1, value=0)), "run.mllog line 2: global_batch_size 0 is below 1"),
    (run_lines(line(mllog.LOWEST_PRECISION_ATTN, T0 + 1, value=16)),
     "run.mllog line 2: lowest_numerical_precision_in_attn 16 is not a string"),
    (run_lines(line(mllog.SUBMISSION_DIVISION, T0 + 1, value=None)),
     "run.mllog line 2: submission_division None is not a string"),
])
def test_a_log_that_does_not_say_one_run_unambiguously_names_the_line(lines, message):
    assert str(failure(lines)) == message


def test_several_metrics_evaluated_together_are_read_each_as_its_own():
    """stable_diffusion logs CLIP and FID at each evaluation: the log was refused ("names
    metric 'FID', the evaluations before it 'CLIP'"), and MLPerf scores it."""
    log = summarize(parse(run_lines(acc(T0 + 1, 0.10, metric="CLIP", samples_count=8),
                                    acc(T0 + 1, 120.0, metric="FID", samples_count=8),
                                    acc(T0 + 2, 0.16, metric="CLIP", samples_count=16),
                                    acc(T0 + 2, 80.0, metric="FID", samples_count=16)), "run.mllog"), "run.mllog")
    assert log.metrics == ("CLIP", "FID") and log.metric is None
    assert [e.value for e in log.of("FID")] == [120.0, 80.0] and len(log.evals) == 4
    assert log.first_reaching(90.0, False, "FID").samples_count == 16
    assert log.first_reaching(0.15, True, "CLIP").samples_count == 16
    one = summarize(parse(run_lines(acc(T0 + 1, 0.5)), "run.mllog"), "run.mllog")
    assert one.metrics == (None,) and one.of("accuracy") == one.evals


def test_run_stop_before_run_start_in_time_names_run_stop():
    events = [LogEvent(1, T0, mllog.INTERVAL_START, mllog.RUN_START, None, {}),
              LogEvent(2, T0 - 1, mllog.INTERVAL_END, mllog.RUN_STOP, None, {"status": "success"})]
    with pytest.raises(LogError) as info:
        summarize(events, "built")
    assert str(info.value) == "built line 2: run_stop at time_ms 1699999999999 is before run_start's 1700000000000 (line 1)"


def test_what_is_not_ambiguous_is_read():
    got = summarize(parse([
        start(mllog.INIT_START, T0 - 9), start(mllog.INIT_START, T0 - 8),   # MLPerf allows several: the first
        line(mllog.SEED, T0 - 3, value=5), line(mllog.SEED, T0 - 2, value=5.0),  # the same seed twice
        line(mllog.GLOBAL_BATCH_SIZE, T0 - 1, value=1024.0),
        end(mllog.BLOCK_STOP, T0 - 1, samples_count=10**9),   # before run_start: not the run's samples
        *run_lines(acc(T0 + 1, 1, samples_count=None, epoch_num=0.5), end("epoch_stop", T0 + 2, samples_count=96)),
        end(mllog.BLOCK_STOP, T0 + 20_000, samples_count=10**9),  # after run_stop: neither
    ], "x"), "x")
    assert got.init_start_ms == T0 - 9 and got.init_stop_ms is None
    assert got.seed == 5 and got.global_batch_size == 1024 and isinstance(got.global_batch_size, int)
    assert got.evals == (Eval(T0 + 1, 1.0, None, 0.5, 8),) and got.metric is None
    assert got.samples == 96 and got.train_samples is None and got.submission == {}
    assert got.duration_s == 10.0 and got.succeeded
    assert isinstance(got, TrainingLog)


def test_log_error_is_a_one_line_user_error_that_pickles():
    err = LogError("dir/run\n.mllog", 12, "eval_accuracy value 'abc' is not a number")
    assert isinstance(err, UserError) and err.exit_code == 2
    assert str(err) == "dir/run\\n.mllog line 12: eval_accuracy value 'abc' is not a number"
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.source, back.line, back.detail) == (str(err), err.source, 12, err.detail)
    assert str(LogError("run.mllog", None, "no run_start")) == "run.mllog: no run_start"


# --------------------------------------------------------------------------- a log of any size


def test_a_file_is_summarized_in_one_pass_as_the_whole_list_of_its_events_is(tmp_path):
    lines = run_lines(start(mllog.EVAL_START, T0 + 1), acc(T0 + 2, 0.5, samples_count=8),
                      end(mllog.EVAL_STOP, T0 + 3), line("tracked_stats", T0 + 4, value=1.5))
    path = tmp_path / "run.mllog"
    path.write_text("\n".join(lines) + "\n")
    streamed, listed = read_training_log(path), summarize(parse(lines, str(path)), str(path))
    assert streamed == listed and streamed.event_count == 6
    assert streamed.eval_intervals == ((T0 + 1, T0 + 3),) and streamed.points == {"tracked_stats": 1.5}


def test_a_noise_line_longer_than_a_piece_is_skipped_and_the_lines_after_it_keep_their_numbers(tmp_path):
    path = tmp_path / "run.mllog"
    noise = "x" * (2 * MAX_LINE + 5)  # read in three pieces
    path.write_text("\n".join([start(mllog.RUN_START, T0), noise, acc(T0 + 1, 0.5),
                               end(mllog.RUN_STOP, T0 + 2, status="success")]) + "\n")
    (ev,) = read_training_log(path).evals
    assert ev.line == 3 and ev.value == 0.5


@pytest.mark.parametrize("at", [10, MAX_LINE - 4, MAX_LINE + 100])  # in the first piece, across two, in the second
def test_an_event_line_longer_than_a_piece_is_refused_naming_its_line(tmp_path, at):
    path = tmp_path / "run.mllog"
    long_line = "x" * at + mllog.PREFIX + "y" * (MAX_LINE + 200 - at)
    path.write_text("\n".join([start(mllog.RUN_START, T0), long_line, end(mllog.RUN_STOP, T0 + 2)]) + "\n")
    with pytest.raises(LogError) as info:
        read_training_log(path)
    assert info.value.line == 2 and "holds an MLLOG event" in info.value.detail


def test_a_scan_digests_every_byte_of_the_file_even_where_the_log_is_refused(tmp_path):
    path = tmp_path / "run.mllog"
    path.write_text("\n".join([start(mllog.RUN_START, T0), '0: :::MLLOG {"cut', "noise " * 1000]))
    got = scan(path)
    assert got.log is None and got.error is not None and got.error.line == 2
    assert (got.sha256, got.size) == (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_size)
    with pytest.raises(LogError):
        got.log_or_raise()


def test_points_keep_the_first_keys_only_however_many_a_log_invents():
    keys = [line(f"k{i}", T0 + 1, value=i) for i in range(MAX_POINT_KEYS + 5)]
    got = summarize(parse(run_lines(*keys, line("k0", T0 + 2, value="last")), "x"), "x")
    assert len(got.points) == MAX_POINT_KEYS and got.points["k0"] == "last" and f"k{MAX_POINT_KEYS}" not in got.points


def test_a_wrong_event_before_the_run_names_run_starts_line_found_after_it():
    lines = [acc(T0 - 1, 0.5), *run_lines()]
    assert str(failure(lines)) == ("run.mllog line 1: eval_accuracy before run_start (line 2): "
                                   "an evaluation outside the run")
    # a log without a run says so first, whatever else is wrong in it
    assert failure([acc(T0, "abc")]).detail == "no run_start: this log holds no training run"
