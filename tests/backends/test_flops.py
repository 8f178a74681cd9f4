"""FLOPs per step, the peak MFU is measured against, and the datasheet table."""

from __future__ import annotations

import pytest
import torch

from ampcert.backends.capability import datasheet_peaks, probe
from ampcert.backends.torch_backend import count_train_flops
from ampcert.workloads.base import TorchTask


def test_flop_count_of_a_linear_step_matches_hand_computation():
    batch, fan_in, fan_out = 32, 64, 10
    model = torch.nn.Linear(fan_in, fan_out)
    before = [p.detach().clone() for p in model.parameters()]
    task = TorchTask(model=model, train_x=torch.randn(100, fan_in), train_y=torch.randint(0, fan_out, (100,)),
                     eval_x=torch.randn(4, fan_in), eval_y=torch.zeros(4, dtype=torch.int64), batch_size=batch,
                     loss_fn=torch.nn.functional.cross_entropy, make_optimizer=torch.optim.SGD,
                     evaluate=lambda m, x, y: 0.0)
    # forward matmul + grad wrt weight, 2 FLOPs per multiply-add each; the data
    # needs no gradient, so autograd computes none for it (and counts none)
    assert count_train_flops(task) == 2 * 2 * batch * fan_in * fan_out
    assert all(p.grad is None for p in model.parameters())  # counted on a copy
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("name, expected, tflops", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ("NVIDIA H200", "H200 SXM", 989.4),
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA A10", "A10", 125.0),
    ("NVIDIA L40S", "L40S", 362.05),
    ("NVIDIA L4", "L4", 121.0),
])
def test_datasheet_lookup_picks_the_right_entry(name, expected, tflops):
    peaks, source = datasheet_peaks(name)
    assert f"({expected})" in source and peaks["bf16"] == pytest.approx(tflops * 1e12)


def test_unknown_gpu_has_no_datasheet_entry():
    assert datasheet_peaks("Some Future GPU 9000") is None


def test_cpu_peak_is_measured_and_says_so():
    caps = probe("cpu", ["fp32", "bf16"])
    assert caps["fp32"]["peak_source"].startswith("measured: 512x512 fp32 matmul")
    bf16 = caps["bf16"]
    assert bf16["peak_flops"] > 0
    if bf16["accelerated"]:
        assert bf16["peak_source"].startswith("measured: 512x512 bf16 matmul")
    else:  # emulated: measured against the fp32 units it runs on
        assert bf16["peak_flops"] == caps["fp32"]["peak_flops"]
        assert "bf16 has no native units here" in bf16["peak_source"]
