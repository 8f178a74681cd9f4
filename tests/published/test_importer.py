"""`ampcert import mlperf` (ampcert/published/importer.py, system.py) and `ampcert plan` on what it
wrote (published/capacity.py): real v5.1 llama2_70b_lora results of three submitters
(tests/fixtures/mlperf/SOURCE.md), copied where a test changes them."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error
from factories import warm_cli

from ampcert import session
from ampcert.errors import UserError
from ampcert.published.importer import find_benchmarks, load_published
from ampcert.published.system import read_system

ROUND = Path(__file__).resolve().parents[1] / "fixtures" / "mlperf" / "training_results_v5.1"
SYSTEMS = {"AMD": "MI355X_EPYC_9575F_pytorch", "Cisco": "1xC885A_M8-8xH200-SXM-141GB",
           "Dell": "1xXE9780x8B200-SXM-180GB"}


def _summarizer(folder: Path) -> float | None:
    from mlperf_logging.result_summarizer import result_summarizer

    return result_summarizer._compute_strong_score_standalone(
        "llama2_70b_lora", folder.parent.name, False, str(folder), "training", "5.1.0")[0]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("imported") / "out"
    proc = warm_cli("import", "mlperf", ROUND, "--out", out, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, json.loads(proc.stdout)


def _round_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "training_results_v5.1"
    shutil.copytree(ROUND, copy)
    return copy


def test_each_system_and_benchmark_is_a_folder_scored_as_mlperfs_summarizer_scores_it(imported):
    out, data = imported
    assert [(row["submitter"], row["system"], row["round"]) for row in data["imported"]] == \
        [(sub, system, "5.1") for sub, system in SYSTEMS.items()]
    for submitter, system in SYSTEMS.items():
        rec = load_published(out / submitter / system / "llama2_70b_lora")
        official = _summarizer(ROUND / submitter / "results" / system / "llama2_70b_lora")
        assert rec.score.score_minutes == official, submitter  # to the last digit
        low, high = rec.score.interval_minutes
        assert low < official < high
        assert rec.score.accelerator_hours_per_run == official * 8 / 60
        assert rec.division == "closed" and rec.availability == "Available on-premise"
    amd = load_published(out / "AMD" / SYSTEMS["AMD"] / "llama2_70b_lora")
    assert amd.score.score_minutes == 10.18474574915825


def test_the_original_logs_are_kept_byte_for_byte_with_their_digests(imported):
    out, _ = imported
    for submitter, system in SYSTEMS.items():
        folder = out / submitter / system / "llama2_70b_lora"
        source = ROUND / submitter / "results" / system / "llama2_70b_lora"
        rec = load_published(folder)
        assert [log.file for log in rec.logs] == [f"logs/result_{n}.txt" for n in range(10)]
        for log in rec.logs:
            original = (ROUND / log.original).read_bytes()
            assert (folder / log.file).read_bytes() == original
            assert log.sha256 == hashlib.sha256(original).hexdigest() and log.bytes == len(original)
        assert (folder / "system.json").read_bytes() == (ROUND / submitter / "systems" / f"{system}.json").read_bytes()
        assert (folder / "scaling.json").exists() == (source / "scaling.json").exists()
        if rec.scaling_json_sha256:
            assert rec.scaling_json_sha256 == hashlib.sha256((source / "scaling.json").read_bytes()).hexdigest()


def test_the_system_description_is_the_fingerprint_and_precision_is_never_guessed(imported):
    out, _ = imported
    amd = load_published(out / "AMD" / SYSTEMS["AMD"] / "llama2_70b_lora")
    fp = amd.fingerprint
    assert (fp.accelerator_model, fp.nodes, fp.accelerators_per_node, fp.accelerators) == ("AMD Instinct MI355X", 1, 8, 8)
    assert fp.host_cpu == "AMD EPYC 9575F" and fp.host_processors_per_node == 2 and fp.host_processor_core_count == 64
    assert fp.framework.startswith("PyTorch 2.8.0") and "TransformerEngine" in fp.software_stack
    # v5.1 logs disclose no precision; the free-text note is kept verbatim, not parsed into one
    assert amd.precision.disclosed == "not disclosed" and amd.precision.sw_notes == "FP8 Training"


def test_a_log_without_run_stop_or_that_failed_is_kept_and_dropped_with_its_reason(imported, tmp_path):
    out, _ = imported
    dell = load_published(out / "Dell" / SYSTEMS["Dell"] / "llama2_70b_lora")
    assert dell.logs[0].status is None and dell.logs[0].problem.startswith("no run_stop")
    assert dell.score.runs[0].dropped.startswith("no run_stop")
    # a run whose run_stop says aborted: kept, dropped from the score with the status
    copy = _round_copy(tmp_path)
    log = copy / "Cisco" / "results" / SYSTEMS["Cisco"] / "llama2_70b_lora" / "result_3.txt"
    log.write_text(log.read_text().replace('"status": "success"', '"status": "aborted"'))
    done = session.import_mlperf([log.parent], tmp_path / "out")
    (cisco,) = done.records
    assert cisco.logs[3].status == "aborted" and cisco.score.runs[3].dropped == "run_stop status aborted"
    assert cisco.score.score_minutes is not None and cisco.round == "5.1"


def test_a_round_a_submitter_and_a_benchmark_folder_import_alike(imported, tmp_path):
    out, _ = imported
    benchmark = ROUND / "Cisco" / "results" / SYSTEMS["Cisco"] / "llama2_70b_lora"
    for i, path in enumerate((ROUND / "Cisco", benchmark)):
        done = session.import_mlperf([path], tmp_path / str(i))
        (folder,) = done.folders
        expected = out / "Cisco" / SYSTEMS["Cisco"] / "llama2_70b_lora"
        assert (folder / "published.json").read_bytes() == (expected / "published.json").read_bytes()
    assert [b.system for b in find_benchmarks(ROUND)] == list(SYSTEMS.values())


def test_importing_again_writes_the_same_bytes_and_other_content_is_not_replaced(imported):
    out, _ = imported
    published = out / "AMD" / SYSTEMS["AMD"] / "llama2_70b_lora" / "published.json"
    before = published.read_bytes()
    assert warm_cli("import", "mlperf", ROUND / "AMD", "--out", out).returncode == 0
    assert published.read_bytes() == before
    (out / "Cisco" / SYSTEMS["Cisco"] / "llama2_70b_lora" / "logs" / "result_0.txt").write_text("edited\n")
    try:
        proc = warm_cli("import", "mlperf", ROUND, "--out", out)
        assert_one_line_error(proc, "result_0.txt already exists with other content")
        assert published.read_bytes() == before
    finally:
        shutil.copyfile(ROUND / "Cisco" / "results" / SYSTEMS["Cisco"] / "llama2_70b_lora" / "result_0.txt",
                        out / "Cisco" / SYSTEMS["Cisco"] / "llama2_70b_lora" / "logs" / "result_0.txt")


def test_a_folder_that_is_not_a_submission_is_one_line_and_nothing_is_written(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello\n")
    proc = warm_cli("import", "mlperf", tmp_path / "notes", "--out", tmp_path / "out")
    assert_one_line_error(proc, "not an MLPerf Training submission")
    assert not (tmp_path / "out").exists()
    loose = tmp_path / "loose"
    shutil.copytree(ROUND / "AMD" / "results" / SYSTEMS["AMD"] / "llama2_70b_lora", loose)
    assert_one_line_error(warm_cli("import", "mlperf", loose, "--out", tmp_path / "out"),
                          "not at <submitter>/results/<system>/<benchmark>/")
    assert_one_line_error(warm_cli("import", "mlperf", tmp_path / "missing", "--out", tmp_path / "out"),
                          "no such folder")


@pytest.mark.parametrize("kind", ["link to a host file", "link to a log elsewhere", "fifo", "linked folder"])
def test_a_link_or_a_fifo_in_a_submission_is_refused_not_followed_and_nothing_is_written(tmp_path, kind):
    """A submission is untrusted: a result log that links to /etc/os-release was copied into the
    import as a result log, a link to a log elsewhere was imported as if it were there, and a FIFO
    would hang the import (and MLPerf's checkers, which open what they find)."""
    import os

    copy = _round_copy(tmp_path)
    bench = copy / "AMD" / "results" / SYSTEMS["AMD"] / "llama2_70b_lora"
    if kind == "link to a host file":
        (bench / "result_10.txt").symlink_to("/etc/os-release")
    elif kind == "link to a log elsewhere":
        elsewhere = tmp_path / "elsewhere.txt"
        shutil.copy(bench / "result_0.txt", elsewhere)
        (bench / "result_10.txt").symlink_to(elsewhere)
    elif kind == "fifo":
        os.mkfifo(bench / "result_10.txt")
    else:
        moved = tmp_path / "moved"
        shutil.move(bench, moved)
        bench.symlink_to(moved, target_is_directory=True)
    proc = warm_cli("import", "mlperf", copy / "AMD", "--out", tmp_path / "out", timeout=120)
    says = "not a regular file" if kind == "fifo" else "a symbolic link"
    assert_one_line_error(proc, says)
    assert not (tmp_path / "out").exists()


def test_an_import_without_a_score_exits_1_with_its_reason(tmp_path):
    """Every run dropped (here: each logged run_stop aborted), so no score: the folder is
    imported with the reason, and the import exits 1 (it exited 0, and compare-systems then
    showed "runs 0/10 ... MLPerf checks: passed")."""
    copy = _round_copy(tmp_path)
    bench = copy / "AMD" / "results" / SYSTEMS["AMD"] / "llama2_70b_lora"
    for log in bench.glob("result_*.txt"):
        log.write_text(log.read_text().replace('"status": "success"', '"status": "aborted"'))
    proc = warm_cli("import", "mlperf", bench, "--out", tmp_path / "out")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "no score:" in proc.stdout
    rec = load_published(tmp_path / "out" / "AMD" / SYSTEMS["AMD"] / "llama2_70b_lora")
    assert rec.score.score_minutes is None and rec.score.no_score
    # Exit 1 for the missing score alone, where MLPerf's checkers pass (here they also reject the
    # aborted runs): the import's verdict, held apart from them.
    from ampcert.session.published import Imported

    passing = rec.model_copy(update={"reverification": rec.reverification.model_copy(update={"checks": []})})
    assert not passing.rejected and not Imported(tmp_path / "out", [bench], [passing]).ok


@pytest.mark.parametrize(("field", "value", "says"), [
    ("accelerators_per_node", "8x", "accelerators_per_node '8x' is not a whole number"),
    ("number_of_nodes", 1.5, "number_of_nodes 1.5 is not a whole number"),
    ("number_of_nodes", True, "number_of_nodes True is not a whole number"),
    ("accelerator_model_name", 355, "accelerator_model_name 355 is not text"),
    ("submitter", ["AMD"], "submitter ['AMD'] is not text"),
    ("accelerators_per_node", None, "accelerators_per_node is missing"),
    ("accelerators_per_node", "²", "accelerators_per_node '²' is not a whole number"),
    ("number_of_nodes", "9" * 5000, "number_of_nodes '" + "9" * 39 + "… is not a whole number"),
])
def test_a_system_description_with_the_wrong_types_is_one_line_and_nothing_is_written(tmp_path, field, value, says):
    copy = _round_copy(tmp_path)
    path = copy / "AMD" / "systems" / f"{SYSTEMS['AMD']}.json"
    data = json.loads(path.read_text())
    data[field] = value
    path.write_text(json.dumps(data))
    proc = warm_cli("import", "mlperf", copy, "--out", tmp_path / "out")
    assert_one_line_error(proc, f"{SYSTEMS['AMD']}.json: {says}")
    assert not (tmp_path / "out").exists()  # the other submitters' folders were not written either


def test_counts_written_as_numbers_or_digit_strings_both_read(tmp_path):
    path = tmp_path / "s.json"
    data = json.loads((ROUND / "AMD" / "systems" / f"{SYSTEMS['AMD']}.json").read_text())
    path.write_text(json.dumps(data | {"number_of_nodes": 2, "accelerators_per_node": " 8 ",
                                       "other_software_stack": {"NeMo": "2.3", "TE": ""},
                                       "host_processors_per_node": "2 (big); 4 (LITTLE)",
                                       "host_processor_core_count": "N/A", "sw_notes": "FP8  Training\n"}))
    fp = read_system(path)
    assert (fp.nodes, fp.accelerators) == (2, 16) and fp.software_stack == "NeMo 2.3, TE"
    # optional counts that are no number multiply nothing: unknown, not a refusal; the notes stay as written
    assert fp.host_processors_per_node is None and fp.host_processor_core_count is None
    assert fp.sw_notes == "FP8  Training\n"
    path.write_text("[1, 2]")
    with pytest.raises(UserError, match="is a JSON object, found list"):
        read_system(path)


def test_plan_gives_accelerator_hours_and_cost_for_n_training_runs(imported, tmp_path):
    out, _ = imported
    proc = warm_cli("plan", out, "--training-runs", "20", "--json", "--csv", tmp_path / "plan.csv")
    assert proc.returncode == 0, proc.stderr
    rows = {row["submitter"]: row for row in json.loads(proc.stdout)["rows"]}
    cisco = rows["Cisco"]
    score = load_published(out / "Cisco" / SYSTEMS["Cisco"] / "llama2_70b_lora").score
    assert cisco["accelerator_hours"] == pytest.approx(20 * score.score_minutes * 8 / 60)
    assert cisco["cost"] == pytest.approx(cisco["accelerator_hours"] * 3.50)  # the shipped table's H200
    low, high = cisco["accelerator_hours_range"]
    assert low < cisco["accelerator_hours"] < high
    # the shipped table has no MI355X: no cost, with the reason, never a made-up one
    assert rows["AMD"]["cost"] is None and "no price for 'AMD Instinct MI355X'" in rows["AMD"]["reason"]
    assert "no price for 'AMD Instinct MI355X'" in proc.stderr
    assert (tmp_path / "plan.csv").read_text().count("\n") == 4
    one = warm_cli("plan", out / "AMD" / SYSTEMS["AMD"] / "llama2_70b_lora", "--training-runs", "3",
                   "--price-per-gpu-hour", "2", "--json")
    (amd,) = json.loads(one.stdout)["rows"]
    assert amd["cost"] == pytest.approx(3 * 10.18474574915825 * 8 / 60 * 2)


def test_plan_asks_for_the_unit_each_folder_is_planned_in(imported):
    out, _ = imported
    assert_one_line_error(warm_cli("plan", out, "--target-samples", "1000"),
                          "--target-samples", "plan them in training_runs")
    assert_one_line_error(warm_cli("plan", out), "--training-runs", "planned in training runs")
    assert_one_line_error(warm_cli("plan", out, "--training-runs", "0"), "--training-runs 0: expected at least 1")


def test_a_damaged_published_json_is_one_line(imported, tmp_path):
    out, _ = imported
    folder = tmp_path / "damaged"
    shutil.copytree(out / "AMD" / SYSTEMS["AMD"] / "llama2_70b_lora", folder)
    data = json.loads((folder / "published.json").read_text())
    data["score"]["score_minutes"] = "fast"
    (folder / "published.json").write_text(json.dumps(data))
    assert_one_line_error(warm_cli("plan", folder, "--training-runs", "2"), "published.json: score.score_minutes")


POWER_ROUND = ROUND.parent / "training_results_v5.0"
LENOVO = "SR780aV3-8xB200_SXM_180GB"


def test_mlperfs_own_checkers_judge_each_folder_for_its_rounds_ruleset(imported):
    out, data = imported
    assert data["ok"] is True and {row["ruleset"] for row in data["imported"]} == {"5.1.0"}
    for submitter, system in SYSTEMS.items():
        checked = load_published(out / submitter / system / "llama2_70b_lora").reverification
        assert [(c.name, c.status) for c in checked.checks] == [
            ("compliance", "passed"), ("system description", "passed"), ("rcp", "passed"),
            ("scaling factor (ampcert)", "passed"), ("summarizer", "passed"), ("package", "passed")], submitter
        assert checked.summarizer_minutes == load_published(out / submitter / system / "llama2_70b_lora").score.score_minutes
        assert checked.rcp_scaling_factor == checked.published_scaling_factor
        assert not checked.folder.startswith("/") and str(ROUND) not in json.dumps(checked.model_dump())
    dell = load_published(out / "Dell" / SYSTEMS["Dell"] / "llama2_70b_lora").reverification.check("compliance")
    (bad,) = [f for f in dell.files if not f.ok]
    assert bad.file == "result_0.txt" and any("'run_stop'" in e for e in bad.errors)


def test_a_scaling_json_that_disagrees_with_the_rcp_checker_is_ampcerts_finding_beside_mlperfs_pass(tmp_path):
    """MLPerf's RCP checker passes the runs whatever scaling.json says (its review may set the
    factor): the RCP line is its verdict; the disagreement is ampcert's own finding, and exits 1."""
    copy = _round_copy(tmp_path)
    folder = copy / "AMD" / "results" / SYSTEMS["AMD"] / "llama2_70b_lora"
    (folder / "scaling.json").write_text(json.dumps({"scaling_factor": 1.5}))
    proc = warm_cli("import", "mlperf", folder, "--out", tmp_path / "out")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rcp passed, scaling factor (ampcert) failed" in proc.stdout
    assert "scaling factor (ampcert) failed: ampcert's recomputation: the RCP checker's scaling factor 1.00337, " \
        "published 1.5" in proc.stdout and "rejected 1 of 1 imported folder(s)" in proc.stdout
    rec = load_published(tmp_path / "out" / "AMD" / SYSTEMS["AMD"] / "llama2_70b_lora")
    assert rec.reverification.check("rcp").status == "passed" and rec.reverification.published_scaling_factor == 1.5
    assert rec.score.scaling_factor == 1.5 and rec.rejected[0].startswith("scaling factor (ampcert): ")


def _power_benchmark(tmp_path: Path) -> Path:
    """Lenovo's bert folder with four runs: the fixture keeps two of its ten (SOURCE.md), and
    MLPerf's olympic mean needs three, so two more are made from them, later by 1 and 2 minutes."""
    copy = tmp_path / "training_results_v5.0"
    shutil.copytree(POWER_ROUND, copy)
    folder = copy / "Lenovo" / "results" / LENOVO / "bert"
    for source, new, later in ((1, 5, 60_000), (3, 7, 120_000)):
        text = (folder / f"result_{source}.txt").read_text().splitlines(keepends=True)
        at = next(i for i, line in enumerate(text) if '"key": "run_stop"' in line)
        (folder / f"result_{new}.txt").write_text("".join(text[:at]) + "".join(_later(line, later)
                                                                              for line in text[at:]))
        shutil.copytree(folder / "power" / f"result_{source}", folder / "power" / f"result_{new}")
    return folder


def test_the_power_system_gets_energy_to_train_beside_mlperfs_figure(tmp_path, cli_here):
    folder = _power_benchmark(tmp_path)
    proc = cli_here("import", "mlperf", folder, "--out", tmp_path / "out")
    # four of ten runs: MLPerf's RCP check (and the summarizer and package checker after it)
    # reject the truncated submission, as they should; the energy is computed all the same
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    imported = tmp_path / "out" / "Lenovo" / LENOVO / "bert"
    energy = load_published(imported).energy
    assert energy.power_logs and energy.measurement_types == ["AC"] and energy.sampling_interval_s == 1.0
    assert energy.nodes_joules == energy.nodes_and_switches_joules == energy.mlperf_joules  # no switch logs
    assert energy.mlperf_joules is not None and 1e6 < energy.mlperf_joules < 3e6
    assert [r.file for r in energy.runs] == [f"result_{n}.txt" for n in (1, 3, 5, 7)]
    kwh = f"{energy.mlperf_joules / 3.6e6:.3f} kWh"
    assert (f"energy to train per run: nodes {kwh}, nodes and switches {kwh}, MLPerf's figure {kwh} (+0.00%); "
            "AC, 1 Hz") in proc.stdout
    assert "energy against MLPerf's figure: no switch logs were published: the nodes alone" in proc.stdout
    plan = session.capacity(imported, training_runs=10)
    (row,) = plan.plan.rows
    assert row.energy_kwh == pytest.approx(10 * energy.nodes_joules / 3.6e6)
    assert row.energy_scope == "nodes" and row.accelerator == load_published(imported).fingerprint.accelerator_model


def test_a_power_log_that_lasts_no_time_refuses_its_run_and_keeps_the_exit_code(tmp_path, cli_here):
    """A power window whose stop equals its start (where MLPerf's summarizer raises
    ZeroDivisionError): the run's energy is refused with one reason, printed and stored; its time
    still counts; the import's exit code is what MLPerf's checkers make it (docs/published.md)."""
    folder = _power_benchmark(tmp_path)
    whole = cli_here("import", "mlperf", folder, "--out", tmp_path / "whole")
    node = folder / "power" / "result_5" / "node_0.txt"
    lines = node.read_text().splitlines(keepends=True)
    start = next(re.search(r'"time_ms": (\d+)', line)[1] for line in lines if "power_measurement_start" in line)
    node.write_text("".join(re.sub(r'"time_ms": \d+', f'"time_ms": {start}', line)
                            if "power_measurement_stop" in line else line for line in lines))
    proc = cli_here("import", "mlperf", folder, "--out", tmp_path / "out")
    assert proc.returncode == whole.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    reason = "power/result_5/node_0.txt: the power measurement lasts 0 ms"
    assert f"result_5.txt: no energy: {reason}" in proc.stdout
    energy = load_published(tmp_path / "out" / "Lenovo" / LENOVO / "bert").energy
    (refused,) = [run for run in energy.runs if run.refused]
    assert refused.file == "result_5.txt" and refused.refused.startswith(reason) and refused.minutes is not None
    assert energy.mlperf_joules is None and "result_5.txt has no energy figure" in energy.no_figure
    assert "energy to train: no figure (result_5.txt has no energy figure" in proc.stdout


def test_power_logs_are_kept_digested_named_and_a_window_outside_its_run_is_flagged(tmp_path, cli_here):
    """The energy figure can be traced to its bytes: every power log is copied into the import and
    digested, as the result logs are, and each run names the logs its figure comes from. A power
    log whose events lie 5 hours before its run's is counted as MLPerf counts it, and said."""
    import hashlib

    folder = _power_benchmark(tmp_path)
    node = folder / "power" / "result_7" / "node_0.txt"
    node.write_text("".join(_later(line, -5 * 3_600_000) for line in node.read_text().splitlines(keepends=True)))
    proc = cli_here("import", "mlperf", folder, "--out", tmp_path / "out")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr  # (RCP, as above)
    imported = tmp_path / "out" / "Lenovo" / LENOVO / "bert"
    rec = load_published(imported)
    published = sorted(p.relative_to(folder).as_posix() for p in (folder / "power").rglob("*.txt"))
    assert [p.file for p in rec.power_logs] == published
    for p in rec.power_logs:
        data = (imported / p.file).read_bytes()
        assert data == (folder / p.file).read_bytes() and p.sha256 == hashlib.sha256(data).hexdigest()
    run7 = next(r for r in rec.energy.runs if r.file == "result_7.txt")
    assert run7.sources == ["power/result_7/node_0.txt"]
    assert run7.outside_run == ["power/result_7/node_0.txt: its events end 4.9 h before run_start"]
    assert not any(r.outside_run for r in rec.energy.runs if r.file != "result_7.txt")
    assert "result_7.txt's power/result_7/node_0.txt: its events end 4.9 h before run_start" in proc.stdout


def _later(line: str, ms: int) -> str:
    return re.sub(r'"time_ms": (\d+)', lambda m: f'"time_ms": {int(m[1]) + ms}', line)


def test_a_submission_without_power_logs_says_so_and_plans_no_energy(imported):
    out, _ = imported
    rec = load_published(out / "AMD" / SYSTEMS["AMD"] / "llama2_70b_lora")
    assert rec.energy.power_logs is False and "without power logs" in rec.energy.no_figure
    (row,) = session.capacity(out / "AMD" / SYSTEMS["AMD"] / "llama2_70b_lora", training_runs=1).plan.rows
    assert row.energy_kwh is None and "without power logs" in row.energy_reason


def test_the_same_results_import_to_the_same_bytes_whatever_the_hash_seed(tmp_path):
    """MLPerf's checkers order some of their messages by a set's order, and whether an either-or
    message is written once or twice depends on it too (seed 29 writes "'block_stop' or
    'epoch_stop'" twice for Dell's truncated result_0, seed 10 once); stored as they come, they
    would make a second import of the same results 'other content'."""
    from conftest import run_cli

    for seed in ("10", "29"):
        proc = run_cli("import", "mlperf", ROUND / "Dell", "--out", tmp_path / seed, env={"PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
    path = Path("Dell", SYSTEMS["Dell"], "llama2_70b_lora", "published.json")
    assert (tmp_path / "10" / path).read_bytes() == (tmp_path / "29" / path).read_bytes()


# --------------------------------------------------------------------------- compare-systems


def test_the_systems_comparison_is_rendered_signed_and_verifiable(imported, tmp_path):
    out, _ = imported
    assert warm_cli("keygen", tmp_path / "key").returncode == 0
    proc = warm_cli("compare-systems", out, out / "AMD", "--out", tmp_path / "cmp", "--sign-key", tmp_path / "key",
                    "--json")
    assert proc.returncode == 0, proc.stderr
    cmp = json.loads(proc.stdout)["comparison"]
    rows = {row["name"].split()[0]: row for row in cmp["rows"]}
    assert cmp["benchmark"] == "llama2_70b_lora" and sorted(rows) == ["AMD", "Cisco", "Dell"]  # AMD named twice, once
    for submitter, system in SYSTEMS.items():
        rec = load_published(out / submitter / system / "llama2_70b_lora")
        row = rows[submitter]
        assert row["time_to_train_minutes"] == rec.score.score_minutes
        assert row["interval_minutes"] == rec.score.interval_minutes
        assert row["accelerator_hours_per_run"] == pytest.approx(rec.score.score_minutes * 8 / 60)
        assert row["compliance"] == "passed" and row["precision"] == "not disclosed"
    assert rows["Cisco"]["cost_per_run"] == pytest.approx(rows["Cisco"]["accelerator_hours_per_run"] * 3.50)
    assert rows["AMD"]["cost_per_run"] is None and rows["AMD"]["energy_kwh_per_run"] is None
    folder = tmp_path / "cmp"
    md = (folder / "comparison.md").read_text()
    assert "| Cisco 1xC885A_M8-8xH200-SXM-141GB v5.1 | 8 x NVIDIA H200-SXM5-141GB | not disclosed | 10/10 | 23.63 (22.48–24.78)" in md
    assert "precision not disclosed (sw_notes: FP8 Training)" in md
    html = (folder / "comparison.html").read_text()
    assert html.count("<svg") == 3 and "default-src 'none'" in html and "<script" not in html
    verified = warm_cli("verify", folder / "comparison.dsse.json", "--pubkey", tmp_path / "key.pub")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verified: comparison.html sha256" in verified.stdout
    assert "suite systems compared: llama2_70b_lora" in verified.stdout and "3 PASSED, 0 FAILED" in verified.stdout
    (folder / "comparison.md").write_text(md.replace("23.63", "13.63"))
    tampered = warm_cli("verify", folder / "comparison.dsse.json", "--pubkey", tmp_path / "key.pub")
    assert tampered.returncode == 1 and "comparison.md: sha256" in tampered.stderr


def test_the_same_comparison_renders_to_the_same_bytes(imported, tmp_path):
    out, _ = imported
    for name in ("a", "b"):
        session.compare_systems([out], tmp_path / name)
    for name in ("comparison.json", "comparison.md", "comparison.html"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_compare_systems_bad_input_is_one_line_and_nothing_is_written(imported, tmp_path):
    out, _ = imported
    target = tmp_path / "cmp"
    (tmp_path / "plain").mkdir()
    assert_one_line_error(warm_cli("compare-systems", tmp_path / "plain", "--out", target),
                          "neither imported MLPerf results")
    assert_one_line_error(warm_cli("compare-systems", out, "--out", target, "--benchmark", "bert"),
                          "--benchmark bert: none of the folders holds it")
    assert_one_line_error(warm_cli("compare-systems", out, "--out", target, "--sign-key", tmp_path / "nokey"),
                          "nokey")
    other = tmp_path / "other"
    shutil.copytree(out / "Cisco", other / "Cisco")
    published = other / "Cisco" / SYSTEMS["Cisco"] / "llama2_70b_lora" / "published.json"
    published.write_text(published.read_text().replace('"division": "closed"', '"division": "open"', 1))
    assert_one_line_error(warm_cli("compare-systems", out, other, "--out", target), "is also imported, differently")
    assert not target.exists()


def test_a_run_mlperfs_compliance_checker_refuses_is_dropped_as_the_summarizer_drops_it(tmp_path):
    copy = _round_copy(tmp_path)
    folder = copy / "Cisco" / "results" / SYSTEMS["Cisco"] / "llama2_70b_lora"
    log = folder / "result_2.txt"  # the benchmark's closed rules want lora_rank 16; the run still succeeded
    log.write_text(log.read_text().replace('"key": "lora_rank", "value": 16', '"key": "lora_rank", "value": 8'))
    (rec,) = session.import_mlperf([folder], tmp_path / "out").records
    assert rec.logs[2].status == "success"
    assert rec.score.runs[2].minutes is None
    assert rec.score.runs[2].dropped.startswith("MLPerf's compliance checker: CHECK for 'lora_rank' failed")
    assert rec.score.score_minutes == _summarizer(folder) == rec.reverification.summarizer_minutes
    assert rec.score.score_minutes != load_published_score(ROUND / "Cisco" / "results" / SYSTEMS["Cisco"]
                                                           / "llama2_70b_lora")


def load_published_score(folder: Path) -> float | None:
    from ampcert.published.scores import score_benchmark

    return score_benchmark(folder).score_minutes



def test_the_same_results_import_to_the_same_bytes_from_wherever_they_lie(imported, tmp_path, monkeypatch):
    """Paths are resolved and stored relative to the submission: a copy elsewhere, a relative path,
    or '.' inside the benchmark folder import to what the fixtures import to."""
    out, _ = imported
    copy = _round_copy(tmp_path)
    expected = (out / "Dell" / SYSTEMS["Dell"] / "llama2_70b_lora" / "published.json").read_bytes()
    benchmark = copy / "Dell" / "results" / SYSTEMS["Dell"] / "llama2_70b_lora"
    monkeypatch.chdir(benchmark)
    done = session.import_mlperf(["."], tmp_path / "a")
    assert done.records[0].submitter == "Dell" and done.records[0].round == "5.1"
    monkeypatch.chdir(tmp_path)
    session.import_mlperf([Path("training_results_v5.1") / "Dell" / "results" / SYSTEMS["Dell"]], "b")
    for name in ("a", "b"):
        assert (tmp_path / name / "Dell" / SYSTEMS["Dell"] / "llama2_70b_lora" / "published.json").read_bytes() \
            == expected, name
    assert str(tmp_path) not in expected.decode()


def test_an_output_in_the_way_is_one_line_and_nothing_is_written(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "AMD").write_text("a file where a folder goes\n")
    proc = warm_cli("import", "mlperf", ROUND, "--out", tmp_path / "out")
    assert_one_line_error(proc, "out/AMD: exists and is not a folder")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["AMD"]
    assert_one_line_error(warm_cli("import", "mlperf", ROUND / "AMD", "--out", tmp_path / "out" / "AMD"),
                          "exists and is not a folder")
    assert_one_line_error(warm_cli("import", "mlperf", ROUND / "AMD", "--out", tmp_path / "o2", "--round", "five"),
                          "--round five: expected a round such as 5.1")


def test_a_run_the_compliance_checker_refuses_has_no_energy_either(tmp_path):
    copy = tmp_path / "training_results_v5.0"
    shutil.copytree(POWER_ROUND, copy)
    folder = copy / "Lenovo" / "results" / LENOVO / "bert"
    log = folder / "result_3.txt"
    log.write_text(log.read_text().replace('"key": "submission_benchmark", "value": "bert"',
                                           '"key": "submission_benchmark", "value": "bert-large"'))
    (rec,) = session.import_mlperf([folder], tmp_path / "out").records
    refused = rec.score.runs[1]
    assert refused.file == "result_3.txt" and refused.dropped.startswith("MLPerf's compliance checker"), refused
    energy = {run.file: run for run in rec.energy.runs}
    assert energy["result_3.txt"].minutes is None and "MLPerf's compliance checker" in energy["result_3.txt"].refused
    assert energy["result_1.txt"].nodes_joules is not None


def test_an_unsigned_comparison_leaves_no_older_signature_behind(imported, tmp_path):
    out, _ = imported
    assert warm_cli("keygen", tmp_path / "key").returncode == 0
    session.compare_systems([out], tmp_path / "cmp", sign_key=tmp_path / "key")
    assert (tmp_path / "cmp" / "comparison.dsse.json").exists()
    session.compare_systems([out], tmp_path / "cmp", price_per_gpu_hour=9.0)
    assert not (tmp_path / "cmp" / "comparison.dsse.json").exists()


def test_a_comparison_is_the_same_however_its_paths_are_typed(imported, tmp_path, monkeypatch):
    out, _ = imported
    shutil.copytree(out, tmp_path / "published")
    monkeypatch.chdir(tmp_path)
    session.compare_systems(["published"], "a")
    session.compare_systems([str(tmp_path / "published") + "/"], tmp_path / "b")
    session.compare_systems(["./published/Cisco", "./published/AMD", "./published/Dell"], "c")
    a = (tmp_path / "a" / "comparison.json").read_bytes()
    assert (tmp_path / "b" / "comparison.json").read_bytes() == a == (tmp_path / "c" / "comparison.json").read_bytes()
    assert json.loads(a)["inputs"][0]["folder"] == "../published/AMD/MI355X_EPYC_9575F_pytorch/llama2_70b_lora"


def test_a_published_log_whose_ranks_interleave_counts_as_mlperf_counts_it(tmp_path):
    """318 of v5.1's 1,679 logs go backwards in time somewhere (their ranks' lines as the launcher
    collected them, up to 4.7 minutes apart); MLPerf's tools accept them, and so does the import."""
    copy = _round_copy(tmp_path)
    folder = copy / "Cisco" / "results" / SYSTEMS["Cisco"] / "llama2_70b_lora"
    log = folder / "result_4.txt"
    lines = log.read_text().splitlines(keepends=True)
    times = [int(re.search(r'"time_ms": (\d+)', line)[1]) for line in lines]
    at = next(i for i in range(len(lines) // 2, len(lines) - 1) if times[i] < times[i + 1])
    lines[at], lines[at + 1] = lines[at + 1], lines[at]  # a later line before an earlier one
    log.write_text("".join(lines))
    with pytest.raises(UserError, match="timestamps go backwards"):  # ampcert's own logs stay strict
        from ampcert.mllog.reader import read
        read(log)
    (rec,) = session.import_mlperf([folder], tmp_path / "out").records
    assert rec.logs[4].status == "success" and rec.score.runs[4].minutes is not None
    assert rec.score.score_minutes == _summarizer(folder) == 23.628676823361822


def test_a_log_changed_between_its_reading_and_its_copy_is_refused_and_nothing_is_written(tmp_path):
    """A log is read once for its digest and score, and copied when the folder is written
    (streamed, not held): the copy must be the bytes that were read."""
    from ampcert.published.importer import read_benchmark, write_planned

    (where,) = find_benchmarks(_round_copy(tmp_path) / "Dell")
    planned = read_benchmark(where)
    log = where.folder / "result_3.txt"
    log.write_bytes(log.read_bytes().replace(b'"success"', b'"aborted"'))
    with pytest.raises(UserError, match=r"result_3.txt: changed while it was imported"):
        write_planned([planned], tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.txt"))
