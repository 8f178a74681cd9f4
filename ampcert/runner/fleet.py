"""Fleets: a suite's runs placed by a cluster engine (Ray, Slurm), one driver for all.

An executor only places runs and reports how each ended; everything else is
decided here, the same way for every engine:

- **What a run asks for** (:func:`resources`): GPUs from its spec (one for a
  CUDA run, ``nproc_per_node`` for a torchrun run, all on one node), CPUs as
  given (``--cpus-per-run``; a CPU run's torch uses that many threads).
- **What runs on the node** (:func:`run_on_node`): the local orchestrator's
  ``run_one`` in a node-local temporary folder, so the run is isolated in its
  own process with its timeout exactly as a local run is, and telemetry is
  sampled on the node that trains. The run folder's files come back as bytes:
  no file system needs to be shared with the node.
- **How results come home** (:func:`store_payload`): what a node returns is
  input from elsewhere, so it is validated (file names, a result.json that is
  this run's RunResult) and then written into the one results folder
  atomically, result.json last. The folder is then a local run's folder:
  ``--resume`` (with any executor), ``report``, ``merge`` read it alike.
- **Retries**: a run whose worker process or node was lost (the executor
  returns :class:`Lost`) is submitted again, up to ``retries`` times, then
  recorded failed (``worker_lost``) with every attempt's reason. A run that
  failed by itself (divergence, an exception, its timeout) returns a failed
  result like any other and is never retried: doing it again would hide a
  finding.
- **fleet.jsonl**: one line per submission, start, loss, retry and result, in
  the results folder, for reading what the cluster did afterwards.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from ampcert.atomic import atomic_write_bytes
from ampcert.errors import UserError
from ampcert.results import FailureKind, ResultsDir, RunResult, atomic_write_json
from ampcert.spec import RunSpec

Event = dict[str, Any]
EXECUTORS = ("local", "ray", "slurm")
FLEET_LOG = "fleet.jsonl"
# Files a node may send back for its run folder: plain names, none hidden.
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_MAX_REASON = 400
# A run's step events reach the driver at most this often (a cluster's event
# channel carries every run at once; the progress bar needs no more).
STEP_EVENT_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Resources:
    """What one run asks the cluster for, all on one node."""

    cpus: int
    gpus: int

    def __str__(self) -> str:
        return f"{self.cpus} CPU" + (f", {self.gpus} GPU" if self.gpus else "")


@dataclass(frozen=True)
class Lost:
    """A run that came back without a result: its worker, node or job was lost."""

    reason: str


class Executor(Protocol):
    """A cluster engine that places runs (see ray_executor, slurm_executor).

    ``submit`` hands runs over and returns one ticket per run (any hashable);
    ``poll`` waits up to ``timeout_s`` and returns the runs that ended, each
    with the payload :func:`run_on_node` returned or :class:`Lost`, and the
    events nodes sent meanwhile; ``cancel`` stops everything submitted (an
    interrupted command); ``close`` lets go of the cluster."""

    name: str
    capacity: int | None  # runs in flight at most; None: the engine queues them

    def check(self, runs: Sequence[RunSpec], cpus_per_run: int) -> None: ...

    def submit(self, specs: Sequence[RunSpec], cpus_per_run: int) -> list[Any]: ...

    def poll(self, timeout_s: float) -> tuple[list[tuple[Any, dict[str, Any] | Lost]], list[Event]]: ...

    def cancel(self) -> None: ...

    def close(self) -> None: ...


def resources(spec: RunSpec, cpus_per_run: int) -> Resources:
    ranks = spec.nproc_per_node if spec.launcher == "torchrun" else 1
    return Resources(cpus=cpus_per_run * ranks, gpus=ranks if spec.device == "cuda" else 0)


def check_runs(runs: Sequence[RunSpec], executor: str) -> None:
    """What no executor but local can run: a multi-node torchrun world is one
    rendezvous started on each node by hand (see docs/distributed.md)."""
    for spec in runs:
        if spec.launcher == "torchrun" and spec.nnodes > 1:
            raise UserError(f"run {spec.run_id}: a torchrun world of {spec.nnodes} nodes is started on each node "
                            f"(`ampcert run --executor local` there); --executor {executor} places one-node runs")


def short_reason(text: str) -> str:
    """The first line of an engine's error, bounded (Ray's run to pages)."""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "no reason given")
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."


# --------------------------------------------------------------------------- on the node


def run_on_node(spec_json: str, send: Callable[[Event], None] | None = None) -> dict[str, Any]:
    """Train one run on this node and return its run folder's files.

    The run trains as a local run does (``orchestrator.run_one``: its own
    process, its timeout) in a temporary folder that is removed afterwards.
    ``send`` carries events to the driver: ``running`` once training has
    started (with this node's name and this process's pid), then ``step``
    events at most every :data:`STEP_EVENT_INTERVAL_S`."""
    from ampcert.runner.orchestrator import run_one

    spec = RunSpec.model_validate_json(spec_json)
    node, pid = socket.gethostname(), os.getpid()
    started = False
    last = 0.0

    def on_event(event: Event) -> None:
        nonlocal started, last
        if send is None:
            return
        if not started:
            started = True
            send({"kind": "running", "run_id": spec.run_id, "node": node, "pid": pid})
        now = time.monotonic()
        if now - last >= STEP_EVENT_INTERVAL_S:
            last = now
            send({"kind": "step", **event, "run_id": spec.run_id})

    with tempfile.TemporaryDirectory(prefix="ampcert-run-") as tmp:
        run_one(spec, Path(tmp), on_event)
        run_dir = ResultsDir(Path(tmp)).run_dir(spec.run_id)
        files = {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())
                 if p.is_file() and not p.is_symlink() and not p.name.startswith(".")}
    return {"run_id": spec.run_id, "node": node, "pid": pid, "files": files}


# --------------------------------------------------------------------------- back home


def store_payload(rd: ResultsDir, spec: RunSpec, payload: object) -> RunResult | str:
    """Write a node's run files into the results folder; the stored result, or
    why the payload cannot be trusted (nothing is written then)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("files"), dict):
        return "the node returned no run files"
    files: dict[Any, Any] = payload["files"]
    for name, data in files.items():
        if not isinstance(name, str) or not _FILE_NAME.match(name) or not isinstance(data, bytes):
            return f"the node returned a file ampcert does not write: {str(name)[:80]!r}"
    if "result.json" not in files:
        return "the node returned no result.json"
    try:
        result = RunResult.model_validate_json(files["result.json"])
    except ValidationError as exc:
        return f"the node's result.json is not a run result: {short_reason(str(exc))}"
    if result.run_id != spec.run_id or result.spec != spec:
        return f"the node's result.json is for another run ({result.run_id})"
    run_dir = rd.run_dir(spec.run_id)
    # What an earlier attempt (a resumed failed run) left and this one did not write.
    for stale in ("error.txt", "run.mllog", "telemetry.csv"):
        if stale not in files:
            (run_dir / stale).unlink(missing_ok=True)
    for name in sorted(files):
        if name != "result.json":
            atomic_write_bytes(run_dir / name, files[name])
    atomic_write_bytes(rd.result_file(spec.run_id), files["result.json"])  # last: the run is done once it is
    return result


class FleetLog:
    """``fleet.jsonl``: what the cluster did, a line per event (appended whole)."""

    def __init__(self, root: Path, executor: str):
        self.path = root / FLEET_LOG
        self.executor = executor

    def write(self, event: str, run_id: str, **fields: Any) -> None:
        line = {"time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                "executor": self.executor, "event": event, "run_id": run_id, **fields}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")


def lost_result(spec: RunSpec, executor: str, reasons: list[str], retries: int) -> RunResult:
    from ampcert.runner.worker import now_iso

    tries = f"{len(reasons)} attempt" + ("s" if len(reasons) != 1 else "")
    reason = f"lost on {executor} after {tries} (--retries {retries}): " + "; ".join(
        f"{i}: {r}" for i, r in enumerate(reasons, 1))
    return RunResult(run_id=spec.run_id, spec=spec, status="failed", reason=reason,
                     failure=FailureKind.WORKER_LOST, finished_at=now_iso(),
                     accelerated=spec.accelerated, capability_note=spec.capability_note)


def run_fleet(root: Path, todo: Sequence[RunSpec], executor: Executor, *, retries: int, cpus_per_run: int,
              total: int, on_event: Callable[[Event], None]) -> None:
    """Run ``todo`` on ``executor`` into the results folder ``root``; see the module's docstring.

    Runs are submitted at once (or ``executor.capacity`` at a time) and stored
    as they end, in any order. An exception (an interrupt) cancels what is in
    flight: those runs have no result and stay pending for ``--resume``."""
    from ampcert.runner.orchestrator import skipped_result

    rd = ResultsDir(root)
    log = FleetLog(root, executor.name)
    on_event({"kind": "plan", "total": total, "todo": len(todo)})
    waiting: deque[RunSpec] = deque()
    for spec in todo:
        if spec.skip_reason:
            on_event({"kind": "start", "run_id": spec.run_id, "limit": spec.train.step_limit})
            result = skipped_result(spec)
            atomic_write_json(rd.result_file(spec.run_id), result)
            on_event({"kind": "done", "run_id": spec.run_id, "result": result})
        else:
            waiting.append(spec)
    attempts: Counter[str] = Counter()
    reasons: defaultdict[str, list[str]] = defaultdict(list)
    in_flight: dict[Any, RunSpec] = {}
    started: set[str] = set()

    def submit_waiting() -> None:
        room = len(waiting) if executor.capacity is None else max(executor.capacity - len(in_flight), 0)
        batch = [waiting.popleft() for _ in range(min(room, len(waiting)))]
        if not batch:
            return
        for spec, ticket in zip(batch, executor.submit(batch, cpus_per_run), strict=True):
            attempts[spec.run_id] += 1
            in_flight[ticket] = spec
            log.write("submitted", spec.run_id, attempt=attempts[spec.run_id],
                      resources=str(resources(spec, cpus_per_run)))

    def start(spec: RunSpec, event: Event) -> None:
        log.write("running", spec.run_id, attempt=attempts[spec.run_id],
                  **{k: event[k] for k in ("node", "pid") if k in event})
        if spec.run_id not in started:
            started.add(spec.run_id)
            on_event({"kind": "start", "run_id": spec.run_id, "limit": spec.train.step_limit,
                      "node": event.get("node")})

    by_id = {spec.run_id: spec for spec in waiting}
    try:
        submit_waiting()
        while in_flight:
            ended, events = executor.poll(0.5)
            for event in events:
                spec_of = by_id.get(str(event.get("run_id")))
                if spec_of is None:
                    continue
                if event.get("kind") == "running":
                    start(spec_of, event)
                elif event.get("kind") == "step" and spec_of.run_id in started:
                    on_event({**event, "kind": "step", "limit": spec_of.train.step_limit})
            for ticket, outcome in ended:
                spec = in_flight.pop(ticket)
                stored = (store_payload(rd, spec, outcome) if not isinstance(outcome, Lost)
                          else outcome.reason)
                if isinstance(stored, RunResult):
                    where = outcome.get("node") if isinstance(outcome, dict) else None
                    log.write("done", spec.run_id, attempt=attempts[spec.run_id], status=stored.status, node=where)
                    on_event({"kind": "done", "run_id": spec.run_id, "result": stored})
                    continue
                reasons[spec.run_id].append(short_reason(stored))
                log.write("lost", spec.run_id, attempt=attempts[spec.run_id], reason=short_reason(stored))
                if attempts[spec.run_id] <= retries:
                    log.write("retry", spec.run_id, attempt=attempts[spec.run_id] + 1)
                    on_event({"kind": "retry", "run_id": spec.run_id, "attempt": attempts[spec.run_id] + 1,
                              "reason": short_reason(stored)})
                    waiting.appendleft(spec)
                else:
                    result = lost_result(spec, executor.name, reasons[spec.run_id], retries)
                    atomic_write_json(rd.result_file(spec.run_id), result)
                    log.write("done", spec.run_id, attempt=attempts[spec.run_id], status="failed")
                    on_event({"kind": "done", "run_id": spec.run_id, "result": result})
            submit_waiting()
    except BaseException:
        executor.cancel()
        raise
