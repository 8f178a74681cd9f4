"""`backend: jax` through the real CLI: runner, results, MLLOG and summary, as for torch."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("jax")

from factories import warm_cli  # noqa: E402  (the CLI forked warm: 2-3 s less a command than a cold start)

TORCH_INSTALLED = importlib.util.find_spec("torch") is not None


def _results(out):
    return {r["spec"]["workload"] + "-" + r["spec"]["precision"]: r
            for r in (json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/result.json")))}


# The three tests below read one `ampcert run` of this suite (a module fixture, through the
# warm CLI): fp32 to the default targets, and 6 low-precision steps (bf16 and fp16 take about
# half a second a step here), gpt-low on 20 kB of the corpus (reading all of it costs each
# run's process a second and a half). One invocation instead of three spares CLI starts,
# forkservers and JAX's start-ups.
SUITE = """\
name: jax-runs
backend: jax
amp: ampcert
device: cpu
precisions: [fp32]
seeds: [0]
unaccelerated: run
workloads:
  - workload: resnet
    params: {size: tiny}
  - workload: gpt
    params: {size: tiny}
  - workload: resnet
    id: resnet-low
    params: {size: tiny}
    precisions: [bf16, fp16]
    train: {steps: 6, eval_every: 3}
  - workload: gpt
    id: gpt-low
    params: {size: tiny, eval_windows: 32, max_bytes: 20000}
    precisions: [bf16]
    train: {steps: 6, eval_every: 3}
"""


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("jax-runs")
    (root / "suite.yaml").write_text(SUITE)
    out = root / "out"
    proc = warm_cli("run", root / "suite.yaml", "--out", out, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, _results(out)


def test_fp32_reaches_the_torch_targets(jax_runs):
    out, res = jax_runs
    for key in ("resnet-fp32", "gpt-fp32"):
        r = res[key]
        assert r["status"] == "completed" and r["target_reached"], (key, r["evals"])
        # seed 0 reaches these targets at steps 175 (resnet) and 200 (gpt), as its torch twin does
        assert r["steps_to_target"] <= {"resnet-fp32": 225, "gpt-fp32": 200}[key]
        assert r["environment"]["jax"] and r["flops_per_step"] > 0
        assert r["spec"]["backend"] == "jax" and r["amp_policy"]["name"] == "none (fp32)"
    lines = (out / "runs" / res["gpt-fp32"]["run_id"] / "run.mllog").read_text().splitlines()
    events = [json.loads(line.removeprefix(":::MLLOG ")) for line in lines]
    assert {"key": "backend", "value": "jax"}.items() <= next(e for e in events if e["key"] == "backend").items()
    assert events[-1]["key"] == "run_stop" and events[-1]["metadata"]["status"] == "success"


def test_low_precision_runs_record_policy_rewrite_and_loss_scale(jax_runs):
    out, everything = jax_runs
    res = {key: r for key, r in everything.items() if r["spec"]["precision"] != "fp32"}
    assert len(res) == 3 and {r["spec"]["label"] for r in res.values()} == {"resnet-low", "gpt-low"}
    for key, r in res.items():
        assert r["status"] == "completed" and r["steps"] == 6, key
        assert r["amp_policy"]["name"] == "jax" and len(r["amp_policy"]["sha256"]) == 64
        rewrite = r["environment"]["policy_rewrite"]
        assert rewrite["cast"]["lower_precision"] > 0 and rewrite["not_rewritten"] == []
        tel = r["telemetry"]  # the same sampler as the torch backend
        assert tel["peak_memory"]["host.rss_bytes"]["value"] > 0 and tel["phases_s"]["train"] > 0
        assert tel["gpu"]["statement"].startswith("GPU telemetry unavailable")
        assert (out / "runs" / r["run_id"] / "telemetry.csv").is_file()
        if key.endswith("fp16"):
            assert len(r["loss_scale"]) == 6 and r["skipped_steps"] is not None
        else:
            assert r["loss_scale"] is None
    assert res["resnet-bf16"]["environment"]["policy_rewrite"]["regions"].get("custom_jvp", 0) > 0  # relu


def test_jax_bf16_gpt_passes_mlperfs_rules_and_discloses_what_its_jaxpr_computes(jax_runs):
    """MLPerf's own compliance checker (tests/certify/test_mlperf_checker.py) on the JAX
    backend's bf16 GPT log, and the precision it discloses: measured from the jaxpr."""
    from ampcert.certify.mlperf import check_common

    out, res = jax_runs
    run = out / "runs" / res["gpt-bf16"]["run_id"]
    check = check_common(run / "run.mllog")
    assert check.ok, check.errors
    lowest = json.loads((run / "result.json").read_text())["lowest_precision"]
    assert (lowest["linear"], lowest["attn"], lowest["comm"]) == ("bfloat16", "bfloat16", "fp32")
    # Found by its jax.named_scope, kept through the autocast rewrite.
    assert lowest["detail"]["attn"]["observed"] is True


@pytest.mark.parametrize("extra, message", [
    ("amp: native\n", "`backend: jax` needs `amp: ampcert`"),
    # Where torch is not installed, reading a torch policy stops earlier, naming the extra.
    ("amp: ampcert\npolicy: torch-cpu\n", "expected a jax policy" if TORCH_INSTALLED
     else "a torch policy needs PyTorch, which is not installed"),
])
def test_bad_jax_suites_exit_2_with_one_line(tmp_path, write_suite, extra, message):
    suite = write_suite("name: bad\nbackend: jax\n" + extra + "workloads:\n  - workload: resnet\n")
    proc = warm_cli("run", suite, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_audit_backend_jax_passes_for_the_shipped_policy():
    proc = warm_cli("audit", "--backend", "jax")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for region in ("jit", "scan", "while", "cond", "custom_jvp", "custom_vjp", "remat"):
        assert any(line.split()[:2] == [region, "yes"] for line in proc.stdout.splitlines()), region
    assert "as the policy says" in proc.stdout


def test_a_workload_without_a_jax_version_fails_as_unsupported(tmp_path):
    """Planning refuses it; a worker started on such a spec anyway records why, as UNSUPPORTED."""
    from ampcert.results import FailureKind
    from ampcert.runner.worker import execute
    from ampcert.spec import expand, parse_suite

    suite = parse_suite({"name": "nojax", "precisions": ["fp32"], "seeds": [0], "device": "cpu",
                         "train": {"steps": 2, "eval_every": 2}, "workloads": [{"workload": "digits"}]})
    (spec,) = expand(suite, "cpu")
    result = execute(spec.model_copy(update={"backend": "jax", "amp": "ampcert"}), tmp_path)
    assert (result.status, result.failure) == ("failed", FailureKind.UNSUPPORTED)
    assert result.reason == "workload 'digits' has no JAX version (no build_jax)"
