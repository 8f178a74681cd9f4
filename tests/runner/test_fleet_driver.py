"""The fleet driver (ampcert.runner.fleet.run_fleet) on synthetic outcomes.

``ScriptedEngine`` is a stand-in for a cluster engine, named as such: it
returns, per run and attempt, what a test scripts (a node's payload built from
a real RunResult, or Lost), so retries, payload validation, capacity and
cancellation are checked without a cluster. The real engines are exercised in
test_fleet_engines.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import completed, failed, plan

from ampcert.errors import BadArgument
from ampcert.results import FailureKind, ResultsDir
from ampcert.runner.executors import FleetOptions
from ampcert.runner.fleet import FLEET_LOG, Lost, Resources, resources, run_fleet, store_payload
from ampcert.spec import Launch

SPECS = plan({"name": "fleet", "precisions": ["fp32", "bf16"], "seeds": [0, 1],
              "workloads": [{"workload": "digits"}]})


def payload(result) -> dict:
    return {"run_id": result.run_id, "node": "node-a", "pid": 1,
            "files": {"result.json": result.model_dump_json().encode(), "run.mllog": b":::MLLOG {}\n"}}


class ScriptedEngine:
    """A stand-in for Ray or Slurm: outcomes come from ``script[run_id]``, one per attempt."""

    name = "scripted"
    keeps_log = True

    def __init__(self, script: dict, capacity: int | None = None, interrupt_after: int | None = None):
        self.script = {k: list(v) for k, v in script.items()}
        self.capacity = capacity
        self.in_flight: list = []
        self.submissions: list[str] = []
        self.most_in_flight = 0
        self.cancelled = False
        self.interrupt_after = interrupt_after

    def check(self, runs, cpus_per_run):
        pass

    def submit(self, specs, cpus_per_run):
        tickets = []
        for spec in specs:
            ticket = (spec.run_id, len(self.submissions))
            self.submissions.append(spec.run_id)
            self.in_flight.append((ticket, spec))
            tickets.append(ticket)
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight))
        return tickets

    def poll(self, timeout_s):
        if self.interrupt_after is not None and len(self.submissions) >= self.interrupt_after:
            raise KeyboardInterrupt
        ticket, spec = self.in_flight.pop(0)
        outcome = self.script[spec.run_id].pop(0)
        event = {"kind": "running", "run_id": spec.run_id, "node": "node-a", "pid": 1}
        return [(ticket, outcome(spec) if callable(outcome) else outcome)], [event]

    def cancel(self):
        self.cancelled = True

    def close(self):
        pass


def ok(spec):
    return payload(completed(spec, final_metric=0.9))


def drive(tmp_path: Path, engine, retries=2, specs=SPECS) -> tuple[ResultsDir, list[dict]]:
    events: list[dict] = []
    run_fleet(tmp_path, specs, engine, retries=retries, cpus_per_run=1, total=len(specs), on_event=events.append)
    return ResultsDir(tmp_path), events


def fleet_log(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / FLEET_LOG).read_text().splitlines()]


def test_a_lost_run_is_submitted_again_and_its_second_attempt_stored(tmp_path):
    lost_id = SPECS[1].run_id
    script = {s.run_id: [ok] for s in SPECS} | {lost_id: [Lost("WorkerCrashedError: the worker died"), ok]}
    rd, events = drive(tmp_path, ScriptedEngine(script))
    assert all(rd.read_result(s.run_id).status == "completed" for s in SPECS)
    assert [e["run_id"] for e in events if e["kind"] == "retry"] == [lost_id]
    log = [(e["event"], e["attempt"]) for e in fleet_log(tmp_path) if e["run_id"] == lost_id]
    assert log == [("submitted", 1), ("running", 1), ("lost", 1), ("retry", 2), ("submitted", 2),
                   ("running", 2), ("done", 2)]
    assert (rd.run_dir(lost_id) / "run.mllog").read_bytes() == b":::MLLOG {}\n"


def test_a_run_lost_on_every_attempt_is_recorded_failed_with_each_reason(tmp_path):
    spec = SPECS[0]
    engine = ScriptedEngine({spec.run_id: [Lost(f"NodeDiedError: node {i} died") for i in range(3)]})
    rd, _ = drive(tmp_path, engine, retries=2, specs=[spec])
    result = rd.read_result(spec.run_id)
    assert engine.submissions == [spec.run_id] * 3
    assert result.status == "failed" and result.failure == FailureKind.WORKER_LOST
    assert "after 3 attempts (--retries 2)" in result.reason
    assert all(f"node {i} died" in result.reason for i in range(3))


def test_a_run_that_failed_by_itself_is_not_retried(tmp_path):
    spec = SPECS[0]
    diverged = payload(failed(spec, "loss became nan at step 3"))
    engine = ScriptedEngine({spec.run_id: [diverged, ok]})
    rd, events = drive(tmp_path, engine, specs=[spec])
    assert engine.submissions == [spec.run_id]
    assert rd.read_result(spec.run_id).reason == "loss became nan at step 3"
    assert not [e for e in events if e["kind"] == "retry"]


@pytest.mark.parametrize("bad, why", [
    (lambda s: {"files": {}}, "no result.json"),
    (lambda s: {"nothing": 1}, "no run files"),
    (lambda s: {"files": {"../result.json": b"{}"}}, "does not write"),
    (lambda s: {"files": {"result.json": b"{not json"}}, "not a run result"),
    (lambda s: payload(completed(SPECS[3], final_metric=0.9)), "for another run"),
])
def test_a_payload_that_cannot_be_trusted_writes_nothing_and_counts_as_lost(tmp_path, bad, why):
    spec = SPECS[0]
    assert why in store_payload(ResultsDir(tmp_path), spec, bad(spec))
    assert not (tmp_path / "runs").exists()
    rd, events = drive(tmp_path, ScriptedEngine({spec.run_id: [bad, ok]}), specs=[spec])
    assert rd.read_result(spec.run_id).status == "completed"
    assert why in next(e["reason"] for e in events if e["kind"] == "retry")


def test_capacity_bounds_the_runs_in_flight(tmp_path):
    engine = ScriptedEngine({s.run_id: [ok] for s in SPECS}, capacity=1)
    rd, _ = drive(tmp_path, engine)
    assert engine.most_in_flight == 1 and len(engine.submissions) == len(SPECS)


def test_an_interrupt_cancels_what_is_in_flight_and_leaves_it_pending(tmp_path):
    engine = ScriptedEngine({s.run_id: [ok] for s in SPECS}, interrupt_after=1)
    with pytest.raises(KeyboardInterrupt):
        drive(tmp_path, engine)
    assert engine.cancelled
    assert all(ResultsDir(tmp_path).read_result(s.run_id) is None for s in SPECS)


def test_resources_come_from_the_spec():
    spec = SPECS[0]
    assert resources(spec, 3) == Resources(cpus=3, gpus=0)
    gpu = spec.model_copy(update={"device": "cuda"})
    assert resources(gpu, 1) == Resources(cpus=1, gpus=1)
    ddp = gpu.model_copy(update={"launch": Launch(launcher="torchrun", nproc_per_node=4)})
    assert resources(ddp, 2) == Resources(cpus=8, gpus=4)


@pytest.mark.parametrize("options, message, flag_line", [
    (FleetOptions(executor="k8s"), "executor k8s: expected one of local, ray, slurm",
     "--executor k8s: expected one of local, ray, slurm"),
    (FleetOptions(address="h:1"), "address: only with the ray executor", "--address: only with the ray executor"),
    (FleetOptions(executor="ray", partition="gpu"), "partition: only with the slurm executor",
     "--partition: only with the slurm executor"),
    (FleetOptions(retries=3), "retries: only with the ray or slurm executor", "--retries: only with the ray"),
    (FleetOptions(executor="ray", retries=-1), "retries -1: expected 0 or more", "--retries -1: expected 0"),
    (FleetOptions(executor="slurm", cpus_per_run=0), "cpus_per_run 0: expected 1 or more",
     "--cpus-per-run 0: expected 1 or more"),
])
def test_fleet_options_are_checked_with_one_line(options, message, flag_line):
    """In the API's words (the FleetOptions field), and as the CLI prints it (the flag)."""
    with pytest.raises(BadArgument) as bad:
        options.check()
    assert str(bad.value).startswith(message) and bad.value.as_option().startswith(flag_line), str(bad.value)
