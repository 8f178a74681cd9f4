"""The GPU evidence command, run as CI can: `--quick --device cpu` (issue 51). Every step it
takes on a GPU machine runs here too, small, so the script cannot rot before a GPU comes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_evidence.py"


@pytest.mark.slow
def test_the_quick_cpu_run_measures_every_step_and_writes_the_page(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--device", "cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ev = json.loads((tmp_path / "evidence.json").read_text())
    steps = {name: s["status"] for name, s in ev["steps"].items()}
    assert steps == {"suite: precisions": "ok", "suite: memory": "ok", "dispatch": "ok", "gpt step bf16": "ok", "gpt step fp16": "ok",
                     "gpt step compiled": "ok", "audit": "ok", "gpu tests": "not run"}, ev["steps"]
    assert ev["machine"]["device"] == "cpu" and ev["machine"]["torch"] and "cpu_flags" in ev["machine"]
    assert ev["matmul"]["fp32"]["tflops"] > 0 and ev["matmul"]["bf16"]["tflops"] > 0
    runs = {(r["workload"], r["precision"]): r for r in ev["suites"]["runs"]}
    assert set(runs) == {(w, p) for w in ("resnet", "gpt") for p in ("fp32", "bf16")}
    for r in runs.values():
        assert r["status"] == "completed" and r["samples_per_s"] > 0 and r["peak_memory_bytes"] > 0, r
        assert r["speedup_vs_fp32"] > 0
    assert runs[("gpt", "fp32")]["speedup_vs_fp32"] == 1.0
    fits = {(f["workload"], f["precision"]) for f in ev["suites"]["memory_fits"] if f["bytes_per_sample"] is not None}
    assert fits == set(runs)
    amp = ev["amp_vs_native"]
    assert set(amp) >= {"per-op dispatch, ampcert / native", "GPT step eager bf16", "GPT step eager fp16 (scaler included)"}
    assert all(v is not None for v in amp["GPT step eager bf16"].values()), amp
    assert all(v is not None for v in amp["GPT step compiled (aot_eager) bf16"].values()), amp
    assert ev["checks"]["audit"].split()[0] == f"{len(ev['audit_rows'])}/{len(ev['audit_rows'])}"
    page = (tmp_path / "evidence.md").read_text()
    for heading in ("## Matmul rate per precision", "## Workloads per precision", "## ampcert's AMP against native",
                    "## Checks", "## Steps"):
        assert heading in page
    assert "| gpt | bf16 | completed |" in page
