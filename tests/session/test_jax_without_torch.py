"""A JAX-only team installs no torch: a JAX suite plans, trains, reports and
certifies without it, and a torch suite says which extra to install.

Torch is made unimportable in every process of the CLI (the orchestrator, its
forkserver and the workers) by a ``sitecustomize`` on PYTHONPATH that puts a
meta-path finder in front of the real ones: importing a blocked package
raises ModuleNotFoundError, as it would where it is not installed, and each
attempt is logged with the ampcert lines that made it. So this runs in the
normal dev venv (torch installed) and in a venv without torch alike (where
the blocker has nothing to hide, and still logs the attempts). The full
JAX suite (JIT compiling: half a minute on 2 cores) runs only where torch is
really absent: in `nox -s jax_current` (JAX 0.12), which .ci/run calls. In the
torch venv it would repeat tests/backends/test_jax_backend.py's work on JAX 0.10.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

from conftest import REPO, cli_env  # noqa: E402

BLOCKER = '''
"""Test-only: make the packages named in AMPCERT_TEST_BLOCK unimportable and log who tried."""
import json
import os
import sys
import traceback

_BLOCKED = tuple(p for p in os.environ.get("AMPCERT_TEST_BLOCK", "").split(",") if p)
_LOG = os.environ.get("AMPCERT_TEST_BLOCK_LOG")
_OURS = os.sep + "ampcert" + os.sep


class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in _BLOCKED:
            return None
        if _LOG:
            callers = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack() if _OURS in f.filename]
            with open(_LOG, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"pid": os.getpid(), "module": name, "callers": callers[::-1]}) + "\\n")
        raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)


if _BLOCKED:
    sys.meta_path.insert(0, _Blocker())
'''

# The environment fingerprint written into plan.json asks torch for its CUDA
# build and GPUs inside a try (``torch_error`` says why it could not). It is
# the one torch import a JAX suite still attempts; see the test below.
FINGERPRINT_PROBE = "ampcert" + os.sep + "envinfo.py"


def _cli(tmp_path: Path, block: str, *args, timeout: float = 300) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run ``python -m ampcert ARGS`` with the packages in ``block`` hidden in
    every process; returns the process and the logged import attempts."""
    site = tmp_path / "blocker"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    log = tmp_path / f"attempts-{len(list(tmp_path.glob('attempts-*')))}.jsonl"
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    env.update(AMPCERT_TEST_BLOCK=block, AMPCERT_TEST_BLOCK_LOG=str(log))
    proc = subprocess.run([sys.executable, "-m", "ampcert", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    attempts = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, attempts


def _suite(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None,
                    reason="runs where torch is absent: nox -s jax_current (called by .ci/run)")
def test_a_jax_suite_plans_trains_reports_and_certifies_without_torch(tmp_path):
    suite = _suite(tmp_path, """
        name: jax-no-torch
        backend: jax
        amp: ampcert
        device: auto
        seeds: [0]
        unaccelerated: run
        train: {steps: 4, eval_every: 2}
        workloads:
          - workload: resnet      # one run per workload: the imports are under test, and
            params: {size: tiny}    # each run is seconds of JIT compiling on 2 cores
            precisions: [fp32]
          - workload: gpt
            params: {size: tiny, max_bytes: 100000, eval_windows: 8}
            precisions: [bf16]
    """)
    out = tmp_path / "out"
    proc, attempts = _cli(tmp_path, "torch", "run", suite, "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/result.json"))]
    assert len(results) == 2
    for r in results:
        assert r["status"] == "completed" and r["steps"] == 4, r.get("reason")
        assert r["environment"]["jax"] and "torch" not in r["environment"]
        assert r["determinism"]["deterministic_algorithms"] is True  # what certify's determinism check reads
    assert (out / "report.html").is_file() and (out / "summary.json").is_file()
    plan = json.loads((out / "plan.json").read_text())
    assert plan["capabilities"]["fp32"]["measured_flops"] > 0  # the capability probe ran through JAX

    # Reading the results back: report and certify.
    report, more = _cli(tmp_path, "torch", "report", out)
    assert report.returncode == 0, report.stdout + report.stderr
    cert, more_cert = _cli(tmp_path, "torch", "certify", out, "--rules", "default")
    assert cert.returncode in (0, 1) and (out / "verdicts.json").is_file(), cert.stdout + cert.stderr

    # Nothing on the JAX path imports torch: not the spec, registry, orchestrator,
    # forkserver, worker, capability probe, telemetry, backend, results,
    # report or certify. The fingerprint's guarded probe is the one exception
    # (it finds torch missing and records why), until envinfo skips torch
    # for a suite that does not train with it.
    others = [a for a in attempts + more + more_cert if not any(FINGERPRINT_PROBE in c for c in a["callers"])]
    assert others == [], json.dumps(others, indent=1)


def test_a_torch_suite_without_torch_names_the_extra_and_writes_nothing(tmp_path):
    suite = _suite(tmp_path, """
        name: needs-torch
        precisions: [fp32]
        workloads:
          - workload: digits
    """)
    out = tmp_path / "out"
    proc, _ = _cli(tmp_path, "torch", "run", suite, "--out", out)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"ampcert: error: {suite}: backend torch needs PyTorch, which is not "
                                   "installed: pip install 'ampcert[torch]'")
    assert not out.exists()


def test_listing_workloads_imports_neither_framework(tmp_path):
    proc, attempts = _cli(tmp_path, "torch,jax", "list")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    assert {"resnet", "gpt", "digits", "underflow", "overflow"} <= listed, proc.stdout
    assert attempts == [], json.dumps(attempts, indent=1)


def test_a_jax_suite_without_jax_names_the_extra(tmp_path):
    suite = _suite(tmp_path, "name: needs-jax\nbackend: jax\namp: ampcert\nworkloads:\n  - workload: resnet\n")
    proc, _ = _cli(tmp_path, "jax", "run", suite, "--dry-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"ampcert: error: {suite}: backend jax needs JAX, which is not "
                                   "installed: pip install 'ampcert[jax]'")


def test_resuming_a_torch_folder_without_torch_stops_before_any_run(tmp_path, monkeypatch):
    """A folder planned on a machine with torch and resumed on one without."""
    from ampcert import frameworks
    from ampcert import spec as spec_mod
    from ampcert.errors import UserError
    from ampcert.runner.local_executor import LocalExecutor

    run = spec_mod.RunSpec(suite="s", label="digits", workload="digits", params={}, backend="torch",
                           amp="native", policy=None, precision="fp32", seed=0, device="cpu",
                           train=spec_mod.TrainBudget(steps=1), timeout_s=60)
    installed = frameworks._installed
    monkeypatch.setattr(frameworks, "_installed", lambda module: module != "torch" and installed(module))
    with pytest.raises(UserError, match=r"backend torch needs PyTorch, which is not installed: "
                                        r"pip install 'ampcert\[torch\]'"):
        LocalExecutor(tmp_path).check([run], cpus_per_run=1)  # what the driver asks before any run
    assert list(tmp_path.iterdir()) == []
