"""The shipped own-job examples, certified as users run them: real HF Trainer, Lightning and
mlperf_logging jobs as own jobs (examples/own_job/suite.yaml as shipped: fp32 and
bf16 x 3 seeds and a repeat, the default rule pack), signed and verified from the command line.

The suite is the slowest thing here: 28 jobs, each a fresh interpreter that spent most of its
CPU importing torch, transformers and lightning (2 to 7 s of a job's 4 to 12; the suite took
200 s of CPU). Its interpreters hand their job to a zygote that has imported those once
(own_job_zygote/): the same script, argv, working folder, environment, streams and exit
code, and the same evaluations bit for bit as cold starts. What differs: ampcert samples
the waiting interpreter's process tree, not the child's (peak memory, energy), and what a
job imported on the clock is imported already (torch._dynamo, 1.4 s of a cold MLLOG job's
run), so throughput and time to target come out higher. Nothing here reads those values
beyond their being there. The suite runs once per session, in this process, and the tests
read its folder. The disclosure test's job starts cold, as a user's `python hf_trainer.py`.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, cli_env
from factories import built_once

from ampcert.results import load

# Installed, not imported: the jobs import them (in the zygote), this process only reads results.
for _name in ("transformers", "lightning"):
    if importlib.util.find_spec(_name) is None:
        pytest.skip(f"could not find {_name!r} (pip install 'ampcert[hf,lightning]')", allow_module_level=True)

EXAMPLES = REPO / "examples" / "own_job"
ZYGOTE = Path(__file__).resolve().parent / "own_job_zygote"
JOBS = ("hf-bert", "lightning-encoder", "mllog-mlp")


@contextmanager
def own_job_zygote() -> Iterator[SimpleNamespace]:
    """A zygote for the examples' jobs (own_job_zygote/zygote.py), running until the block
    ends. Yields ``env``, the environment under which an `ampcert run` hands its jobs to it,
    and, once the block is over, ``jobs``: how many it ran."""
    folder = tempfile.mkdtemp(prefix="own-job-zygote-")  # a short path: a socket's is at most 107 bytes
    socket_path = os.path.join(folder, "socket")
    base = cli_env()
    env = {"PYTHONPATH": os.pathsep.join([str(ZYGOTE), base["PYTHONPATH"]]),
           "OWN_JOB_ZYGOTE_SOCKET": socket_path, "OWN_JOB_ZYGOTE_SCRIPTS": str(EXAMPLES)}
    # What the suite's jobs are told too, for what their libraries read on import.
    server_env = base | env | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    errors = Path(folder) / "stderr.txt"
    with errors.open("wb") as err:
        server = subprocess.Popen([sys.executable, str(ZYGOTE / "zygote.py"), socket_path], env=server_env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    zygote = SimpleNamespace(env=env, jobs=None)
    try:
        assert server.stdout.readline() == b"ready\n", f"the own-job zygote did not start: {errors.read_text()[-3000:]}"
        yield zygote
    finally:
        # Its stdin closed, it ends once its children are reaped (their CPU time counted here).
        try:
            out, _ = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            out, _ = server.communicate()
        shutil.rmtree(folder, ignore_errors=True)
        last = out.split()  # b"jobs N", at its exit
        zygote.jobs = int(last[1]) if last[:1] == [b"jobs"] and len(last) == 2 else None


def ampcert_here(*args: object, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``ampcert ARGS`` through the entry point in this process, as conftest's ``cli_here``
    (which a module's fixture cannot use), with ``env`` laid over os.environ (what a
    own job is started with)."""
    from ampcert.cli import main

    argv = ["ampcert", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as m, redirect_stdout(out), redirect_stderr(err):
        m.chdir(cwd)
        m.setattr(sys, "argv", argv)
        for name, value in (env or {}).items():
            m.setenv(name, value)
        with pytest.raises(SystemExit) as exit_:
            main()
    code = exit_.value.code
    return subprocess.CompletedProcess(argv, code if isinstance(code, int) else 1, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def certified(tmp_path_factory) -> Path:
    """examples/own_job/suite.yaml run and signed once per test session (however many xdist
    workers ask); the results folder, with the key beside it."""
    def build(tmp: Path) -> None:
        assert ampcert_here("keygen", tmp / "key", cwd=tmp).returncode == 0
        with own_job_zygote() as zygote:
            proc = ampcert_here("run", EXAMPLES / "suite.yaml", "--out", tmp / "out", "--sign-key", tmp / "key",
                                cwd=tmp, env=zygote.env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # Every job handed over: a cold start is as right, but it made this file 4 times as slow.
        assert zygote.jobs == 28, f"the zygote ran {zygote.jobs} of the suite's 28 jobs"

    return built_once(tmp_path_factory, "own-job-zygote", build) / "out"


def test_the_three_jobs_are_certified_with_parity_throughput_and_time_to_quality(certified):
    verdicts = json.loads((certified / "verdicts.json").read_text())
    assert verdicts["status"] == "PASS", json.dumps(verdicts, indent=1)[:3000]
    for job in JOBS:
        checks = {v["rule"]: v for v in verdicts["verdicts"]
                  if (v["subject"]["workload"], v["subject"]["precision"]) == (job, "bf16")}
        assert checks["parity.final_metric"]["status"] == "PASS", checks["parity.final_metric"]
        assert "TOST" in checks["parity.final_metric"]["summary"]
        assert checks["convergence.samples_to_target"]["status"] == "PASS"
        assert checks["determinism.repeat_run"]["status"] == "PASS"
    # Lightning's bf16-true, certified as the recipe (the default pack's bf16 rules judge it)
    true = {v["rule"]: v["status"] for v in verdicts["verdicts"]
            if (v["subject"]["workload"], v["subject"]["precision"]) == ("lightning-encoder", "bf16-true")}
    assert true["parity.final_metric"] == true["convergence.samples_to_target"] == "PASS", true
    runs = load(certified).runs
    assert len(runs) == 28 and all(r.status == "completed" for r in runs), [r.reason for r in runs]
    for r in runs:
        assert r.samples_per_s and r.samples_per_s > 0 and r.time_to_target_s and r.time_to_target_s > 0
        assert len(r.evals) >= 3 and r.final_metric > 0.8
        # Each job measured the precision its first step computed in, through its callback or not at all.
        if r.spec.label != "mllog-mlp":
            assert r.lowest_precision.linear == ("fp32" if r.spec.precision == "fp32" else "bfloat16")


def test_the_signed_report_verifies(certified, cli_here):
    proc = cli_here("verify", certified / "report.dsse.json", "--pubkey", certified.parent / "key.pub")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_job_declared_bf16_that_trains_fp32_fails_the_precision_disclosure(tmp_path, cli_here):
    """The HF example told to ignore the precision it is asked for trains fp32; its
    callback measures that, and the declared bf16 disclosure fails."""
    for name in ("hf_trainer.py",):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    (tmp_path / "rules.yaml").write_text(textwrap.dedent("""\
        name: disclosure-only
        version: 1
        rules:
          - id: disclosure.lowest_precision
            check: precision_disclosure
            measures: the job's measured lowest precision against the declared one
            required: true
        """))
    (tmp_path / "suite.yaml").write_text(textwrap.dedent("""\
        name: declared-bf16
        device: cpu
        precisions: [bf16]
        seeds: [0]
        certify: rules.yaml
        submission:
          lowest_precision:
            bf16: {linear: bfloat16}
        workloads:
          - id: hf-bert
            command: ["{python}", hf_trainer.py]
            env: {EXAMPLE_IGNORE_PRECISION: "1", OMP_NUM_THREADS: "1"}
        """))
    proc = cli_here("run", tmp_path / "suite.yaml", "--out", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    (verdict,) = verdicts["verdicts"]
    assert verdict["status"] == "FAIL"
    assert "linear declared bfloat16, measured fp32" in verdict["summary"]
