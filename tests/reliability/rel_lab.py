"""Shared, expensive fixtures of the reliability tests, started once and concurrently.

One small suite (digits, fp32 and bf16, two seeds, six steps, a rule pack:
four runs) is run

* ``a``: from scratch, uninterrupted, signed: the reference;
* ``chain0``, ``chain1``: from scratch again, twice, each SIGKILLed at random
  points, then resumed, again and again, then resumed to the end: fault
  injection, and (with ``a``) determinism across processes. Before its last
  resume, every result file of ``chain1`` is spoilt (truncated, another run's,
  a foreign JSON file, an edited spec).

They run side by side in threads (each is a chain of ``ampcert`` processes
that spend much of their time starting up or waiting), so the tests that
need them share one wait.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

from conftest import REPO, cli_env
from factories import session_dir

from ampcert.report.sign import keygen
from ampcert.results import ResultsDir

SUITE = """\
name: reliability
description: fault injection and determinism (tests/reliability)
device: cpu
precisions: [fp32, bf16]
seeds: [0, 1]
train: {steps: 6, eval_every: 3}
timeout_s: 120
certify: rules.yaml
speed_probe: {enabled: false}  # the lab counts and corrupts the certified runs' files
workloads:
  - workload: digits
"""
# Only checks whose verdicts cannot depend on timing (no speed-up, no memory).
RULES = """\
name: reliability
version: 1
rules:
  - id: parity.final_metric
    check: accuracy_parity
    measures: final metric, low precision minus fp32, paired by seed
    margin: 0.5
    min_seeds: 2
  - id: determinism.seed_spread
    check: seed_spread
    measures: final metric range across seeds
    max_spread: 1.0
    applies_to: {precisions: [fp32, bf16]}
  - id: numerics.finite_loss
    check: nonfinite_loss
    measures: non-finite losses
"""
PLANNED_RUNS = 4
KILLS_PER_CHAIN = int(os.environ.get("AMPCERT_KILLS_PER_CHAIN", "10"))
CHAINS = 2


def ampcert(*args, log: Path | None = None, **kw) -> subprocess.Popen:
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed by the caller's wait
    try:
        return subprocess.Popen([sys.executable, "-m", "ampcert", *map(str, args)], cwd=REPO, env=cli_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw)
    finally:
        if log:
            out.close()


def live_members(pgid: int) -> list[int]:
    """Processes of a process group that are still running (zombies excluded)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(stat.parent.name))
    return pids


def wait_group_gone(pgid: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := live_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


@dataclass
class Chain:
    """Kill an `ampcert run` (then its `--resume`s) with SIGKILL at random moments, then finish it."""

    suite: Path
    out: Path
    logs: Path
    seed: int
    kills: int = 0
    main_only_kills: int = 0     # the orchestrator alone: its workers must not outlive it
    group_kills: int = 0         # the whole process group (orchestrator, forkserver, worker)
    invocations: int = 0
    resumes_completed: int = 0
    fresh_restarts: int = 0      # killed before plan.json: `run SUITE --out` again into the same folder
    temp_files_seen: int = 0
    tracebacks: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    kill_times: list[float] = field(default_factory=list)
    corrupt: bool = False        # spoil every result file before the final resume
    corrupted: dict[str, str] = field(default_factory=dict)  # run id -> the reason the resume must give

    def _command(self) -> list:
        if (self.out / "plan.json").exists():
            return ["run", "--resume", self.out]
        if self.out.exists():
            self.fresh_restarts += 1
        return ["run", self.suite, "--out", self.out]

    def run(self, target_kills: int) -> None:
        """Kill, resume, kill...: first while runs are pending (start-up, planning,
        the forkserver, training), then, after one resume left alone to finish
        them, while resumes only certify and render (cheap, and where the
        summary, verdicts and reports are rewritten); then resume to the end."""
        rng = random.Random(self.seed)
        self._kill_loop(target_kills - target_kills * 2 // 5, rng, window=6.5)
        self._finish("middle")
        self._kill_loop(target_kills, rng, window=4.0)
        if self.corrupt:
            self._corrupt_results()
        self._finish("final")

    def _corrupt_results(self) -> None:
        """Spoil every result (each run has one, after the middle resume) in a
        different way; the final resume must report each and redo its run."""
        rd = ResultsDir(self.out)
        ids = sorted(p.parent.name for p in self.out.glob("runs/*/result.json"))
        assert len(ids) == PLANNED_RUNS, ids
        texts = {i: rd.result_file(i).read_text() for i in ids}
        truncated, other_runs, foreign, tampered = ids
        rd.result_file(truncated).write_text(texts[truncated][: len(texts[truncated]) // 2])
        rd.result_file(other_runs).write_text(texts[truncated])
        rd.result_file(foreign).write_text((self.out / "plan.json").read_text())
        edited = json.loads(texts[tampered])
        edited["spec"]["seed"] += 10  # the same run id, another run's spec
        rd.result_file(tampered).write_text(json.dumps(edited))
        self.corrupted = {
            truncated: "not valid JSON, truncated or corrupted",
            other_runs: f"holds the result of another run ({truncated})",
            foreign: "not an ampcert run result (run_id: Field required)",
            tampered: "its spec is not the spec of this run",
        }

    def _kill_loop(self, until: int, rng: random.Random, window: float) -> None:
        while self.kills < until:
            log = self.logs / f"invocation-{self.invocations:02d}.log"
            self.invocations += 1
            started = time.monotonic()
            proc = ampcert(*self._command(), log=log)
            delay = rng.uniform(0.2, window)
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                main_only = rng.random() < 0.5
                if main_only:
                    os.kill(proc.pid, signal.SIGKILL)
                    self.main_only_kills += 1
                else:
                    os.killpg(proc.pid, signal.SIGKILL)
                    self.group_kills += 1
                proc.wait()
                self.kills += 1
                self.kill_times.append(round(delay, 2))
                left = wait_group_gone(proc.pid, 10)
                if left:
                    self.orphans.append(f"{log.name}: pids {left} outlived the orchestrator")
                    for pid in left:
                        os.kill(pid, signal.SIGKILL)
            else:  # finished before the kill: shrink the window so later kills land inside
                window = max(0.5, min(window, time.monotonic() - started))
                if proc.returncode not in (0, 1):
                    self.violations.append(f"{log.name}: exit {proc.returncode}: {log.read_text()[-500:]}")
            self._check(log)

    def _finish(self, name: str) -> None:
        log = self.logs / f"{name}.log"
        self.invocations += 1
        proc = ampcert(*self._command(), log=log)
        proc.wait(timeout=300)
        self._check(log)
        if proc.returncode != 0:
            self.violations.append(f"{name} resume: exit {proc.returncode}: {log.read_text()[-2000:]}")
        else:
            self.resumes_completed += 1

    def _check(self, log: Path) -> None:
        """What must hold after any kill: every result file present is whole and
        trusted, every JSON file parses; temp files may be left, and are counted."""
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            self.tracebacks.append(f"{log.name}: {text[-1500:]}")
        if not self.out.is_dir():
            return
        self.temp_files_seen += len(list(self.out.glob(".*.tmp")) + list(self.out.glob("runs/*/.*.tmp")))
        rd = ResultsDir(self.out)
        for result_file in self.out.glob("runs/*/result.json"):
            _, problem = rd.check_result(result_file.parent.name)
            if problem:
                self.violations.append(f"after {log.name}: {result_file}: {problem}")
        for name in ("plan.json", "summary.json", "report.json", "verdicts.json", "report.dsse.json"):
            path = self.out / name
            if path.exists():
                try:
                    json.loads(path.read_text())
                except ValueError as exc:
                    self.violations.append(f"after {log.name}: {name}: {exc}")


class Lab:
    def __init__(self, root: Path):
        self.root = root
        self.suite_dir = root / "suite"
        self.suite_dir.mkdir(parents=True)
        self.suite = self.suite_dir / "suite.yaml"
        self.suite.write_text(SUITE)
        (self.suite_dir / "rules.yaml").write_text(RULES)
        self.key, self.pub = keygen(root / "keys" / "signing.key")
        self.logs = root / "logs"
        self.logs.mkdir()
        self.chains = [Chain(self.suite, root / f"chain{i}", self._logdir(f"chain{i}"), seed=1000 + i,
                             corrupt=i == CHAINS - 1) for i in range(CHAINS)]
        self.procs: dict[str, subprocess.CompletedProcess] = {}
        self.errors: list[BaseException] = []
        self.wall: dict[str, float] = {}
        self.threads = [
            threading.Thread(target=self._guard, args=("a", self._fresh, "a", ["--sign-key", self.key])),
        ] + [threading.Thread(target=self._guard, args=(f"chain{i}", c.run, KILLS_PER_CHAIN))
             for i, c in enumerate(self.chains)]
        for t in self.threads:
            t.start()
        threading.Thread(target=self._record).start()

    def _logdir(self, name: str) -> Path:
        path = self.logs / name
        path.mkdir()
        return path

    def _guard(self, name, fn, *args) -> None:
        start = time.monotonic()
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test that waits
            self.errors.append(exc)
        finally:
            self.wall[name] = time.monotonic() - start

    def _fresh(self, name: str, extra: list) -> None:
        proc = subprocess.run([sys.executable, "-m", "ampcert", "run", str(self.suite), "--out",
                               str(self.root / name), *map(str, extra)], cwd=REPO, env=cli_env(),
                              capture_output=True, text=True, timeout=600)
        self.procs[name] = proc

    def _record(self) -> None:
        """When every thread is done: what the tests read, to lab.json (any process may wait for it)."""
        for t in self.threads:
            t.join()
        state = {
            "root": str(self.root), "key": str(self.key), "pub": str(self.pub), "wall": self.wall,
            "procs": {name: {"args": p.args, "returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
                      for name, p in self.procs.items()},
            "errors": ["".join(traceback.format_exception(e)) for e in self.errors],
            "chains": [asdict(c) for c in self.chains],
        }
        tmp = self.root / ".lab.json.tmp"
        tmp.write_text(json.dumps(state, default=str))
        tmp.rename(self.root / "lab.json")


@dataclass
class LabResult:
    """What a finished Lab left, as the tests read it (in whichever process ran it)."""

    root: Path
    key: Path
    pub: Path
    wall: dict[str, float]
    procs: dict[str, subprocess.CompletedProcess]
    chains: list[SimpleNamespace]


class Handle:
    def __init__(self, root: Path):
        self.root = root

    def wait(self, timeout: float = 1500) -> LabResult:
        state_file = self.root / "lab.json"
        deadline = time.monotonic() + timeout
        while not state_file.exists():
            assert time.monotonic() < deadline, f"the reliability lab did not finish in {timeout} s"
            time.sleep(0.2)
        state = json.loads(state_file.read_text())
        if state["errors"]:
            raise AssertionError("the reliability lab failed:\n" + state["errors"][0])
        paths = ("suite", "out", "logs")
        return LabResult(
            root=Path(state["root"]), key=Path(state["key"]), pub=Path(state["pub"]), wall=state["wall"],
            procs={name: subprocess.CompletedProcess(p["args"], p["returncode"], p["stdout"], p["stderr"])
                   for name, p in state["procs"].items()},
            chains=[SimpleNamespace(**{k: Path(v) if k in paths else v for k, v in c.items()})
                    for c in state["chains"]])


_LAB: list[Handle] = []
USERS = ("test_kill_resume", "test_same_suite_twice_determinism", "test_signing_security")


def lab(tmp_path_factory) -> Handle:
    """The one Lab of this test session, started on first use by whichever process
    (pytest-xdist worker) asks first; every process waits for the same one."""
    if not _LAB:
        shared = session_dir(tmp_path_factory)
        root = shared / "reliability-lab"
        with open(shared / "reliability-lab.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not root.exists():
                    Lab(root)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        _LAB.append(Handle(root))
    return _LAB[0]


def start_early(request, tmp_path_factory) -> None:
    """Start the Lab now, in the background, if a test of this session will
    wait for it: the quick tests collected before those then run meanwhile."""
    if any(getattr(item, "module", None) and item.module.__name__ in USERS for item in request.session.items):
        lab(tmp_path_factory)
