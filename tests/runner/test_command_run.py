"""Own jobs: a team's own job run by ampcert, read from the MLLOG it writes.

Real jobs (small Python scripts written by each test), real process trees, the
real local executor and the real MLLOG writer of MLPerf (mlperf_logging.mllog).
The jobs import no framework, so each run costs a Python start-up.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import assert_one_line_error, cli_env, run_cli

from ampcert.results import FailureKind, ResultsDir, load
from ampcert.runner.procs import alive
from ampcert.session import resume, run_suite

# A job that writes MLLOG through mlcommons' own logger: the accuracy rises by
# `STEP` per epoch from a seed-dependent start, and it logs eval intervals.
MLLOG_JOB = """\
import os, sys, time
from mlperf_logging import mllog
mllog.config(filename=os.environ["AMPCERT_MLLOG"])
log = mllog.get_mllogger()
seed = int(os.environ["AMPCERT_SEED"])
assert sys.argv[1] == os.environ["AMPCERT_PRECISION"], sys.argv
log.event(key=mllog.constants.SEED, value=seed)
log.event(key=mllog.constants.GLOBAL_BATCH_SIZE, value=32)
log.start(key=mllog.constants.RUN_START)
acc = 0.5 + 0.001 * seed
for epoch in range(1, 4):
    time.sleep(0.05)
    log.start(key=mllog.constants.EVAL_START, metadata={"epoch_num": epoch})
    acc += 0.1
    log.end(key=mllog.constants.EVAL_STOP, metadata={"epoch_num": epoch})
    log.event(key=mllog.constants.EVAL_ACCURACY, value=acc, metadata={"epoch_num": epoch, "samples_count": epoch * 320})
log.end(key=mllog.constants.RUN_STOP, metadata={"status": "success"})
print("trained", sys.argv[1])
"""


def _suite(tmp_path: Path, job: str, *, extra: str = "", entry: str = "", precisions: str = "[fp32, bf16]",
           seeds: str = "[0]", argv: str = '["{python}", job.py, "{precision}"]') -> Path:
    (tmp_path / "job.py").write_text(job)
    path = tmp_path / "suite.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: own-job
        device: cpu
        precisions: {precisions}
        seeds: {seeds}
        {extra}
        workloads:
          - id: job
            command: {argv}
            target: 0.75
        """) + textwrap.indent(textwrap.dedent(entry), "    "))
    return path


def test_a_script_logging_with_mlperf_logging_becomes_the_run_fields(tmp_path):
    done = run_suite(_suite(tmp_path, MLLOG_JOB), tmp_path / "out")
    rs = load(done.root).runs
    assert [r.status for r in rs] == ["completed", "completed"], [r.reason for r in rs]
    r = next(r for r in rs if r.spec.precision == "bf16")
    assert (r.metric, r.higher_is_better, r.target) == ("accuracy", True, 0.75)
    assert [e.value for e in r.evals] == pytest.approx([0.6, 0.7, 0.8])
    assert [e.samples for e in r.evals] == [320, 640, 960] and [e.step for e in r.evals] == [10, 20, 30]
    assert r.final_metric == pytest.approx(0.8) and r.train_samples == 960 and r.steps == 30
    # time to target: run_start to the eval that first reached 0.75 (the third), evals included
    assert r.target_reached and r.samples_to_target == 960 and r.steps_to_target == 30
    assert 0.1 < r.time_to_target_s < 5
    # throughput over the training time, the logged eval intervals left out
    assert r.samples_per_s == pytest.approx(960 / r.phases.train_s, rel=1e-6)
    assert r.peak_memory.value > 1e6 and "process tree" in r.peak_memory.method
    assert r.telemetry["sampling"]["requested_hz"] == 10.0 and r.telemetry["phases_s"]["train"] > 0
    assert r.environment["command"][1:] == ["job.py", "bf16"] and r.environment["exit_code"] == 0
    assert r.environment["code"]["files"]["job.py"]  # the script's digest: edits outside git are seen
    run_dir = ResultsDir(done.root).run_dir(r.run_id)
    assert (run_dir / "stdout.txt").read_text().endswith("trained bf16\n")  # (mllog echoes to stdout too)
    assert ":::MLLOG" in (run_dir / "run.mllog").read_text()


BAD_JOBS = {
    "exits non-zero": ("import sys; print('boom', file=sys.stderr); sys.exit(3)",
                       "the command exited with code 3; last line of stderr.txt: boom"),
    "writes no log": ("print('hello')", "wrote no MLLOG"),
    "unparsable log": ("import os; open(os.environ['AMPCERT_MLLOG'], 'w').write(':::MLLOG {not json\\n')",
                       "run.mllog line 1:"),
    "never logs run_stop": (
        "import os, json, time\n"
        "open(os.environ['AMPCERT_MLLOG'], 'w').write(':::MLLOG ' + json.dumps({'namespace': '', 'time_ms': 1, "
        "'event_type': 'INTERVAL_START', 'key': 'run_start', 'value': None, 'metadata': {}}) + '\\n')",
        "no run_stop"),
    "leaves children behind": (
        "import subprocess, sys, os\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open(os.path.join(os.environ['AMPCERT_RUN_DIR'], 'child.pid'), 'w').write(str(p.pid))\n",
        "left 1 process(es) running"),
}


@pytest.mark.parametrize("case", sorted(BAD_JOBS))
def test_a_bad_job_is_a_failed_run_with_its_reason_and_its_output_kept(tmp_path, case):
    job, reason = BAD_JOBS[case]
    done = run_suite(_suite(tmp_path, job, precisions="[fp32]"), tmp_path / "out")
    (r,) = load(done.root).runs
    assert r.status == "failed" and r.failure_kind == FailureKind.ERROR
    assert reason in r.reason, r.reason
    run_dir = ResultsDir(done.root).run_dir(r.run_id)
    assert (run_dir / "stdout.txt").exists() and (run_dir / "stderr.txt").exists()
    if case == "leaves children behind":
        child = int((run_dir / "child.pid").read_text())
        assert not alive(child)


def test_a_command_that_is_not_found_fails_its_run_and_the_suite_goes_on(tmp_path):
    path = _suite(tmp_path, MLLOG_JOB, precisions="[fp32]", argv="[./no-such-program]")
    done = run_suite(path, tmp_path / "out")
    (r,) = load(done.root).runs
    assert r.status == "failed" and "cannot start the command './no-such-program'" in r.reason
    assert "No such file or directory" in r.reason


def test_a_job_past_its_timeout_is_ended_with_its_whole_tree(tmp_path):
    job = ("import subprocess, sys, os, time\n"
           "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
           "open(os.path.join(os.environ['AMPCERT_RUN_DIR'], 'child.pid'), 'w').write(str(p.pid))\n"
           "time.sleep(60)\n")
    done = run_suite(_suite(tmp_path, job, precisions="[fp32]", entry="timeout_s: 2\n"), tmp_path / "out")
    (r,) = load(done.root).runs
    assert r.status == "failed" and r.failure_kind == FailureKind.TIMEOUT and "past 2 s" in r.reason
    child = int((ResultsDir(done.root).run_dir(r.run_id) / "child.pid").read_text())
    assert not alive(child)


def test_an_unknown_template_field_is_one_line_at_planning(tmp_path):
    path = _suite(tmp_path, MLLOG_JOB, argv='["{python}", job.py, "{precison}"]')
    proc = run_cli("run", path, "--out", tmp_path / "out")
    assert_one_line_error(proc, "command[2]", "unknown template field {precison}", "{precision}")
    assert not (tmp_path / "out").exists()


SLOW_JOB = """\
import os, subprocess, sys, time
from mlperf_logging import mllog
mllog.config(filename=os.environ["AMPCERT_MLLOG"])
log = mllog.get_mllogger()
log.event(key=mllog.constants.SEED, value=int(os.environ["AMPCERT_SEED"]))
log.start(key=mllog.constants.RUN_START)
if os.environ["AMPCERT_PRECISION"] == "bf16" and os.path.exists("hang"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    open(os.path.join(os.environ["AMPCERT_RUN_DIR"], "pids"), "w").write(f"{os.getpid()} {child.pid}")
    time.sleep(120)
log.event(key=mllog.constants.EVAL_ACCURACY, value=0.8, metadata={"samples_count": 64})
log.end(key=mllog.constants.RUN_STOP, metadata={"status": "success"})
"""


def test_interrupting_ampcert_ends_the_jobs_tree_and_resume_reruns_only_that_run(tmp_path):
    path = _suite(tmp_path, SLOW_JOB)
    (tmp_path / "hang").write_text("")  # the bf16 job hangs while this file is there
    out = tmp_path / "out"
    # SIGINT at its default in ampcert: a shell starts background jobs (`.ci/run &`) with SIGINT
    # ignored, exec keeps that, and ampcert rightly leaves an inherited ignore alone, so the
    # interrupt below would wait out the timeout (as tests/reliability/test_signals.py says too).
    proc = subprocess.Popen([sys.executable, "-m", "ampcert", "run", str(path), "--out", str(out)],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pids = ""
    deadline = time.monotonic() + 60
    while not pids and time.monotonic() < deadline:
        found = list(out.glob("runs/*bf16*/pids"))
        pids = found[0].read_text() if found else ""
        time.sleep(0.1)
    assert pids, "the bf16 job never started"
    job_pid, child_pid = map(int, pids.split())
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err
    for pid in (job_pid, child_pid):  # the job and its child: nothing of its tree is left
        assert not alive(pid), f"pid {pid} survived the interrupt"
    (fp32,) = load(out).runs  # fp32 finished; bf16 has no result: pending
    assert fp32.status == "completed" and fp32.spec.precision == "fp32"
    kept = ResultsDir(out).result_file(fp32.run_id).read_bytes()

    (tmp_path / "hang").unlink()
    done = resume(out)
    assert done.ran == 2
    runs = {r.spec.precision: r for r in load(out).runs}
    assert runs["bf16"].status == "completed", runs["bf16"].reason
    assert ResultsDir(out).result_file(fp32.run_id).read_bytes() == kept  # not rerun


def test_resume_after_the_code_changed_is_one_line(tmp_path):
    path = _suite(tmp_path, MLLOG_JOB, precisions="[fp32]")
    out = tmp_path / "out"
    run_suite(path, out)
    (tmp_path / "job.py").write_text(MLLOG_JOB + "# edited\n")  # the job's script, edited outside git
    proc = run_cli("run", "--resume", out)
    assert_one_line_error(proc, "planned with other code", "job job: job.py changed")
    (tmp_path / "job.py").write_text(MLLOG_JOB)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["code"]["jobs"]["job"]["files"]["job.py"] and plan["code"]["ampcert"]
    plan["code"]["ampcert"] = "0.0.1"
    (out / "plan.json").write_text(json.dumps(plan))
    proc = run_cli("run", "--resume", out)
    assert_one_line_error(proc, "planned with other code", "ampcert 0.0.1 ->")


def test_a_cpu_job_sees_no_gpu_and_every_field(tmp_path):
    job = ("import os, json\n"
           "json.dump({k: v for k, v in os.environ.items() if k.startswith('AMPCERT_') or k == 'CUDA_VISIBLE_DEVICES'"
           " or k == 'EXTRA'}, open(os.path.join(os.environ['AMPCERT_RUN_DIR'], 'env.json'), 'w'))\n" + MLLOG_JOB)
    done = run_suite(_suite(tmp_path, job, precisions="[bf16]", seeds="[7]",
                            entry='env: {EXTRA: "run {run_id} seed {seed}"}\n'), tmp_path / "out")
    (r,) = load(done.root).runs
    assert r.status == "completed", r.reason
    env = json.loads((ResultsDir(done.root).run_dir(r.run_id) / "env.json").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["AMPCERT_PRECISION"] == "bf16" and env["AMPCERT_SEED"] == "7" and env["AMPCERT_AMP"] == "native"
    assert env["AMPCERT_RUN_ID"] == r.run_id and env["AMPCERT_DEVICE"] == "cpu"
    assert Path(env["AMPCERT_MLLOG"]) == (ResultsDir(done.root).mllog_file(r.run_id)).resolve()
    assert env["EXTRA"] == f"run {r.run_id} seed 7"


def test_a_job_that_ignores_the_seed_fails_rather_than_certify_one_run_three_times(tmp_path):
    job = MLLOG_JOB.replace("value=seed)", "value=0)")
    done = run_suite(_suite(tmp_path, job, precisions="[fp32]", seeds="[0, 1]"), tmp_path / "out")
    by_seed = {r.spec.seed: r for r in load(done.root).runs}
    assert by_seed[0].status == "completed"
    assert by_seed[1].status == "failed" and "logged seed 0 where the run's is 1" in by_seed[1].reason


# The MLLOG job above, whose bf16 runs diverge: every evaluation logs `VALUE` (NaN or Infinity).
DIVERGING_JOB = MLLOG_JOB.replace(
    "acc += 0.1\n", "acc += 0.1\n    if sys.argv[1] == 'bf16': acc = float(VALUE)\n")


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_precision_whose_job_diverges_fails_its_certificate_and_is_never_missing(tmp_path, value):
    """A NaN (or Infinity) eval_accuracy on every bf16 seed: the runs are failed as diverged
    (stored and read back, never "missing"), parity and numerics judge them, and an Infinity
    reaches no target. Before, pydantic wrote NaN as null, the result did not read back, the
    runs vanished from every view and the certificate said PASS, exit 0."""
    job = DIVERGING_JOB.replace("VALUE", repr(value))
    suite = _suite(tmp_path, job, seeds="[0, 1, 2]", extra="certify: default")
    proc = run_cli("run", suite, "--out", tmp_path / "out")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rs = load(tmp_path / "out")
    assert not rs.missing
    bf16 = [r for r in rs.runs if r.spec.precision == "bf16"]
    assert bf16 and all(r.status == "failed" and r.failure_kind == FailureKind.NON_FINITE for r in bf16)
    assert all("the run diverged" in r.reason for r in bf16) and not any(r.target_reached for r in bf16)
    cert = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    assert cert["status"] == "FAIL"
    found = {v["rule"]: v["status"] for v in cert["verdicts"] if v["subject"]["precision"] == "bf16"}
    assert found["parity.final_metric"] == "FAIL" and found["numerics.finite_loss"] == "FAIL", found
    assert "certificate: FAIL" in proc.stdout


@pytest.mark.parametrize(("kind", "says"), [("fifo", "not a regular file"), ("link", "a symbolic link")])
def test_a_log_that_is_a_fifo_or_a_link_is_refused_within_the_timeout(tmp_path, kind, says):
    """A job that leaves a FIFO at $AMPCERT_MLLOG and exits hung ampcert for good (it blocked
    opening it); one that leaves a link there had the link followed. Both are refused: a failed
    run with the reason, in seconds."""
    make = ("os.mkfifo(os.environ['AMPCERT_MLLOG'])" if kind == "fifo" else
            "os.symlink('/etc/os-release', os.environ['AMPCERT_MLLOG'])")
    suite = _suite(tmp_path, f"import os\n{make}\n", precisions="[fp32]", extra="timeout_s: 3")
    start = time.monotonic()
    proc = run_cli("run", suite, "--out", tmp_path / "out", timeout=60)
    assert time.monotonic() - start < 30, "ampcert took too long"
    (r,) = load(tmp_path / "out").runs
    assert r.status == "failed" and says in r.reason, (r.reason, proc.stdout + proc.stderr)


# A job that leaves a daemon: fork, setsid, fork again (the classic double fork), the
# grandchild writing into the run's folder for a minute; the job itself exits at once.
DAEMON_JOB = MLLOG_JOB.replace("print(\"trained\", sys.argv[1])\n", """\
print("trained", sys.argv[1])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        path = os.path.join(os.environ["AMPCERT_RUN_DIR"], "daemon.txt")
        open(path + ".pid", "w").write(str(os.getpid()))
        for i in range(600):
            open(path, "a").write(f"{i}\\n")
            time.sleep(0.1)
    os._exit(0)
""")


def test_a_double_forked_daemon_does_not_outlive_its_run(tmp_path):
    """Before, the daemon (in a session of its own, reparented to init) kept running after the
    run completed and after ampcert exited, still writing into the run's folder. Under the
    job's keeper it is reparented to the keeper, ended with the run, and the run fails naming it."""
    done = run_suite(_suite(tmp_path, DAEMON_JOB, precisions="[fp32]"), tmp_path / "out")
    (r,) = load(done.root).runs
    run_dir = ResultsDir(done.root).run_dir(r.run_id)
    daemon = int((run_dir / "daemon.txt.pid").read_text())
    assert not alive(daemon)
    assert r.status == "failed" and "left 1 process(es) running" in r.reason, r.reason
    lines = (run_dir / "daemon.txt").read_text()
    time.sleep(0.5)
    assert (run_dir / "daemon.txt").read_text() == lines  # nobody writes there any more


def test_inherit_env_passes_only_the_variables_it_names(tmp_path):
    """By default a job inherits ampcert's whole environment; `inherit_env` passes the named
    variables alone (the AMPCERT_* fields and the entry's env still follow), and enters the
    run id only where it is set."""
    job = MLLOG_JOB.replace('print("trained", sys.argv[1])',
                            'open(os.path.join(os.environ["AMPCERT_RUN_DIR"], "env.json"), "w").write('
                            '__import__("json").dumps(dict(os.environ)))')
    suites = {}
    for name, extra in (("all", ""), ("named", "inherit_env: [PATH, AMPCERT_TEST_KEPT, NOT_SET_ANYWHERE]")):
        folder = tmp_path / name
        folder.mkdir()
        suites[name] = _suite(folder, job, precisions="[fp32]",
                              entry=f"env: {{FROM_ENTRY: x}}\n{extra}\n")
    env = cli_env() | {"AMPCERT_TEST_KEPT": "kept", "AMPCERT_TEST_SECRET": "secret"}
    seen, ids = {}, {}
    for name, suite in suites.items():
        proc = subprocess.run([sys.executable, "-m", "ampcert", "run", str(suite), "--out", str(tmp_path / name / "out")],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (r,) = load(tmp_path / name / "out").runs
        seen[name] = json.loads((ResultsDir(tmp_path / name / "out").run_dir(r.run_id) / "env.json").read_text())
        ids[name] = r.run_id
    assert seen["all"]["AMPCERT_TEST_SECRET"] == "secret" and seen["all"]["FROM_ENTRY"] == "x"
    named = seen["named"]
    assert "AMPCERT_TEST_SECRET" not in named and "HOME" not in named and "NOT_SET_ANYWHERE" not in named
    assert named["AMPCERT_TEST_KEPT"] == "kept" and named["PATH"] == env["PATH"] and named["FROM_ENTRY"] == "x"
    assert named["AMPCERT_SEED"] == "0" and named["AMPCERT_PRECISION"] == "fp32"
    assert ids["all"] != ids["named"]


def test_a_jobs_output_is_kept_as_its_last_bytes_with_a_line_saying_what_was_dropped(tmp_path):
    """The keeper copies the job's stdout and stderr into the run's files, keeping the last CAP
    bytes of each (OUTPUT_TAIL_BYTES in a run; a small CAP here): a job that writes without end
    costs bounded disk, and the end of its output, where it says how it ended, is kept."""
    from ampcert.own_job.run import KEEPER

    cap = 10_000
    job = ("import sys\n"
           "for i in range(20_000): sys.stdout.write(f'line {i:05d}\\n')\n"   # 220,000 bytes
           "sys.stderr.write('small\\n'); sys.stdout.write('the end\\n')\n")
    out, err, status = tmp_path / "stdout.txt", tmp_path / "stderr.txt", tmp_path / "keeper.json"
    with out.open("w+b") as o, err.open("w+b") as e:
        proc = subprocess.run([sys.executable, "-I", "-S", str(KEEPER), str(status), "1", str(cap), "--",
                               sys.executable, "-c", job], stdout=o, stderr=e, timeout=60)
    assert proc.returncode == 0
    header, kept = out.read_bytes().split(b"\n", 1)
    assert header == (b"[ampcert: the job wrote 220,008 bytes here; the first 210,008 are dropped, "
                      b"the last 10,000 kept]")
    assert len(kept) == cap and kept.endswith(b"line 19999\nthe end\n")
    assert err.read_bytes() == b"small\n"  # under the cap: whole, and no line added
    assert json.loads(status.read_text())["survivors"] == []
    # A file the keeper cannot read back (opened write-only) loses the output past that point, never the job.
    with out.open("wb") as o:
        proc = subprocess.run([sys.executable, "-I", "-S", str(KEEPER), str(status), "1", str(cap), "--",
                               sys.executable, "-c", job], stdout=o, stderr=subprocess.DEVNULL, timeout=60)
    assert proc.returncode == 0 and out.stat().st_size >= 2 * cap
