"""The nightly history: the store (SQLite here), the change-point gate, bad input.

Nights are synthetic results folders (tests/factories.py: real RunResults,
a plan.json with its night's date and a machine fingerprint) whose throughput
follows a level with seeded noise, so where a change is planted is known.
"""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
from conftest import run_cli
from factories import completed, plan, write_results

from ampcert import session
from ampcert.errors import UserError
from ampcert.history.changepoints import change_points, judge
from ampcert.history.store import SCHEMA_VERSION, open_store

SPECS = plan({"name": "nightly", "precisions": ["fp32", "bf16"], "seeds": [0, 1],
              "workloads": [{"workload": "digits"}]})
NOISE_CV = 0.01


def night_folder(root, index: int, level: float, rng, suite: str = "nightly"):
    runs = [completed(s, final_metric=0.95, samples_per_s=5000 * level * (1 + NOISE_CV * rng.standard_normal()))
            for s in SPECS]
    folder = write_results(root / f"night-{index:02d}", runs, suite=suite)
    plan_file = folder / "plan.json"
    data = json.loads(plan_file.read_text())
    data |= {"created_at": f"2026-10-{1 + index // 24:02d}T{index % 24:02d}:00:00+00:00",
             "environment": {"hostname": "ci-runner-1", "cpu": {"model": "Test CPU"}}}
    plan_file.write_text(json.dumps(data))
    return folder


def history(tmp_path, levels, seed=0):
    rng = np.random.default_rng(seed)
    return [night_folder(tmp_path, i, level, rng) for i, level in enumerate(levels)]


def test_adding_a_folder_twice_records_it_once(tmp_path):
    store = str(tmp_path / "h.sqlite")
    folders = history(tmp_path, [1.0, 1.0])
    assert [added for _, added in session.history_add(folders, store=store)] == [True, True]
    assert [added for _, added in session.history_add([folders[0]], store=store)] == [False]
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT COUNT(*) FROM nights").fetchone()[0] == 2
        points = db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
    session.history_add(folders, store=store)
    with sqlite3.connect(store) as db:
        assert db.execute("SELECT COUNT(*) FROM points").fetchone()[0] == points
    assert [n.machine for n in session.history_show(store=store)] == ["ci-runner-1 / Test CPU"] * 2


def test_a_planted_5_percent_throughput_drop_is_found_at_its_night(tmp_path):
    store = str(tmp_path / "h.sqlite")
    levels = [1.0] * 30 + [0.95] * 10
    folders = history(tmp_path, levels)
    session.history_add(folders[:30], store=store)
    first_fail = None
    for night, folder in enumerate(folders[30:], start=30):
        result = session.gate_history(folder, store=store)
        row = next(r for r in result.rows if r.metric == "samples_per_s" and r.subject.endswith("/fp32"))
        if row.status == "REGRESSION" and first_fail is None:
            first_fail = night
            assert row.change_night == json.loads((folders[30] / "plan.json").read_text())["created_at"]
            assert -0.07 < row.change < -0.03 and result.status == "FAIL"
        session.history_add([folder], store=store)
    assert first_fail is not None and first_fail <= 32, first_fail  # seen within 3 nights of the drop


def test_a_bf16_only_slowdown_is_found_by_the_paired_speedup_under_machine_noise(tmp_path):
    """A runner whose load moves each night's throughput by 10% (both precisions alike, as
    interleaved runs of a seed see it), and from night 30 bf16 alone 5% slower: the
    absolute series cannot tell that from the noise; the in-night speedup, paired by
    seed, sees it within 3 nights. The first 30 nights alone raise no alarm."""
    rng = np.random.default_rng(7)
    store = str(tmp_path / "h.sqlite")
    folders = []
    for night in range(33):
        machine = 1 + 0.10 * rng.standard_normal()  # the night's load: both precisions alike
        runs = []
        for spec in SPECS:
            slow = 0.95 if spec.precision == "bf16" and night >= 30 else 1.0
            gain = 1.3 if spec.precision == "bf16" else 1.0
            speed = 5000 * machine * gain * slow * (1 + 0.005 * rng.standard_normal())
            runs.append(completed(spec, final_metric=0.95, samples_per_s=speed))
        folder = write_results(tmp_path / f"night-{night:02d}", runs, suite="nightly")
        data = json.loads((folder / "plan.json").read_text())
        data |= {"created_at": f"2026-10-{1 + night // 24:02d}T{night % 24:02d}:00:00+00:00",
                 "environment": {"hostname": "noisy-runner", "cpu": {"model": "Test CPU"}}}
        (folder / "plan.json").write_text(json.dumps(data))
        folders.append(folder)
    session.history_add(folders[:20], store=store)
    for folder in folders[20:30]:  # noise only: nothing flagged
        assert session.gate_history(folder, store=store).status == "PASS"
        session.history_add([folder], store=store)
    flagged = []
    for folder in folders[30:]:
        rows = session.gate_history(folder, store=store).rows
        flagged += [(r.metric, r.subject) for r in rows if r.status == "REGRESSION"]
        session.history_add([folder], store=store)
    assert ("paired_speedup_vs_fp32", "digits/torch/native/bf16") in flagged, flagged
    assert not [f for f in flagged if f[1].endswith("/fp32")]  # fp32 did not change


def test_a_history_of_pure_noise_passes_the_gate(tmp_path):
    store = str(tmp_path / "h.sqlite")
    folders = history(tmp_path, [1.0] * 40, seed=1)
    session.history_add(folders[:-1], store=store)
    done = run_cli("gate", folders[-1], "--store", store, "--json-out", tmp_path / "gate.json",
                   "--markdown", tmp_path / "gate.md")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS: no regression in the history" in done.stdout
    data = json.loads((tmp_path / "gate.json").read_text())
    assert data["status"] == "PASS" and {r["metric"] for r in data["rows"]} >= {"samples_per_s", "final_metric"}
    assert (tmp_path / "gate.md").read_text().startswith("### :white_check_mark: ampcert history gate: PASS")


def test_change_points_sit_where_the_levels_change():
    rng = np.random.default_rng(3)
    x = np.r_[np.full(15, 100.0), np.full(15, 90.0)] + rng.normal(0, 0.5, 30)
    assert change_points(x) == [15]
    assert judge(list(x[:17]), higher_is_better=True).status == "REGRESSION"
    assert judge(list(x[:17]), higher_is_better=False).status == "IMPROVEMENT"
    assert judge(list(x[:15]), higher_is_better=True).status == "OK"
    assert judge([1.0, 1.0, 1.0], higher_is_better=True).status == "SHORT"


def bytes_of(path):
    return path.read_bytes() if path.exists() else None


def test_bad_stores_and_folders_are_one_line_exit_2_and_leave_the_store_unchanged(tmp_path):
    folder = history(tmp_path, [1.0])[0]
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(b"not a database at all" * 40)
    other = tmp_path / "other.sqlite"
    session.history_add([folder], store=str(other))
    other_suite = night_folder(tmp_path, 7, 1.0, np.random.default_rng(0), suite="another-suite")
    cases = [
        (("history", "add", folder, "--store", corrupt), corrupt, "not an SQLite database"),
        (("gate", folder, "--store", corrupt), corrupt, "not an SQLite database"),
        (("gate", other_suite, "--store", other), other, "a folder from another suite"),
        (("history", "add", tmp_path / "missing", "--store", other), other, "results folder not found"),
        (("gate", folder, "--store", "postgresql://ampcert@127.0.0.1:1/history"), None, "cannot open it"),
    ]
    for args, store_file, message in cases:
        before = bytes_of(store_file) if store_file else None
        done = run_cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, done.stderr)
        if store_file:
            assert bytes_of(store_file) == before


def test_a_plan_of_the_wrong_shape_is_one_line_or_recorded_as_not_known(tmp_path):
    store = tmp_path / "h.sqlite"
    folder = history(tmp_path, [1.0])[0]
    plan_file = folder / "plan.json"
    good = json.loads(plan_file.read_text())
    for created_at, message in (("yesterday", "not an ISO 8601"), ("2026-10-01T12:00:00", "no time zone")):
        plan_file.write_text(json.dumps(good | {"created_at": created_at}))
        done = run_cli("history", "add", folder, "--store", store)
        assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert not store.exists()
    # a fingerprint from elsewhere, of the wrong shape; a date in another zone is kept in UTC
    plan_file.write_text(json.dumps(good | {"created_at": "2026-10-01T14:00:00+02:00",
                                            "environment": {"hostname": "h", "cpu": "x", "gpu": [1]}}))
    assert session.history_add([folder], store=str(store))[0][1]
    (night,) = session.history_show(store=str(store))
    assert night.created_at == "2026-10-01T12:00:00+00:00" and night.machine == "h / unknown CPU"


def test_reading_a_store_that_is_not_there_is_one_line_and_creates_nothing(tmp_path):
    folder = history(tmp_path, [1.0])[0]
    missing = tmp_path / "mistyped.sqlite"
    for args in (("history", "show"), ("history", "plot", tmp_path / "x.svg"), ("gate", folder)):
        done = run_cli(*args, "--store", missing)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, (args, done.stderr)
        assert "no such file" in done.stderr and not missing.exists()


def test_the_gate_table_piped_at_80_columns_names_every_subject_whole(tmp_path):
    store = tmp_path / "h.sqlite"
    folders = history(tmp_path, [1.0] * 7)
    session.history_add(folders[:-1], store=str(store))
    done = run_cli("gate", folders[-1], "--store", store, env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stdout + done.stderr
    for precision in ("fp32", "bf16"):
        assert f"digits/torch/native/{precision}" in done.stdout
    assert "…" not in done.stdout


def test_stores_of_another_kind_or_a_newer_ampcert_are_refused(tmp_path):
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE invoices (id INTEGER)")
    with pytest.raises(UserError, match="not an ampcert history store"):
        open_store(str(foreign))
    newer = tmp_path / "newer.sqlite"
    open_store(str(newer))
    with sqlite3.connect(newer) as db:
        db.execute("UPDATE ampcert_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(UserError, match="written by a newer ampcert"):
        open_store(str(newer))
    with sqlite3.connect(newer) as db:
        db.execute("UPDATE ampcert_meta SET value = '0' WHERE key = 'schema_version'")
    with pytest.raises(UserError, match="schema 0 is older than any"):
        open_store(str(newer))


def test_a_store_of_an_older_schema_is_migrated_in_place_and_keeps_its_nights(tmp_path, monkeypatch):
    from ampcert.history import store as store_module

    path = tmp_path / "h.sqlite"
    folders = history(tmp_path, [1.0, 1.0])
    session.history_add(folders, store=str(path))
    # The next schema, as a release that changed it would ship it: version 2 adds a column.
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(store_module.MIGRATIONS, 1, ["ALTER TABLE nights ADD COLUMN note TEXT"])
    assert [added for _, added in session.history_add(folders, store=str(path))] == [False, False]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM ampcert_meta WHERE key = 'schema_version'").fetchone() == ("2",)
        assert "note" in {row[1] for row in db.execute("PRAGMA table_info(nights)")}
        assert db.execute("SELECT COUNT(*) FROM nights").fetchone()[0] == 2


def test_the_page_and_the_plot_show_the_series_and_its_change_point(tmp_path):
    store = str(tmp_path / "h.sqlite")
    folders = history(tmp_path, [1.0] * 12 + [0.9] * 3)
    session.history_add(folders[:-1], store=store)
    result = session.gate_history(folders[-1], store=store)
    assert result.status == "FAIL"
    written = session.write_history_gate_outputs(result, None, None, tmp_path / "gate.html")
    page = written[0].read_text()
    assert page.count("<svg") >= 2 and "REGRESSION" in page and "2026-10-01T12:00:00+00:00" in page
    svg = session.history_plot(tmp_path / "tp.svg", store=store).read_text()
    assert svg.startswith("<svg") and "digits/torch/native/fp32" in svg and "2026-10-01" in svg
    with pytest.raises(UserError, match="^metric speed: expected one of") as bad:  # the API's words
        session.history_plot(tmp_path / "x.svg", store=store, metric="speed")
    assert bad.value.as_option() == f"--metric speed: {bad.value.detail}"  # the CLI's


def test_the_gate_names_what_changed_in_the_software_since_the_night_before(tmp_path):
    store = str(tmp_path / "h.sqlite")
    folders = history(tmp_path, [1.0] * 4)
    for i, (torch, commit) in enumerate([("2.13.0", "a" * 40)] * 3 + [("2.14.1", "b" * 40)]):
        data = json.loads((folders[i] / "plan.json").read_text())
        data["environment"]["packages"] = {"torch": torch}
        data["tool"] = "ampcert 0.4.0"
        data["code"] = {"jobs": {"bert": {"git": {"commit": commit, "dirty": False}}}}
        (folders[i] / "plan.json").write_text(json.dumps(data))
    session.history_add(folders[:3], store=store)
    assert session.gate_history(folders[2], store=store).notes == []  # the same stack as the night before
    (note,) = session.gate_history(folders[3], store=store).notes
    assert "torch 2.13.0 -> 2.14.1" in note and f"job bert commit {'a' * 12} -> {'b' * 12}" in note
    assert "ampcert" not in note
