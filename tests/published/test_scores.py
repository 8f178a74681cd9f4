"""Published MLPerf Training results scored (ampcert/published/scores.py): MLPerf's own figure to
the last digit, against mlperf_logging's result summarizer run on the same folders, and what the
score leaves out. The folders are real v5.1 llama2_70b_lora results of three submitters, their
logs stripped to the MLLOG lines (tests/fixtures/mlperf/SOURCE.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ampcert.errors import UserError
from ampcert.published.scores import olympic_score, score_benchmark

ROUND = Path(__file__).resolve().parents[1] / "fixtures" / "mlperf" / "training_results_v5.1"
FOLDERS = sorted(ROUND.glob("*/results/*/llama2_70b_lora"))


def _summarizer(folder: Path) -> tuple[float | None, float]:
    from mlperf_logging.result_summarizer import result_summarizer

    score, _, factor = result_summarizer._compute_strong_score_standalone(
        "llama2_70b_lora", folder.parent.name, False, str(folder), "training", "5.1.0")
    return score, factor


def test_the_fixtures_are_three_submitters():
    assert [f.parts[-4] for f in FOLDERS] == ["AMD", "Cisco", "Dell"]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.parts[-4])
def test_the_score_is_mlperfs_to_the_last_digit(folder):
    official, factor = _summarizer(folder)
    ours = score_benchmark(folder)
    assert ours.score_minutes == official and ours.scaling_factor == factor
    assert ours.benchmark == "llama2_70b_lora" and len(ours.runs) == 10


def test_a_published_score_and_what_it_leaves_out():
    amd = score_benchmark(ROUND / "AMD" / "results" / "MI355X_EPYC_9575F_pytorch" / "llama2_70b_lora", accelerators=8)
    assert amd.score_minutes == 10.18474574915825  # as published for MI355X llama2_70b_lora v5.1
    assert amd.scaling_factor == pytest.approx(1.0033670033670032)
    low, high = amd.interval_minutes
    assert low < amd.score_minutes < high and high - low < 2
    assert amd.fastest_minutes < amd.score_minutes < amd.slowest_minutes and 0 < amd.cv < 0.2
    assert amd.accelerator_hours_per_run == amd.score_minutes * 8 / 60
    # llama2_70b_lora evaluates every 384 samples: the 10 runs stopped at two of those points
    assert "2 evaluation point(s): 3,072 samples (7 runs), 3,456 samples (3 runs)" in amd.discrete_note
    assert "not Gaussian" in amd.discrete_note


def test_a_log_without_run_stop_is_dropped_with_its_reason_as_mlperf_drops_it():
    dell = score_benchmark(ROUND / "Dell" / "results" / "1xXE9780x8B200-SXM-180GB" / "llama2_70b_lora")
    [dropped] = [r for r in dell.runs if r.dropped]
    assert dropped.file == "result_0.txt" and dropped.minutes is None and dropped.dropped.startswith("no run_stop")
    # one dropped run stands in for the slowest: only the fastest of the nine is left out
    counted = sorted(r.minutes for r in dell.runs if r.minutes is not None)
    assert dell.score_minutes == sum(counted[1:]) / 8 and dell.interval_minutes is not None


def test_the_olympic_rule():
    assert olympic_score([1.0, 2.0, 3.0, 10.0], 0, "bert") == (2.5, "")
    assert olympic_score([1.0, 2.0, 3.0], 1, "bert") == (2.5, "")  # the dropped run is the slowest
    assert olympic_score([1.0, 2.0, 3.0], 0, "bert", 2.0) == (4.0, "")
    score, why = olympic_score([1.0, 2.0, 3.0], 2, "bert")
    assert score is None and "2 runs dropped, more than the 1" in why
    assert olympic_score([float(m) for m in range(1, 41)], 4, "unet3d")[0] == sum(range(5, 41)) / 36
    assert olympic_score([5.0], 1, "bert")[0] is None


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "llama2_70b_lora"
    shutil.copytree(ROUND / "AMD" / "results" / "MI355X_EPYC_9575F_pytorch" / "llama2_70b_lora", folder)
    return folder


def test_an_aborted_run_is_dropped_with_its_status(tmp_path):
    folder = _copy(tmp_path)
    log = folder / "result_3.txt"
    log.write_text(log.read_text().replace('"status": "success"', '"status": "aborted"'))
    score = score_benchmark(folder)
    [dropped] = [r for r in score.runs if r.dropped]
    assert dropped.file == "result_3.txt" and dropped.dropped == "run_stop status aborted"
    assert score.score_minutes is not None


@pytest.mark.parametrize("scaling, message", [
    ('{"scaling_factor": "1.2"}', "scaling_factor '1.2' is not a positive number"),
    ('{"scaling_factor": 0}', "scaling_factor 0 is not a positive number"),
    ('{"factor": 1.2}', "no scaling_factor to read"),
    ("not json", "no scaling_factor to read"),
])
def test_a_bad_scaling_file_is_one_line(tmp_path, scaling, message):
    folder = _copy(tmp_path)
    (folder / "scaling.json").write_text(scaling)
    with pytest.raises(UserError, match=message) as caught:
        score_benchmark(folder)
    assert "\n" not in str(caught.value)


def test_a_folder_without_logs_is_not_a_benchmark(tmp_path):
    (tmp_path / "notes.txt").write_text(json.dumps({}))
    with pytest.raises(UserError, match="no result_\\*.txt logs: not an MLPerf benchmark folder"):
        score_benchmark(tmp_path)


def test_a_benchmark_evaluating_two_metrics_is_scored_as_mlperfs_summarizer_scores_it(tmp_path):
    """stable_diffusion logs CLIP and FID `eval_accuracy` at each evaluation; every such run was
    dropped ("names metric 'FID', the evaluations before it 'CLIP'") and the import exited 0
    without a score. Here: AMD's llama2_70b_lora logs with each evaluation logged as such a pair
    (the fixture holds no published stable_diffusion folder), in a stable_diffusion folder,
    scored against mlperf_logging's summarizer on the same files."""
    from mlperf_logging.result_summarizer import result_summarizer

    folder = tmp_path / "system" / "stable_diffusion"
    shutil.copytree(ROUND / "AMD" / "results" / "MI355X_EPYC_9575F_pytorch" / "llama2_70b_lora", folder)
    for log in folder.glob("result_*.txt"):
        out = []
        for line in log.read_text().splitlines(keepends=True):
            if '"key": "eval_accuracy"' not in line:
                out.append(line)
                continue
            at = line.index(":::MLLOG ")
            event = json.loads(line[at + len(":::MLLOG "):])
            for metric, value in (("CLIP", event["value"]), ("FID", 100.0 - 10 * event["value"])):
                paired = event | {"value": value, "metadata": event["metadata"] | {"metric": metric}}
                out.append(line[:at] + ":::MLLOG " + json.dumps(paired) + "\n")
        log.write_text("".join(out))
    official, _, factor = result_summarizer._compute_strong_score_standalone(
        "stable_diffusion", "system", False, str(folder), "training", "5.1.0")
    ours = score_benchmark(folder)
    assert official is not None and ours.score_minutes == official and ours.scaling_factor == factor
    assert not any(r.dropped for r in ours.runs) and ours.discrete_note  # one metric's evaluations timed
