"""The driver: a suite's runs placed by an executor (this machine, Ray, Slurm), one loop for all.

:func:`run_fleet` is the only loop that plans, starts, retries and stores
runs; every command that trains (``run``, ``run --resume``, a cluster node's
own run) goes through it. An executor only places runs and reports how each
ended (:class:`Executor`; this machine's is :mod:`ampcert.runner.local_executor`);
everything else is decided here, the same way for every engine:

- **What a run asks for** (:func:`resources`): GPUs from its spec (one for a
  CUDA run, ``nproc_per_node`` for a torchrun run, all on one node), CPUs as
  given (``--cpus-per-run``; a CPU run's torch uses that many threads).
- **What runs on the node** (:func:`run_on_node`): this driver with the local
  executor, into a node-local temporary folder, so the run is isolated in its
  own process with its timeout exactly as a local run is, and telemetry is
  sampled on the node that trains. The run folder's files come back as bytes:
  no file system needs to be shared with the node.
- **How results come home** (:func:`store_payload`): what a node returns is
  input from elsewhere, so it is validated (file names, a result.json that is
  this run's RunResult) and then written into the one results folder
  atomically, result.json last. The folder is then a local run's folder:
  ``--resume`` (with any executor), ``report``, ``merge`` read it alike. The
  local executor's workers write into the folder themselves: what it returns
  is the stored :class:`~ampcert.results.RunResult`, taken as it is.
- **Retries**: a run whose worker process or node was lost (the executor
  returns :class:`Lost`) is submitted again, up to ``retries`` times, then
  recorded failed (``worker_lost``) with every attempt's reason. A run that
  failed by itself (divergence, an exception, its timeout) returns a failed
  result like any other and is never retried: doing it again would hide a
  finding.
- **fleet.jsonl**: one line per submission, start, loss, retry and result, in
  the results folder, for reading what the cluster did afterwards (engines
  whose ``keeps_log`` is true: the clusters, not this machine).
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
from ampcert.vocabulary import Event, OnEvent

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
    """An engine that places runs (local_executor, ray_executor, slurm_executor).

    ``check`` refuses, with one line, runs it cannot hold (before any is
    submitted); ``submit`` hands runs over and returns one ticket per run (any
    hashable); ``poll`` waits up to ``timeout_s`` and returns the runs that
    ended, each with the payload :func:`run_on_node` returned, :class:`Lost`,
    or (an engine whose workers write into the results folder themselves) the
    stored RunResult, and the events its runs sent meanwhile (``running`` once
    a run trains, then ``step``); ``cancel`` stops everything submitted (an
    interrupted command); ``close`` lets go of the engine."""

    name: str
    capacity: int | None  # runs in flight at most; None: the engine queues them
    keeps_log: bool       # whether the driver records its placements in fleet.jsonl

    def check(self, runs: Sequence[RunSpec], cpus_per_run: int) -> None: ...

    def submit(self, specs: Sequence[RunSpec], cpus_per_run: int) -> list[Any]: ...

    def poll(self, timeout_s: float) -> tuple[Sequence[tuple[Any, dict[str, Any] | Lost | RunResult]], list[Event]]: ...

    def cancel(self) -> None: ...

    def close(self) -> None: ...


def resources(spec: RunSpec, cpus_per_run: int) -> Resources:
    ranks = spec.launch.nproc_per_node if spec.launch.launcher == "torchrun" else 1
    return Resources(cpus=cpus_per_run * ranks, gpus=ranks if spec.device == "cuda" else 0)


def check_runs(runs: Sequence[RunSpec], executor: str) -> None:
    """What no executor but local can run: a multi-node torchrun world is one
    rendezvous started on each node by hand (see docs/distributed.md)."""
    for spec in runs:
        if spec.launch.launcher == "torchrun" and spec.launch.nnodes > 1:
            raise UserError(f"run {spec.run_id}: a torchrun world of {spec.launch.nnodes} nodes is started on each node "
                            f"(`ampcert run --executor local` there); --executor {executor} places one-node runs")


def short_reason(text: str) -> str:
    """The first line of an engine's error, bounded (Ray's run to pages)."""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "no reason given")
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."


# --------------------------------------------------------------------------- on the node


def run_on_node(spec_json: str, send: Callable[[Event], None] | None = None) -> dict[str, Any]:
    """Train one run on this node and return its run folder's files.

    The run trains as a local run does (this driver with the local executor:
    its own process, its timeout) in a temporary folder that is removed
    afterwards. ``send`` carries events to the driver: ``running`` once
    training has started (with this node's name and this process's pid), then
    ``step`` events at most every :data:`STEP_EVENT_INTERVAL_S`."""
    from ampcert.runner.local_executor import LocalExecutor

    spec = RunSpec.model_validate_json(spec_json)
    node, pid = socket.gethostname(), os.getpid()
    last = 0.0

    def on_event(event: Event) -> None:
        nonlocal last
        if send is None:
            return
        if event["kind"] == "start":
            send({"kind": "running", "run_id": spec.run_id, "node": node, "pid": pid})
        elif event["kind"] == "step" and time.monotonic() - last >= STEP_EVENT_INTERVAL_S:
            last = time.monotonic()
            send({**event, "run_id": spec.run_id})

    with tempfile.TemporaryDirectory(prefix="ampcert-run-") as tmp:
        local = LocalExecutor(Path(tmp))
        try:
            local.check([spec], 1)
            run_fleet(Path(tmp), [spec], local, retries=0, cpus_per_run=1, total=1, on_event=on_event)
        finally:
            local.close()
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
    """``fleet.jsonl``: what the cluster did, a line per event (appended whole);
    nothing where ``enabled`` is false (this machine: one place, nothing to record)."""

    def __init__(self, root: Path, executor: str, enabled: bool = True):
        self.path = root / FLEET_LOG
        self.executor = executor
        self.enabled = enabled

    def write(self, event: str, run_id: str, **fields: Any) -> None:
        if not self.enabled:
            return
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
              total: int, on_event: OnEvent) -> None:
    """Run ``todo`` on ``executor`` into the results folder ``root``; see the module's docstring.

    Runs are submitted at once (or ``executor.capacity`` at a time) and stored
    as they end, in any order. An exception (an interrupt) cancels what is in
    flight: those runs have no result and stay pending for ``--resume``."""
    from ampcert.runner.planning import skipped_result

    rd = ResultsDir(root)
    log = FleetLog(root, executor.name, executor.keeps_log)
    on_event({"kind": "plan", "total": total, "todo": len(todo)})
    waiting: deque[RunSpec] = deque()
    for spec in todo:
        if spec.skip_reason:
            on_event({"kind": "start", "run_id": spec.run_id, "limit": spec.step_limit})
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
            on_event({"kind": "start", "run_id": spec.run_id, "limit": spec.step_limit,
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
                    on_event({"limit": spec_of.step_limit, **event, "kind": "step"})
            for ticket, outcome in ended:
                spec = in_flight.pop(ticket)
                stored: RunResult | str
                if isinstance(outcome, RunResult):  # written into the folder by a local worker
                    stored = outcome
                elif isinstance(outcome, Lost):
                    stored = outcome.reason
                else:
                    stored = store_payload(rd, spec, outcome)
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
