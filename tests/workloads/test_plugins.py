"""A user's own workload package (examples/custom_workload), installed and certified
through the public CLI, by entry-point name and by import path, in torch and JAX."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, cli_env

EXAMPLE = REPO / "examples" / "custom_workload"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example package installed with pip into a folder of its own (the venv is left alone)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(EXAMPLE)], check=True, timeout=300)
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(target), env["PYTHONPATH"]])
    return target, env


def _cli(env, *args, timeout=400):
    return subprocess.run([sys.executable, "-m", "ampcert", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_installed_package_registers_its_workload(installed):
    proc = _cli(installed[1], "list")
    assert proc.returncode == 0 and "wine " in proc.stdout and "torch and JAX" in proc.stdout


def test_certify_and_sign_a_users_workload_through_the_cli(installed, tmp_path):
    _, env = installed
    (tmp_path / "rules.yaml").write_text(textwrap.dedent("""
        name: plugin-test
        rules:
          - {id: parity, check: accuracy_parity, measures: final accuracy vs fp32, margin: 0.05, min_seeds: 2}
          - {id: finite, check: nonfinite_loss, measures: finite losses}
    """))
    suite = tmp_path / "suite.yaml"
    suite.write_text(textwrap.dedent("""
        name: wine-test
        amp: ampcert
        device: cpu
        precisions: [fp32, bf16]
        seeds: [0, 1]
        unaccelerated: run
        certify: rules.yaml
        train: {steps: 40, eval_every: 20}
        workloads:
          - workload: wine                        # by entry-point name
          - workload: wine_workload:WORKLOAD      # by import path
            id: wine-by-path
            params: {hidden: 16}
    """))
    from ampcert.report.sign import keygen, load_public_key, verify_envelope

    out = tmp_path / "out"
    key, pub = keygen(tmp_path / "k")  # the key pair and its check in this process: the run is under test
    proc = _cli(env, "run", suite, "--out", out, "--sign-key", key)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cert = json.loads((out / "verdicts.json").read_text())
    assert cert["status"] == "PASS" and {s["subject"]["workload"] for s in cert["subjects"]} == {"wine", "wine-by-path"}
    verify_envelope(out / "report.dsse.json", load_public_key(pub))  # raises where the signature is bad


def test_a_users_workload_runs_in_jax(installed, tmp_path):
    pytest.importorskip("jax")
    suite = tmp_path / "suite.yaml"
    suite.write_text("name: wine-jax\nbackend: jax\namp: ampcert\ndevice: cpu\nprecisions: [bf16]\n"
                     "unaccelerated: run\ntrain: {steps: 4, eval_every: 2}\nworkloads:\n  - workload: wine\n")
    proc = _cli(installed[1], "run", suite, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(next((tmp_path / "out" / "runs").glob("*/result.json")).read_text())
    assert result["status"] == "completed" and result["environment"]["policy_rewrite"]["cast"]


@pytest.mark.parametrize("workload, message", [
    ("wine_workload:NOPE", "workload 'wine_workload:NOPE' does not import: AttributeError"),
    ("wine_workload:WineParams", "lacks the workload protocol (missing: name, summary"),
    ("winee", "unknown workload 'winee'"),
])
def test_a_broken_plugin_is_one_line_and_exit_2(installed, tmp_path, workload, message):
    suite = tmp_path / "s.yaml"
    suite.write_text(f"name: bad\nworkloads:\n  - workload: {workload}\n")
    proc = _cli(installed[1], "run", suite, "--dry-run")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
