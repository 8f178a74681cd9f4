"""Certification: each check passes and fails where it should, INCONCLUSIVE where
the evidence is short; rule packs are data with one-line errors.

The shipped numerics suite runs for real once (its designed verdicts, the
`certify` and `check` commands on its folder); the checks themselves are tested
on synthetic results shaped like that run's (tests/factories.py), which the
real run pins: same run ids, same required verdicts."""

from __future__ import annotations

import json
import shutil
import textwrap

import factories
import pytest
from conftest import REPO
from factories import warm_cli

from ampcert import results
from ampcert.certify import evaluate, load_rules
from ampcert.certify.rules import RulePack
from ampcert.errors import UserError


def _by(cert, rule, subject_prefix):
    """The verdict of ``rule`` on the subject whose str starts with ``subject_prefix``."""
    found = [v for v in cert.verdicts if v.rule == rule and str(v.subject).startswith(subject_prefix)]
    assert len(found) == 1, (rule, subject_prefix, [str(v.subject) for v in cert.verdicts if v.rule == rule])
    return found[0]


def _pack(*rules: str, name: str = "test") -> RulePack:
    body = "\n".join(textwrap.dedent(r).strip("\n") for r in rules)
    return RulePack.model_validate({"name": name, "rules": __import__("yaml").safe_load(body)})


@pytest.fixture(scope="module")
def numerics(tmp_path_factory):
    """The shipped numerics suite, run for real (32 runs of under a second each; the command,
    its workers and the report take most of its 25-35 s on a 2-core CPU), through the warm
    CLI as the commands below."""
    out = tmp_path_factory.mktemp("numerics") / "out"
    proc = warm_cli("run", REPO / "suites" / "numerics.yaml", "--out", out, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the certificate FAILs, as designed
    return out, proc.stdout


@pytest.fixture(scope="module")
def synthetic():
    """What the numerics suite records on a CPU, built by hand (tests/factories.py):
    the verdict logic is tested on it in milliseconds; the real run above pins it."""
    return factories.numerics_runs()


@pytest.fixture(scope="module")
def faults():
    """Runs that skip steps, hit the scale floor, and rerun differently (as the
    tests/fault_workloads.py workloads `spiky` and `nondeterministic` record them)."""
    return factories.faults_runs()


# The rules whose verdicts the unit tests below read off the synthetic results.
PINNED = ("parity.final_metric", "convergence.samples_to_target", "determinism.repeat_run",
          "numerics.finite_loss", "scaler.skipped_steps", "scaler.floor")


def _statuses(cert) -> dict[tuple[str, str], str]:
    return {(v.rule, str(v.subject)): v.status for v in cert.verdicts if v.rule in PINNED}


def test_numerics_suite_gives_the_designed_verdicts(numerics, synthetic):
    out, stdout = numerics
    cert = json.loads((out / "verdicts.json").read_text())
    status = {f"{s['subject']['workload']}/{s['subject']['precision']}": s["status"] for s in cert["subjects"]}
    assert status["underflow/fp16"] == "PASS" and status["underflow/bf16"] == "PASS"
    assert status["underflow-noscale/fp16"] == "FAIL"
    assert status["overflow/fp16"] == "FAIL" and status["overflow/bf16"] == "PASS"
    assert cert["status"] == "FAIL" and "certificate: FAIL" in stdout
    # the runner scheduled what the rules need: 3 seeds and one repeat per precision
    runs = results.load(out).runs
    assert {r.spec.seed for r in runs} == {0, 1, 2}
    assert sum(1 for r in runs if r.spec.repeat == 1) == 8
    # the synthetic results the unit tests below use plan the same runs and get the same verdicts
    assert sorted(r.run_id for r in synthetic) == sorted(
        r.run_id for r in runs), "tests/factories.py plans the numerics suite differently from `ampcert run`"
    real = evaluate(runs, load_rules("default"))
    synth = evaluate(synthetic, load_rules("default"))
    assert _statuses(synth) == _statuses(real)
    assert {str(s.subject): s.status for s in synth.subjects} == {str(s.subject): s.status for s in real.subjects}


def test_parity_and_convergence_pass_and_fail(synthetic):
    cert = evaluate(synthetic, load_rules("default"))
    ok = _by(cert, "parity.final_metric", "underflow/torch/ampcert/fp16")
    assert ok.status == "PASS" and ok.evidence["tost"]["n"] == 3 and ok.evidence["tost"]["equivalent"]
    bad = _by(cert, "parity.final_metric", "underflow-noscale/torch/ampcert/fp16")
    assert bad.status == "FAIL" and bad.evidence["tost"]["mean_diff"] < -0.5  # it never learned
    crashed = _by(cert, "parity.final_metric", "overflow/torch/ampcert/fp16")
    assert crashed.status == "FAIL" and "non-finite" in crashed.summary
    assert _by(cert, "convergence.samples_to_target", "underflow/torch/ampcert/bf16").status == "PASS"
    assert _by(cert, "convergence.samples_to_target", "underflow-noscale/torch/ampcert/fp16").status == "FAIL"


def test_inconclusive_below_min_seeds_never_a_silent_pass(synthetic):
    pack = _pack("""
        - {id: parity, check: accuracy_parity, measures: m, margin: 0.02, min_seeds: 5}
        - {id: conv, check: convergence, measures: m, max_ratio: 1.25, min_seeds: 5}
        - {id: spread, check: seed_spread, measures: m, max_spread: 0.05, min_seeds: 4}
    """)
    cert = evaluate(synthetic, pack)
    for rule in ("parity", "conv"):
        v = _by(cert, rule, "underflow/torch/ampcert/fp16")
        assert v.status == "INCONCLUSIVE" and "at least 5" in v.summary
    assert _by(cert, "spread", "underflow/torch/ampcert/bf16").status == "INCONCLUSIVE"
    assert cert.status == "FAIL"  # FAIL elsewhere still wins over INCONCLUSIVE
    only_good = [r for r in synthetic if r.spec.label == "underflow"]
    assert evaluate(only_good, pack).status == "INCONCLUSIVE"


def test_seed_spread_and_nonfinite_loss_pass_and_fail(synthetic):
    cert = evaluate(synthetic, load_rules("default"))
    assert _by(cert, "determinism.seed_spread", "underflow/torch/ampcert/fp32").status == "PASS"
    assert _by(cert, "numerics.finite_loss", "underflow/torch/ampcert/fp16").status == "PASS"
    assert _by(cert, "numerics.finite_loss", "overflow/torch/ampcert/fp16").status == "FAIL"
    strict = evaluate(synthetic, _pack("""
        - {id: spread, check: seed_spread, measures: m, max_spread: 0.001, applies_to: {precisions: [fp32]}}
    """))
    v = _by(strict, "spread", "underflow/torch/ampcert/fp32")
    assert v.status == "FAIL" and v.evidence["spread"] > 0.001


def test_determinism_passes_on_repeats_and_fails_on_a_nondeterministic_workload(synthetic, faults):
    cert = evaluate(synthetic, load_rules("default"))
    ok = _by(cert, "determinism.repeat_run", "underflow/torch/ampcert/fp16")
    assert ok.status == "PASS" and ok.evidence["compared"][0]["first_differing_step"] is None
    cert = evaluate(faults, load_rules("default"))
    bad = _by(cert, "determinism.repeat_run", "nondeterministic/torch/ampcert/fp32")
    assert bad.status == "FAIL" and "loss differs from step 3" in bad.summary
    no_repeats = [r for r in faults if r.spec.repeat == 0]
    v = _by(evaluate(no_repeats, load_rules("default")), "determinism.repeat_run", "spiky/torch/ampcert/fp32")
    assert v.status == "INCONCLUSIVE"


def test_a_run_and_its_repeat_that_both_failed_are_no_determinism_pass(synthetic):
    """Two failures agree on nothing computed: the repeat rule is INCONCLUSIVE, never PASS
    (it compared the two statuses, failed and failed, and said "identical bit for bit")."""
    runs = [factories.failed(r.spec, "the job logged no eval_accuracy") if r.spec.seed == 0
            and str(r.spec.precision) == "fp16" and r.spec.label == "underflow" else r for r in synthetic]
    v = _by(evaluate(runs, load_rules("default")), "determinism.repeat_run", "underflow/torch/ampcert/fp16")
    assert v.status == "INCONCLUSIVE" and "both failed" in v.summary, v.summary


def test_planned_runs_without_a_result_make_the_certificate_incomplete(synthetic, tmp_path):
    """A folder whose plan names runs with no readable result is never certified PASS:
    INCOMPLETE, naming the runs, exit 1; a FAIL among what was judged stays FAIL."""
    passing = [r for r in synthetic if r.spec.label == "underflow"]
    assert evaluate(passing, load_rules("default")).status == "PASS"
    gone = sorted(r.run_id for r in passing if str(r.spec.precision) == "bf16")
    cert = evaluate([r for r in passing if r.run_id not in gone], load_rules("default"), missing=gone)
    assert cert.status == "INCOMPLETE" and cert.missing_runs == gone
    assert "bf16" not in {str(s.subject.precision) for s in cert.subjects}  # nothing judged them
    assert evaluate(synthetic, load_rules("default"), missing=gone).status == "FAIL"
    # Through the command: one run's result.json unreadable (truncated by a crash, say).
    root = factories.write_results(tmp_path / "folder", passing)
    results.ResultsDir(root).result_file(gone[0]).write_text('{"run_id": ')
    proc = warm_cli("certify", root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "certificate: INCOMPLETE" in proc.stdout and gone[0] in proc.stdout
    stored = json.loads((root / "verdicts.json").read_text())
    assert stored["status"] == "INCOMPLETE" and stored["missing_runs"] == [gone[0]]


def test_non_finite_values_are_stored_and_read_back(synthetic, tmp_path):
    """NaN and the infinities round-trip through result.json (as "NaN", "Infinity",
    "-Infinity"): pydantic's default wrote null, which the float fields refused on reading,
    so the run became "missing"."""
    import math

    run = next(r for r in synthetic if r.status == "completed")
    odd = run.model_copy(update={"final_metric": math.nan, "samples_per_s": math.inf,
                                 "evals": [run.evals[0].model_copy(update={"value": -math.inf})]})
    root = factories.write_results(tmp_path / "folder", [odd])
    back = results.load(root)
    assert not back.missing and len(back.runs) == 1
    got = back.runs[0]
    assert math.isnan(got.final_metric) and got.samples_per_s == math.inf and got.evals[0].value == -math.inf


def test_an_infinite_value_reaches_no_target():
    import math

    from ampcert.backends.loop import target_hit

    assert target_hit(0.9, 0.8, True) and not target_hit(math.inf, 0.8, True)
    assert not target_hit(math.nan, 0.8, True) and not target_hit(-math.inf, 2.5, False)


def test_scaler_health_fails_on_skipped_steps_and_the_floor(synthetic, faults):
    cert = evaluate(faults, load_rules("default"))
    skip = _by(cert, "scaler.skipped_steps", "spiky/torch/ampcert/fp16")
    assert skip.status == "FAIL" and max(skip.evidence["rates"].values()) > 0.3
    floor = _by(cert, "scaler.floor", "spiky/torch/ampcert/fp16")
    assert floor.status == "FAIL" and min(floor.evidence["final_scales"].values()) >= 1.0
    assert _by(cert, "numerics.finite_loss", "spiky/torch/ampcert/fp16").status == "FAIL"
    good = evaluate(synthetic, load_rules("default"))
    assert _by(good, "scaler.skipped_steps", "underflow/torch/ampcert/fp16").status == "PASS"
    assert _by(good, "scaler.floor", "underflow/torch/ampcert/fp16").status == "PASS"


@pytest.mark.parametrize("accelerated", [False, True])
def test_gains_are_advisory_where_the_precision_is_not_accelerated(synthetic, accelerated):
    runs = [r if r.spec.precision != "bf16" else r.model_copy(update={"accelerated": accelerated})
            for r in synthetic]
    pack = _pack("""
        - {id: fast, check: speedup, measures: m, min_ratio: 1000.0}
        - {id: slim, check: memory_ratio, measures: m, max_ratio: 10.0}
    """)
    cert = evaluate(runs, pack)
    fast = _by(cert, "fast", "underflow/torch/ampcert/bf16")
    slim = _by(cert, "slim", "underflow/torch/ampcert/bf16")
    assert fast.status == "FAIL" and slim.status == "PASS"
    assert fast.required is accelerated  # advisory where bf16 is not accelerated (as on the CI CPUs)
    assert ("not accelerated" in fast.summary) is not accelerated


def test_certify_cli_reevaluates_without_rerunning(numerics, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(numerics[0], out)
    before = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("result.json")}
    proc = warm_cli("certify", out, "--rules", "procurement")
    assert proc.returncode == 1 and "rules procurement" in proc.stdout, proc.stdout + proc.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("result.json")} == before
    cert = json.loads((out / "verdicts.json").read_text())
    assert cert["rules"]["name"] == "procurement"
    assert any(v["status"] == "INCONCLUSIVE" for v in cert["verdicts"])  # procurement wants 5 seeds


MALFORMED = [
    ("name: x\nrules: []\n", "rules"),
    ("name: x\nrules:\n  - {id: a, check: eval_python, measures: m}\n", "rules[0].check: expected one of"),
    ("name: x\nrules:\n  - {id: a, check: speedup, measures: m, min_ratio: '__import__(\"os\")'}\n", "min_ratio"),
    ("name: x\nrules:\n  - {id: a, check: speedup, measures: m, min_ratio: 1}\n"
     "  - {id: a, check: speedup, measures: m, min_ratio: 1}\n", "appears twice"),
    ("name: x\nrules:\n  - {id: a, check: speedup, measures: m}\n", "min_ratio"),
    ("rules: [\n", "YAML"),
]


@pytest.mark.parametrize("text, message", MALFORMED)
def test_malformed_rule_packs_are_one_line_errors(tmp_path, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")) as info:
        load_rules(bad)
    assert "\n" not in str(info.value)


def test_malformed_rule_packs_are_one_line_exit_2_through_the_cli(numerics, tmp_path):
    """`ampcert certify DIR --rules BAD` for each pack above: exit 2, one line naming the problem."""
    for i, (text, message) in enumerate(MALFORMED):
        bad = tmp_path / f"bad{i}.yaml"
        bad.write_text(text)
        proc = warm_cli("certify", numerics[0], "--rules", bad)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr


def test_ampcert_logs_pass_the_default_compliance_rules(numerics):
    runs = results.load(numerics[0]).runs
    done = [numerics[0] / "runs" / r.run_id / "run.mllog" for r in runs if r.status == "completed"]
    proc = warm_cli("check", *done)
    assert proc.returncode == 0 and f"{len(done)} log(s) checked" in proc.stdout, proc.stdout
    failed = next(r for r in runs if r.status == "failed")
    proc = warm_cli("check", numerics[0] / "runs" / failed.run_id / "run.mllog")
    # It logged run_stop aborted, which the rules accept (as MLPerf's do: a run that did not
    # reach its target); what fails is the evaluation it never got to.
    assert proc.returncode == 1 and "keys.eval_stop" in proc.stdout, proc.stdout
    assert "values.run_stop" not in proc.stdout, proc.stdout


# --------------------------------------------------------------------------- messages that help; certify as a what-if


def test_a_mistyped_rule_pack_name_lists_the_shipped_ones(tmp_path):
    from ampcert.certify.rules import RULES_DIR, shipped_rule_names

    with pytest.raises(UserError) as info:
        load_rules("procurment")
    message = str(info.value)
    assert "rules: no shipped rule pack is called 'procurment'; did you mean 'procurement'?" in message, message
    assert f"shipped: {', '.join(shipped_rule_names())}" in message and "default" in message, message
    assert str(RULES_DIR) not in message and "site-packages" not in message, message  # no path the user never typed
    with pytest.raises(UserError) as info:
        load_rules(tmp_path / "nope.yaml")
    assert str(info.value).startswith(f"{tmp_path / 'nope.yaml'}: rules: rule file not found"), info.value
    (tmp_path / "pack.yaml").mkdir()
    with pytest.raises(UserError, match="expected a rule file \\(YAML\\), found a folder"):
        load_rules(tmp_path / "pack.yaml")


def test_without_fp32_no_verdict_speaks_of_capped_steps(synthetic):
    """Nothing is capped where there is no FP32 at all: the checks that compare with it say so."""
    cert = evaluate([r for r in synthetic if r.spec.precision != "fp32"], load_rules("default"))
    for rule in ("parity.final_metric", "convergence.samples_to_target", "gains.speedup", "gains.peak_memory"):
        verdict = _by(cert, rule, "underflow/torch/ampcert/bf16")
        assert verdict.status == "INCONCLUSIVE", (rule, verdict.summary)
        assert verdict.summary.startswith("no fp32 runs of this entry to compare with"), (rule, verdict.summary)
    assert not any("capped" in v.summary or "budget differs" in v.summary for v in cert.verdicts)


NO_FP32 = """\
name: t
precisions: [bf16]
seeds: [0]
certify: default
train: {steps: 4, eval_every: 2}
workloads:
  - workload: digits
"""


def test_a_pack_comparing_with_fp32_refuses_a_suite_without_fp32_when_planned(write_suite, tmp_path):
    from conftest import assert_one_line_error

    from ampcert.runner.planning import plan_suite

    suite = write_suite(NO_FP32)
    with pytest.raises(UserError) as info:
        plan_suite(suite)
    message = str(info.value)
    assert message.startswith(f"{suite}: certify: rule pack 'default' compares bf16 with fp32 (rule "
                              "parity.final_metric, accuracy_parity), but workload 'digits' runs no fp32"), message
    # the dry run says it too, and a run trains nothing and writes nothing
    assert_one_line_error(warm_cli("run", suite, "--dry-run"), "runs no fp32", "add fp32 to its precisions")
    assert_one_line_error(warm_cli("run", suite, "--out", tmp_path / "out"), "runs no fp32")
    assert not (tmp_path / "out").exists()
    # fp32 in the entry: planned; a pack that compares nothing with fp32 (or only fp16): planned without it
    plan_suite(write_suite(NO_FP32.replace("- workload: digits", "- workload: digits\n    precisions: [fp32, bf16]"),
                           "with-fp32.yaml"))
    pack = tmp_path / "own.yaml"
    pack.write_text("name: own\nrules:\n  - {id: finite, check: nonfinite_loss, measures: m}\n"
                    "  - {id: parity, check: accuracy_parity, measures: m, margin: 0.1, applies_to: {precisions: [fp16]}}\n")
    assert plan_suite(write_suite(NO_FP32.replace("certify: default", f"certify: {pack}"), "own-pack.yaml")).runs


def test_certify_leaves_a_signed_folder_verifiable(numerics, tmp_path):
    """certify on a signed folder is a what-if: nothing in it is written and `verify` still
    passes; --out writes the re-evaluation to a copy; --force rewrites it and removes the
    envelope that would no longer verify."""
    from conftest import assert_one_line_error, snapshot

    from ampcert.report.sign import keygen

    signed = tmp_path / "signed"
    shutil.copytree(numerics[0], signed)
    key, pub = keygen(tmp_path / "k")
    assert warm_cli("sign", signed, "--key", key).returncode == 0
    envelope, before = signed / "report.dsse.json", snapshot(signed)

    def verified() -> bool:
        proc = warm_cli("verify", envelope, "--pubkey", pub)
        assert proc.returncode in (0, 1), proc.stderr
        return proc.returncode == 0

    proc = warm_cli("certify", signed, "--rules", "procurement")
    assert proc.returncode == 1 and "rules procurement" in proc.stdout, proc.stdout + proc.stderr
    assert f"verdicts: not written ({signed} is signed: a what-if" in proc.stdout, proc.stdout
    assert "--out NEW" in proc.stdout and "--force" in proc.stdout, proc.stdout
    assert snapshot(signed) == before and verified()

    new = tmp_path / "new"
    proc = warm_cli("certify", signed, "--rules", "procurement", "--out", new)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"verdicts: {new / 'verdicts.json'}" in proc.stdout
    assert f"report: {new / 'report.html'} ({signed} is left as it was)" in proc.stdout, proc.stdout
    assert json.loads((new / "verdicts.json").read_text())["rules"]["name"] == "procurement"
    assert "procurement" in (new / "report.json").read_text() and not (new / "report.dsse.json").exists()
    assert sorted(p.name for p in (new / "runs").iterdir()) == sorted(p.name for p in (signed / "runs").iterdir())
    assert snapshot(signed) == before and verified()

    assert_one_line_error(warm_cli("certify", signed, "--out", tmp_path / "both", "--force"), "--force",
                          "give one of the two")
    assert_one_line_error(warm_cli("certify", signed, "--out", signed / "inside"), "--out", "inside the results folder")
    assert_one_line_error(warm_cli("certify", signed, "--out", new), "--out", "is not empty")
    assert not (tmp_path / "both").exists() and snapshot(signed) == before and verified()

    proc = warm_cli("certify", signed, "--rules", "procurement", "--force")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"note: removed {envelope}: it signed the report as it was" in proc.stdout, proc.stdout
    assert not envelope.exists()
    assert json.loads((signed / "verdicts.json").read_text())["rules"]["name"] == "procurement"
    assert_one_line_error(warm_cli("verify", envelope, "--pubkey", pub), "report.dsse.json: envelope not found")
