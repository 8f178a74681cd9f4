"""An own job in flight: a team's own training job, run, watched and read.

The local executor's contract, as for a worker process and for torchrun
(:class:`~ampcert.runner.local_executor.RunningRun`), so every executor runs
own jobs (on a Ray or Slurm node, the node's own local executor does):

- **start**: the argv and ``env`` rendered with the run's fields
  (:mod:`ampcert.own_job.entry`), the job started in a session (process group) of
  its own, in its ``cwd``, with ``AMPCERT_*`` variables and, on a CPU run,
  no GPU; its stdout and stderr go to ``runs/<id>/stdout.txt`` and
  ``stderr.txt``, of which the last :data:`OUTPUT_TAIL_BYTES` each are kept
  (on Linux, through the keeper: a job's output costs bounded disk, and the
  end of it, which says how the job ended, is what is kept). Telemetry samples
  around it from this process: RAPL, the RSS and CPU time of the job's whole
  process tree, NVML on the GPUs it was given.
- **events**: the MLLOG the job appends is read as it grows: run_start,
  eval_start and eval_stop move the telemetry's phase (to within one poll,
  0.25 s), each eval_accuracy is a progress event.
- **ended**: the job exited, or passed its timeout (then its whole tree is
  ended: SIGTERM, two seconds' grace, SIGKILL).
- **finish**: processes the job left behind are ended, and make the run
  fail; then its log is read strictly (:mod:`ampcert.mllog.reader`) into the
  result (:func:`ampcert.own_job.result.outcome`), or the run fails with
  the one reason: the command not found, a non-zero exit (with the last
  line of its stderr), no log, a log cut short, no run_stop, a timeout.
- **stop** (ampcert interrupted): the tree is ended, the run stays pending
  without a result, and ``--resume`` reruns it.

On Linux the job runs under its keeper (:mod:`ampcert.own_job.keeper`), the
child subreaper of everything the job starts: a process that leaves the job's
session *and* its tree (a daemon that double-forks and calls setsid) is
reparented to the keeper, not to init, and ended with the run, which fails
naming it. What is not caught: a job that is SIGKILLed along with ampcert (and
its keeper) outlives it, as nothing is left to end it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from ampcert import mllog
from ampcert.mllog.reader import LogEvent, iter_events
from ampcert.own_job.entry import job_environment, job_values, render
from ampcert.results import FailureKind, ResultsDir, RunResult, atomic_write_json, read_regular_file
from ampcert.runner import signals
from ampcert.runner.code_identity import job_source
from ampcert.runner.procs import end_tree
from ampcert.runner.torchrun import Tail
from ampcert.spec import RunSpec
from ampcert.telemetry.host import HostSource, TreeStats, process_tree
from ampcert.version import __version__

STDOUT_NAME, STDERR_NAME = "stdout.txt", "stderr.txt"
# The last bytes of each of the job's stdout and stderr kept in its run folder (the keeper's
# BoundedTail: a file grows to twice this, then keeps this).
OUTPUT_TAIL_BYTES = 8 << 20
# Seconds between SIGTERM and SIGKILL when a job is ended.
GRACE_S = 2.0
# The job's keeper (a script run by a bare interpreter) and what it writes in the run's folder.
KEEPER = Path(__file__).with_name("keeper.py")
KEEPER_NAME = "keeper.json"
# The telemetry phase each MLLOG interval event begins.
_PHASE_AFTER = {mllog.RUN_START: "train", mllog.EVAL_START: "eval", mllog.EVAL_STOP: "train", mllog.RUN_STOP: "done"}


def _last_line(path: Path, limit: int = 240) -> str | None:
    try:
        with path.open("rb") as fh:
            fh.seek(max(path.stat().st_size - 8192, 0))
            lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return None
    if not lines:
        return None
    line = " ".join(lines[-1].split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class _LogTail(Tail):
    """MLLOG events appended since the last read, by the one MLLOG reader in its tolerant mode
    (progress only: a line not yet whole is skipped; the result reads the whole log strictly
    once the job is over)."""

    def events(self) -> list[LogEvent]:
        lines = (raw.decode("utf-8", "replace") for raw in self.new_lines())
        return list(iter_events(lines, str(self.path), in_order=False, on_bad=lambda _: None))


class _Tree:
    """What a second signal during shutdown kills (signals.watch_worker): the job's tree."""

    def __init__(self, pid: int):
        self.pid = pid

    def kill(self) -> None:
        end_tree(self.pid, grace_s=0.0)


class OwnJobRun:
    """One own job in flight (see the module docstring)."""

    def __init__(self, spec: RunSpec, root: Path):
        assert spec.command is not None, "a command entry's run"
        self.spec = spec
        self.job = spec.command
        self.root = root
        self.rd = ResultsDir(root)
        self.proc: subprocess.Popen | None = None
        self.telemetry: Any = None
        self.launch_error: str | None = None
        self.timed_out = False
        self.argv: list[str] = []
        self._files: list[IO[bytes]] = []

    # -- RunningRun ------------------------------------------------------------

    def start(self) -> None:
        from ampcert.runner.worker import now_iso

        spec, rd = self.spec, self.rd
        run_dir = rd.run_dir(spec.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        # A redone run starts afresh: this attempt's files only.
        for name in (rd.result_file(spec.run_id), rd.mllog_file(spec.run_id), rd.telemetry_file(spec.run_id),
                     run_dir / STDOUT_NAME, run_dir / STDERR_NAME, run_dir / "error.txt"):
            name.unlink(missing_ok=True)
        self.log_path = rd.mllog_file(spec.run_id)
        values = job_values(precision=spec.precision, seed=spec.seed, amp=spec.amp, run_dir=run_dir,
                            mllog=self.log_path, run_id=spec.run_id, device=spec.device, repeat=spec.repeat,
                            label=spec.label)
        self.argv = [render(a, values) for a in self.job.argv]
        env = job_environment(dict(os.environ), self.job, values)
        self.tail = _LogTail(self.log_path)
        self.source = job_source(Path(self.job.workdir or "."), self.job.argv)
        self.started_at = now_iso()
        self.spawned = time.time()
        self.deadline = time.monotonic() + spec.timeout_s
        # Read and written: the keeper keeps their last bytes (it reads them back to move them).
        out = (run_dir / STDOUT_NAME).open("w+b")
        err = (run_dir / STDERR_NAME).open("w+b")
        self._files = [out, err]
        self.keeper_file = run_dir / KEEPER_NAME
        self.keeper_file.unlink(missing_ok=True)
        keeper = [sys.executable, "-I", "-S", str(KEEPER), str(self.keeper_file), str(GRACE_S),
                  str(OUTPUT_TAIL_BYTES), "--"] \
            if sys.platform == "linux" else []
        try:
            # Not under signals.deferred(): the job would inherit the blocked mask.
            self.proc = subprocess.Popen([*keeper, *self.argv], cwd=self.job.workdir, env=env,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        except OSError as exc:
            self.launch_error = self._cannot_start(exc.strerror or str(exc))
            self._close_files()
            return
        signals.watch_worker(_Tree(self.proc.pid))
        self.telemetry = _start_telemetry(spec, self.proc.pid, keeper=bool(keeper))

    def events(self, wait_s: float) -> list[dict[str, Any]]:
        found = self._read_log()
        if not found and wait_s > 0 and self.proc is not None and self.proc.poll() is None:
            time.sleep(wait_s)
            found = self._read_log()
        return found

    def ended(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return True
        if time.monotonic() > self.deadline:
            self.timed_out = True
            end_tree(self.proc.pid, GRACE_S)
            self.proc.wait()
            return True
        return False

    def finish(self) -> RunResult:
        from ampcert.own_job import result as reading
        from ampcert.runner.worker import now_iso

        spec, rd = self.spec, self.rd
        left: list[int] = []
        if self.proc is not None:
            self.proc.wait()
            left = [p.pid for p in process_tree(self.proc.pid)]
            if left:
                end_tree(self.proc.pid, GRACE_S)
            left += self._keeper_record()
            self._read_log()
        signals.watch_worker(None)
        self._close_files()
        wall_s = time.time() - self.spawned
        reason = self._failure(left)
        failure = FailureKind.TIMEOUT if self.timed_out else FailureKind.ERROR
        trained: dict[str, Any] = {"accelerated": spec.accelerated, "capability_note": spec.capability_note}
        phases = None
        if reason is None:
            try:
                outcome = reading.outcome(spec, self.log_path, self.telemetry, argv=self.argv,
                                          returncode=self.proc.returncode if self.proc else None,
                                          spawned=self.spawned,
                                          environment={"ampcert": __version__, "code": self.source})
            except reading.JobFailed as exc:
                reason = str(exc)
            except reading.LossNotFinite as exc:  # the job's evaluations diverged: judged as such
                reason, failure = str(exc), FailureKind.NON_FINITE
            else:
                self.telemetry = None
                trained = outcome.trained_fields()
                if outcome.telemetry_series is not None:
                    try:
                        trained["telemetry"]["series_file"] = outcome.telemetry_series.write(
                            rd.telemetry_file(spec.run_id)).name
                    except OSError as exc:
                        trained["telemetry"]["notes"].append(f"series not written: {exc}")
                phases = reading.phases(outcome, wall_s)
        if self.telemetry is not None:
            self.telemetry.close()
        result = RunResult(
            run_id=spec.run_id, spec=spec, status="completed" if reason is None else "failed", reason=reason,
            failure=None if reason is None else failure, started_at=self.started_at, finished_at=now_iso(),
            wall_s=wall_s, phases=phases, **trained,
        )
        atomic_write_json(rd.result_file(spec.run_id), result)
        return result

    def stop(self) -> None:
        """End the job's whole tree, unfinished: the run stays without a result, pending."""
        if self.proc is not None:
            end_tree(self.proc.pid, GRACE_S)
            self.proc.wait()
        signals.watch_worker(None)
        if self.telemetry is not None:
            self.telemetry.close()
            self.telemetry = None
        self._close_files()

    # -- the pieces --------------------------------------------------------------

    def _failure(self, left: list[int]) -> str | None:
        """Why the job failed, before its log is read (None: it exited 0 and alone)."""
        run_dir = self.rd.run_dir(self.spec.run_id)
        if self.launch_error is not None:
            return self.launch_error
        assert self.proc is not None
        if self.timed_out:
            return f"timeout: the job ran past {self.spec.timeout_s} s; its process tree was ended"
        code = self.proc.returncode
        if code != 0:
            how = (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
            last = _last_line(run_dir / STDERR_NAME)
            return f"the command {how}" + (f"; last line of {STDERR_NAME}: {last}" if last
                                           else f"; see {STDERR_NAME} in the run's folder")
        if left:
            shown = ", ".join(map(str, left[:5])) + (" ..." if len(left) > 5 else "")
            return (f"the job exited but left {len(left)} process(es) running (pid {shown}); they were ended. "
                    "A job must wait for its children")
        return None

    def _cannot_start(self, why: str) -> str:
        """The reason of a run whose command did not start (Popen's error, or the keeper's exec)."""
        return f"cannot start the command {self.argv[0]!r} (in {self.job.workdir}): {why}"

    def _keeper_record(self) -> list[int]:
        """The processes the job left that its keeper ended (their pids), and the job's start
        failure, where the keeper recorded one (a launch error, as Popen's own would be)."""
        try:
            record = json.loads(read_regular_file(self.keeper_file))
        except (OSError, ValueError, AttributeError):
            return []
        if not isinstance(record, dict):
            return []
        if record.get("exec_error") and self.launch_error is None:
            self.launch_error = self._cannot_start(str(record["exec_error"]))
        return [int(s["pid"]) for s in record.get("survivors") or [] if isinstance(s, dict) and "pid" in s]

    def _read_log(self) -> list[dict[str, Any]]:
        out = []
        tel = self.telemetry
        for event in self.tail.events():
            phase = _PHASE_AFTER.get(event.key)
            if tel is not None and phase is not None:
                try:
                    tel.phase(phase)
                except RuntimeError:  # sampling already stopped
                    pass
            if event.key == mllog.EVAL_ACCURACY and isinstance(event.value, (int, float)) \
                    and not isinstance(event.value, bool):
                samples = event.metadata.get("samples_count")
                out.append({"step": samples if isinstance(samples, int) else 0, "metric": float(event.value),
                            "loss": None})
        return out

    def _close_files(self) -> None:
        for fh in self._files:
            fh.close()
        self._files = []


def _start_telemetry(spec: RunSpec, pid: int, *, keeper: bool) -> Any:
    """The sampler around a job: the host through its process tree (the keeper, ``pid``
    where ``keeper``, left out of its sums), and on cuda the GPUs it was given
    (CUDA_VISIBLE_DEVICES, as ordinals)."""
    from ampcert.telemetry import Telemetry

    gpus: list[int | str] | None = None
    if spec.device == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        count = len([v for v in visible.split(",") if v.strip()]) if visible else 1
        gpus = list(range(max(count, 1)))
    return Telemetry.start(device=spec.device, rate_hz=spec.telemetry_rate_hz, gpus=gpus,
                           host=HostSource(tree=TreeStats(pid, count_root=not keeper)), phase="init")
