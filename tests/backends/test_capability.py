"""A measured speed-up is believed on a CPU only where it has the 16-bit instructions."""

from __future__ import annotations

import pytest

from ampcert.backends import capability


@pytest.mark.parametrize(("flags", "precision", "missing"), [
    ({"avx2": True, "avx512_bf16": False, "amx_bf16": False, "avx512_fp16": False, "amx_fp16": False},
     "fp16", ["avx512_fp16", "amx_fp16"]),
    ({"avx2": True, "avx512_bf16": True, "amx_bf16": False, "avx512_fp16": False, "amx_fp16": False},
     "bf16", None),
    ({"avx2": True, "avx512_bf16": False, "amx_bf16": False, "avx512_fp16": False, "amx_fp16": False},
     "bf16", ["avx512_bf16", "amx_bf16"]),
    ("unknown", "fp16", None),  # flags unreadable (not Linux): the timing decides
])
def test_missing_cpu_units(monkeypatch, flags, precision, missing):
    monkeypatch.setattr("ampcert.envinfo.cpu_info", lambda: {"flags": flags})
    assert capability._missing_cpu_units(precision) == missing


def test_a_fast_reading_without_the_instructions_is_not_believed(monkeypatch):
    monkeypatch.setattr("ampcert.envinfo.cpu_info", lambda: {"flags": {"avx2": True}})
    times = {"float32": 1.0, "float16": 0.8}  # fp16 "1.25x fp32": what a noisy small matmul once read
    monkeypatch.setattr(capability, "_time_matmul_jax", lambda dtype, device, n, reps: times[dtype])
    caps = capability.probe("cpu", ["fp32", "fp16"], backend="jax")
    assert caps["fp16"]["accelerated"] is False
    assert caps["fp16"]["speedup_vs_fp32"] == 1.25
    assert "none of ['avx512_fp16', 'amx_fp16']" in caps["fp16"]["note"]
