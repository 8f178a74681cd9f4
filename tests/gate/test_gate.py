"""The regression gate (`ampcert compare`) and capacity planning (`ampcert plan`).

The timing tests (marked serial: they run alone, after the parallel run) compare
folders from real `ampcert run` invocations of small suites: the digits CNN (6
seeds x 60 steps) and the underflow MLP in fp32 and fp16 (2 seeds), certified
with a one-rule parity pack. Timing on a shared 2-core machine is only as good
as the measurement: other processes' load drifts by tens of percent from one
minute to the next, more than a 15% slowdown (so the test injects 50%). So the
two sides of each comparison run side by side (interleaved in time, the usual
practice for A/B timing on a noisy machine), single-threaded (OMP_NUM_THREADS=1:
two torch processes with a thread per core each would fight over the 2 cores).
The slowdown test also holds the gate to the real verdict flip (fp16 without
loss scaling fails its parity rule).

The other tests check what the gate and the planner compute from results, so
they read synthetic folders of the same suite (:func:`synthetic_folder`: the
real planner's run matrix, results shaped as this CPU records them, verdicts
from the real certifier) instead of training five more suites in the parallel
run (~75 s of CPU, for figures the tests construct or hand-compute anyway).
"""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import json
import re
import shutil
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import assert_one_line_error, cli_env, run_cli
from factories import completed, warm_cli, write_results
from factories import plan as plan_runs

from ampcert import capacity_planning, gate, results
from ampcert.certify import evaluate, load_rules
from ampcert.errors import UserError

RULES = """\
name: gate-test
rules:
  - id: parity.final_metric
    check: accuracy_parity
    measures: final eval metric, low precision minus FP32, paired by seed
    margin: 0.05
    alpha: 0.05
    min_seeds: 2
    required: true
"""

SUITE = """\
name: gate
device: cpu
precisions: [fp32]
seeds: [0, 1, 2, 3, 4, 5]
unaccelerated: run
certify: {rules}
train: {{steps: 60, eval_every: 30}}
workloads:
  - workload: {digits}
    id: digits
  - workload: underflow
    precisions: [fp32, fp16]
    seeds: [0, 1]
    train: {{steps: 60, eval_every: 30}}
    loss_scaling: {scaling}
"""

DIGITS = "digits/torch/native/fp32"
FP16 = "underflow/torch/native/fp16"


def run_side_by_side(jobs: dict[str, Path], out_root: Path) -> dict[str, Path]:
    """`ampcert run SUITE --out DIR` for every job at once; wait for all."""
    env = cli_env() | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = {}
    for name, suite in jobs.items():
        out = out_root / name
        procs[name] = (out, subprocess.Popen(
            [sys.executable, "-m", "ampcert", "run", str(suite), "--out", str(out)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    folders = {}
    for name, (out, proc) in procs.items():
        output, _ = proc.communicate(timeout=300)
        # the candidate's certificate FAILs (exit 1) by design; anything else is a broken run
        assert proc.returncode in (0, 1) and (out / "verdicts.json").exists(), output
        folders[name] = out
    return folders


@pytest.fixture(scope="module")
def suites(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The folder all runs go in, the baseline suite, and the candidate (digits
    steps 50% slower, fp16 without loss scaling)."""
    root = tmp_path_factory.mktemp("gate")
    rules = root / "rules.yaml"
    rules.write_text(RULES)

    def suite(name: str, digits: str, scaling: bool) -> Path:
        path = root / f"{name}.yaml"
        path.write_text(SUITE.format(rules=rules, digits=digits, scaling=str(scaling).lower()))
        return path

    return root, suite("base", "digits", True), suite("cand", "fault_workloads:slow", False)


@pytest.fixture(scope="module")
def pair(suites) -> dict:
    """base1 and cand, side by side (the serial slowdown test needs only these)."""
    root, base, cand = suites
    out = run_side_by_side({"base1": base, "cand": cand}, root)
    # for another measurement of the slowdown, if one was too noisy to decide (attempt n: 1, 2)
    out["again"] = lambda n: run_side_by_side({f"base1-{n}": base, f"cand-{n}": cand}, root)
    return out


@pytest.fixture(scope="module")
def folders(suites, pair) -> dict:
    """The pair, and base2 and base3 side by side (the same suite). Two processes,
    never three: three single-threaded runs on 2 cores leave one of them sharing a
    core for minutes, which slowed one side's digits runs by 14% in CI (a real
    difference in machine state, which the gate rightly called significant)."""
    root, base, _ = suites
    out = pair | run_side_by_side({"base2": base, "base3": base}, root)
    # a second measurement, for a difference that may be the machine's rather than the code's
    out["same_again"] = lambda: run_side_by_side({"base2b": base, "base3b": base}, root)
    return out


# What a real run of SUITE records on this CPU (the figures of a measured run, rounded):
# the gate and the planner read these fields.
ENVIRONMENT = {"torch": "2.13.0+cpu", "device_name": "Test CPU"}
NO_ENERGY = {"energy": {"scope": "host", "train_j": None, "eval_j": None, "init_j": None, "total_j": None,
                        "train_j_per_sample": None, "method": None,
                        "reason": "host: RAPL unavailable: /sys/class/powercap not present"}}
SPEED = {"digits": 17_000.0, ("underflow", "fp32"): 137_000.0, ("underflow", "fp16"): 69_000.0}
ACCURACY = {"digits": [0.791, 0.713, 0.813, 0.827, 0.844, 0.774], "underflow": [0.922, 0.908]}


def synthetic_folder(suites: tuple[Path, Path, Path], name: str, *, candidate: bool = False, side: int = 0) -> Path:
    """A results folder of the baseline suite (or, with ``candidate``, of the candidate:
    digits 50% slower, fp16 without loss scaling, which then stays at chance accuracy)
    as `ampcert run` leaves it: plan.json with the run matrix the real planner makes of
    that suite, a result.json per run, verdicts.json from the real certifier. ``side``
    moves each run's throughput by a few percent, as two measurements of the same code
    differ; accuracies depend on the seed only (same code, same seed: bit-identical)."""
    root, base_suite, cand_suite = suites
    suite_file = cand_suite if candidate else base_suite
    runs = []
    for spec in plan_runs(yaml.safe_load(suite_file.read_text())):
        wobble = (1 + 0.004 * side) * (1 + 0.01 * ((3 * spec.seed + side) % 5 - 2))  # a few percent
        if spec.label == "digits":
            speed, accuracy = SPEED["digits"] / (1.3 if candidate else 1.0), ACCURACY["digits"][spec.seed]
        else:
            speed, accuracy = SPEED[("underflow", spec.precision)], ACCURACY["underflow"][spec.seed]
            if candidate and spec.precision == "fp16":
                accuracy = 0.1 + 0.01 * spec.seed  # no loss scaler: the gradients underflow, nothing is learnt
        runs.append(completed(spec, final_metric=accuracy, samples_per_s=round(speed * wobble, 1),
                              environment=ENVIRONMENT, telemetry=copy.deepcopy(NO_ENERGY)))
    folder = write_results(root / name, runs, suite="gate")
    stored = json.loads((folder / "plan.json").read_text())
    stored["suite_sha256"] = hashlib.sha256(suite_file.read_bytes()).hexdigest()
    (folder / "plan.json").write_text(json.dumps(stored))
    (folder / "verdicts.json").write_text(evaluate(runs, load_rules(root / "rules.yaml")).model_dump_json())
    return folder


@pytest.fixture(scope="module")
def synthetic(suites) -> dict[str, Path]:
    """Synthetic twins of the real folders, for the tests of what is computed from
    results: base1 and cand (the candidate suite), base2 and base3 (the same suite
    measured twice)."""
    return {"base1": synthetic_folder(suites, "syn-base1"),
            "cand": synthetic_folder(suites, "syn-cand", candidate=True, side=1),
            "base2": synthetic_folder(suites, "syn-base2", side=2),
            "base3": synthetic_folder(suites, "syn-base3", side=3)}


def _compare(b: Path, c: Path, cfg=None) -> gate.GateResult:
    return gate.compare(gate.load_source(b), gate.load_source(c), cfg or gate.load_gate())


def _row(result: gate.GateResult, subject: str, metric: str) -> gate.MetricComparison:
    found = [c for c in result.comparisons if str(c.subject) == subject and c.metric == metric]
    assert len(found) == 1, [(str(c.subject), c.metric) for c in result.comparisons]
    return found[0]


def _table(result: gate.GateResult) -> str:
    return gate.to_markdown(result)


def _write_report(folder: Path, path: Path, suite_name: str | None = None, relabel: str | None = None) -> Path:
    """A report.json as issue 8 defines it (runs, certificate, suite), from a results folder."""
    rs = results.load(folder)
    runs = [json.loads(r.model_dump_json()) for r in sorted(rs.runs, key=lambda r: r.run_id)]  # as report.json
    if relabel:
        for r in runs:
            r["spec"]["label"] = relabel
    plan_json = json.loads((folder / "plan.json").read_text())
    verdicts = folder / "verdicts.json"
    path.write_text(json.dumps({
        "schema_version": 1,
        "suite": {"name": suite_name or rs.suite_name, "sha256": plan_json["suite_sha256"]},
        "runs": runs,
        "certificate": json.loads(verdicts.read_text()) if verdicts.exists() else None,
    }))
    return path


# --------------------------------------------------------------------------- the gate


@pytest.mark.serial  # throughput is under test: it runs alone, after the parallel run
def test_injected_slowdown_is_flagged(pair, tmp_path):
    base, cand = pair["base1"], pair["cand"]
    # The gate may find the machine too noisy to tell the change from its load (as designed,
    # it does not fail a build on that): then measure again, side by side, twice at most.
    # With steps 30% slower, CI's 2-core VM read -28% with a CI of [-48%, +1%] in both of
    # the two measurements the test then made (b8325eb, d105bfe), and alone once read -18%
    # [-29%, +0.3%]: hence 50% slower (-33%) and a third measurement.
    for attempt in (1, 2):
        if _row(_compare(base, cand), DIGITS, "step_samples_per_s").status != "INCONCLUSIVE":
            break
        again = pair["again"](attempt)
        base, cand = again[f"base1-{attempt}"], again[f"cand-{attempt}"]
    out_json, out_md = tmp_path / "gate.json", tmp_path / "gate.md"
    proc = run_cli("compare", base, cand, "--json-out", out_json, "--markdown", out_md)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = gate.GateResult.model_validate_json(out_json.read_text())
    speed = _row(result, DIGITS, "step_samples_per_s")  # steady state: runs x step windows
    assert speed.status == "REGRESSION", _table(result)
    assert speed.change < -0.10 and speed.ci[1] < 0
    assert speed.test.startswith("bootstrap") and re.search(r"runs x \d+-step windows", speed.test)
    # 6 runs x 60 steps, less each run's warm-up (at most half: MSER-5 searches the first half)
    assert speed.baseline.runs == speed.candidate.runs == 6 and 180 <= speed.baseline.samples <= 360
    # the whole-run figure, over the six runs a side: the same slowdown, its own test
    whole = _row(result, DIGITS, "samples_per_s")
    assert whole.change < -0.10 and whole.baseline.samples == 6 and whole.status in ("REGRESSION", "INCONCLUSIVE")
    # the slowdown touched nothing else of that workload
    assert _row(result, DIGITS, "final_metric").status == "OK"
    assert _row(result, DIGITS, "final_metric").change == 0  # same seeds, same code path: bit-identical
    assert _row(result, DIGITS, "peak_memory_bytes").status == "OK"
    # on real runs too (test_accuracy_drop_... checks the rest on synthetic ones): fp16
    # trained without loss scaling fails its parity rule, a verdict flip the gate flags
    assert result.baseline.certificate == "PASS" and result.candidate.certificate == "FAIL"
    overall = {(str(v.subject), v.rule): v for v in result.verdict_changes}[(FP16, None)]
    assert (overall.baseline, overall.candidate, overall.regression) == ("PASS", "FAIL", True)
    assert _row(result, FP16, "final_metric").change < -0.5
    # the terminal output names the test that decided, and the verdict
    assert "REGRESSION" in proc.stdout and "bootstrap 95% CI" in proc.stdout and "FAIL:" in proc.stdout
    md = out_md.read_text()
    assert md.startswith("### :x: ampcert gate: FAIL") and f"{DIGITS}: step_samples_per_s" in md
    assert "| **REGRESSION** |" in md


def test_accuracy_drop_that_flips_a_verdict_is_a_regression(synthetic):
    # (synthetic folders; the serial slowdown test checks the flip on real runs)
    result = _compare(synthetic["base1"], synthetic["cand"])
    assert result.baseline.certificate == "PASS" and result.candidate.certificate == "FAIL"
    flips = {(str(v.subject), v.rule): v for v in result.verdict_changes}
    overall = flips[(FP16, None)]
    assert (overall.baseline, overall.candidate, overall.regression) == ("PASS", "FAIL", True)
    parity = flips[(FP16, "parity.final_metric")]
    assert parity.regression and "mean difference" in parity.summary
    assert any(line.startswith(f"{FP16}: verdict PASS -> FAIL") for line in result.regressions)
    # regardless of speed: without a loss scaler fp16 is no slower, and with 2 seeds the
    # metric rows cannot be significant at all; the verdict alone fails the gate
    assert _row(result, FP16, "samples_per_s").status != "REGRESSION"
    accuracy = _row(result, FP16, "final_metric")
    assert accuracy.change < -0.5 and accuracy.status == "INCONCLUSIVE" and accuracy.test.startswith("none")
    # the unchanged fp32 reference of that workload stays unflagged
    assert all(c.status != "REGRESSION" for c in result.comparisons if str(c.subject).endswith("underflow/torch/native/fp32"))


@pytest.mark.serial  # throughput is compared: a test beside it on the other core makes one side slower
def test_same_code_twice_is_not_flagged(folders):
    """The false-positive check: two runs of the same suite, side by side, each
    against the other.

    Two processes side by side still sit on different cores, and on a shared runner one
    core can be slower than the other for minutes (a neighbour on its sibling thread):
    CI once measured the same digits runs 11.5% apart, p=0.02, a difference the gate
    rightly calls real. As a performance CI does before it blames the code, a flagged
    throughput is measured once more; the code is at fault only if both measurements
    flag it. Accuracy and verdicts do not depend on the machine: they must hold the
    first time."""
    def compared(first: str, second: str) -> list[tuple[str, gate.GateResult]]:
        out = []
        for b, c in [(first, second), (second, first)]:
            result = _compare(folders[b], folders[c])
            assert not result.verdict_changes and not result.run_failures, _table(result)
            assert _row(result, DIGITS, "final_metric").change == 0  # same seeds, same code: bit-identical
            assert all(r.status != "REGRESSION" for r in result.comparisons if r.metric == "final_metric")
            out.append((f"{b} -> {c}", result))
        return out

    measured = compared("base2", "base3")
    passed = ("base2", "base3")
    if any(result.status != "PASS" for _, result in measured):
        folders.update(folders["same_again"]())
        again = compared("base2b", "base3b")
        flagged = [(name, result) for name, result in measured + again if result.status != "PASS"]
        assert all(result.status == "PASS" for _, result in again), \
            "\n".join(f"{name}\n{_table(result)}" for name, result in flagged)
        passed = ("base2b", "base3b")
    proc = run_cli("compare", folders[passed[0]], folders[passed[1]])
    assert proc.returncode == 0 and "PASS: no regression" in proc.stdout, proc.stdout + proc.stderr


def test_report_json_compares_like_its_folder(synthetic, tmp_path):
    report = _write_report(synthetic["base3"], tmp_path / "report.json")
    via_report = _compare(synthetic["base2"], report)
    via_folder = _compare(synthetic["base2"], synthetic["base3"])
    assert via_report.candidate.kind == "report" and via_report.candidate.certificate == "PASS"
    assert [(c.metric, c.status, c.change, c.ci) for c in via_report.comparisons] == \
        [(c.metric, c.status, c.change, c.ci) for c in via_folder.comparisons]


def test_mismatched_suites_and_bad_input_exit_2(synthetic, tmp_path):
    other = _write_report(synthetic["base3"], tmp_path / "other.json", suite_name="vision")
    assert_one_line_error(warm_cli("compare", synthetic["base2"], other), "suites differ", "'gate'", "'vision'")
    disjoint = _write_report(synthetic["base3"], tmp_path / "disjoint.json", relabel="resnet")
    assert_one_line_error(warm_cli("compare", disjoint, synthetic["base2"]),
                          "no common (workload, backend, precision)", "resnet/torch/fp32", "digits/torch/fp32")
    # the same, in-process, without a subprocess each
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    not_report = tmp_path / "list.json"
    not_report.write_text("[1, 2]")
    envelope = tmp_path / "report.dsse.json"
    envelope.write_text('{"payloadType": "application/vnd.in-toto+json", "payload": "", "signatures": []}')
    broken_run = tmp_path / "broken.json"
    broken_run.write_text(json.dumps({"suite": {"name": "gate"}, "runs": [{"run_id": "x"}]}))
    for path, fragment in [(tmp_path / "nope", "no such report file or results folder"),
                           (tmp_path, "no plan.json"), (bad_json, "invalid JSON"),
                           (not_report, "expected a JSON object with `runs`"),
                           (envelope, "signed envelope"), (broken_run, "runs[0]")]:
        with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
            gate.load_source(path)


def test_gate_file_overrides_defaults(synthetic, tmp_path):
    loose = tmp_path / "loose.yaml"
    loose.write_text("metrics:\n  samples_per_s: {threshold: 0.6}\n  step_samples_per_s: {threshold: 0.6}\n"
                     "verdicts: {new_fail: false}\n")
    cfg = gate.load_gate(loose)
    assert cfg.metrics["samples_per_s"].threshold == 0.6 and cfg.metrics["final_metric"].threshold == 0.02
    result = _compare(synthetic["base1"], synthetic["cand"], cfg)
    assert _row(result, DIGITS, "samples_per_s").status == "OK"  # a ~23% drop in throughput is under 60%
    assert result.status == "PASS" and result.verdict_changes  # still listed, no longer failing
    assert result.gate["name"] == "default + loose.yaml"
    for text, fragment in [("metrics:\n  throughput: {threshold: 0.1}\n", "metrics.throughput: expected one of"),
                           ("metrics:\n  samples_per_s: {threshold: -1}\n", "metrics.samples_per_s.threshold"),
                           ("metrics:\n  samples_per_s: {test: t-test}\n", "metrics.samples_per_s.test"),
                           ("alpha: [\n", "YAML")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
            gate.load_gate(bad)
    assert_one_line_error(warm_cli("compare", synthetic["base2"], synthetic["base3"], "--gate", tmp_path / "no.yaml"),
                           "no.yaml", "--gate")


def test_runs_that_fail_now_are_regressions(synthetic):
    base = gate.load_source(synthetic["base2"])
    cand = gate.load_source(synthetic["base3"])
    broken = [r.model_copy(update={"status": "failed", "reason": "RuntimeError: CUDA out of memory"})
              if r.spec.label == "digits" and r.spec.seed == 1 else r for r in cand.runs]
    result = gate.compare(base, gate.Source(cand.path, cand.kind, cand.suite_name, cand.suite_sha256, broken,
                                            cand.certificate))
    assert result.status == "FAIL"
    (failure,) = result.run_failures
    assert str(failure.subject) == DIGITS and failure.candidate_failed == 1 and failure.regression
    assert "out of memory" in result.regressions[-1]


def test_decision_needs_effect_and_support(synthetic):
    """The decision rule on constructed step times (real runs otherwise): 15%
    slower on consistent runs is a regression, 5% is within the threshold, 15%
    faster is an improvement; two runs a side support nothing; and runs far
    apart (a noisy machine) leave a 15% change INCONCLUSIVE, not failed."""
    import numpy as np

    base = gate.load_source(synthetic["base2"])
    template = [r for r in base.runs if r.spec.label == "digits"]
    noise = np.random.default_rng(0)
    # four runs of 100 steps: 10 ms +- 3% per step, runs 2% apart
    steps = [10.0 * (1 + 0.02 * i) * noise.normal(1, 0.03, 100) for i in range(4)]

    def side(factor: float, seeds=(0, 1, 2, 3)) -> gate.Source:
        runs = [r.model_copy(update={"step_times_ms": list(steps[r.spec.seed] * factor),
                                     "samples_per_s": 64e3 / float(np.mean(steps[r.spec.seed] * factor))})
                for r in template if r.spec.seed in seeds]
        return gate.Source(base.path, "results folder", base.suite_name, None, runs, None)

    reference = side(1.0)
    assert _row(gate.compare(reference, side(1.15)), DIGITS, "samples_per_s").status == "REGRESSION"
    assert _row(gate.compare(reference, side(1.05)), DIGITS, "samples_per_s").status == "OK"
    assert _row(gate.compare(reference, side(0.85)), DIGITS, "samples_per_s").status == "IMPROVED"
    few = _row(gate.compare(side(1.0, (0, 1)), side(1.3, (0, 1))), DIGITS, "samples_per_s")
    assert few.status == "INCONCLUSIVE" and few.test.startswith("none: 2 vs 2 runs")
    spread = [10.0 * (1 + 0.4 * i) * noise.normal(1, 0.03, 100) for i in range(4)]  # runs 40% apart
    steps[:] = spread
    assert _row(gate.compare(side(1.0), side(1.15)), DIGITS, "samples_per_s").status == "INCONCLUSIVE"

    rng = np.random.default_rng(1)
    medians = gate.bootstrap_medians([np.full(50, 10.0), np.full(50, 12.0), np.full(50, 11.0)], 2000, rng)
    assert medians.min() >= 10.0 and medians.max() <= 12.0 and np.median(medians) == 11.0


# --------------------------------------------------------------------------- capacity planning


def test_capacity_plan_matches_hand_computed_figures(synthetic):
    rs = results.load(synthetic["base2"])
    n, k, price = 10_000_000, 4, 2.5
    cp = capacity_planning.capacity_plan(rs.runs, target_samples=n, gpus=k, price_per_gpu_hour=price)
    rows = {f"{r.workload}/{r.backend}/{r.amp}/{r.precision}": r for r in cp.rows}
    assert set(rows) == {DIGITS, FP16, "underflow/torch/native/fp32"}

    digits = sorted(r.samples_per_s for r in rs.runs if r.spec.label == "digits")
    assert len(digits) == 6
    median = (digits[2] + digits[3]) / 2  # of six seeds
    row = rows[DIGITS]
    assert row.seeds == 6 and row.samples_per_s == pytest.approx(median)
    assert row.wall_time_h == pytest.approx(n / (median * k) / 3600)
    assert row.wall_time_h_range == pytest.approx([n / (digits[-1] * k) / 3600, n / (digits[0] * k) / 3600])
    assert row.device_hours == pytest.approx(n / median / 3600)  # K devices x wall time
    assert row.cost == pytest.approx(n / median / 3600 * price)
    assert row.cost_range == pytest.approx([n / digits[-1] / 3600 * price, n / digits[0] / 3600 * price])
    # no energy counter (as a CPU without RAPL records it): null with the reason, never 0
    assert row.energy_kwh is None and row.energy_reason
    assert row.speedup_vs_fp32 is None and row.time_saving_vs_fp32 is None  # it is the FP32 row

    def thr(precision):
        return statistics.median(r.samples_per_s for r in rs.runs
                                 if r.spec.label == "underflow" and r.spec.precision == precision)

    fp16 = rows[FP16]
    assert fp16.speedup_vs_fp32 == pytest.approx(thr("fp16") / thr("fp32"))
    assert fp16.time_saving_vs_fp32 == pytest.approx(1 - thr("fp32") / thr("fp16"))
    assert fp16.cost_saving_vs_fp32 == pytest.approx(1 - thr("fp32") / thr("fp16"))
    assert not fp16.accelerated  # a CPU without fast fp16 (as planned for this suite): the plan says so


def test_capacity_plan_energy_from_a_stored_result_with_energy(synthetic, tmp_path):
    """A stored result that measured energy (as a GPU run's NVML counter records
    it): kWh = N x median J/sample / 3.6e6, the range from the seeds."""
    folder = tmp_path / "with-energy"
    shutil.copytree(synthetic["base2"], folder)
    joules = {0: 0.5, 1: 0.6, 2: 0.8, 3: 0.7, 4: 0.55, 5: 0.65}
    for path in folder.glob("runs/digits-*/result.json"):
        data = json.loads(path.read_text())
        data["telemetry"]["energy"].update(train_j_per_sample=joules[data["spec"]["seed"]], scope="gpu",
                                           method="NVML total energy counter at phase edges", reason=None)
        path.write_text(json.dumps(data))
    n = 10_000_000
    cp = capacity_planning.capacity_plan(results.load(folder).runs, target_samples=n, gpus=8)
    row = next(r for r in cp.rows if r.workload == "digits")
    assert row.energy_j_per_sample == pytest.approx(0.625)  # the median of six seeds
    assert row.energy_kwh == pytest.approx(n * 0.625 / 3.6e6)  # 1.736 kWh
    assert row.energy_kwh_range == pytest.approx([n * 0.5 / 3.6e6, n * 0.8 / 3.6e6])
    assert row.energy_scope == "gpu" and row.energy_reason is None
    assert row.cost is None and "pass --price-per-gpu-hour" in row.cost_reason  # a CPU has no list price


def test_plan_cli_table_csv_and_pricing(synthetic, tmp_path):
    rs = results.load(synthetic["base2"])
    device = rs.runs[0].environment["device_name"]
    pricing = tmp_path / "pricing.yaml"
    pricing.write_text(textwrap.dedent(f"""\
        currency: EUR
        note: test prices
        devices:
          - {{name: this machine, match: [{json.dumps(device)}], price_per_gpu_hour: 1.25}}
    """))
    out_csv = tmp_path / "plan.csv"
    proc = warm_cli("plan", synthetic["base2"], "--target-samples", "1000000", "--gpus", "2",
                   "--pricing", pricing, "--csv", out_csv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "linear scaling" in proc.stdout and "not measured" in proc.stdout and "EUR" in proc.stdout
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    expected = capacity_planning.capacity_plan(rs.runs, 1_000_000, 2, pricing=pricing)
    assert len(rows) == len(expected.rows) == 3
    for got, want in zip(rows, expected.rows, strict=True):
        assert got["precision"] == want.precision and got["currency"] == "EUR"
        assert float(got["wall_time_h"]) == pytest.approx(want.wall_time_h)
        assert float(got["cost"]) == pytest.approx(want.device_hours * 1.25)
        assert got["energy_kwh"] == "" and got["energy_reason"]
    assert expected.rows[0].price_source.endswith("this machine (test prices)")
    assert_one_line_error(warm_cli("plan", synthetic["base2"], "--target-samples", "0"), "--target-samples")
