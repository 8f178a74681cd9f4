"""One name, one value: a results folder's figures read the same in every view.

One folder (digits in fp32 and bf16, three seeds, no target) goes through the
run summary (summary.json), report.json, ``compare`` (the folder against
itself), the history store and its gate, and the capacity plan. Each figure
the views share (samples_per_s, step_samples_per_s, final_metric,
peak_memory_bytes, energy_j_per_sample) must have the value the aggregate
table gives it: the median over the seeds (docs/reports.md), and a suite
without a target must show no time to target anywhere.
"""

from __future__ import annotations

import json

import pytest
from factories import completed, plan, write_results

from ampcert import formats, session
from ampcert.aggregate import FIGURES, aggregate, run_value
from ampcert.results import load

SPECS = plan({"name": "figures", "precisions": ["fp32", "bf16"], "seeds": [0, 1, 2],
              "train": {"steps": 60, "eval_every": 30}, "workloads": [{"workload": "digits"}]})
SHARED = ["samples_per_s", "step_samples_per_s", "final_metric", "peak_memory_bytes", "energy_j_per_sample"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    runs = []
    for i, spec in enumerate(SPECS):
        # uneven seeds: a mean and a median differ, so a view that averages is caught
        speed = {0: 10_000.0, 1: 11_000.0, 2: 16_000.0}[spec.seed] * (1.4 if spec.precision == "bf16" else 1.0)
        run = completed(
            spec, final_metric=0.80 + 0.05 * spec.seed ** 2, samples_per_s=speed, peak_memory=(300 + 40 * i) * 2**20,
            telemetry={"energy": {"scope": "host", "method": "synthetic", "train_j_per_sample": 0.5 + 0.3 * i}})
        # the whole run is slower than its steady steps (data loading, the first steps)
        runs.append(run.model_copy(update={"samples_per_s": 0.8 * speed}))
    root = write_results(tmp_path_factory.mktemp("figures") / "night", runs, suite="figures")
    data = json.loads((root / "plan.json").read_text())
    data |= {"created_at": "2026-11-01T00:00:00+00:00",
             "environment": {"hostname": "runner", "cpu": {"model": "Test CPU"}}}
    (root / "plan.json").write_text(json.dumps(data))
    session.report(root)
    return root


def test_each_shared_figure_has_one_value_in_every_view(folder, tmp_path):
    rs = load(folder)
    table = {str(row.key): row for row in aggregate(rs.runs)}
    # the table's figure is the median over the seeds, not the mean
    fp32 = table["digits/torch/native/fp32"]
    assert fp32.samples_per_s == pytest.approx(8_800.0) and fp32.final_metric == pytest.approx(0.85)
    summary = {f"{g['workload']}/{g['backend']}/{g['amp']}/{g['precision']}": g
               for g in json.loads((folder / "summary.json").read_text())["groups"]}
    report = {f"{r['workload']}/{r['backend']}/{r['amp']}/{r['precision']}": r
              for r in json.loads((folder / "report.json").read_text())["table"]}
    gate = session.compare(folder, folder)
    compared = {(str(c.subject), c.metric): c for c in gate.comparisons}
    store = str(tmp_path / "history.sqlite")
    session.history_add([folder], store=store)
    history = {(r.subject, r.metric): r for r in session.gate_history(folder, store=store).rows}
    capacity = {str(r.key): r for r in session.capacity(folder, 10**6).plan.rows}
    bf16 = table["digits/torch/native/bf16"]
    assert bf16.paired_speedup_vs_fp32 == pytest.approx(1.4, rel=0.05)  # each seed's pair, run side by side
    assert history[("digits/torch/native/bf16", "paired_speedup_vs_fp32")].value == \
        pytest.approx(bf16.paired_speedup_vs_fp32)
    assert report["digits/torch/native/bf16"]["paired_speedup_vs_fp32"] == pytest.approx(bf16.paired_speedup_vs_fp32)
    for subject, row in table.items():
        for name in SHARED:
            want = getattr(row, name)
            assert want is not None, (subject, name)
            assert summary[subject][name] == pytest.approx(want), ("summary.json", subject, name)
            assert report[subject][name] == pytest.approx(want), ("report.json", subject, name)
            assert compared[(subject, name)].baseline.value == pytest.approx(want), ("compare", subject, name)
            assert history[(subject, name)].value == pytest.approx(want), ("history gate", subject, name)
        assert capacity[subject].samples_per_s == pytest.approx(row.samples_per_s)
        assert capacity[subject].energy_j_per_sample == pytest.approx(row.energy_j_per_sample)
    # the whole-run and the steady-state throughput are two figures with two names
    assert set(FIGURES) >= {"samples_per_s", "step_samples_per_s"}
    assert run_value(rs.runs[0], "step_samples_per_s") != run_value(rs.runs[0], "samples_per_s")


def test_no_target_means_no_time_to_target_anywhere(folder, tmp_path):
    rs = load(folder)
    assert all(r.spec.target is None and r.time_to_target_s is None for r in rs.runs)
    assert all(g["time_to_target_s"] is None for g in json.loads((folder / "summary.json").read_text())["groups"])
    assert all(r["time_to_target_s"] is None for r in json.loads((folder / "report.json").read_text())["table"])
    assert not [c for c in session.compare(folder, folder).comparisons if c.metric == "time_to_target_s"]
    store = str(tmp_path / "history.sqlite")
    session.history_add([folder], store=store)
    assert not [r for r in session.gate_history(folder, store=store).rows if r.metric == "time_to_target_s"]


def test_one_format_for_a_figure():
    assert formats.figure("samples_per_s", 15_620.4) == "15,620"  # never 1.562e+04
    assert formats.figure("peak_memory_bytes", 299 * 2**20) == "299.0 MiB"
    assert formats.figure("time_to_target_s", 0.09564) == "0.0956 s"
    assert formats.figure("energy_j_per_sample", 0.0123) == "0.0123 J"
    assert formats.figure("final_metric", None) == "—"
    assert formats.change(-0.0312) == "-3.1%" and formats.percent(0.47) == "+47%"
    # a memory budget reads as the suite wrote it, in the console, both reports and ampcert plan
    assert formats.budget(2**30) == "1 GiB" and formats.budget(80 * 10**9) == "80 GB"
    assert formats.budget(141 * 2**30) == "141 GiB" and formats.budget(1000 * 2**20) == "1,000.0 MiB"
