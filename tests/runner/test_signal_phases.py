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

Only the signalled invocations start cold (the wrapper must be their interpreter); the
`--resume`s that finish a folder afterwards run through the warm CLI (tests/factories.py),
and the signing key is made in this process.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import cli_env
from factories import warm_cli

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


def signalled_cli(tmp_path: Path, target: str, how: str, *args: object) -> subprocess.CompletedProcess:
    wrapper = tmp_path / "signal_at.py"
    wrapper.write_text(SIGNAL_AT)
    env = cli_env()
    return subprocess.run([sys.executable, str(wrapper), target, how, *map(str, args)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


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
def test_planning(tmp_path, suite, how):
    proc = signalled_cli(tmp_path, "ampcert.backends.capability:probe", how, "run", suite, "--out", "out")
    assert_interrupted(proc, how, None)
    assert not (tmp_path / "out").exists()  # nothing written before the plan


@pytest.mark.parametrize("how", ["group-sigint"])
def test_running_then_resume_redoes_only_the_interrupted_run(tmp_path, suite, how):
    proc = signalled_cli(tmp_path, "ampcert.runner.local_executor:WorkerRun.__init__+", how,
                         "run", suite, "--out", "out")
    out = tmp_path / "out"
    assert_interrupted(proc, how, Path("out"))
    rd = ResultsDir(out)
    assert len(rd.read_plan().runs) == 2 and no_temp_files(out)
    assert all(rd.read_result(r.run_id) is None for r in rd.read_plan().runs)  # the first run was stopped
    resumed = warm_cli("run", "--resume", out, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "report.json").exists()


@pytest.mark.parametrize("how", BOTH)
def test_finishing_keeps_every_result(tmp_path, suite, how):
    proc = signalled_cli(tmp_path, "ampcert.report.render:write", how, "run", suite, "--out", "out")
    out = tmp_path / "out"
    assert_interrupted(proc, how, Path("out"))
    rd = ResultsDir(out)
    runs = rd.read_plan().runs
    stored = {r.run_id: rd.result_file(r.run_id).read_bytes() for r in runs}
    assert all(rd.read_result(r.run_id) is not None for r in runs) and no_temp_files(out)
    resumed = warm_cli("run", "--resume", out, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert {r.run_id: rd.result_file(r.run_id).read_bytes() for r in runs} == stored  # nothing redone
    assert (out / "report.json").exists() and (out / "report.html").exists()


@pytest.mark.parametrize("how", ["group-sigint"])
def test_signing(tmp_path, suite, how):
    key, _ = keygen(tmp_path / "k.key")
    proc = signalled_cli(tmp_path, "ampcert.report.sign:sign_results", how,
                         "run", suite, "--out", "out", "--sign-key", key)
    out = tmp_path / "out"
    assert_interrupted(proc, how, Path("out"))
    assert not (out / "report.dsse.json").exists() and no_temp_files(out)
    # `ampcert sign` on its own, interrupted the same way: no envelope, no temp file, the lock released.
    proc = signalled_cli(tmp_path, "ampcert.report.sign:sign_results", how, "sign", out, "--key", key)
    assert_interrupted(proc, how, None)
    assert not (out / "report.dsse.json").exists() and no_temp_files(out) and not (out / ".lock").exists()


@pytest.mark.parametrize("how", ["self-sigterm"])
def test_printing_and_exiting(tmp_path, suite, how):
    """After the session returned: while the CLI prints what it returned, and once the exit
    code is known (the interpreter's teardown is left), a signal still gives the one line."""
    proc = signalled_cli(tmp_path, "ampcert.cli.views:print_finished", how, "run", suite, "--out", "out")
    assert_interrupted(proc, how, None)
    assert (tmp_path / "out" / "report.json").exists()
    proc = signalled_cli(tmp_path, "ampcert.session:closing+", how, "report", tmp_path / "out")
    assert_interrupted(proc, how, None)
