"""The memory sweep's fit (ampcert/memory.py): on synthetic peaks, where the answer is known,
and on real CPU runs of digits and gpt tiny, where a fitted line must predict a fourth,
unseen batch size."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli  # cold where the start matters; warm_cli elsewhere
from factories import completed, failed, plan, warm_cli

from ampcert.memory import device_memory, fit_sweep
from ampcert.results import FailureKind, load
from ampcert.spec import SweepPoint

MiB = 2**20


def _sweep(precisions=("fp32", "bf16"), batches=(16, 32, 64)):
    return [s for s in plan({"name": "t", "precisions": list(precisions), "train": {"steps": 20},
                             "memory": {"batch_sizes": list(batches)}, "workloads": [{"workload": "digits"}]})
            if s.is_memory_sweep]


def _measured(spec, fixed, per_sample, wobble=0.0):
    return completed(spec, final_metric=0.5, peak_memory=fixed + per_sample * spec.sweep.batch_size + wobble)


def test_a_line_is_recovered_with_its_budgets_and_the_saving_per_sample():
    fp32 = {16: 0.0, 32: 0.0, 64: 0.0}
    runs = [_measured(s, 200 * MiB, (1 if s.precision == "fp32" else 0.5) * MiB, fp32[s.sweep.batch_size] if s.precision == "fp32"
                      else {16: 0.1, 32: -0.2, 64: 0.1}[s.sweep.batch_size] * MiB) for s in _sweep()]
    fits = fit_sweep(runs, budgets=[1024 * MiB, 100 * MiB])
    assert [str(f.subject) for f in fits] == ["digits/torch/native/fp32", "digits/torch/native/bf16"]
    ref, low = fits
    assert ref.fixed_bytes == pytest.approx(200 * MiB) and ref.bytes_per_sample == pytest.approx(MiB)
    assert ref.max_residual_share == pytest.approx(0, abs=1e-9)
    # (1024 - 200) MiB at 1 MiB a sample; the fixed bytes alone exceed 100 MiB
    assert [(b.budget_bytes, b.largest_batch, b.source) for b in ref.budgets] == [
        (1024 * MiB, 824, "suite"), (100 * MiB, None, "suite")]
    assert "fixed bytes alone" in ref.budgets[1].note
    assert ref.predict(824) <= 1024 * MiB < ref.predict(825)
    assert low.bytes_per_sample == pytest.approx(0.5 * MiB, rel=0.02)
    assert low.budgets[0].largest_batch == pytest.approx(1648, abs=40)
    assert low.saving is not None and low.saving.fraction == pytest.approx(0.5, abs=0.01)
    lo, hi = low.saving.interval
    assert lo < low.saving.fraction < hi and hi - lo < 0.2 and not low.saving.note
    assert all(p.residual_bytes == pytest.approx(p.peak_bytes - low.predict(p.batch)) for p in low.points)


def test_a_precision_that_costs_memory_says_so():
    runs = [_measured(s, 280 * MiB, (70 if s.precision == "fp32" else 84) * 1024,
                      {16: 1, 32: -2, 64: 1}[s.sweep.batch_size] * 1024) for s in _sweep()]
    low = fit_sweep(runs)[1]
    assert low.saving.fraction == pytest.approx(-0.2, abs=0.02)
    assert low.saving.interval[1] < 0
    assert "bf16 does not save memory here: 20% more per sample than fp32 (90% interval: " in low.note
    assert low.budgets == []  # no budgets given and no device memory known


def test_out_of_memory_is_does_not_fit_and_the_device_budget_is_capped_by_it():
    specs = _sweep(precisions=("fp32",), batches=(16, 32, 64, 128))
    runs = [_measured(s, 100 * MiB, MiB) for s in specs[:3]]
    runs.append(failed(specs[3], "does not fit: out of cuda memory at batch 128 (CUDA out of memory)",
                       failure=FailureKind.OUT_OF_MEMORY))
    fit = fit_sweep(runs, device_bytes=1000 * MiB)[0]
    assert [(d.batch, d.reason.split(":")[0]) for d in fit.does_not_fit] == [(128, "does not fit")]
    assert [p.batch for p in fit.points] == [16, 32, 64]
    budget = fit.budgets[0]
    assert budget.source == "device" and budget.largest_batch == 127  # the line says 900; batch 128 did not fit
    assert "did not fit on the device" in budget.note
    assert "does not fit at batch 128" in fit.note


def test_too_few_points_and_a_flat_peak_are_said_not_guessed():
    specs = _sweep(precisions=("fp32",))
    one = fit_sweep([_measured(specs[0], 100 * MiB, MiB)], budgets=[MiB * 500])[0]
    assert one.bytes_per_sample is None and one.budgets == [] and "a line needs two or more" in one.note
    flat = fit_sweep([_measured(s, 100 * MiB, 0) for s in specs], budgets=[MiB * 500])[0]
    assert flat.budgets[0].largest_batch is None and "does not grow with the batch" in flat.note


def test_device_memory_comes_from_the_fingerprint():
    env = {"cpu": {"memory_bytes": 25 * 2**30}, "gpu": {"devices": [{"memory_bytes": 80 * 2**30}]}}
    assert device_memory(env, "cpu") == 25 * 2**30 and device_memory(env, "cuda") == 80 * 2**30
    assert device_memory({"gpu": {"cuda_available": False}}, "cuda") is None and device_memory(None, "cpu") is None


SWEEP_SUITE = """\
name: memory-sweep
device: cpu
precisions: [fp32, bf16]
unaccelerated: run
memory: {batch_sizes: [32, 64, 96, 128], steps: 2}
workloads:
  - workload: digits
    train: {steps: 2}
  - workload: gpt
    params: {size: tiny}
    train: {steps: 2}
"""


def test_cpu_sweeps_of_digits_and_gpt_predict_an_unseen_batch_within_10_percent(tmp_path, write_suite):
    """Real runs: each (workload, precision) line fitted on three batch sizes predicts the
    measured peak at the fourth (96, left out of the fit) within 10%."""
    out = tmp_path / "out"
    proc = warm_cli("run", write_suite(SWEEP_SUITE), "--out", out, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rs = load(out)
    assert len(rs.runs) == 4 and len(rs.memory_runs) == 16 and not rs.memory_missing
    assert all(r.status == "completed" and "before any evaluation" in r.peak_memory.method for r in rs.memory_runs)
    seen = [r for r in rs.memory_runs if r.spec.sweep.batch_size != 96]
    unseen = {(r.spec.label, r.spec.precision): r.peak_memory.value for r in rs.memory_runs if r.spec.sweep.batch_size == 96}
    fits = fit_sweep(seen)
    assert {(f.subject.workload, f.subject.precision) for f in fits} == set(unseen)
    for fit in fits:
        measured = unseen[fit.subject.workload, fit.subject.precision]
        assert fit.bytes_per_sample > 0, fit
        assert fit.predict(96) == pytest.approx(measured, rel=0.10), fit


SHRUNK_CARD_SUITE = """\
name: shrunk-card
device: cuda
precisions: [fp32, bf16]
memory: {batch_sizes: [16, 64, 65536], device_memory: 1GiB, steps: 2}
workloads:
  - workload: gpt
    params: {size: tiny}
    train: {steps: 2}
"""


@pytest.mark.gpu
def test_a_run_that_overflows_a_shrunk_card_does_not_fit_and_the_suite_goes_on(tmp_path, write_suite):
    """A 1 GiB card emulated (set_per_process_memory_fraction): gpt tiny at batch 65536
    (about 1.4 GiB a 1k batch, measured on a CPU) runs out of it. That run is recorded as
    'does not fit', the sweep's other runs and the suite's matrix complete, and the fit
    caps the 1 GiB budget below that batch."""
    out = tmp_path / "out"
    proc = run_cli("run", write_suite(SHRUNK_CARD_SUITE), "--out", out, timeout=600)  # cold, as on a GPU host
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rs = load(out)
    assert all(r.status == "completed" for r in rs.runs)
    big = [r for r in rs.memory_runs if r.spec.sweep.batch_size == 65536]
    assert len(big) == 2 and all(r.failure == FailureKind.OUT_OF_MEMORY for r in big)
    assert all(r.reason.startswith("does not fit: out of cuda memory at batch 65536") for r in big)
    fine = [r for r in rs.memory_runs if r.spec.sweep.batch_size != 65536]
    assert all(r.status == "completed" and r.peak_memory.value < 2**30 for r in fine)
    assert all("after the first" in r.peak_memory.method for r in fine)
    for fit in fit_sweep(rs.memory_runs, device_bytes=2**30):
        assert [d.batch for d in fit.does_not_fit] == [65536]
        assert fit.budgets[0].largest_batch is not None and fit.budgets[0].largest_batch < 65536
    # each precision's line tried at its largest batch within the 1 GiB card, limited to it: an
    # answer either way (it fits, or it ran out of the card), never a crash
    for fit in json.loads((out / "report.json").read_text())["memory"]:
        [budget] = fit["budgets"]
        found = budget["confirmation"]
        assert found["batch"] == budget["largest_batch"] and found["fits"] is not None, found
        print(fit["subject"]["precision"], found["note"])  # the figures for the note (pytest -s)


def test_shrinking_a_cpu_is_refused_in_one_line(tmp_path, write_suite):
    proc = warm_cli("run", write_suite(SHRUNK_CARD_SUITE.replace("device: cuda", "device: cpu")), "--out",
                    tmp_path / "out", "--dry-run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "`memory.device_memory` shrinks a CUDA device" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_smaller_card_for_a_jax_sweep_is_refused_when_planned():
    """JAX has no per-process memory limit: an emulated card would silently be the whole card."""
    from ampcert.errors import UserError
    from ampcert.spec import expand, parse_suite

    suite = {"name": "jax-card", "backend": "jax", "amp": "ampcert", "device": "cuda", "precisions": ["bf16"],
             "memory": {"batch_sizes": [16, 32, 64], "device_memory": "1GiB"}, "workloads": [{"workload": "resnet"}]}
    with pytest.raises(UserError, match=r"^`memory.device_memory` emulates a smaller card .* leave it out of a JAX"):
        expand(parse_suite(suite), "cuda")


def test_a_sweep_batch_is_never_silently_smaller_than_asked():
    from ampcert.backends.contract import Unsupported
    from ampcert.backends.loop import sweep_batch

    spec = _sweep(batches=(16, 32, 4096))[2]
    assert sweep_batch(spec.model_copy(update={"sweep": SweepPoint(batch_size=32)}), n_train=1438) == 32
    with pytest.raises(Unsupported, match="batch 4096 is more than the 1438 training examples"):
        sweep_batch(spec, n_train=1438)
    with pytest.raises(Unsupported, match="streams its training batches"):
        sweep_batch(spec, n_train=None)


# --------------------------------------------------------------------------- ampcert plan: the fitting question


def _swept_folder(tmp_path):
    """A folder with the matrix (one fp32 and one bf16 run) and a sweep whose lines are known:
    fp32 200 MiB + 1 MiB a sample, bf16 200 MiB + 0.5 MiB a sample."""
    from factories import write_results

    specs = plan({"name": "t", "precisions": ["fp32", "bf16"], "train": {"steps": 20},
                  "memory": {"batch_sizes": [16, 32, 64], "budgets": ["1GiB"]}, "workloads": [{"workload": "digits"}]})
    runs = [completed(s, final_metric=0.9) for s in specs if not s.is_memory_sweep]
    runs += [_measured(s, 200 * MiB, (1 if s.precision == "fp32" else 0.5) * MiB) for s in specs if s.is_memory_sweep]
    return write_results(tmp_path / "out", runs)


def test_plan_says_how_many_devices_each_precision_needs_for_a_global_batch(tmp_path, cli_here):
    from ampcert.capacity_planning import capacity_plan
    from ampcert.results import load

    rs = load(_swept_folder(tmp_path))
    fits = fit_sweep(rs.memory_runs, budgets=[1024 * MiB])
    cp = capacity_plan(rs.runs, 10**6, global_batch=4096, memory_fits=fits, device_memory=1024 * MiB)
    rows = {r.precision: r for r in cp.rows}
    # (1024 - 200) MiB: 824 samples of fp32 and 1648 of bf16 per device; 4096 samples need 5 and 3 devices
    assert (rows["fp32"].max_batch_per_device, rows["fp32"].devices_for_global_batch) == (824, 5)
    assert (rows["bf16"].max_batch_per_device, rows["bf16"].devices_for_global_batch) == (1648, 3)
    assert cp.global_batch == 4096 and any(a.startswith("fitting: data parallel") for a in cp.assumptions)
    small = capacity_plan(rs.runs, 10**6, global_batch=4096, memory_fits=fits, device_memory=100 * MiB)
    assert all(r.devices_for_global_batch is None and "not even batch 1" in r.fit_reason for r in small.rows)
    # Without a global batch, the plan's bytes are what they were: no fitting fields at all.
    assert "devices_for_global_batch" not in capacity_plan(rs.runs, 10**6).model_dump_json()
    # The console shows the answer (this folder has no suite.yaml, whose budgets would be the default).
    proc = cli_here("plan", tmp_path / "out", "--target-samples", "1000000", "--global-batch", "4096",
                    "--device-memory", "1GiB")
    assert proc.returncode == 0, proc.stderr
    assert "5 (824/device in 1 GiB)" in proc.stdout and "3 (1,648/device" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--global-batch", "4096", "--device-memory", "lots"], "--device-memory: expected a size such as 80GiB"),
    (["--global-batch", "0"], "--global-batch: expected a positive batch, got 0"),
])
def test_plan_bad_fitting_input_is_one_line_exit_2(tmp_path, cli_here, args, message):
    proc = cli_here("plan", _swept_folder(tmp_path), "--target-samples", "1000", *args)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_plan_of_a_folder_without_a_sweep_refuses_a_global_batch(tmp_path, cli_here):
    from factories import write_results

    specs = plan({"name": "t", "precisions": ["fp32"], "train": {"steps": 20}, "workloads": [{"workload": "digits"}]})
    folder = write_results(tmp_path / "out", [completed(s, final_metric=0.9) for s in specs])
    proc = cli_here("plan", folder, "--target-samples", "1000", "--global-batch", "64")
    assert proc.returncode == 2 and "no memory sweep to fit a global batch with" in proc.stderr


# --------------------------------------------------------------------------- the memory.saving rule


def _swept_runs(device, bf16_per_sample_mib, wobble_mib=0.0):
    specs = plan({"name": "t", "device": device, "precisions": ["fp32", "bf16"], "train": {"steps": 20},
                  "memory": {"batch_sizes": [16, 32, 64]}, "workloads": [{"workload": "digits"}]}, device=device)
    runs = [completed(s, final_metric=0.9) for s in specs if not s.is_memory_sweep]
    sweep = [_measured(s, 200 * MiB, (1 if s.precision == "fp32" else bf16_per_sample_mib) * MiB,
                       {16: 1, 32: -2, 64: 1}[s.sweep.batch_size] * wobble_mib * MiB) for s in specs if s.is_memory_sweep]
    return runs, sweep


@pytest.mark.parametrize("bf16_mib, wobble, status", [(0.5, 0.0, "PASS"), (0.9, 0.0, "FAIL"), (0.68, 2.0, "INCONCLUSIVE")])
def test_memory_saving_is_judged_on_cuda_from_the_sweep(bf16_mib, wobble, status):
    from ampcert.certify import evaluate, load_rules

    runs, sweep = _swept_runs("cuda", bf16_mib, wobble)
    cert = evaluate(runs, load_rules("procurement"), sweep)
    [verdict] = [v for v in cert.verdicts if v.rule == "memory.saving"]
    assert str(verdict.subject) == "digits/torch/native/bf16" and verdict.required
    assert verdict.status == status, verdict.summary
    assert verdict.evidence["limit"] == 0.3 and verdict.evidence["saving"] == pytest.approx(1 - bf16_mib, abs=0.05)
    # without the sweep: no verdict (the rule judges what was swept)
    assert not [v for v in evaluate(runs, load_rules("procurement")).verdicts if v.rule == "memory.saving"]


def test_memory_saving_does_not_apply_on_a_cpu():
    from ampcert.certify import evaluate, load_rules

    runs, sweep = _swept_runs("cpu", 1.2)  # bf16 costs memory on a CPU: not a verdict of this rule there
    assert not [v for v in evaluate(runs, load_rules("procurement"), sweep).verdicts if v.rule == "memory.saving"]
    assert all(r.check != "memory_saving" for r in load_rules("default").rules)


def test_a_jax_sweep_reads_its_peak_before_the_evaluation(tmp_path, write_suite):
    pytest.importorskip("jax")
    suite = write_suite("""\
        name: jax-sweep
        backend: jax
        amp: ampcert
        device: cpu
        precisions: [fp32]
        memory: {batch_sizes: [8, 16, 32], steps: 2}
        workloads:
          - workload: gpt   # each run is a JIT compile: the smallest that has a line to fit
            params: {size: tiny, max_bytes: 100000, eval_windows: 8}
            train: {steps: 2}
        """)
    proc = warm_cli("run", suite, "--out", tmp_path / "out", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rs = load(tmp_path / "out")
    assert sorted(r.spec.sweep.batch_size for r in rs.memory_runs) == [8, 16, 32]
    assert all(r.status == "completed" and r.spec.backend == "jax" for r in rs.memory_runs)
    assert all("before any evaluation" in r.peak_memory.method for r in rs.memory_runs)
    [fit] = fit_sweep(rs.memory_runs)
    assert str(fit.subject) == "gpt/jax/ampcert/fp32" and len(fit.points) == 3
    assert "memory:" in proc.stdout and "per sample" in proc.stdout  # the fit printed after the run


def test_jax_out_of_memory_is_does_not_fit_and_other_errors_stay_errors(monkeypatch):
    """XLA's own allocation failure (a real one: 16 TiB, refused on any machine) ends a JAX
    sweep run as "does not fit", as torch's OutOfMemoryError does; the worker records it as
    out_of_memory. Any other error is still the error it was."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from ampcert.backends import jax_backend
    from ampcert.backends.contract import DoesNotFit

    try:
        jnp.zeros((2**42,), jnp.float32).block_until_ready()
        pytest.fail("XLA allocated 16 TiB")
    except jax.errors.JaxRuntimeError as exc:
        oom = exc
    [spec] = [s for s in plan({"name": "t", "backend": "jax", "amp": "ampcert", "precisions": ["bf16"], "train": {"steps": 20},
                               "memory": {"batch_sizes": [16, 32, 64]}, "workloads": [{"workload": "resnet"}]})
              if s.sweep.batch_size == 32]

    def raising(error):
        def _train(*args):
            raise error
        return _train

    monkeypatch.setattr(jax_backend.training_loop, "train", raising(oom))
    with pytest.raises(DoesNotFit, match=r"^does not fit: out of cpu memory at batch 32 \(RESOURCE_EXHAUSTED: Out of memory"):
        jax_backend.train(spec, log=None)
    monkeypatch.setattr(jax_backend.training_loop, "train", raising(RuntimeError("RESOURCE_EXHAUSTED: not XLA's")))
    with pytest.raises(RuntimeError) as caught:
        jax_backend.train(spec, log=None)
    assert not isinstance(caught.value, DoesNotFit)


def test_a_sweep_batch_larger_than_the_training_set_is_refused_when_planned(tmp_path, write_suite, cli_here):
    suite = write_suite("""\
        name: too-big
        device: cpu
        precisions: [fp32]
        memory: {batch_sizes: [16, 32, 4096]}
        workloads:
          - workload: digits
            train: {steps: 2}
        """)
    proc = cli_here("run", suite, "--out", tmp_path / "out", "--dry-run")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"{suite}: memory: workload 'digits': memory sweep batch 4096 is more than the 1438 training examples" \
        in proc.stderr
    assert not (tmp_path / "out").exists()


def test_nvmls_view_is_kept_beside_each_point_where_it_was_sampled():
    specs = _sweep(precisions=("fp32",))
    runs = [_measured(s, 100 * MiB, MiB).model_copy(update={"telemetry": {"peak_memory": {
        "gpu0.mem_used_bytes": {"value": 700.0 * MiB + s.sweep.batch_size * MiB, "unit": "bytes", "method": "nvml"},
        "host.rss_bytes": {"value": 5e9, "unit": "bytes", "method": "rss"}}}}) for s in specs]
    fit = fit_sweep(runs)[0]
    assert [p.device_used_bytes for p in fit.points] == [(700 + b) * MiB for b in (16, 32, 64)]
    plain = fit_sweep([_measured(s, 100 * MiB, MiB) for s in specs])[0]
    assert all(p.device_used_bytes is None for p in plain.points)
    assert "device_used_bytes" not in plain.model_dump_json()  # absent, not null, without NVML


# --------------------------------------------------------------------------- the confirming run


def _sweep_folder(tmp_path, device: str, memory: dict, measured, extra=()):
    """A results folder holding ``measured`` (the sweep, listed in plan.json, planned on
    ``device`` with 16 GiB of host memory and an 80 GiB GPU), its suite.yaml's ``memory:``,
    and ``extra`` results that no plan lists (confirming runs'); read back as a reader does."""
    import yaml
    from factories import write_results

    from ampcert.memory import stored_sweep
    from ampcert.results import ResultsDir, atomic_write_json

    root = write_results(tmp_path / f"{device}-folder", measured)
    rd = ResultsDir(root)
    stored = json.loads(rd.plan_file.read_text()) | {
        "device": device, "environment": {"cpu": {"memory_bytes": 16 * 2**30},
                                          "gpu": {"devices": [{"memory_bytes": 80 * 2**30}]}}}
    atomic_write_json(rd.plan_file, stored)
    rd.suite_file.write_text(yaml.safe_dump({"name": "t", "memory": memory}))
    for result in extra:
        atomic_write_json(rd.result_file(result.run_id), result)
    return load(root), rd.read_plan(), stored_sweep(rd)


def _lines(device: str):
    """fp32 200 MiB + 1 MiB a sample, bf16 200 MiB + 0.5 MiB a sample, at 16, 32 and 64."""
    specs = plan({"name": "t", "device": device, "precisions": ["fp32", "bf16"], "train": {"steps": 20},
                  "memory": {"batch_sizes": [16, 32, 64]}, "workloads": [{"workload": "digits"}]}, device=device)
    return [_measured(s, 200 * MiB, (1 if s.precision == "fp32" else 0.5) * MiB) for s in specs if s.is_memory_sweep]


def test_the_confirming_run_tries_the_smallest_budget_the_device_holds_and_is_read_back(tmp_path):
    from ampcert.memory import confirming_runs, folder_fits

    memory = {"batch_sizes": [16, 32, 64], "budgets": ["1GiB", "512MiB", "64GiB"]}  # 64 GiB: more than this host
    rs, stored, doc = _sweep_folder(tmp_path, "cpu", memory, _lines("cpu"))
    specs = confirming_runs(rs, stored, doc)
    # (512 - 200) MiB at 1 MiB a sample (fp32) and at 0.5 MiB (bf16); not limited on a CPU
    assert [(s.precision, s.sweep.batch_size, s.sweep.confirms_budget, s.sweep.device_memory_limit) for s in specs] == [
        ("fp32", 312, 512 * MiB, None), ("bf16", 624, 512 * MiB, None)]
    assert all(s.run_id.startswith(f"digits-{s.precision}-native-s0-b{s.sweep.batch_size}c-") for s in specs)
    assert [s.run_id for s in confirming_runs(rs, stored, doc)] == [s.run_id for s in specs]  # derived, stable
    fp32, bf16 = specs
    ran = [completed(fp32, final_metric=0.5, peak_memory=(200 + 312 - 4) * MiB),
           failed(bf16, "does not fit: out of cuda memory at batch 624", failure=FailureKind.OUT_OF_MEMORY)]
    rs, stored, doc = _sweep_folder(tmp_path / "ran", "cpu", memory, _lines("cpu"), extra=ran)
    fits = folder_fits(rs, stored, doc)
    confirmed = {(str(f.subject), b.budget_bytes): b.confirmation for f in fits for b in f.budgets}
    held = confirmed["digits/torch/native/fp32", 512 * MiB]
    assert (held.batch, held.fits, held.peak_bytes) == (312, True, 508 * MiB)
    assert held.error == pytest.approx(-4 / 512)
    assert held.note == "tried at batch 312: peak 508.0 MiB, -0.8% from the line's 512.0 MiB, within the budget"
    refused = confirmed["digits/torch/native/bf16", 512 * MiB]
    assert (refused.fits, refused.peak_bytes) == (False, None) and "did not fit at batch 624" in refused.note
    assert confirmed["digits/torch/native/fp32", 2**30] is None  # one confirming run per subject


def test_a_cpus_own_memory_is_not_confirmed_a_cuda_device_is_and_confirm_false_leaves_the_fit_alone(tmp_path):
    from ampcert.memory import confirming_runs

    cpu = _sweep_folder(tmp_path, "cpu", {"batch_sizes": [16, 32, 64]}, _lines("cpu"))
    assert confirming_runs(*cpu) == []  # the host's memory, shared with everything on it
    cuda = _sweep_folder(tmp_path, "cuda", {"batch_sizes": [16, 32, 64]}, _lines("cuda"))
    # the device's own 80 GiB: the card itself is the limit
    assert [(s.sweep.batch_size, s.sweep.confirms_budget, s.sweep.device_memory_limit) for s in confirming_runs(*cuda)] == [
        ((80 * 1024 - 200), 80 * 2**30, None), ((80 * 1024 - 200) * 2, 80 * 2**30, None)]
    # a suite's 24 GiB on it: a smaller card, emulated (set_per_process_memory_fraction in the worker)
    card = _sweep_folder(tmp_path / "card", "cuda", {"batch_sizes": [16, 32, 64], "budgets": ["24GiB"]}, _lines("cuda"))
    assert [(s.sweep.batch_size, s.sweep.device_memory_limit) for s in confirming_runs(*card)] == [
        ((24 * 1024 - 200), 24 * 2**30), ((24 * 1024 - 200) * 2, 24 * 2**30)]
    off = _sweep_folder(tmp_path / "off", "cuda", {"batch_sizes": [16, 32, 64], "confirm": False}, _lines("cuda"))
    assert confirming_runs(*off) == []


CONFIRM_SUITE = """\
name: memory-confirm
device: cpu
precisions: [fp32]
memory: {batch_sizes: [8, 16, 32], budgets: [400MiB], steps: 2}
workloads:
  - workload: gpt
    params: {size: tiny}
    train: {steps: 2}
"""


def test_a_cpu_sweep_is_confirmed_at_its_fitted_batch_after_the_sweep_and_once(tmp_path, write_suite):
    """Real runs: after the sweep, one run at the batch the line puts within 400 MiB (gpt tiny's
    fixed bytes are about 320 MiB here: about 2.5x the largest batch swept); its peak within 10%
    of the line's, in the report and the printed table; `--resume` runs nothing again."""
    out = tmp_path / "out"
    proc = warm_cli("run", write_suite(CONFIRM_SUITE), "--out", out, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "memory: confirming the fit's largest batch within 400.0 MiB: gpt-fp32-native-s0-b" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    [fit] = report["memory"]
    [budget] = fit["budgets"]
    found = budget["confirmation"]
    assert found["batch"] == budget["largest_batch"] > 32 and found["fits"] is not None, found
    assert abs(found["error"]) < 0.1, found  # the line holds where it was not measured
    assert "400.0 MiB: tried at batch" in " ".join(proc.stdout.split())  # the table's footnote, wrapped
    files = {p: p.read_bytes() for p in (out / "runs").rglob("result.json")}
    again = warm_cli("run", "--resume", out)
    assert again.returncode == 0 and "confirming" not in again.stdout, again.stdout + again.stderr
    assert {p: p.read_bytes() for p in (out / "runs").rglob("result.json")} == files


def test_a_stored_sweep_edited_after_the_run_is_one_clear_error_not_the_devices_memory(tmp_path):
    """suite.yaml's `memory:` was valid when the suite ran; edited since into something that
    does not parse, its budgets are not replaced by the device's memory without a word."""
    from ampcert.errors import UserError

    with pytest.raises(UserError, match=r"suite\.yaml: memory\.budgets\.0: .*edited after the run"):
        _sweep_folder(tmp_path, "cpu", {"batch_sizes": [16, 32, 64], "budgets": ["a lot"]}, _lines("cpu"))
    with pytest.raises(UserError, match=r"suite\.yaml: memory: "):
        _sweep_folder(tmp_path / "list", "cpu", ["not", "a", "mapping"], _lines("cpu"))
    # suite.yaml gone, or no longer YAML: the same, never the device's memory instead
    rs, stored, sweep = _sweep_folder(tmp_path / "gone", "cpu", {"batch_sizes": [16, 32, 64]}, _lines("cpu"))
    from ampcert.memory import stored_sweep
    from ampcert.results import ResultsDir

    rd = ResultsDir(rs.root)
    rd.suite_file.write_text("memory: [unclosed")
    with pytest.raises(UserError, match=r"suite\.yaml: malformed YAML at line 1"):
        stored_sweep(rd)
    rd.suite_file.write_text("- a list, not a suite\n")
    with pytest.raises(UserError, match=r"suite\.yaml: expected a mapping of suite settings"):
        stored_sweep(rd)
