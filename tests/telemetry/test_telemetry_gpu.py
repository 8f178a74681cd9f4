"""Real NVML on a real GPU (`nox -s gpu`; skipped without CUDA by tests/conftest.py)."""

from __future__ import annotations

import time

import pytest

from ampcert.telemetry import Telemetry, ensure_pci_bus_order, torch_cuda_gpu_ref, torch_cuda_memory


@pytest.mark.gpu
def test_real_nvml_counter_and_integrated_energy_agree_under_steady_load():
    ensure_pci_bus_order()
    import torch

    a = torch.randn(8192, 8192, device="cuda")
    tel = Telemetry.start("cuda", 20.0, gpus=[torch_cuda_gpu_ref()], framework_memory=torch_cuda_memory)
    torch.cuda.synchronize()
    tel.phase("train")
    # Several seconds of steady matmuls: long against the ~1 s power average.
    end = time.perf_counter() + 5.0
    n = 0
    while time.perf_counter() < end:
        for _ in range(8):
            b = a @ a
        torch.cuda.synchronize()
        n += 8
    tel.phase("eval")
    time.sleep(0.5)
    s = tel.stop(train_samples=n)
    del b
    assert s["gpu"]["available"], s["gpu"]
    gpu = s["sources"]["gpu0"]
    assert gpu["power_method"] and gpu["uuid"].startswith(("GPU-", "MIG-"))
    assert gpu["peak_w"]["train"] > 0 and gpu["stats"]["mem_used_bytes"]["max"] > 8192 * 8192 * 4
    assert s["peak_memory"]["torch.cuda.max_memory_allocated"]["value"] >= 2 * 8192 * 8192 * 4
    assert s["energy"]["train_j"] > 0 and s["energy"]["train_j_per_sample"] > 0
    assert s["sampling"]["achieved_hz"] > 10
    if gpu["energy_method"].startswith("counter"):
        # The counter and the integrated power over the same phases.
        diff = abs(gpu["cross_check"]["relative_difference"])
        limit = 0.05 if "INSTANT" in gpu["power_method"] else 0.15
        assert diff < limit, gpu["cross_check"]
