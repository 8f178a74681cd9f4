"""A suite on real cluster engines: a local Ray cluster (started here with
`ray start`, two CPUs: two worker processes train at once) and submitit's local
executor, each against a local run of the same suite.

The Ray test kills the worker process of a run while it trains (the pid comes
from the run's ``running`` line in fleet.jsonl) and checks that the run is
retried, and that the folder then equals the local one: the same run ids and
the same verdicts (the rule pack holds only checks that cannot depend on timing).
The retry test finishes a copy of the local folder with one run taken out (the
bf16 one of seed 0). A suite from scratch runs on Ray in the interrupted-folder
run (SIGTERM once runs of both precisions are done), whose remaining runs
submitit's job arrays then train: the interrupted-folder test checks the Ray
side and the folder, the submitit test what the job arrays did (one shared run:
each submitit job is a fresh interpreter that starts its own forkserver, 4 to
6 s of CPU).

Commands whose process start is not under test run warm (tests/factories.py:
warm_cli) or in this process (conftest.cli_here); the interrupted Ray driver is
a process of its own, as the signal is under test.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, cli_env, run_cli
from factories import built_once, warm_cli  # warm: the CLI forked with its imports done, 2-3 s less

pytest.importorskip("ray")
pytest.importorskip("submitit")
pytestmark = pytest.mark.slow

# Long enough that a worker can be killed mid-training: about 4 s a run on one AVX2-only core.
# (At 200 steps, on a 2-core AMD EPYC with AVX512-BF16, a bf16 run once ended before the kill
# its "running" event set off landed, and no retry was seen.)
SUITE = """\
name: fleet-digits
device: cpu
amp: ampcert
precisions: [fp32, bf16]
seeds: [0, 1]
train: {steps: 400, eval_every: 200}
timeout_s: 300
certify: rules.yaml
# The folders of two executors are compared run by run; the speed probe, a timing, is not
# one of them (tests/backends/test_speed_probe.py tests it through the same driver).
speed_probe: {enabled: false}
workloads:
  - workload: digits
"""
RULES = """\
name: fleet
version: 1
rules:
  - id: parity.final_metric
    check: accuracy_parity
    measures: final metric, low precision minus fp32, paired by seed
    margin: 0.5
    min_seeds: 2
  - id: numerics.finite_loss
    check: nonfinite_loss
    measures: non-finite losses
"""


def write_suite(folder: Path) -> Path:
    (folder / "rules.yaml").write_text(RULES)
    suite = folder / "suite.yaml"
    suite.write_text(SUITE)
    return suite


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    return write_suite(tmp_path_factory.mktemp("fleet-suite"))


@pytest.fixture(scope="module")
def local_folder(tmp_path_factory) -> Path:
    def build(root: Path) -> None:
        # One thread, as each fleet run has (--cpus-per-run 1): CPU bf16 matmuls block by
        # thread count, so the same run on 1 and on 2 threads may differ in its last bits.
        # (Warm: the runs train in the forkserver's workers, which start with this environment.)
        done = warm_cli("run", write_suite(root), "--out", root / "out", env={"OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stdout + done.stderr

    return built_once(tmp_path_factory, "fleet-local", build) / "out"


def verdicts(folder: Path) -> list[tuple]:
    data = json.loads((folder / "verdicts.json").read_text())
    return sorted((v["rule"], json.dumps(v["subject"], sort_keys=True), v["status"], v["summary"])
                  for v in data["verdicts"])


def run_ids(folder: Path) -> set[str]:
    return {p.name for p in (folder / "runs").iterdir()}


def assert_same_as_local(folder: Path, local: Path) -> None:
    assert run_ids(folder) == run_ids(local)
    assert verdicts(folder) == verdicts(local)
    for run_id in run_ids(local):
        result = json.loads((folder / "runs" / run_id / "result.json").read_text())
        assert result["status"] == "completed" and result["run_id"] == run_id
        assert (folder / "runs" / run_id / "run.mllog").stat().st_size > 0


def pending_copy(local: Path, dest: Path, *fragments: str) -> tuple[Path, set[str]]:
    """A copy of the local folder without the runs whose id holds every fragment ("bf16",
    "-s0-") and without its verdicts: what a `--resume` on another executor must train and
    certify again (assert_same_as_local then compares the verdicts it wrote, not the copied ones)."""
    shutil.copytree(local, dest)
    pending = {run_id for run_id in run_ids(local) if all(f in run_id for f in fragments)}
    assert pending, fragments
    for run_id in pending:
        shutil.rmtree(dest / "runs" / run_id)
    (dest / "verdicts.json").unlink()
    return dest, pending


def precision(folder: Path, run_id: str) -> str:
    return json.loads((folder / "runs" / run_id / "result.json").read_text())["spec"]["precision"]


def fleet_log(folder: Path) -> list[dict]:
    path = folder / "fleet.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# The ports a Ray head takes for its other components by default: a head whose own port
# the kernel happened to hand out as one of them fails to start ("dashboard_agent_http is
# trying to use a port number 52365 that is used by other components", seen once in CI).
RAY_DEFAULT_PORTS = {6379, 8076, 8077, 8265, 10001, 52365, 52366}


def free_port() -> int:
    """A port nothing listens on, and none that Ray keeps for its own components."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RAY_DEFAULT_PORTS:
            return port


# Ray (2.59 on) starts clusters with token authentication, as on a real cluster: every
# process that starts or joins one needs the cluster's token. `ray start` does not create
# one (only a local ray.init() writes ~/.ray/auth_token), so on a clean machine the tests
# make their own and hand it to the cluster and every client through the environment.
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}


def ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray head on this machine with two CPUs, stopped afterwards."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    env = cli_env() | RAY_ENV
    # No log monitor: it streams workers' output to drivers, and ampcert's connect with
    # log_to_driver=False (its start and polling: ~1 s of CPU; the logs stay in `temp`).
    started = subprocess.run([ray_cli(), "start", "--head", f"--port={port}", "--num-cpus=2", "--num-gpus=0",
                              "--include-dashboard=false", "--include-log-monitor=false", f"--temp-dir={temp}",
                              "--disable-usage-stats"],
                             env=env, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray_cli(), "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


# The tests that need no Ray cluster come first: the module's cluster starts with the
# first test that asks for it and stops after the module's last test, so with the Ray
# tests last its daemons (~0.1 s of CPU a second, idle) are not kept through the rest.


def test_ray_at_an_address_nothing_answers_on_is_one_line(local_folder, tmp_path, cli_here):
    folder = tmp_path / "copy"
    shutil.copytree(local_folder, folder)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    done = cli_here("run", "--resume", folder, "--executor", "ray", "--address", f"127.0.0.1:{free_port()}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().startswith("ampcert: error: --address 127.0.0.1:")
    assert "cannot reach a Ray cluster there" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_without_ray_or_submitit_installed_the_extra_is_named(suite, tmp_path, cli_here, monkeypatch):
    # Neither importable, as where the extra is not installed: `import ray` and `import
    # submitit` raise ImportError (a None in sys.modules), here in the entry point's process.
    for name in ("ray", "submitit"):
        monkeypatch.setitem(sys.modules, name, None)
    for executor, extra in (("ray", "ampcert[ray]"), ("slurm", "ampcert[slurm]")):
        out = tmp_path / executor
        done = cli_here("run", suite, "--out", out, "--executor", executor)
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"pip install '{extra}'" in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not out.exists()


def test_slurm_without_sbatch_points_to_slurm_local(suite, tmp_path, cli_here):
    if shutil.which("sbatch"):
        pytest.skip("this machine is a Slurm login node")
    done = cli_here("run", suite, "--out", tmp_path / "out", "--executor", "slurm")
    assert done.returncode == 2 and "no sbatch on PATH" in done.stderr and "--slurm-local" in done.stderr


def test_ray_retries_a_run_whose_worker_is_killed_and_matches_the_local_folder(
        local_folder, ray_cluster, tmp_path):
    # One run (bf16, seed 0: bf16 is the precision whose bits depend on the thread count) to
    # do on Ray, the rest kept from the local folder: the retry needs one run to kill; runs of
    # both precisions trained on Ray are compared in the interrupted-folder run (a fresh suite).
    out, pending = pending_copy(local_folder, tmp_path / "ray", "bf16", "-s0-")
    assert len(pending) == 1, pending
    # The driver is the warm CLI (its start is not under test), in a thread, while this one
    # watches fleet.jsonl for the run to kill.
    finished: list[subprocess.CompletedProcess] = []
    driver = threading.Thread(target=lambda: finished.append(warm_cli(
        "run", "--resume", out, "--executor", "ray", "--address", ray_cluster, env=RAY_ENV, timeout=300)))
    driver.start()
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and driver.is_alive() and time.monotonic() < deadline:
        running = [e for e in fleet_log(out) if e["event"] == "running"]
        if running:
            killed = running[0]
            os.kill(killed["pid"], signal.SIGKILL)  # the Ray worker process training this run
        time.sleep(0.05)
    driver.join(timeout=300)
    assert finished, "the driver did not finish"
    output = finished[0].stdout + finished[0].stderr
    assert killed is not None, "no run was seen training\n" + output
    assert finished[0].returncode == 0, output
    events = [(e["event"], e["attempt"]) for e in fleet_log(out) if e["run_id"] == killed["run_id"]]
    assert ("lost", 1) in events and ("retry", 2) in events and events[-1] == ("done", 2), events
    lost = next(e for e in fleet_log(out) if e["event"] == "lost")
    assert "Worker" in lost["reason"] or "died" in lost["reason"], lost
    assert f"[retry] {killed['run_id']}: attempt 2" in output
    assert {e["run_id"] for e in fleet_log(out) if e["event"] == "done"} == pending
    assert_same_as_local(out, local_folder)


@pytest.fixture(scope="module")
def interrupted_then_submitit(suite, local_folder, ray_cluster, tmp_path_factory) -> SimpleNamespace:
    """The suite from scratch on Ray, SIGTERMed once runs of both precisions are done (the driver
    a process of its own: the signal is under test), then `--resume` through submitit's local executor:
    what each step left, for the interrupted-folder test (Ray's side) and the submitit test
    (the job arrays' side)."""
    out = tmp_path_factory.mktemp("interrupted") / "ray"
    proc = subprocess.Popen([sys.executable, "-m", "ampcert", "run", str(suite), "--out", str(out),
                             "--executor", "ray", "--address", ray_cluster],
                            cwd=REPO, env=cli_env() | RAY_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # Once runs of both precisions are done (as a rule the first two: the run matrix
    # interleaves them, fp32 s0, bf16 s0, fp32 s1, bf16 s1, and two train at once): the
    # others are in flight or waiting (each trains for seconds), so the signal interrupts
    # something, and submitit then trains the rest (as a rule one run per precision).
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        done = [e["run_id"] for e in fleet_log(out) if e["event"] == "done"]
        if {precision(out, run_id) for run_id in done} == {"fp32", "bf16"}:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=120)
    kept = {e["run_id"] for e in fleet_log(out) if e["event"] == "done"}
    stored = {p.parent.name for p in out.glob("runs/*/result.json")}
    resumed = warm_cli("run", "--resume", out, "--executor", "slurm", "--slurm-local")
    return SimpleNamespace(out=out, returncode=proc.returncode, stderr=err, kept=kept, stored=stored,
                           resumed=resumed)


def test_an_interrupted_ray_folder_is_finished_by_another_executor(interrupted_then_submitit, local_folder):
    """SIGTERM while Ray trains: runs in flight are cancelled, finished ones kept, one
    line, exit 143; then `--resume` through submitit's local executor finishes the folder."""
    run = interrupted_then_submitit
    out, kept = run.out, run.kept
    assert run.returncode == 143, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (f"ampcert: interrupted by SIGTERM; finished runs are kept; "
                                                   f"resume with ampcert run --resume {out}")
    assert kept and kept == run.stored
    assert len(kept) < len(run_ids(local_folder))  # the test interrupted something
    # what Ray trained, compared with the local runs below: both precisions
    assert {precision(out, run_id) for run_id in kept} == {"fp32", "bf16"}, kept
    done = run.resumed
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming: {len(kept)} of 4 runs already have results" in done.stdout
    assert {e["run_id"] for e in fleet_log(out) if e["executor"] == "slurm"} == run_ids(local_folder) - kept
    assert_same_as_local(out, local_folder)


def test_submitit_local_job_arrays_match_the_local_folder(interrupted_then_submitit, local_folder):
    # The runs the interrupted Ray run left (two of four, one per precision, as a rule) through
    # submitit's job arrays: each job is a fresh interpreter, and the runs a job array trains
    # are what is compared; a fresh suite through sbatch is the slurm test's.
    run = interrupted_then_submitit
    out, done = run.out, run.resumed
    pending = run_ids(local_folder) - run.kept
    assert pending, "the Ray run was not interrupted"
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming: {4 - len(pending)} of 4 runs already have results" in done.stdout, done.stdout
    assert_same_as_local(out, local_folder)
    log = [e for e in fleet_log(out) if e["executor"] == "slurm"]
    assert {e["run_id"] for e in log if e["event"] == "running"} == pending
    assert all(e["attempt"] == 1 for e in log)
    assert (out / ".submitit").is_dir()


def test_ray_refuses_a_run_larger_than_every_node_and_keeps_the_folder(local_folder, ray_cluster, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(local_folder, folder)
    result_file = next((folder / "runs").iterdir()) / "result.json"
    result_file.unlink()  # one run left to do
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    done = warm_cli("run", "--resume", folder, "--executor", "ray", "--address", ray_cluster, "--cpus-per-run", "3",
                    env=RAY_ENV)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "asks for 3 CPU on one node; the largest node of" in done.stderr and "has 2 CPU, 0 GPU" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before

    # A CUDA run on this CPU-only cluster: the same refusal, in GPUs (the executor's own
    # check, as planning on this machine refuses a CUDA suite before it).
    script = f"""
import sys
from ampcert.errors import UserError
from ampcert.results import ResultsDir
from ampcert.runner.ray_executor import RayExecutor
from pathlib import Path
spec = ResultsDir(Path({str(folder)!r})).read_plan().runs[0].model_copy(update={{"device": "cuda"}})
executor = RayExecutor({ray_cluster!r})
try:
    executor.check([spec], 1)
except UserError as exc:
    print(exc)
finally:
    executor.close()
"""
    checked = subprocess.run([sys.executable, "-c", script], env=cli_env() | RAY_ENV, capture_output=True,
                             text=True, timeout=120)
    assert "asks for 1 CPU, 1 GPU on one node" in checked.stdout, checked.stdout + checked.stderr


@pytest.mark.slurm
def test_a_real_slurm_job_array_matches_the_local_folder(suite, local_folder, tmp_path):
    """Through sbatch, on the single-node Slurm that `nox -s slurm` starts."""
    if shutil.which("sbatch") is None or subprocess.run(["sinfo", "-h"], capture_output=True).returncode:
        pytest.skip("no Slurm here: `nox -s slurm` starts a single-node one")
    out = tmp_path / "slurm"
    done = run_cli("run", suite, "--out", out, "--executor", "slurm", "--time-min", "10", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_same_as_local(out, local_folder)
    # One job array (every run asks for the same resources), one task per run: <job>_<task>.
    tasks = [p.name.split("_") for p in (out / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name)]
    assert len({job for job, _ in tasks}) == 1 and sorted(int(t) for _, t in tasks) == [0, 1, 2, 3], tasks
