"""Energy to train of published MLPerf results (ampcert/published/energy.py): MLPerf's own figure
to the last digit, against mlperf_logging's result summarizer run on the same folders, and what it
leaves out (switches that were measured, not estimated) or cannot compute (a power log of zero
duration). The folder is a real v5.0 Lenovo bert result with power logs, two of its runs
(tests/fixtures/mlperf/training_results_v5.0/SOURCE.md)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from ampcert.published.energy import (
    BenchmarkEnergy,
    against_mlperf,
    energy_benchmark,
    olympic_by_time,
)

ROUND = Path(__file__).resolve().parents[1] / "fixtures" / "mlperf" / "training_results_v5.0"
BERT = ROUND / "Lenovo" / "results" / "SR780aV3-8xB200_SXM_180GB" / "bert"
RULESET = "5.0.0"


def _summarizer(folder: Path) -> tuple[dict[str, float], float | None]:
    """The summarizer's energy of each run (by file name) and of the benchmark."""
    from mlperf_logging.result_summarizer import result_summarizer

    _, runs, _, energy, _ = result_summarizer._compute_strong_score_standalone(
        folder.name, "SR780aV3-8xB200_SXM_180GB", True, str(folder), "training", RULESET, return_full_scores=True)
    return {Path(file).name: joules for file, joules in runs.items()}, energy


def _summarizer_run(folder: Path, result: str) -> float:
    """The summarizer's energy of one run, its compliance check left out (the time as it takes it)."""
    from mlperf_logging.compliance_checker.mlp_parser import parse_file
    from mlperf_logging.result_summarizer import result_summarizer

    start, stop = result_summarizer._query_run_start_stop(parse_file(str(folder / result), RULESET)[0])
    return result_summarizer._compute_total_power(str(folder), str(folder / result), stop - start, RULESET)


@pytest.fixture(scope="module")
def bert() -> BenchmarkEnergy:
    return energy_benchmark(BERT)


def test_each_runs_energy_is_mlperfs_to_the_last_digit(bert):
    runs, energy = _summarizer(BERT)
    assert [run.file for run in bert.runs] == ["result_1.txt", "result_3.txt"] == sorted(runs)
    for run in bert.runs:
        assert run.mlperf_joules == runs[run.file] and run.refused is None
        # one node, no switch logs: ampcert's figures are MLPerf's
        assert run.nodes_joules == run.nodes_and_switches_joules == run.mlperf_joules and run.difference_pct == 0
        assert (run.nodes, run.switches_measured, run.switches_estimated) == (1, 0, 0)
    # as published for the SR780a V3 bert runs 1 and 3 (v5.0), in joules
    assert [run.mlperf_joules for run in bert.runs] == [1778201.5872893876, 1899438.6998662858]
    # two runs: nothing is left once the fastest and the slowest are left out, here as there
    assert energy is None and bert.mlperf_joules is None and "none left" in bert.no_figure


def test_the_measurement_type_and_sampling_rate_as_the_logs_state_them(bert):
    for run in bert.runs:
        assert run.measurement_type == "AC" and run.conversion_eff == [0.94]
        # 1 Hz, with a missed second now and then
        assert (run.sampling_interval_s, run.sampling_rate_hz, run.longest_gap_s) == (1.0, 1.0, 2.0)
    assert bert.measurement_types == ["AC"] and bert.sampling_interval_s == 1.0


def _shift_stop(text: str, ms: int) -> str:
    """The log with run_stop, and every line after it, ``ms`` later."""
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if '"key": "run_stop"' in line)
    later = [re.sub(r'"time_ms": (\d+)', lambda m: f'"time_ms": {int(m[1]) + ms}', line) for line in lines[at:]]
    return "".join(lines[:at] + later)


def _add_run(folder: Path, source: int, new: int, later_ms: int, eff: float | None = None) -> None:
    text = (folder / f"result_{source}.txt").read_text()
    (folder / f"result_{new}.txt").write_text(_shift_stop(text, later_ms))
    shutil.copytree(folder / "power" / f"result_{source}", folder / "power" / f"result_{new}")
    if eff is not None:
        node = folder / "power" / f"result_{new}" / "node_0.txt"
        node.write_text(node.read_text().replace('"value": 0.94,', f'"value": {eff},'))


def test_the_benchmark_figure_is_mlperfs_olympic_mean_by_time(tmp_path):
    folder = tmp_path / "bert"
    shutil.copytree(BERT, folder)
    _add_run(folder, 3, 4, 60_000)           # the slowest
    _add_run(folder, 1, 6, 10_000, eff=0.5)  # second fastest, and the least energy
    (folder / "scaling.json").write_text(json.dumps({"scaling_factor": 1.25}))
    runs, energy = _summarizer(folder)
    ours = energy_benchmark(folder)
    assert {run.file: run.mlperf_joules for run in ours.runs} == runs
    assert ours.mlperf_joules == energy == ours.nodes_joules == ours.nodes_and_switches_joules
    by_file = {run.file: run.mlperf_joules for run in ours.runs}
    # the fastest (result_1) and the slowest (result_4) by time are left out, not the extreme energies
    assert energy == pytest.approx((by_file["result_6.txt"] + by_file["result_3.txt"]) / 2 * 1.25, rel=1e-15)
    assert min(by_file, key=by_file.__getitem__) == "result_6.txt"


def test_the_olympic_mean_by_time():
    assert olympic_by_time([3.0, 1.0, 2.0, 4.0], [30.0, 100.0, 20.0, 40.0], 0, "bert") == 25.0
    assert olympic_by_time([3.0, 1.0, 2.0], [30.0, 100.0, 20.0], 1, "bert", 2.0) == 50.0
    assert olympic_by_time([1.0, 2.0], [1.0, 2.0], 0, "bert") is None
    assert olympic_by_time([1.0, 2.0, 3.0], [1.0, None, 3.0], 0, "bert") is None


def _event(time_ms: int, key: str, value: object = None, kind: str = "POINT_IN_TIME", **metadata: object) -> str:
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": time_ms, "event_type": kind, "key": key,
                                     "value": value, "metadata": metadata}) + "\n"


def _one_run(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "bert"
    power = folder / "power" / "result_1"
    power.mkdir(parents=True)
    shutil.copy(BERT / "result_1.txt", folder)
    return folder, power


def test_switches_measured_are_counted_where_mlperf_counts_only_estimates(tmp_path):
    folder, power = _one_run(tmp_path)
    shutil.copy(BERT / "power" / "result_1" / "node_0.txt", power)
    node = (power / "node_0.txt").read_text()
    start, stop = (int(re.search(rf'"time_ms": (\d+), "event_type": "{kind}", "key": "power_measurement_{key}"',
                                 node)[1]) for kind, key in (("INTERVAL_START", "start"), ("INTERVAL_END", "stop")))
    readings = "".join(_event(t, "power_reading", 400.0, host="sw_0") for t in range(start + 1000, stop + 1, 1000))
    (power / "sw_0.txt").write_text(_event(start, "power_measurement_start", kind="INTERVAL_START") + readings
                                    + _event(stop, "power_measurement_stop", kind="INTERVAL_END"))
    (power / "sw_1.txt").write_text(_event(start, "interconnect_power_est", 250.0, host="sw_1"))
    [run] = energy_benchmark(folder).runs
    assert run.mlperf_joules == _summarizer_run(folder, "result_1.txt")
    assert (run.switches_measured, run.switches_estimated) == (1, 1)
    seconds = run.minutes * 60
    # MLPerf's figure: the nodes and sw_1's estimate; sw_0's 400 W measured are left out
    assert run.mlperf_joules - run.nodes_joules == pytest.approx(250 * seconds, rel=1e-9)
    assert run.nodes_and_switches_joules - run.mlperf_joules == pytest.approx(400 * seconds, rel=1e-9)
    assert run.difference_pct == pytest.approx(400 * seconds / run.mlperf_joules * 100)
    assert 0 < run.difference_pct < 10
    assert against_mlperf(run.switches_measured, run.switches_estimated, run.switches_unknown) == (
        "MLPerf counts a switch only by its interconnect_power_est, so it leaves out the 1 switch log(s) measured "
        "with power_reading, which ampcert counts as it counts a node; 1 estimated switch(es) counted as MLPerf "
        "counts them")


@pytest.mark.parametrize("lines, reason, mlperf", [
    ([(1_000, "power_measurement_start", "INTERVAL_START"), (1_000, "power_reading", "POINT_IN_TIME"),
      (1_000, "power_measurement_stop", "INTERVAL_END")],
     "power/result_1/node_0.txt: the power measurement lasts 0 ms", ZeroDivisionError),
    ([(1_000, "power_measurement_start", "INTERVAL_START"), (1_000, "power_measurement_stop", "INTERVAL_END"),
      (2_000, "power_reading", "POINT_IN_TIME")],
     "power/result_1/node_0.txt: the power measurement lasts 0 ms", ZeroDivisionError),
    ([(1_000, "power_measurement_start", "INTERVAL_START"), (200_000, "power_measurement_stop", "INTERVAL_END")],
     "power/result_1/node_0.txt: no power_reading inside its measurement window", 0.0),
], ids=["zero duration", "zero duration, readings after it", "no readings"])
def test_a_power_log_without_a_figure_refuses_its_run_with_one_reason(tmp_path, lines, reason, mlperf):
    folder, power = _one_run(tmp_path)
    (power / "node_0.txt").write_text(_event(1_000, "conversion_eff", 1.0, measurement_type="DC") + "".join(
        _event(t, key, 5000.0 if key == "power_reading" else None, kind) for t, key, kind in lines))
    result = energy_benchmark(folder)
    [run] = result.runs
    assert run.refused.startswith(reason) and "\n" not in run.refused
    assert run.nodes_joules is run.mlperf_joules is run.nodes_and_switches_joules is None
    assert run.minutes is not None and result.no_figure  # the time counts; the energy is unknown
    if mlperf is ZeroDivisionError:  # where MLPerf's summarizer stops ...
        with pytest.raises(ZeroDivisionError):
            _summarizer_run(folder, "result_1.txt")
    else:  # ... or counts no energy at all
        assert _summarizer_run(folder, "result_1.txt") == mlperf


def test_a_run_without_its_power_folder_is_refused(tmp_path):
    folder = tmp_path / "bert"
    shutil.copytree(BERT, folder)
    shutil.rmtree(folder / "power" / "result_3")
    result = energy_benchmark(folder)
    assert [run.refused for run in result.runs] == [None, "no power/result_3/node_*.txt"]


def test_a_folder_without_power_logs(tmp_path):
    shutil.copy(BERT / "result_1.txt", tmp_path)
    result = energy_benchmark(tmp_path, "bert")
    assert not result.power_logs and result.runs == [] and result.mlperf_joules is None
    assert result.no_figure.startswith("no power/ folder")


def test_the_results_are_stored_as_json(bert):
    assert BenchmarkEnergy.model_validate_json(bert.model_dump_json()) == bert
    with pytest.raises(ValidationError):
        BenchmarkEnergy.model_validate({**bert.model_dump(), "joules": 1.0})
