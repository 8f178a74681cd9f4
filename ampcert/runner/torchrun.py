"""Runs with ``launcher: torchrun``: start torch.distributed.run, watch it, record the outcome.

The local executor's contract is the same as for a single worker process: the
run gets its timeout, a run that hangs is killed, and a run that dies without
a result becomes a failed RunResult with the reason. torchrun is started in
a process group of its own; its ranks live in sessions of their own (torchrun
puts them there), so they write their pids into a private channel folder and
are killed by pid, and each rank also exits when its torchrun agent or the
ampcert dies. Everything torchrun and the ranks print goes to
``runs/<run_id>/launcher.log``; rank 0 reports progress through the channel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ampcert.results import ResultsDir, RunResult
from ampcert.spec import RunSpec

LOG_NAME = "launcher.log"


def command(spec: RunSpec, spec_file: Path, root: Path, channel: Path, *,
            orchestrator: int | None = None, spawned: float | None = None,
            environ: dict[str, str] | None = None) -> list[str]:
    """The torchrun command line for ``spec``. Rendezvous settings the suite
    leaves out are left to torchrun (and its ``PET_*`` environment variables);
    a one-node run with none of them uses ``--standalone`` (a private
    rendezvous on a free port, so concurrent suites never collide)."""
    env = os.environ if environ is None else environ
    launch = spec.launch
    cmd = [sys.executable, "-m", "torch.distributed.run",
           "--nproc_per_node", str(launch.nproc_per_node), "--nnodes", str(launch.nnodes),
           "--max_restarts", "0"]
    rendezvous = any(v is not None for v in (launch.rdzv_backend, launch.rdzv_endpoint, launch.rdzv_id, launch.node_rank))
    from_env = any(k in env for k in ("PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND", "PET_MASTER_ADDR"))
    if launch.nnodes == 1 and not rendezvous and not from_env:
        cmd.append("--standalone")
    else:
        if launch.rdzv_backend is not None:
            cmd += ["--rdzv_backend", launch.rdzv_backend]
        if launch.rdzv_endpoint is not None:
            cmd += ["--rdzv_endpoint", launch.rdzv_endpoint]
        # One rendezvous per run: the nodes meet again for the next run of the
        # suite under a new id, never in the previous run's closed rendezvous.
        base = launch.rdzv_id if launch.rdzv_id is not None else env.get("PET_RDZV_ID")
        cmd += ["--rdzv_id", f"{base}-{spec.run_id}" if base else spec.run_id]
        if launch.node_rank is not None:
            cmd += ["--node_rank", str(launch.node_rank)]
    cmd += ["-m", "ampcert.runner.ddp_worker", "--spec", str(spec_file), "--root", str(root),
            "--channel", str(channel)]
    if orchestrator is not None:
        cmd += ["--orchestrator", str(orchestrator)]
    if spawned is not None:
        cmd += ["--spawned", repr(spawned)]
    return cmd


class Tail:
    """Complete JSON lines appended to a file since the last read (a line still being
    written waits for the next read). Also the own job's MLLOG tail."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def new_lines(self) -> list[bytes]:
        """The complete lines appended since the last call. Only a regular file is read, never
        through a link (a job's files are untrusted input): opening a FIFO the job left at the
        log's path would block until something writes to it, so it is opened non-blocking and
        left unread, as a link or a device is (the log's reader then refuses it)."""
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(self.path, flags)
        except OSError:
            return []
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        return lines

    def read(self) -> list[dict[str, Any]]:
        out = []
        for line in self.new_lines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


def _kill_all(proc: subprocess.Popen, channel: Path) -> None:
    """SIGKILL every rank that registered, then torchrun's process group."""
    for pid_file in channel.glob("rank*.pid"):
        try:
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


_ERROR_LINE = re.compile(r"(\b\w*(Error|Exception|RunFailed)\b:|ampcert: (error|rank)|Signal \d+|exitcode\s*:)")


def last_error(log: Path, limit: int = 300) -> str | None:
    """The last line of the launcher log that names an error, shortened."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    if "Root Cause (first observed failure):" in lines:  # torchrun's own summary of a failed worker
        cause = lines[lines.index("Root Cause (first observed failure):"):]
        fields = dict(re.findall(r"^\s*(rank|exitcode)\s*:\s*(.+?)\s*$", "\n".join(cause[:8]), re.M))
        if fields:
            return "first failure: " + ", ".join(f"{k} {v}" for k, v in fields.items())
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            line = " ".join(line.split())
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return None


def failure_reason(returncode: int | None, timed_out: bool, timeout_s: int, log: Path) -> str:
    if timed_out:
        return f"timeout: run exceeded {timeout_s} s; torchrun and its ranks were killed"
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        why = f"torchrun killed by {name} before rank 0 wrote the result"
    else:
        why = f"torchrun exited with code {returncode} before rank 0 wrote the result"
    err = last_error(log)
    return why + (f"; last error in {log.parent.name}/{log.name}: {err}" if err else f"; see {log}")


class TorchrunRun:
    """A run on its torchrun ranks, in flight (see :class:`~ampcert.runner.local_executor.RunningRun`).

    On a node whose ranks do not include rank 0 (multi-node), nothing is
    stored: the result is ``skipped`` with the reason, and the result lives
    in the results folder of the node that ran rank 0."""

    def __init__(self, spec: RunSpec, root: Path):
        self.spec = spec
        self.root = root
        self.rd = ResultsDir(root)
        self.channel: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.timed_out = False
        self.node: dict[str, Any] | None = None

    def start(self) -> None:
        from ampcert.runner.worker import now_iso

        spec, root = self.spec, self.root
        run_dir = self.rd.run_dir(spec.run_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.rd.result_file(spec.run_id).unlink(missing_ok=True)  # a retried run: this attempt decides
        self.channel = channel = Path(tempfile.mkdtemp(prefix="ampcert-torchrun-"))
        spec_file = channel / "spec.json"
        spec_file.write_text(spec.model_dump_json(), encoding="utf-8")
        self.log_path = run_dir / LOG_NAME
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.started_at = now_iso()
        self.spawned = time.time()
        self.tail = Tail(channel / "progress.jsonl")
        cmd = command(spec, spec_file, root, channel, orchestrator=os.getpid(), spawned=self.spawned, environ=env)
        with self.log_path.open("w", encoding="utf-8") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            # torchrun is exec'd with ampcert's signal mask: not under signals.deferred(). A
            # signal between Popen and this assignment leaves ranks that end with ampcert
            # (ddp_worker watches its pid) and the channel that stop() removes.
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        self.deadline = time.monotonic() + spec.timeout_s

    @property
    def _proc(self) -> subprocess.Popen:
        assert self.proc is not None, "start() first"
        return self.proc

    def events(self, wait_s: float) -> list[dict[str, Any]]:
        found = self.tail.read()
        if not found and wait_s > 0 and self._proc.poll() is None:
            time.sleep(wait_s)
            found = self.tail.read()
        return found

    def ended(self) -> bool:
        if self._proc.poll() is not None:
            return True
        if time.monotonic() > self.deadline:
            self.timed_out = True
            self._kill()
            return True
        return False

    def _kill(self) -> None:
        """No rank outlives this run: a timeout, or ampcert interrupted."""
        if self.proc is not None and self.channel is not None and self.proc.poll() is None:
            _kill_all(self.proc, self.channel)
            self.proc.wait()
            _kill_all(self.proc, self.channel)  # ranks that registered while torchrun was being killed

    def _close_channel(self) -> None:
        assert self.channel is not None, "start() first"
        follower = self.channel / "node.json"
        try:
            self.node = json.loads(follower.read_text()) if follower.exists() else None
        finally:
            shutil.rmtree(self.channel, ignore_errors=True)

    def stop(self) -> None:
        self._kill()
        if self.channel is not None:
            shutil.rmtree(self.channel, ignore_errors=True)

    def finish(self) -> RunResult:
        from ampcert.runner.worker import now_iso, record_unfinished

        self._proc.wait()
        self._close_channel()
        spec, rd, node = self.spec, self.rd, self.node
        result = rd.read_result(spec.run_id)
        if result is None and not self.timed_out and self._proc.returncode == 0 and node is not None:
            return RunResult(
                run_id=spec.run_id, spec=spec, status="skipped",
                reason=(f"trained as node {node['node_rank']} of {node['nnodes']}; rank 0 ran on another node, "
                        "whose results folder holds this run"),
                started_at=self.started_at, finished_at=now_iso(), wall_s=time.time() - self.spawned,
                accelerated=spec.accelerated, capability_note=spec.capability_note,
            )
        if result is None or self.timed_out:
            result = record_unfinished(
                rd, spec, failure_reason(self._proc.returncode, self.timed_out, spec.timeout_s, self.log_path),
                timed_out=self.timed_out, started_at=self.started_at, spawned=self.spawned)
        return result
