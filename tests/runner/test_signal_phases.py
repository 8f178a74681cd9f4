"""A signal in each phase of a command gives the one line and its exit code, and loses nothing.

The signal is sent from inside the real CLI, deterministically, at the moment
a phase begins: a small wrapper (``SIGNAL_AT``) replaces one function of that
phase with one that signals and then goes on. Each invocation runs in a
session of its own, so that "the group" is ampcert, its forkserver, resource
tracker and worker, as a terminal's Ctrl-C reaches them.

Phases: planning (the device probe), running (the first worker started),
finishing (the report being rendered, after every run has its result),
signing (the envelope being written, by ``run --sign-key`` and by ``sign``),
and printing (the CLI printing what the session returned, and the teardown after it).

Every invocation is a process of its own, started as `subprocess.run(...,
start_new_session=True)` would start it, but forked from a server that has imported
the heavy libraries (torch, scipy, matplotlib: about 3 s of CPU a cold start; not
ampcert, which each command imports afresh): what is under test is what the command
does with the signal, not how an interpreter starts. Its exit code is its real wait
status (a death by a signal reads as one), and the signal wrapper is its ``__main__``,
as it is when run as a script. The `--resume`s that finish a folder afterwards start
from the same server; the signing key is made in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import cli_env

from ampcert.report.sign import keygen
from ampcert.results import ResultsDir

SIGNAL_AT = textwrap.dedent("""\
    import importlib, os, signal, sys

    if __name__ == "__main__":
        target, how = sys.argv.pop(1), sys.argv.pop(1)
        after = target.endswith("+")  # signal once the function has run, not before
        module_name, _, attr = target.rstrip("+").rpartition(":")
        owner = importlib.import_module(module_name)
        for part in attr.split(".")[:-1]:
            owner = getattr(owner, part)
        name = attr.split(".")[-1]
        original = getattr(owner, name)

        def send():
            if how == "group-sigint":
                os.killpg(0, signal.SIGINT)   # a terminal's Ctrl-C
            else:
                os.kill(os.getpid(), signal.SIGTERM)  # `kill PID`

        def signalled(*args, **kwargs):
            if not after:
                send()
            result = original(*args, **kwargs)
            if after:
                send()
            return result

        setattr(owner, name, signalled)
        sys.argv[0] = "ampcert"
        from ampcert.cli import main
        main()
""")

SUITE = """\
name: phases
device: cpu
precisions: [fp32]
seeds: [0, 1]
unaccelerated: run
train: {steps: 4, eval_every: 2}
timeout_s: 120
workloads:
  - workload: digits
"""


# The server: imports what a cold `ampcert` process spends its start on (torch for the
# device probe, the report's libraries), then, for each connection, forks a watcher that
# forks the command's process and sends back its pid and then its wait status. The
# command's process leaves the accept loop and runs at the top level of this script, so
# that it ends as an interpreter does (SystemExit, an uncaught exception, atexit hooks).
_SERVER = r"""
import json, os, runpy, signal, socket, sys, threading
import numpy, pandas, scipy.stats, yaml, pydantic, jinja2, psutil  # noqa: E401
import matplotlib
matplotlib.use("svg")
import matplotlib.pyplot  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402
import torch  # noqa: E402


def serve(path):
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(8)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the watchers reap themselves
    # No Python thread besides this one (the client checks), so no lock is held across the
    # fork; OpenBLAS's pool (numpy, scipy) stops itself for a fork and restarts after it.
    print("ready", threading.active_count(), flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork():
            conn.close()
            continue
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        request = json.loads(conn.makefile("rb").readline())
        pid = os.fork()
        if pid == 0:
            conn.close()
            return request
        conn.sendall(b"%d\n" % pid)
        _, status = os.waitpid(pid, 0)
        conn.sendall(b"%d\n" % status)
        os._exit(0)


request = serve(sys.argv[1])
del serve
# As subprocess.run(..., start_new_session=True) starts a fresh interpreter: a session (and
# process group) of its own, its streams, folder and environment, the handlers a new
# interpreter has (SIGINT raises KeyboardInterrupt), no signal blocked.
os.setsid()
for fd, (path, flags) in enumerate([(os.devnull, os.O_RDONLY), (request["stdout"], os.O_WRONLY),
                                    (request["stderr"], os.O_WRONLY)]):
    opened = os.open(path, flags)
    os.dup2(opened, fd)
    os.close(opened)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
signal.signal(signal.SIGINT, signal.default_int_handler)
for sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_SETMASK, [])
sys.argv = list(request["argv"])
if request["argv"][0] == "-m":  # python -m MODULE ARGS
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:  # python SCRIPT ARGS
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def forked():
    """``forked(ARGV, cwd)``: ``python ARGV`` (a script or ``-m ampcert``) as its own process
    in a session of its own, forked from the server; a CompletedProcess as subprocess.run's."""
    folder = tempfile.mkdtemp(prefix="signal-phases-")
    path = os.path.join(folder, "socket")
    log = Path(folder) / "server.log"  # what the server (or a command before its streams were set) printed
    with log.open("wb") as server_err:
        server = subprocess.Popen([sys.executable, "-c", _SERVER, path], env=cli_env(), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=server_err)
    ready = server.stdout.readline().split()
    assert ready == [b"ready", b"1"], f"the server did not start with one Python thread: {ready} {log.read_text()}"

    def run(argv: list[object], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
        argv = [str(a) for a in argv]
        with tempfile.NamedTemporaryFile(dir=folder) as out, tempfile.NamedTemporaryFile(dir=folder) as err, \
                socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            sock.sendall(json.dumps({"argv": argv, "cwd": str(cwd), "env": cli_env(), "stdout": out.name,
                                     "stderr": err.name}).encode() + b"\n")
            sock.settimeout(timeout)
            replies = sock.makefile("rb")
            pid = int(replies.readline())
            try:
                status = replies.readline()
            except TimeoutError:
                os.killpg(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(argv, timeout) from None
            assert status.strip(), "the watcher died: " + log.read_text()[-2000:]
            stdout, stderr = (open(f.name, "rb").read().decode("utf-8", "replace").replace("\r\n", "\n")
                              for f in (out, err))
        return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(int(status)), stdout, stderr)

    yield run
    server.kill()
    server.wait()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def signalled_cli(forked, tmp_path):
    """``ampcert ARGS`` under the signal wrapper (SIGNAL_AT), in ``tmp_path``."""
    wrapper = tmp_path / "signal_at.py"
    wrapper.write_text(SIGNAL_AT)

    def run(target: str, how: str, *args: object) -> subprocess.CompletedProcess:
        return forked([wrapper, target, how, *args], cwd=tmp_path)

    return run


@pytest.fixture
def resume(forked, tmp_path):
    """``ampcert run --resume FOLDER`` (no signal), in ``tmp_path``."""
    return lambda folder: forked(["-m", "ampcert", "run", "--resume", folder], cwd=tmp_path)


def assert_interrupted(proc: subprocess.CompletedProcess, how: str, folder: Path | None) -> None:
    code, name = (130, "SIGINT") if how == "group-sigint" else (143, "SIGTERM")
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    expected = f"ampcert: interrupted by {name}"
    if folder is not None:
        expected += f"; finished runs are kept; resume with ampcert run --resume {folder}"
    assert lines[0] == expected


def no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.rglob(".*.tmp")]


# Both ways (a terminal's Ctrl-C to the group, `kill PID` to ampcert alone) where the
# bug was (finishing); one way, alternating, in the other phases: each invocation costs
# a torch import and a run, and the policy is one handler for all three signals.
BOTH = ["group-sigint", "self-sigterm"]


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "phases.yaml"
    path.write_text(SUITE)
    return path


@pytest.mark.parametrize("how", ["self-sigterm"])
def test_planning(tmp_path, suite, signalled_cli, how):
    proc = signalled_cli("ampcert.backends.capability:probe", how, "run", suite, "--out", "out")
    assert_interrupted(proc, how, None)
    assert not (tmp_path / "out").exists()  # nothing written before the plan


@pytest.mark.parametrize("how", ["group-sigint"])
def test_running_then_resume_redoes_only_the_interrupted_run(tmp_path, suite, signalled_cli, resume, how):
    proc = signalled_cli("ampcert.runner.local_executor:WorkerRun.__init__+", how,
                         "run", suite, "--out", "out")
    out = tmp_path / "out"
    assert_interrupted(proc, how, Path("out"))
    rd = ResultsDir(out)
    assert len(rd.read_plan().runs) == 2 and no_temp_files(out)
    assert all(rd.read_result(r.run_id) is None for r in rd.read_plan().runs)  # the first run was stopped
    resumed = resume(out)
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "report.json").exists()


@pytest.mark.parametrize("how", BOTH)
def test_finishing_keeps_every_result(tmp_path, suite, signalled_cli, resume, how):
    proc = signalled_cli("ampcert.report.render:write", how, "run", suite, "--out", "out")
    out = tmp_path / "out"
    assert_interrupted(proc, how, Path("out"))
    rd = ResultsDir(out)
    runs = rd.read_plan().runs
    stored = {r.run_id: rd.result_file(r.run_id).read_bytes() for r in runs}
    assert all(rd.read_result(r.run_id) is not None for r in runs) and no_temp_files(out)
    resumed = resume(out)
    assert resumed.returncode == 0, resumed.stderr
    assert {r.run_id: rd.result_file(r.run_id).read_bytes() for r in runs} == stored  # nothing redone
    assert (out / "report.json").exists() and (out / "report.html").exists()


@pytest.mark.parametrize("how", ["group-sigint"])
def test_signing(tmp_path, suite, signalled_cli, how):
    key, _ = keygen(tmp_path / "k.key")
    proc = signalled_cli("ampcert.report.sign:sign_results", how,
                         "run", suite, "--out", "out", "--sign-key", key)
    out = tmp_path / "out"
    assert_interrupted(proc, how, Path("out"))
    assert not (out / "report.dsse.json").exists() and no_temp_files(out)
    # `ampcert sign` on its own, interrupted the same way: no envelope, no temp file, the lock released.
    proc = signalled_cli("ampcert.report.sign:sign_results", how, "sign", out, "--key", key)
    assert_interrupted(proc, how, None)
    assert not (out / "report.dsse.json").exists() and no_temp_files(out) and not (out / ".lock").exists()


@pytest.mark.parametrize("how", ["self-sigterm"])
def test_printing_and_exiting(tmp_path, suite, signalled_cli, how):
    """After the session returned: while the CLI prints what it returned, and once the exit
    code is known (the interpreter's teardown is left), a signal still gives the one line."""
    proc = signalled_cli("ampcert.cli.views:print_finished", how, "run", suite, "--out", "out")
    assert_interrupted(proc, how, None)
    assert (tmp_path / "out" / "report.json").exists()
    proc = signalled_cli("ampcert.session:closing+", how, "report", tmp_path / "out")
    assert_interrupted(proc, how, None)
