"""SIGINT, SIGTERM and SIGHUP to a real `ampcert run`: one policy, whatever the signal.

Each invocation starts in a session of its own, so that a signal can go to
the orchestrator alone (``kill PID``) or, as a terminal's Ctrl-C or hangup
does, to its whole process group: the orchestrator, multiprocessing's
forkserver and resource tracker, and the worker. The signal is sent once a
run has finished and the next one is certainly in progress (the ``gate``
workload, held at step 2 until its gate file appears). Every interrupted
invocation must then have

* exited 130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP) with exactly one line on
  stderr, naming the signal and the folder to resume: no traceback (a worker
  that took Ctrl-C for itself), no warning (a resource tracker lost halfway);
* left plan.json and the finished run's result.json byte for byte (and
  loadable), the interrupted run without a result (pending) and no temp
  file, and no process of its group behind;

and `ampcert run --resume DIR` must then finish the folder, redoing only the
interrupted run. Each chain interrupts its `ampcert run` and then two
`--resume`s in turn; one of those is a second Ctrl-C while the first one's
shutdown is held up (the forkserver stopped, so the killed worker cannot be
reaped and the orchestrator waits for it), which must end the process at
once, with the same one line.

The two chains run side by side (each invocation spends most of its time
importing torch, scipy and matplotlib), and every test here shares them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import REPO, cli_env
from factories import warm_cli
from rel_lab import wait_group_gone

from ampcert.results import ResultsDir, load

SUITE = """\
name: signals
description: signals to a running suite (tests/reliability/test_signals.py)
device: cpu
precisions: [fp32]
seeds: [0]
train: {steps: 4, eval_every: 2}
timeout_s: 120
workloads:
  - workload: digits
  - workload: "reliability.rel_faults:gate"
"""
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
WAIT_S = 300  # for progress on a busy machine; all of this takes well under a minute on an idle one


@dataclass(frozen=True)
class Stop:
    """How one invocation of a chain is interrupted."""

    signum: int
    group: bool          # to the whole process group (a terminal), or to the orchestrator alone
    twice: bool = False  # again, while the first signal's shutdown is held up


# Each chain: `ampcert run`, interrupted; `--resume`, interrupted, as often as listed;
# then `--resume` with the gate open, to the end. Every stop is followed by a resume
# (the next invocation, or the last one), so every signal is checked both ways: it stops
# the invocation as the policy says, and the folder it leaves resumes, redoing only the
# interrupted run. Two chains of three stops, not one chain per signal: each invocation
# costs ~7 s of CPU (mostly imports), and the stops need no fresh folder of their own
# (four chains took 10 invocations for these six stops; two take 8, of which the two last
# resumes, never signalled, go through the warm CLI).
CHAINS = {
    # what a terminal sends the whole group: Ctrl-C, Ctrl-C again while the first is held up, a hangup
    "ctrl_c": [Stop(signal.SIGINT, group=True), Stop(signal.SIGINT, group=True, twice=True),
               Stop(signal.SIGHUP, group=True)],
    # `kill PID` to the orchestrator alone, then `kill -TERM -PGID` to its group
    "kill": [Stop(signal.SIGINT, group=False), Stop(signal.SIGTERM, group=False),
             Stop(signal.SIGTERM, group=True)],
}
INTERRUPTED = [f"{name}/{i}" for name, stops in CHAINS.items() for i in range(len(stops))]


@dataclass
class Chain:
    name: str
    stops: list[Stop]
    out: Path
    logs: Path
    gate: Path
    proc: subprocess.Popen | None = None
    launched_ns: int = 0
    plan_bytes: bytes = b""
    done_bytes: bytes = b""
    outcomes: list[dict] = field(default_factory=list)  # per interrupted invocation
    final: dict = field(default_factory=dict)           # the last --resume
    masks: dict = field(default_factory=dict)

    @property
    def step(self) -> int:
        return len(self.outcomes)

    def launch(self, suite: Path) -> None:
        args = ["run", str(suite), "--out", str(self.out)] if self.step == 0 else ["run", "--resume", str(self.out)]
        env = cli_env() | {"AMPCERT_TEST_GATE": str(self.gate)}
        # The last --resume is never signalled: it runs through the warm CLI (its exit code and
        # streams are the command's; it skips the cold start's imports). Every signalled
        # invocation is a cold interpreter of its own, the group's leader.
        last = self.step == len(self.stops)
        command = [str(warm_cli.bin_dir() / "ampcert")] if last else [sys.executable, "-m", "ampcert"]
        self.launched_ns = time.time_ns()
        with open(self.log("out"), "w") as out, open(self.log("err"), "w") as err:
            self.proc = subprocess.Popen([*command, *args], cwd=REPO, env=env, stdout=out,
                                         stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_default_sigint)

    def log(self, stream: str) -> Path:
        return self.logs / f"{self.step}.{stream}"

    def in_progress(self) -> bool:
        """A run finished (its result.json written) and this invocation's gate run started (its log opened)."""
        if not list(self.out.glob("runs/digits-*/result.json")):
            return False
        log = next(self.out.glob("runs/gate-*/run.mllog"), None)
        try:
            return log is not None and log.stat().st_mtime_ns >= self.launched_ns  # not a previous attempt's
        except FileNotFoundError:
            return False


def _default_sigint() -> None:
    """SIGINT and SIGHUP at their defaults in the child: a shell starts background jobs (a
    CI script's `cmd &`) with SIGINT ignored, `nohup` starts its command with SIGHUP
    ignored, exec keeps both, and ampcert rightly leaves an inherited ignore alone, so
    without this the SIGINT and SIGHUP stops would test the shell, not ampcert (under
    `nohup pytest` the SIGHUP stop would wait out the run's timeout and fail)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _children(pid: int) -> list[tuple[int, str, str]]:
    """(pid, state, command line) of the children of ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if int(fields[1]) == pid:
            found.append((int(stat.parent.name), fields[0], cmd))
    return found


def _state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rfind(")") + 2:].split()[0]


def _sigmask(pid: int, name: str) -> int:
    """A signal mask from ``/proc/PID/status`` (SigBlk, SigIgn), as an int."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {name} for pid {pid}")


def _bit(signum: int) -> int:
    return 1 << (signum - 1)


_STOPS = _bit(signal.SIGINT) | _bit(signal.SIGTERM) | _bit(signal.SIGHUP)


def _helpers(orchestrator: int) -> tuple[int, int, int]:
    """(forkserver, resource tracker, worker in progress) of an orchestrator."""
    kids = _children(orchestrator)
    forkserver = next(p for p, _, cmd in kids if "multiprocessing.forkserver" in cmd)
    tracker = next(p for p, _, cmd in kids if "multiprocessing.resource_tracker" in cmd)
    worker = next(p for p, state, _ in _children(forkserver) if state != "Z")
    return forkserver, tracker, worker


def _until(what: str, ready, chain: Chain) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        assert chain.proc is not None
        if chain.proc.poll() is not None:
            raise AssertionError(f"{chain.name}/{chain.step}: ampcert exited ({chain.proc.returncode}) before "
                                 f"{what}: " + chain.log("err").read_text()[-3000:])
        if time.monotonic() > deadline:
            raise AssertionError(f"{chain.name}/{chain.step}: no {what} within {WAIT_S} s")
        time.sleep(0.02)


def _interrupt(chain: Chain, stop: Stop) -> None:
    """Signal the chain's invocation in progress as ``stop`` says; record what it left."""
    proc = chain.proc
    assert proc is not None
    send = os.killpg if stop.group else os.kill
    forkserver, note = None, ""
    try:
        if stop.twice:
            forkserver, _, worker = _helpers(proc.pid)
            # A stopped forkserver can neither reap the worker nor tell the orchestrator
            # that it ended: the orchestrator's shutdown waits, as it would for a worker
            # stuck in the kernel, until a second signal ends it.
            os.kill(forkserver, signal.SIGSTOP)
            send(proc.pid, stop.signum)
            _until("the worker killed", lambda: _state(worker) == "Z", chain)
            time.sleep(0.3)
            assert proc.poll() is None, "the shutdown was not held up: the second signal would test nothing"
            sent = time.monotonic()
            send(proc.pid, stop.signum)
            proc.wait(timeout=30)
            note = f"exited {time.monotonic() - sent:.2f} s after the second signal"
            assert time.monotonic() - sent < 10, "a second signal must end the process at once"
        else:
            send(proc.pid, stop.signum)
            proc.wait(timeout=WAIT_S)
    finally:
        if forkserver is not None:
            os.kill(forkserver, signal.SIGCONT)
    left = wait_group_gone(proc.pid, 60)  # the forkserver and the tracker end after the orchestrator
    done, problem = ResultsDir(chain.out).check_result(_done_result(chain.out).parent.name)
    chain.outcomes.append({
        "stop": stop, "returncode": proc.returncode, "left": left, "note": note,
        "stderr": chain.log("err").read_text(),  # read once every writer is gone
        "stdout": chain.log("out").read_text(),
        "plan": (chain.out / "plan.json").read_bytes(),
        "done": _done_result(chain.out).read_bytes(),
        "done_loads": (done.status if done is not None else None, problem),
        "missing": load(chain.out).missing, "gate_id": _gate_dir(chain.out).name,
        "gate_files": sorted(p.name for p in _gate_dir(chain.out).iterdir()),
        "temp": sorted(str(p.relative_to(chain.out)) for p in chain.out.rglob("*.tmp")),
    })


def _done_result(out: Path) -> Path:
    return next(out.glob("runs/digits-*/result.json"))


def _gate_dir(out: Path) -> Path:
    return next(out.glob("runs/gate-*"))


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    root = tmp_path_factory.mktemp("signals")
    suite = root / "suite.yaml"
    suite.write_text(SUITE)
    todo = [Chain(name, stops, root / name, root / f"{name}.logs", root / f"{name}.gate")
            for name, stops in CHAINS.items()]
    running: list[subprocess.Popen] = []
    try:
        for chain in todo:
            chain.logs.mkdir()
            chain.launch(suite)
            running.append(chain.proc)
        waiting = list(todo)
        deadline = time.monotonic() + 3 * WAIT_S
        while waiting:
            for chain in list(waiting):
                assert chain.proc is not None
                if chain.proc.poll() is not None:
                    raise AssertionError(f"{chain.name}/{chain.step}: ampcert exited ({chain.proc.returncode}) "
                                         "before it was signalled: " + chain.log("err").read_text()[-3000:])
                if not chain.in_progress():
                    continue
                if chain.step == 0:
                    chain.plan_bytes = (chain.out / "plan.json").read_bytes()
                    chain.done_bytes = _done_result(chain.out).read_bytes()
                if chain.name == "ctrl_c" and chain.step == 0:  # what the policy rests on, seen from outside
                    forkserver, tracker, worker = _helpers(chain.proc.pid)
                    chain.masks = {
                        "worker_ignores_sigint": bool(_sigmask(worker, "SigIgn") & _bit(signal.SIGINT)),
                        "worker_blocks": _sigmask(worker, "SigBlk") & (_bit(signal.SIGTERM) | _bit(signal.SIGHUP)),
                        "forkserver_blocks": _sigmask(forkserver, "SigBlk") & _STOPS,
                        "tracker_blocks": _sigmask(tracker, "SigBlk") & _STOPS,
                        "tracker_ignores": _sigmask(tracker, "SigIgn") & _STOPS,
                    }
                _interrupt(chain, chain.stops[chain.step])
                if chain.step == len(chain.stops):  # the last resume: its gate opens
                    chain.gate.touch()
                    waiting.remove(chain)
                chain.launch(suite)
                running.append(chain.proc)
            if time.monotonic() > deadline:
                raise AssertionError(f"not done within {3 * WAIT_S} s: {[c.name for c in waiting]}")
            time.sleep(0.02)
        for chain in todo:
            assert chain.proc is not None
            chain.proc.wait(timeout=WAIT_S)
            chain.final = {"returncode": chain.proc.returncode, "stderr": chain.log("err").read_text(),
                           "stdout": chain.log("out").read_text()}
    finally:
        for proc in running:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for chain in todo:
            chain.gate.touch()  # a worker that outlived its group's SIGKILL goes on and ends
    return {chain.name: chain for chain in todo}


def _line(signum: int, out: Path) -> str:
    return (f"ampcert: interrupted by {signal.Signals(signum).name}; finished runs are kept; "
            f"resume with ampcert run --resume {out}")


@pytest.mark.slow
@pytest.mark.parametrize("which", INTERRUPTED)
def test_a_signal_stops_the_run_with_one_line_and_keeps_what_finished(chains, which):
    name, step = which.split("/")
    chain = chains[name]
    outcome = chain.outcomes[int(step)]
    stop: Stop = outcome["stop"]
    assert outcome["returncode"] == CODES[stop.signum], (which, outcome["stderr"], outcome["stdout"])
    # exactly one line: no worker traceback, no resource_tracker warning, nothing else
    assert outcome["stderr"].splitlines() == [_line(stop.signum, chain.out)], (which, outcome["stderr"])
    assert outcome["left"] == [], f"{which}: processes of its group outlived it (a worker not stopped?)"
    assert outcome["plan"] == chain.plan_bytes, f"{which}: plan.json changed"
    assert json.loads(outcome["plan"])["suite"] == "signals"
    assert outcome["done"] == chain.done_bytes, f"{which}: the finished run's result.json changed"
    assert outcome["done_loads"] == ("completed", None), which
    # the interrupted run: no result (not even a failed one), no half-written temp file: pending
    assert "result.json" not in outcome["gate_files"] and outcome["temp"] == [], (which, outcome)
    assert outcome["missing"] == [outcome["gate_id"]], which
    if int(step) > 0:  # a resume (after the chain's previous stop) that redid only the interrupted run
        assert "resuming: 1 of 2 runs already have results" in outcome["stdout"], (which, outcome["stdout"])
    if outcome["note"]:
        print(f"\n{which}: {outcome['note']}")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHAINS))
def test_resume_after_the_signal_finishes_the_folder_redoing_only_the_interrupted_run(chains, name):
    chain = chains[name]
    final = chain.final
    assert final.get("returncode") == 0, final
    assert final["stderr"] == "", final["stderr"]
    assert "resuming: 1 of 2 runs already have results" in final["stdout"], final["stdout"]
    rs = load(chain.out)
    assert rs.missing == [] and sorted(r.status for r in rs.runs) == ["completed", "completed"]
    assert _done_result(chain.out).read_bytes() == chain.done_bytes  # kept, not redone
    assert (chain.out / "plan.json").read_bytes() == chain.plan_bytes
    assert not (chain.out / ".lock").exists() and list(chain.out.rglob("*.tmp")) == []


@pytest.mark.slow
def test_workers_ignore_sigint_and_the_helpers_block_the_stop_signals(chains):
    """A terminal's Ctrl-C reaches every process of the group: the worker leaves
    it to the orchestrator (no traceback of its own), and the forkserver and
    resource tracker outlive the orchestrator's shutdown. The worker still ends
    on a SIGTERM or SIGHUP of its own (the orchestrator records a failed run)."""
    assert chains["ctrl_c"].masks == {
        "worker_ignores_sigint": True, "worker_blocks": 0, "forkserver_blocks": _STOPS,
        # the tracker unblocks SIGINT and SIGTERM, which it ignores, and keeps SIGHUP blocked
        "tracker_blocks": _bit(signal.SIGHUP), "tracker_ignores": _bit(signal.SIGINT) | _bit(signal.SIGTERM)}
