"""`ampcert check`: MLLOG compliance with declarative rules, violations with file and line."""

from __future__ import annotations

import json

from factories import warm_cli

from ampcert.certify.compliance import check_log, load_compliance_rules


def _log(path, events):
    lines = ["# a comment line mllog ignores"]
    for i, (key, etype, value, meta) in enumerate(events):
        lines.append(":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1000 + i, "event_type": etype,
                                               "key": key, "value": value, "metadata": meta}))
    path.write_text("\n".join(lines) + "\n")
    return path


S, E, P = "INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME"
GOOD = [("init_start", S, None, {}), ("submission_benchmark", P, "w", {}), ("seed", P, 0, {}),
        ("global_batch_size", P, 64, {}), ("precision", P, "bf16", {}), ("train_samples", P, 100, {}),
        ("eval_samples", P, 10, {}), ("init_stop", E, None, {}), ("run_start", S, None, {}),
        ("block_start", S, None, {}), ("block_stop", E, None, {}), ("eval_start", S, None, {}),
        ("eval_accuracy", P, 0.9, {}), ("eval_stop", E, None, {}), ("run_stop", E, None, {"status": "success"})]


def test_a_compliant_log_passes(tmp_path):
    assert check_log(_log(tmp_path / "ok.mllog", GOOD), load_compliance_rules()) == []


def test_missing_run_stop_and_wrong_order_are_reported_with_lines(tmp_path):
    rules = load_compliance_rules()
    missing = check_log(_log(tmp_path / "a.mllog", GOOD[:-1]), rules)
    assert [str(v) for v in missing] == [f"{tmp_path / 'a.mllog'}:15: keys.run_stop: expected exactly one "
                                        "run_stop, found 0 (the log ends at line 15)"]
    swapped = GOOD[:8] + [GOOD[-1]] + GOOD[8:-1]  # run_stop before run_start
    out = check_log(_log(tmp_path / "b.mllog", swapped), rules)
    assert any(v.rule == "order" and v.line == 10 and "before run_start (line 11)" in v.message for v in out)
    assert any(v.rule == "within" for v in out)


def test_value_checks_and_garbage_lines(tmp_path):
    events = [e if e[0] != "run_stop" else ("run_stop", E, None, {"status": "crashed"}) for e in GOOD]
    events = [e if e[0] != "seed" else ("seed", P, "zero", {}) for e in events]
    path = _log(tmp_path / "c.mllog", events)
    path.write_text(path.read_text() + ":::MLLOG {not json\n")
    out = {v.rule: v for v in check_log(path, load_compliance_rules())}
    assert "expected one of ['success', 'aborted'], got 'crashed'" in out["values.run_stop.metadata.status"].message
    assert "expected a integer" in out["values.seed.value"].message or "integer" in out["values.seed.value"].message
    assert out["format"].line == 17


def test_check_cli_on_real_logs_and_bad_ones(tmp_path):
    good = _log(tmp_path / "good.mllog", GOOD)
    proc = warm_cli("check", good)
    assert proc.returncode == 0 and "0 violation(s)" in proc.stdout, proc.stdout + proc.stderr
    bad = _log(tmp_path / "bad.mllog", GOOD[:-1])
    proc = warm_cli("check", good, bad)
    assert proc.returncode == 1 and f"{bad}:15: keys.run_stop" in proc.stdout
    proc = warm_cli("check", tmp_path / "nope.mllog")
    assert proc.returncode == 2 and "no such log file" in proc.stderr
    rules = tmp_path / "rules.yaml"
    rules.write_text("name: r\nkeys:\n  - {key: a, count: sometimes}\n")
    proc = warm_cli("check", good, "--rules", rules)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_events_after_a_rank_prefix_count_and_an_event_without_a_time_is_a_format_violation(tmp_path):
    """The one MLLOG reader finds the marker anywhere in a line, as MLPerf's tools do (a
    multi-rank job's `0: :::MLLOG ...`); a marked line that is not a whole event, such as
    one without its time_ms, is a format violation on its line, and the check goes on."""
    path = _log(tmp_path / "ranks.mllog", GOOD)
    path.write_text("".join(f"0: {line}\n" if line.startswith(":::MLLOG") else f"{line}\n"
                            for line in path.read_text().splitlines()))
    assert check_log(path, load_compliance_rules()) == []
    path.write_text(path.read_text() + '0: :::MLLOG {"key": "x", "event_type": "POINT_IN_TIME", "value": 1}\n')
    (bad,) = check_log(path, load_compliance_rules())
    assert (bad.line, bad.rule) == (17, "format") and "no time_ms" in bad.message
