"""The history gate on real nights: ``ampcert run`` end to end, night after night, with a
regression that lands from outside the suite.

Each night is ``ampcert run`` of a digits suite (fp32 and bf16, one seed) in its own
process, as a nightly job's would be, with the speed probe after the certified runs.
The workload is tests/fault_workloads.py's ``regressed``: digits, unless the file named
by ``$AMPCERT_TEST_REGRESSION`` says that a path is slower (a busy wait of that fraction
of each of its steps' own time). The suite, and so every run id, never changes: the gate
must see the regression in the speed alone.

Eight clean nights make the history, and the gate passes each of the last three as it
comes (judged, not SHORT: six nights are the least it judges). Then two futures branch
from it, each at most three nights long:

- bf16's path alone 5% slower: the gate must flag it within three nights on the gain
  question (bf16 lost part of its speed-up over FP32), and nothing of FP32's (bf16's
  step got slower too: its speed may be flagged as well, even a night sooner);
- every precision 5% slower: flagged within three nights on the speed question, and the
  gain, which both paths lost alike, not.

Nights are dated a day apart (plan.json's ``created_at``, which orders them in the
store). The gain is gated on the probe's speed-up here because it is the steadiest:
on a 2-core VM the whole runs' paired speed-up moves ~4% from night to night, the probe's
~0.6% (docs/gate.md). Speed is timed, so it runs alone, with the serial tests.
"""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import run_cli

from ampcert import session
from ampcert.results import load

SUITE = {
    "name": "nightly-real",
    "device": "cpu",
    "amp": "native",
    "precisions": ["fp32", "bf16"],
    "seeds": [0],
    "train": {"steps": 600, "eval_every": 600},
    "speed_probe": {"share": 1.0, "max_seconds": 4.0, "processes": 5},
    "workloads": [{"workload": "fault_workloads:regressed", "id": "digits"}],
}
HISTORY, FUTURE = 8, 3
BF16, FP32 = "digits/torch/native/bf16", "digits/torch/native/fp32"


def night(root, day: int, branch: str, regression: dict[str, float] | None = None):
    suite = root / "suite.yaml"
    if not suite.exists():
        suite.write_text(yaml.safe_dump(SUITE))
    control = root / f"{branch}-{day}.json"
    control.write_text(json.dumps(regression or {}))
    folder = root / f"{branch}-night-{day:02d}"
    done = run_cli("run", suite, "--out", folder, env={"AMPCERT_TEST_REGRESSION": str(control)})
    assert done.returncode == 0, done.stdout + done.stderr
    plan_file = folder / "plan.json"
    plan = json.loads(plan_file.read_text())
    plan["created_at"] = f"2026-10-{day + 1:02d}T02:00:00+00:00"
    plan_file.write_text(json.dumps(plan))
    return folder


def gated(result, question: str) -> list[tuple[str, str, str]]:
    return [(r.subject, r.metric, r.status) for r in result.rows if r.question == question and r.gated]


def nights_until(root, store: str, branch: str, regression: dict[str, float], question: str):
    """Nights with ``regression`` until the gate flags ``question`` (at most FUTURE): the last
    night's folder and every night's result."""
    results = []
    for day in range(HISTORY, HISTORY + FUTURE):
        folder = night(root, day, branch, regression)
        results.append(session.gate_history(folder, store=store))
        session.history_add([folder], store=store)
        if any(r.question == question for r in results[-1].regressions):
            break
    return folder, results


@pytest.mark.serial  # speed is gated: a test beside it on the other core moves it
@pytest.mark.timeout(900)
def test_a_5_percent_regression_landed_outside_the_suite_is_flagged_on_the_right_question(tmp_path):
    low, every = str(tmp_path / "low.sqlite"), str(tmp_path / "all.sqlite")
    history = []
    for day in range(HISTORY):
        folder = night(tmp_path, day, "history")
        history.append(folder)
        if day >= 5:  # the same code again: judged (six nights and more), and it passes
            result = session.gate_history(folder, store=low)
            assert result.status == "PASS", [(r.subject, r.metric, r.change) for r in result.regressions]
            assert {(s, status) for s, _, status in gated(result, "gain")} == {(BF16, "OK")}
            assert {(s, status) for s, _, status in gated(result, "speed")} == {(BF16, "OK"), (FP32, "OK")}
        for store in (low, every):
            session.history_add([folder], store=store)
    ids = sorted(r.run_id for r in load(history[0]).runs + load(history[0]).probe_runs)

    # bf16's path alone 5% slower. Its step got slower too, so its speed may be flagged
    # first (a night before the gain, at the earliest): the nights go on until the gain is.
    folder, results = nights_until(tmp_path, low, "low", {"low": 0.05}, "gain")
    assert sorted(r.run_id for r in load(folder).runs + load(folder).probe_runs) == ids  # the same runs
    flagged = {(r.subject, r.question) for result in results for r in result.regressions}
    assert (BF16, "gain") in flagged, f"bf16 5% slower: its gain was not flagged within {FUTURE} nights: " \
                                      f"{[gated(result, 'gain') for result in results]}"
    assert flagged <= {(BF16, "gain"), (BF16, "speed")}, flagged  # FP32 ran the same code
    gain = next(r for r in results[-1].regressions if r.question == "gain")
    assert -0.09 < gain.change < -0.02, gain.change  # 1/1.05 - 1 = -4.8%
    assert any("gain: gated on" in line for line in results[-1].signals), results[-1].signals

    # Every path 5% slower: the speed question, and never the gain, which both lost alike.
    folder, results = nights_until(tmp_path, every, "all", {"all": 0.05}, "speed")
    flagged = [r for result in results for r in result.regressions]
    assert any(r.question == "speed" for r in flagged), \
        f"every path 5% slower was not flagged within {FUTURE} nights: {gated(results[-1], 'speed')}"
    assert {r.question for r in flagged} == {"speed"}, [(r.subject, r.question) for r in flagged]
    assert all(0.02 < abs(r.change) < 0.09 for r in flagged), [r.change for r in flagged]
