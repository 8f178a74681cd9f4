"""The Slurm executor, through submitit: a job array, one run per array task.

``--executor slurm`` submits the pending runs as one ``sbatch --array`` per
resource shape (runs asking for the same CPUs and GPUs share an array), with
``--gpus-per-node`` and ``--cpus-per-task`` from each run's spec, and the
partition, account and time limit from the command line or the suite's
``slurm:`` block. The time limit defaults to the longest run timeout of the
array plus :data:`TIME_MARGIN_MIN`: a run's own timeout ends it first, as a
failed run; Slurm's ends only a task that hung outside the run.

submitit keeps its job files in ``<results>/.submitit/``, which is why the
results folder must be on a file system the nodes share (as submitit needs
for any job). Each task sends its events (started on which node, its steps)
as lines appended to a file there. ``--slurm-local`` runs the same arrays
through submitit's local executor on this machine, without Slurm: for trying a
suite's fleet settings and for tests.

submitit is imported here only, and only when this executor is chosen.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ampcert.errors import UserError
from ampcert.runner.fleet import Event, Lost, Resources, resources, run_on_node, short_reason
from ampcert.spec import RunSpec, SlurmOptions

# Minutes past a run's own timeout before Slurm ends its task (start-up, copying files home).
TIME_MARGIN_MIN = 5
JOB_FOLDER = ".submitit"


def ampcert_slurm_run(spec_json: str, events_file: str, cpus: int) -> dict[str, Any]:
    """The array task: one run on the node Slurm chose (see fleet.run_on_node).

    The run's torch uses the task's CPUs, no more (as under Ray): by default it
    would start a thread per core of the node, whoever else has them."""
    os.environ["OMP_NUM_THREADS"] = str(cpus)

    def send(event: Event) -> None:
        try:
            with open(events_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(event) + "\n")
        except OSError:  # the event channel is best effort; the run's files are not
            pass

    return run_on_node(spec_json, send)


def _import_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise UserError("--executor slurm needs submitit: pip install 'ampcert[slurm]'") from None
    return submitit


def _local_gpus() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


class SlurmExecutor:
    name = "slurm"
    keeps_log = True

    def __init__(self, root: Path, options: SlurmOptions, *, local: bool = False):
        self.submitit = _import_submitit()
        self.local = local
        self.options = options
        if not local and shutil.which("sbatch") is None:
            raise UserError("--executor slurm: no sbatch on PATH (this is not a Slurm login node); "
                            "--slurm-local runs the job array on this machine through submitit")
        self.folder = root / JOB_FOLDER  # created at the first submission
        self.events_dir = self.folder / "events"
        # Slurm queues the arrays; submitit's local executor starts every job at once.
        self.capacity = max((os.cpu_count() or 1), 1) if local else None
        self.jobs: dict[Any, tuple[RunSpec, Path]] = {}
        self.offsets: dict[Path, int] = {}
        self.seen_running: set[Any] = set()

    def check(self, runs: Sequence[RunSpec], cpus_per_run: int) -> None:
        if not self.local:
            return  # Slurm refuses a request no node can hold when it is submitted (one line, below)
        cpus, gpus = os.cpu_count() or 1, _local_gpus()
        self.capacity = max(cpus // cpus_per_run, 1)
        for spec in runs:
            need = resources(spec, cpus_per_run)
            if not spec.skip_reason and (need.gpus > gpus or need.cpus > cpus):
                raise UserError(f"run {spec.run_id} asks for {need}; this machine has {cpus} CPU, {gpus} GPU "
                                "(--cpus-per-run sets a run's CPUs)")

    def _executor(self, need: Resources, time_min: int) -> Any:
        ex = self.submitit.AutoExecutor(folder=self.folder / "%j", cluster="local" if self.local else "slurm")
        params: dict[str, Any] = {"name": "ampcert", "timeout_min": time_min, "nodes": 1, "tasks_per_node": 1,
                                  "cpus_per_task": need.cpus, "gpus_per_node": need.gpus}
        if self.options.partition:
            params["slurm_partition"] = self.options.partition
        if self.options.account:
            params["slurm_account"] = self.options.account
        if self.options.array_parallelism:
            params["slurm_array_parallelism"] = self.options.array_parallelism
        if self.options.additional:
            params["slurm_additional_parameters"] = dict(self.options.additional)
        ex.update_parameters(**params)
        return ex

    def submit(self, specs: Sequence[RunSpec], cpus_per_run: int) -> list[Any]:
        shapes: dict[Resources, list[RunSpec]] = {}
        for spec in specs:
            shapes.setdefault(resources(spec, cpus_per_run), []).append(spec)
        tickets: dict[str, Any] = {}
        self.events_dir.mkdir(parents=True, exist_ok=True)
        for need, group in shapes.items():
            time_min = self.options.time_min or (math.ceil(max(s.timeout_s for s in group) / 60) + TIME_MARGIN_MIN)
            ex = self._executor(need, time_min)
            entries = []
            try:
                with ex.batch():
                    for spec in group:
                        events = self.events_dir / f"{spec.run_id}.{os.urandom(4).hex()}.jsonl"
                        entries.append((spec, events, ex.submit(ampcert_slurm_run, spec.model_dump_json(),
                                                                str(events), need.cpus)))
            except (OSError, subprocess.CalledProcessError, RuntimeError, ValueError) as exc:
                detail = getattr(exc, "stderr", None) or exc
                if isinstance(detail, bytes):
                    detail = detail.decode("utf-8", "replace")
                raise UserError(f"--executor slurm: the job array was refused: {short_reason(str(detail))}") from None
            for spec, events, job in entries:
                self.jobs[job] = (spec, events)
                tickets[spec.run_id] = job
        return [tickets[spec.run_id] for spec in specs]

    def poll(self, timeout_s: float) -> tuple[list[tuple[Any, dict[str, Any] | Lost]], list[Event]]:
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            ended = [job for job in self.jobs if job.done()]
            if ended or time.monotonic() >= deadline:
                break
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))
        events = self._drain()
        outcomes = []
        for job in ended:
            self.jobs.pop(job)
            outcomes.append((job, self._outcome(job)))
        return outcomes, events

    def _outcome(self, job: Any) -> dict[str, Any] | Lost:
        try:
            return job.result()
        except Exception as exc:  # noqa: BLE001 - UncompletedJobError (killed, preempted, timed out), FailedJobError
            return Lost(f"{type(exc).__name__}: {short_reason(str(exc))}")

    def _drain(self) -> list[Event]:
        events: list[Event] = []
        for _spec, path in self.jobs.values():
            events += self._read_new(path)
        return events

    def _read_new(self, path: Path) -> list[Event]:
        try:
            with open(path, "rb") as fh:
                fh.seek(self.offsets.get(path, 0))
                data = fh.read()
        except OSError:
            return []
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self.offsets[path] = self.offsets.get(path, 0) + len(whole)
        events = []
        for line in whole.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events

    def cancel(self) -> None:
        for job in list(self.jobs):
            try:
                job.cancel(check=False)
            except Exception:  # noqa: BLE001 - already ended
                pass
        self.jobs.clear()

    def close(self) -> None:
        pass
