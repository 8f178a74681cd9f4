"""Beyond one device: torchrun data-parallel runs, loss scaling across ranks,
suites sharded with --shard and joined with merge. Everything on CPU (gloo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cli_env

from ampcert.errors import UserError
from ampcert.report.sign import keygen
from ampcert.results import FailureKind, ResultsDir, RunResult, atomic_write_json, load
from ampcert.runner import shard as sharding
from ampcert.runner.torchrun import command
from ampcert.spec import RunSpec, TrainBudget, expand, parse_suite

HERE = Path(__file__).resolve().parent


def _env() -> dict[str, str]:
    # One intra-op thread per process, as torchrun gives each rank: on a small
    # shared CI box, more threads than free cores make every step wait.
    return {**cli_env(), "OMP_NUM_THREADS": "1"}


def _invoke(*args: object) -> tuple[int, str]:
    """The CLI in this process: the imports, the forkserver and the report
    machinery are paid for once, not once per invocation."""
    from typer.testing import CliRunner

    from ampcert.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _spec(**launch) -> RunSpec:
    return RunSpec(suite="s", label="digits", workload="digits", params={}, backend="torch", amp="native",
                   policy=None, precision="fp32", seed=0, device="cpu", train=TrainBudget(steps=10),
                   timeout_s=60, **launch)


# --------------------------------------------------------------------------- specs, ids, command lines


def test_world_size_enters_the_run_id_only_for_torchrun():
    plain = _spec()
    assert "launcher" not in plain.identity() and "world_size" not in plain.identity()
    assert plain.world_size == 1
    two = _spec(launcher="torchrun", nproc_per_node=2)
    also_two = _spec(launcher="torchrun", nproc_per_node=1, nnodes=2, rdzv_endpoint="h:1", rdzv_id="x")
    four = _spec(launcher="torchrun", nproc_per_node=4)
    assert two.identity()["world_size"] == 2 and four.world_size == 4
    # the world size decides what is computed; where the ranks meet does not
    assert two.run_id == also_two.run_id != four.run_id != plain.run_id
    # a process run's id is what it was before the launcher fields existed
    assert plain.run_id == _spec(rdzv_endpoint="ignored:1").run_id


def test_suite_launcher_fields_expand_per_entry():
    suite = parse_suite({
        "name": "d", "precisions": ["fp32"], "train": {"steps": 10},
        "torchrun": {"nproc_per_node": 2, "rdzv_id": "job"},
        "workloads": [{"workload": "digits"},
                      {"workload": "digits", "id": "ddp", "launcher": "torchrun"},
                      {"workload": "digits", "id": "ddp4", "launcher": "torchrun",
                       "torchrun": {"nproc_per_node": 2, "nnodes": 2, "node_rank": 1}}],
    })
    plain, ddp, ddp4 = expand(suite, "cpu")
    assert (plain.launch.launcher, plain.world_size) == ("process", 1)
    assert (ddp.launch.launcher, ddp.world_size, ddp.launch.rdzv_id) == ("torchrun", 2, "job")
    assert (ddp4.world_size, ddp4.launch.node_rank, ddp4.launch.rdzv_id) == (4, 1, None)


@pytest.mark.parametrize("fields, expected", [
    ({"launcher": "torchrun"}, "`launcher: torchrun` needs `torchrun: {nproc_per_node: N}`"),
    ({"launcher": "torchrun", "torchrun": {"nproc_per_node": 0}}, "torchrun.nproc_per_node"),
    ({"launcher": "torchrun", "torchrun": {"nproc_per_node": 2, "nnodes": 2, "node_rank": 2}},
     "`node_rank` 2 is not below `nnodes` 2"),
    ({"launcher": "mpirun"}, "launcher: got 'mpirun'"),
    ({"launcher": "torchrun", "torchrun": {"nproc_per_node": 2}, "backend": "jax", "amp": "ampcert"},
     "trains the torch backend"),
])
def test_bad_launcher_settings_are_one_line_errors(write_suite, cli_here, fields, expected):
    lines = "".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items())
    suite = write_suite("name: bad\n" + lines + "workloads:\n  - workload: digits\n")
    proc = cli_here("run", suite, "--dry-run")  # the entry point in this process: main()'s one line, its exit code
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_torchrun_command_line(tmp_path):
    f, root, ch = tmp_path / "spec.json", tmp_path / "out", tmp_path / "ch"
    local = command(_spec(launcher="torchrun", nproc_per_node=2), f, root, ch, environ={})
    assert local[1:4] == ["-m", "torch.distributed.run", "--nproc_per_node"] and "--standalone" in local
    assert local[local.index("-m", 2):][:2] == ["-m", "ampcert.runner.ddp_worker"]
    multi = _spec(launcher="torchrun", nproc_per_node=8, nnodes=2, rdzv_backend="c10d",
                  rdzv_endpoint="node0:29400", rdzv_id="cert", node_rank=1)
    cmd = command(multi, f, root, ch, environ={})
    assert "--standalone" not in cmd
    pairs = dict(zip(cmd[:cmd.index("ampcert.runner.ddp_worker")], cmd[1:], strict=False))
    assert (pairs["--nnodes"], pairs["--rdzv_backend"], pairs["--rdzv_endpoint"], pairs["--node_rank"]) == (
        "2", "c10d", "node0:29400", "1")
    assert pairs["--rdzv_id"] == f"cert-{multi.run_id}"  # a fresh rendezvous for every run
    # settings left out of the suite come from torchrun's own PET_* variables on each node
    env_cmd = command(_spec(launcher="torchrun", nproc_per_node=2, nnodes=2), f, root, ch,
                      environ={"PET_RDZV_ENDPOINT": "n0:1"})
    assert "--rdzv_endpoint" not in env_cmd and "--node_rank" not in env_cmd and "--standalone" not in env_cmd


def test_shards_cover_the_plan_exactly_once():
    runs = [_spec().model_copy(update={"seed": s}) for s in range(7)]
    shards = [sharding.select(runs, i, 3) for i in (1, 2, 3)]
    assert sorted(r.seed for s in shards for r in s) == list(range(7))
    assert [r.seed for r in shards[0]] == [0, 3, 6] and [r.seed for r in shards[2]] == [2, 5]
    assert sharding.parse_shard("2/3") == (2, 3)


# --------------------------------------------------------------------------- loss scaling across ranks


# Two ranks of a script, as torchrun starts them (RANK, WORLD_SIZE and a rendezvous
# address in the environment, env:// init), forked from one interpreter that has
# imported torch (and torch._dynamo, which the optimizer's first step imports): one
# import (about 3 s of CPU) instead of three (torchrun's agent and each rank). The ranks
# are processes of their own that meet over gloo; torchrun itself is under test in the
# `ampcert run` test below.
TWO_RANKS = """
import os, runpy, signal, socket, sys, threading, traceback
import torch, torch.distributed, torch._dynamo  # noqa: E401,F401
assert threading.active_count() == 1  # no Python thread holds a lock across the fork
script, out = sys.argv[1:]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
ranks = []
for rank in (0, 1):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
            sys.argv = [script, out]
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = 0 if exc.code in (0, None) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    ranks.append(pid)
failed = False
while ranks:  # a rank that fails ends the other, which would wait for it in a collective
    pid, status = os.wait()
    ranks.remove(pid)
    if os.waitstatus_to_exitcode(status) != 0 and not failed:
        failed = True
        for other in ranks:
            os.kill(other, signal.SIGKILL)
sys.exit(1 if failed else 0)
"""


def test_loss_scale_sequence_is_the_same_on_every_rank(tmp_path):
    """Rank 1 alone overflows (no DDP links the ranks): with the cross-rank
    reduction both ranks skip those steps and hold the same scale after every
    update; without it (the control) rank 0 never notices."""
    proc = subprocess.run(
        [sys.executable, "-c", TWO_RANKS, str(HERE / "_scaler_ranks.py"), str(tmp_path)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for mode in ("auto", "auto_sync_free"):
        assert r0[mode]["scale"] == r1[mode]["scale"], mode
        assert r0[mode]["skipped"] == r1[mode]["skipped"] == [2, 6, 7], mode
        assert r0[mode]["scale"][:4] == [1024.0, 1024.0, 512.0, 512.0]
    assert r1["off"] == r1["auto"]  # rank 1 saw its overflows either way
    assert r0["off"]["skipped"] == [] and r0["off"]["scale"] != r1["off"]["scale"]


# --------------------------------------------------------------------------- torchrun through `ampcert run`

DDP = """
name: ddp
amp: native
precisions: [fp32]
seeds: [0]
train: {steps: 30, eval_every: 10}
timeout_s: 240
torchrun: {nproc_per_node: 2}
workloads:
  - workload: digits
  - {workload: digits, id: digits-ddp, launcher: torchrun}
  - {workload: "fault_workloads:raising", launcher: torchrun}
  - {workload: "fault_workloads:killed", launcher: torchrun}
  - {workload: digits, id: digits-timeout, launcher: torchrun, timeout_s: 3}
"""


def _ranks_of(out: Path) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if "ampcert.runner.ddp_worker" in line and str(out) in line]


@pytest.mark.slow
def test_two_gloo_ranks_match_the_single_process_run_and_fail_like_workers(tmp_path, write_suite, monkeypatch):
    """digits has no batch norm: with rank r taking rows r::2 of the same
    seeded batch of 64, DDP's averaged gradient is the global batch's, so the
    2-process run follows the single-process one up to float rounding.
    torchrun runs fail as worker processes do: an exception is recorded by
    rank 0 with its reason (while the other rank fails too); ranks killed
    outright and a run past its timeout (two ranks, killed by pid) become
    failed results saying so; no rank outlives its run."""
    for key in ("OMP_NUM_THREADS", "PYTHONPATH"):  # torchrun and its ranks inherit these
        monkeypatch.setenv(key, _env()[key])
    out = tmp_path / "out"
    code, output = _invoke("run", write_suite(DDP), "--out", out)
    assert code == 1, output[-3000:]  # the faults failed
    runs = {r.spec.label: r for r in load(out).runs}
    single, ddp = runs["digits"], runs["digits-ddp"]
    assert single.status == ddp.status == "completed", ddp.reason
    assert (single.spec.launch.launcher, ddp.spec.launch.launcher, ddp.spec.world_size) == ("process", "torchrun", 2)
    assert ddp.final_metric == pytest.approx(single.final_metric, abs=0.01)
    assert len(ddp.loss) == len(single.loss) == 30 and ddp.train_samples == single.train_samples == 30 * 64
    assert ddp.loss == pytest.approx(single.loss, rel=1e-4, abs=1e-5)
    assert [e.step for e in ddp.evals] == [10, 20, 30]
    dist = ddp.environment["distributed"]
    assert (dist["world_size"], dist["backend"], dist["per_rank_batch"]) == (2, "gloo", 32)
    assert ddp.determinism["world_size"] == 2 and ddp.telemetry["device"] == "cpu"
    # rank 0 alone writes: one MLLOG with one run_start/run_stop, one result
    run_dir = ResultsDir(out).run_dir(ddp.run_id)
    assert sorted(p.name for p in run_dir.iterdir()) == ["launcher.log", "result.json", "run.mllog", "telemetry.csv"]
    mllog = (run_dir / "run.mllog").read_text()
    assert mllog.count('"run_start"') == mllog.count('"run_stop"') == 1 and mllog.count('"eval_accuracy"') == 3
    assert _invoke("check", run_dir / "run.mllog")[0] == 0
    # MLPerf's common rules too; the comm precision is the dtype DDP's gradient
    # all-reduce buckets carried (a comm hook saw them), the micro batch a rank's.
    assert _invoke("check", "--mlperf", run_dir / "run.mllog")[0] == 0
    assert '"key": "micro_batch_size", "value": 32' in mllog
    lowest = ddp.lowest_precision
    assert lowest is not None and (lowest.linear, lowest.attn, lowest.comm) == ("fp32", "fp32", "fp32")
    assert lowest.detail["comm"] == {"observed": True, "what": "the gradients' reduction across ranks (DDP's buckets, or FSDP2's reduce_dtype)"}

    assert {runs[k].status for k in ("raising", "killed", "digits-timeout")} == {"failed"}
    assert runs["raising"].reason == "ValueError: injected failure at step 7"
    assert runs["killed"].reason.startswith("torchrun exited with code 1 before rank 0 wrote the result")
    assert "SIGKILL" in runs["killed"].reason
    assert runs["digits-timeout"].reason == "timeout: run exceeded 3 s; torchrun and its ranks were killed"
    # the kind of each failure is recorded as data, not left to the wording
    assert [runs[k].failure for k in ("raising", "killed", "digits-timeout")] == [
        FailureKind.ERROR, FailureKind.WORKER_LOST, FailureKind.TIMEOUT]
    assert single.failure is None and "failure" not in json.loads(ResultsDir(out).result_file(single.run_id).read_text())
    assert _ranks_of(out) == []


# --------------------------------------------------------------------------- --shard and merge

RULES = """
name: tiny
version: 1
rules:
  - {id: finite, check: nonfinite_loss, measures: finite losses, max_fraction: 0.0, applies_to: {precisions: [fp32]}}
  - {id: repeat, check: determinism, measures: repeat bit for bit, repeats: 1, applies_to: {precisions: [fp32]}}
  - {id: spread, check: seed_spread, measures: seed spread, max_spread: 1.0, min_seeds: 2,
     applies_to: {precisions: [fp32]}}
"""

SHARDED = """
name: sharded
precisions: [fp32]
seeds: [0, 1]
train: {steps: 10, eval_every: 5}
timeout_s: 240
certify: rules.yaml
workloads:
  - workload: digits
"""


def _verdicts(folder: Path) -> list[tuple]:
    data = json.loads((folder / "verdicts.json").read_text())
    return sorted((v["rule"], v["subject"], v["status"]) for v in data["verdicts"]) + [("certificate", data["status"])]


@pytest.mark.slow
def test_three_shards_merge_into_the_unsharded_results(tmp_path, write_suite, monkeypatch, cli_here):
    """The suite runs whole and in 3 shards (as on 3 machines); the merged
    shards hold the same run ids and get the same verdicts."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # see _env (for the forkserver, if this starts it)
    write_suite(RULES, "rules.yaml")
    suite = write_suite(SHARDED)
    full, shards = tmp_path / "full", [tmp_path / f"shard{i}" for i in (1, 2, 3)]
    code, output = _invoke("run", suite, "--out", full)
    assert code == 0, output[-3000:]
    for i, d in enumerate(shards, start=1):
        code, output = _invoke("run", suite, "--shard", f"{i}/3", "--out", d)
        assert code == 0, output[-3000:]
        assert "join the shards' folders with `ampcert merge" in output
        plan = ResultsDir(d).read_plan()
        assert len(plan.runs) == 3 and plan.shard is not None and (plan.shard.index, plan.shard.count) == (i, 3)
        assert len(load(d).runs) == 1 and not (d / "verdicts.json").exists()  # certified once merged

    merged = tmp_path / "merged"
    proc = cli_here("merge", merged, *shards)  # the real entry point (main()), from here on
    assert proc.returncode == 0, proc.stdout + proc.stderr
    full_rs, merged_rs = load(full), load(merged)
    assert [r.run_id for r in merged_rs.plan] == [r.run_id for r in full_rs.plan]
    assert sorted(r.run_id for r in merged_rs.runs) == sorted(r.run_id for r in full_rs.runs)
    assert merged_rs.missing == [] and len(merged_rs.runs) == 3
    assert _verdicts(merged) == _verdicts(full) and _verdicts(merged)[-1] == ("certificate", "PASS")
    plan = ResultsDir(merged).read_plan()
    assert plan.shard is None and [m["shard"]["index"] for m in (plan.model_extra or {})["merged_from"]] == [1, 2, 3]
    assert (merged / "report.json").exists() and (merged / "report.html").exists()
    # the merged folder is an ordinary results folder: certify (re-renders the report) and sign
    assert cli_here("certify", merged).returncode == 0
    keygen(tmp_path / "k.key")
    signed = cli_here("sign", merged, "--key", tmp_path / "k.key")
    assert signed.returncode == 0 and (merged / "report.dsse.json").exists(), signed.stderr


# --------------------------------------------------------------------------- bad input


def _planned(folder: Path, suite: Path) -> list[RunSpec]:
    """A results folder with a plan and no results (planned in-process)."""
    from ampcert.runner import planning as orch

    plan = orch.plan_suite(suite)
    orch.prepare_out_dir(folder)
    orch.write_plan(folder, plan)
    return plan.runs


def test_bad_shard_and_merge_input_is_one_line_exit_2(tmp_path, write_suite, cli_here):
    suite = write_suite(SHARDED.replace("certify: rules.yaml\n", ""))
    proc = cli_here("run", suite, "--shard", "4/3", "--out", tmp_path / "never")
    assert proc.returncode == 2 and "--shard 4/3: there is no shard 4 of 3" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "never").exists()
    for bad, expected in (("0/2", "there is no shard 0 of 2"), ("1-3", "expected i/n"), ("2/0", "no shard 2 of 0")):
        with pytest.raises(UserError, match=expected):
            sharding.parse_shard(bad)

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    runs = _planned(a, suite)
    _planned(b, write_suite(SHARDED.replace("certify: rules.yaml\n", "").replace("seeds: [0, 1]", "seeds: [2]"),
                            "other.yaml"))
    proc = cli_here("merge", tmp_path / "m", a, b)
    assert proc.returncode == 2 and "planned from a different suite" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "m").exists()

    # the same run with a result in two folders
    _planned(c, suite)
    for folder in (a, c):
        atomic_write_json(ResultsDir(folder).result_file(runs[0].run_id),
                          RunResult(run_id=runs[0].run_id, spec=runs[0], status="skipped", reason="test"))
    with pytest.raises(UserError, match=f"run {runs[0].run_id} has results in both"):
        sharding.merge(tmp_path / "m", [a, c], partial=True)
    with pytest.raises(UserError, match="given twice"):
        sharding.merge(tmp_path / "m", [a, a], partial=True)
    # runs without a result anywhere need --partial
    with pytest.raises(UserError, match="1 of 2 planned runs have no result .*--partial"):
        sharding.merge(tmp_path / "m", [a])
    assert not (tmp_path / "m").exists()
    code, output = _invoke("merge", tmp_path / "m", a, "--partial")
    assert code == 0, output
    assert load(tmp_path / "m").missing == [runs[1].run_id]
