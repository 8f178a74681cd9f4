"""Workers that run out of memory; invocations on a folder in use; a plan,
verdicts or report file spoilt in a results folder: each failure detected and
explained in one line, never trusted.

(Workers that raise, diverge, hang past their timeout or are SIGKILLed:
tests/session/test_run_e2e.py::test_failures_are_isolated_and_explained. Spoilt
result files, reported and redone on resume: test_kill_resume.py.)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
from conftest import REPO, cli_env
from factories import warm_cli

from ampcert.results import FailureKind, ResultsDir, load

MEMORY = """
name: memory
device: cpu
precisions: [fp32]
seeds: [0]
train: {steps: 6, eval_every: 3}
timeout_s: 120
workloads:
  - workload: "reliability.rel_faults:oom"
  - workload: "reliability.rel_faults:oom_python"
  - workload: digits
  - workload: "reliability.rel_faults:gate"
"""
BUSY = {  # other invocations started on the folder while its `ampcert run` trains
    "resume": ["run", "--resume", "OUT"],
    "run": ["run", "SUITE", "--out", "OUT"],
    "report": ["report", "OUT"],
    "certify": ["certify", "OUT"],
}


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory):
    """`ampcert run` of MEMORY; while its last run is held at a gate, the BUSY
    invocations try the same folder; then the gate opens."""
    folder = tmp_path_factory.mktemp("memory")
    suite, out, gate = folder / "suite.yaml", folder / "out", folder / "gate"
    suite.write_text(MEMORY)
    env = cli_env() | {"AMPCERT_TEST_GATE": str(gate)}
    logs = [(folder / "first.stdout").open("w+"), (folder / "first.stderr").open("w+")]  # not pipes: never full
    first = subprocess.Popen([sys.executable, "-m", "ampcert", "run", str(suite), "--out", str(out)], cwd=REPO,
                             env=env, stdout=logs[0], stderr=logs[1], text=True)
    busy = {}
    try:
        deadline = time.monotonic() + 300
        while not list(out.glob("runs/gate-*/run.mllog")) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        # each refused at once (never waiting for the lock): one after another, forked warm
        for name, args in BUSY.items():
            busy[name] = warm_cli(*[{"OUT": str(out), "SUITE": str(suite)}.get(a, a) for a in args],
                                  env={"AMPCERT_TEST_GATE": str(gate)}, timeout=300)
        still_running = first.poll() is None
    finally:
        gate.touch()
    first.wait(timeout=300)
    outputs = []
    for f in logs:
        f.seek(0)
        outputs.append(f.read())
        f.close()
    stdout, stderr = outputs
    return out, subprocess.CompletedProcess(first.args, first.returncode, stdout, stderr), busy, still_running, first.pid


def _by_label(out):
    return {r.spec.label: r for r in load(out).runs}


@pytest.mark.slow
def test_a_worker_out_of_memory_fails_alone_with_the_reason(memory_run):
    out, proc, *_ = memory_run
    assert proc.returncode == 1, proc.stdout + proc.stderr  # runs failed; the suite finished
    assert "Traceback" not in proc.stdout + proc.stderr
    runs = _by_label(out)
    assert runs["oom"].status == "failed" and "can't allocate memory" in runs["oom"].reason
    assert runs["oom_python"].status == "failed" and runs["oom_python"].reason.startswith("MemoryError")
    assert runs["oom"].failure == runs["oom_python"].failure == FailureKind.ERROR  # the worker caught both
    # the failed steps are recorded, and the traceback is kept beside the result
    assert runs["oom"].steps == 0 and (ResultsDir(out).run_dir(runs["oom"].run_id) / "error.txt").is_file()
    # each run has its own process: the runs after the out-of-memory ones train normally
    assert runs["digits"].status == "completed" and runs["gate"].status == "completed"
    assert len(runs["digits"].loss) == 6


@pytest.mark.slow
def test_invocations_on_a_folder_in_use_are_refused_with_a_clear_line(memory_run):
    out, first, busy, still_running, pid = memory_run
    assert still_running, "the first invocation ended before the others tried its folder"
    for name, proc in busy.items():
        assert proc.returncode == 2, (name, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stdout + proc.stderr, (name, proc.stderr)
        if name == "run":  # a new suite into it: the folder is not empty
            assert f"--out {out}: folder is not empty" in lines[0]
        else:  # everything else waits for the lock, naming its owner
            assert f"{out}: another ampcert (pid {pid}) is writing" in lines[0], lines[0]
    assert not (out / ".lock").exists()  # released by the owner at its end; never stolen
    assert len(load(out).runs) == 4 and not (out / "verdicts.json").exists()


@pytest.mark.slow
def test_corrupted_plan_verdicts_and_report_are_one_line_exit_2(memory_run, tmp_path):
    from ampcert.report.sign import keygen

    key, _ = keygen(tmp_path / "signing.key")
    cases = {  # the file to spoil, what to write there, the command (on DIR), what the one line says
        "plan": ("plan.json", '{"suite": "memory", "runs": [', ["run", "--resume", "DIR"], "unreadable plan"),
        "plan-deep": ("plan.json", "[" * 100000, ["run", "--resume", "DIR"], "unreadable plan"),
        "verdicts": ("verdicts.json", '{"rules": {}, "status": "PASS"', ["report", "DIR"],
                     "verdicts.json: not trusted"),
        "report": ("report.json", '{"schema_version": 1}', ["sign", "DIR", "--key", str(key)],
                   "report.json: not an ampcert report"),
    }
    for name, (file, text, command, _) in cases.items():
        folder = tmp_path / name
        shutil.copytree(memory_run[0], folder)
        (folder / file).write_text(text)
        proc = warm_cli(*[str(folder) if a == "DIR" else a for a in command], timeout=300)
        out, err = proc.stdout, proc.stderr
        assert proc.returncode == 2, (name, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and cases[name][3] in lines[0] and "Traceback" not in out + err, (name, err)


# --------------------------------------------------------------------------- failure kinds


def test_the_kind_of_a_failure_comes_from_the_exception_type_not_its_words():
    from ampcert.backends.contract import LossNotFinite, RunFailed, Unsupported
    from ampcert.errors import UserError
    from ampcert.runner.worker import classify

    class RunFailedLookalike(Exception):  # the name alone makes nothing the harness's own
        pass

    RunFailedLookalike.__name__ = "RunFailed"
    assert classify(LossNotFinite("non-finite loss at step 5 (fp32, no loss scaling)")) == (
        FailureKind.NON_FINITE, "non-finite loss at step 5 (fp32, no loss scaling)")
    assert classify(Unsupported("no JAX version")) == (FailureKind.UNSUPPORTED, "no JAX version")
    assert classify(RunFailed("rank 0 ended the run at step 3")) == (FailureKind.ERROR, "rank 0 ended the run at step 3")
    assert classify(UserError("params: bad")) == (FailureKind.BAD_INPUT, "params: bad")
    # a message that merely mentions nan or non-finite is an error in the training code
    assert classify(ValueError("loss is nan, non-finite")) == (FailureKind.ERROR, "ValueError: loss is nan, non-finite")
    assert classify(RunFailedLookalike("x")) == (FailureKind.ERROR, "RunFailed: x")


def _spec(workload: str, **update):
    from ampcert.spec import expand, parse_suite

    suite = parse_suite({"name": "kinds", "precisions": ["fp32"], "seeds": [0], "device": "cpu",
                         "train": {"steps": 8, "eval_every": 4}, "workloads": [{"workload": workload}]})
    (spec,) = expand(suite, "cpu")
    return spec.model_copy(update=update)


def test_a_non_finite_loss_is_recorded_as_such_with_its_reason(tmp_path):
    import torch

    from ampcert.runner.worker import execute

    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        result = execute(_spec("fault_workloads:nan"), tmp_path)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert (result.status, result.failure) == ("failed", FailureKind.NON_FINITE)
    assert result.reason == "non-finite loss at step 5 (fp32, no loss scaling)"
    assert ResultsDir(tmp_path).read_result(result.run_id) == result
    # a failed run measured nothing: no phases, no loss scaling record
    assert result.phases is None and result.loss_scale is None and result.steps == 0
