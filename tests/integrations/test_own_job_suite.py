"""The shipped own-job examples, certified as users run them: real HF Trainer, Lightning and
mlperf_logging jobs as command workloads (examples/own_job/suite.yaml: fp32 and bf16 x 3
seeds and a repeat, the default rule pack), signed and verified from the command line.

The suite is the slowest thing here (24 jobs of a few seconds, mostly importing torch and
transformers), so it runs once per session and the tests read its folder.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from factories import certified_own_jobs

from ampcert.results import load

pytest.importorskip("transformers")
pytest.importorskip("lightning")

EXAMPLES = REPO / "examples" / "own_job"
JOBS = ("hf-bert", "lightning-encoder", "mllog-mlp")


@pytest.fixture(scope="module")
def certified(tmp_path_factory) -> Path:
    return certified_own_jobs(tmp_path_factory)


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
    runs = load(certified).runs
    assert len(runs) == 24 and all(r.status == "completed" for r in runs), [r.reason for r in runs]
    for r in runs:
        assert r.samples_per_s and r.samples_per_s > 0 and r.time_to_target_s and r.time_to_target_s > 0
        assert len(r.evals) >= 3 and r.final_metric > 0.8
        # Each job measured the precision its first step computed in, through its callback or not at all.
        if r.spec.label != "mllog-mlp":
            assert r.lowest_precision.linear == ("bfloat16" if r.spec.precision == "bf16" else "fp32")


def test_the_signed_report_verifies(certified):
    proc = run_cli("verify", certified / "report.dsse.json", "--pubkey", certified.parent / "key.pub")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_job_declared_bf16_that_trains_fp32_fails_the_precision_disclosure(tmp_path):
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
    proc = run_cli("run", tmp_path / "suite.yaml", "--out", tmp_path / "out", cwd=tmp_path, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    (verdict,) = verdicts["verdicts"]
    assert verdict["status"] == "FAIL"
    assert "linear declared bfloat16, measured fp32" in verdict["summary"]
