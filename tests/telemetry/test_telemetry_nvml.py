"""The NVML layer against fake_pynvml (a FAKE pynvml: the real module's
function names, ctypes return types and NVMLError codes, no GPU needed)."""

from __future__ import annotations

import json
import time

import fake_pynvml
import pytest
from fake_pynvml import FakeGPU

from ampcert.telemetry import NvmlSession, Telemetry
from ampcert.telemetry import nvml as nv

UUIDS = ["GPU-aaaa1111-0000-0000-0000-000000000000",
         "GPU-bbbb2222-0000-0000-0000-000000000000",
         "GPU-bbbb3333-0000-0000-0000-000000000000"]


def three(**kw) -> list[FakeGPU]:
    return [FakeGPU(u, **kw) for u in UUIDS]


@pytest.fixture
def nvml():
    mod = fake_pynvml.make(three())
    mod.nvmlInit()
    yield mod
    mod.nvmlShutdown()


@pytest.mark.parametrize("value, indices", [
    (None, [0, 1, 2]),
    ("2,0", [2, 0]),
    (" 1 , 2 ", [1, 2]),
    ("1,foo,0", [1]),              # parsing stops at the first invalid entry
    ("1,7,0", [1]),                # ... and at an index NVML does not have
    ("1gpu,2", [1, 2]),            # strtoul: a leading number counts
    ("0,0", []),                   # a repeated device hides every device
    ("", []),
    ("-1", []),
    ("GPU-aaaa", [0]),             # unique UUID prefix
    ("GPU-bbbb3,GPU-aaaa", [2, 0]),
    ("GPU-bbbb,GPU-aaaa", []),     # ambiguous prefix stops parsing
    ("GPU-aaaa,1", [0]),           # a UUID list ends at the first non-UUID entry
])
def test_cuda_visible_devices_as_cuda_reads_it(nvml, value, indices):
    got, how = nv.parse_visible_devices(nvml, value)
    assert got == indices
    assert ("unset" in how) if value is None else ("CUDA_VISIBLE_DEVICES=" in how)


def test_ordinals_and_uuids_resolve_to_the_right_device(nvml):
    env = {"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    first = nv.resolve(nvml, 0, env)
    assert (first.index, first.uuid, first.reason) == (2, UUIDS[2], None)
    assert "CUDA ordinal 0" in first.mapping and "NVML indices [2, 0]" in first.mapping
    assert nv.resolve(nvml, 1, env).index == 0
    gone = nv.resolve(nvml, 2, env)
    assert gone.handle is None and "CUDA ordinal 2 is not visible" in gone.reason
    # Without PCI_BUS_ID the mapping says the ordinal may not match.
    assert "may disagree" in nv.resolve(nvml, 0, {"CUDA_VISIBLE_DEVICES": "2,0"}).mapping
    # torch reports UUIDs without the GPU- prefix; both forms resolve.
    assert nv.resolve(nvml, UUIDS[1][4:]).index == 1
    assert nv.resolve(nvml, UUIDS[1]).index == 1
    missing = nv.resolve(nvml, "GPU-ffff")
    assert "no NVML device with UUID" in missing.reason and "Not Found (NVML error 6)" in missing.reason


def test_ensure_pci_bus_order_sets_it_but_keeps_a_user_choice():
    env: dict[str, str] = {}
    assert nv.ensure_pci_bus_order(env) is None and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    env = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    note = nv.ensure_pci_bus_order(env)
    assert env["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST" and "FASTEST_FIRST" in note


def test_nvml_that_cannot_start_gives_the_reason():
    mod = fake_pynvml.make(three(), init_error=fake_pynvml.LIBRARY_NOT_FOUND)
    s = NvmlSession.open([0], mod)
    assert s.gpus == [] and s.reason == "NVML could not start: NVML Shared Library Not Found (NVML error 12)"
    tel = Telemetry.start("cuda", 10.0, nvml=mod, env={})
    summary = tel.stop(train_samples=10)
    assert summary["gpu"]["statement"] == (
        "GPU telemetry unavailable: NVML could not start: NVML Shared Library Not Found (NVML error 12)")
    assert summary["energy"]["train_j"] is None
    assert summary["energy"]["reason"].startswith("GPU telemetry unavailable")


def test_a_sample_reads_every_metric_with_the_real_return_types(nvml):
    session = NvmlSession.open([1], nvml, env={})
    (gpu,) = session.gpus
    assert gpu.power_method == nv.INSTANT_POWER_NOTE and gpu.energy_counter
    power, mem, util_gpu, util_mem, temp, clock, throttle = gpu.sample(0.0)
    assert power == pytest.approx(300.0)
    assert (mem, util_gpu, util_mem, temp, clock) == (12 * 2**30, 97.0, 41.0, 61.0, 1980.0)
    assert nv.decode_throttle(throttle) == ["sw_power_cap"]
    assert nv.decode_throttle(0x4 | 0x40 | 0x1000) == ["sw_power_cap", "hw_thermal", "other(0x1000)"]
    d = gpu.describe()
    assert d["uuid"] == UUIDS[1] and d["nvml_index"] == 1 and d["name"].startswith("NVIDIA Fake")
    session.close()


def test_without_instant_power_the_averaged_reading_is_used_and_labelled():
    mod = fake_pynvml.make([FakeGPU(UUIDS[0], instant_power=False)])
    (gpu,) = NvmlSession.open([0], mod, env={}).gpus
    assert gpu.power_averaged and gpu.power_method.startswith("nvmlDeviceGetPowerUsage: averaged")
    assert "NVML_FI_DEV_POWER_INSTANT: Not Supported (NVML error 3)" in gpu.power_method
    assert gpu.sample(0.0)[0] == pytest.approx(300.0)


def test_nvml_errors_are_per_call_with_reasons_and_unsupported_calls_stop():
    g = FakeGPU(UUIDS[0], errors={
        "nvmlDeviceGetMemoryInfo": fake_pynvml.NO_PERMISSION,
        "nvmlDeviceGetTemperature": fake_pynvml.NOT_SUPPORTED,
        "nvmlDeviceGetClockInfo": [fake_pynvml.TIMEOUT, fake_pynvml.TIMEOUT],  # transient
    })
    mod = fake_pynvml.make([g])
    (gpu,) = NvmlSession.open([0], mod, env={}).gpus
    rows = [gpu.sample(float(i)) for i in range(4)]
    assert [r[1] for r in rows] == [None] * 4 and [r[4] for r in rows] == [None] * 4
    assert [r[5] for r in rows] == [None, None, 1980.0, 1980.0]  # retried after a timeout
    assert all(r[0] == pytest.approx(300.0) for r in rows)        # the rest still read
    # A permanent error is not retried at 10 Hz.
    assert mod.calls["nvmlDeviceGetMemoryInfo"] == 1 and mod.calls["nvmlDeviceGetTemperature"] == 1
    assert mod.calls["nvmlDeviceGetClockInfo"] == 4
    assert gpu.reasons["mem_used_bytes"] == "nvmlDeviceGetMemoryInfo: Insufficient Permissions (NVML error 4)"
    assert gpu.reasons["temp_c"] == "nvmlDeviceGetTemperature: Not Supported (NVML error 3)"
    assert gpu.extra_summary()["nvml_errors"]["sm_clock_mhz"] == {
        "reason": "nvmlDeviceGetClockInfo: Timeout (NVML error 10)", "count": 2}


def _run(mod, *, train_s=0.4, rate=50.0, gpus=None, env=None):
    tel = Telemetry.start("cuda", rate, nvml=mod, gpus=gpus, env=env or {},
                          framework_memory=lambda: {"torch.cuda.max_memory_allocated": 5e9})
    time.sleep(0.1)
    tel.phase("train")
    time.sleep(train_s)
    tel.phase("eval")
    time.sleep(0.1)
    return tel, tel.stop(train_samples=400)


def test_counter_energy_per_phase_on_a_known_power_schedule():
    # 100 W for the first 0.05 s (inside init), then 300 W: the counter is the exact integral.
    g = FakeGPU(UUIDS[0], power=[(0.0, 100.0), (0.05, 300.0)])
    mod = fake_pynvml.make([g])
    tel, s = _run(mod)
    gpu = s["sources"]["gpu0"]
    assert gpu["energy_method"] == "counter: " + nv.ENERGY_COUNTER_NOTE
    edges = tel.recording.edges
    t0 = edges[0].energy["gpu0"]
    for phase, (a, b) in {"init": (0, 1), "train": (1, 2), "eval": (2, 3)}.items():
        exact = edges[b].energy["gpu0"] - edges[a].energy["gpu0"]
        assert gpu["energy_j"][phase] == pytest.approx(exact)
    assert gpu["energy_j"]["total"] == pytest.approx(edges[-1].energy["gpu0"] - t0)
    dur = s["phases_s"]
    assert gpu["avg_w"]["train"] == pytest.approx(300.0, rel=0.02)  # all of train is at 300 W
    assert 100.0 < gpu["avg_w"]["init"] < 300.0                       # init saw the step
    assert gpu["peak_w"]["train"] == pytest.approx(300.0) and gpu["peak_w"]["init"] == pytest.approx(300.0)
    assert gpu["train_j_per_sample"] == pytest.approx(gpu["energy_j"]["train"] / 400)
    assert s["energy"]["train_j_per_sample"] == gpu["train_j_per_sample"]
    assert s["energy"]["train_j"] == pytest.approx(300.0 * dur["train"], rel=0.02)
    # Instant power integrated over the same phases agrees with the counter.
    assert abs(gpu["cross_check"]["relative_difference"]) < 0.05
    assert s["gpu"] == {"available": True, "devices": ["gpu0"], "statement": None}
    assert gpu["throttle_train"]["fraction"] == {"sw_power_cap": 1.0}
    assert gpu["stats"]["util_gpu_pct"]["train_mean"] == 97.0
    assert s["peak_memory"]["gpu0.mem_used_bytes"]["value"] == 12 * 2**30
    assert s["peak_memory"]["torch.cuda.max_memory_allocated"]["value"] == 5e9
    assert s["sampling"]["achieved_hz"] > 30
    json.dumps(s, allow_nan=False)  # plain JSON, as RunResult stores it
    # NVML is released when the run's telemetry stops.
    assert mod.calls["nvmlInit"] == mod.calls["nvmlShutdown"]


def test_without_the_energy_counter_power_is_integrated():
    g = FakeGPU(UUIDS[0], errors={"nvmlDeviceGetTotalEnergyConsumption": fake_pynvml.NOT_SUPPORTED})
    mod = fake_pynvml.make([g])
    _, s = _run(mod)
    gpu = s["sources"]["gpu0"]
    assert gpu["energy_method"].startswith("trapezoid: sampled power (" + nv.INSTANT_POWER_NOTE)
    assert "nvmlDeviceGetTotalEnergyConsumption: Not Supported (NVML error 3)" in gpu["energy_method"]
    for phase in ("init", "train", "eval", "total"):
        assert gpu["energy_j"][phase] == pytest.approx(300.0 * s["phases_s"][phase], rel=1e-6)
    # Probed once, then never called again.
    assert mod.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1


def test_the_requested_device_is_the_one_sampled_and_misses_are_reported():
    gpus = three()
    gpus[2].power = [(0.0, 123.0)]
    mod = fake_pynvml.make(gpus)
    _, s = _run(mod, train_s=0.1, gpus=[0], env={"CUDA_VISIBLE_DEVICES": "2,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert s["sources"]["gpu0"]["uuid"] == UUIDS[2] and s["sources"]["gpu0"]["peak_w"]["total"] == 123.0
    _, s = _run(mod, train_s=0.1, gpus=[UUIDS[1][4:], 5], env={})
    assert s["gpu"]["devices"] == ["gpu0"] and s["sources"]["gpu0"]["uuid"] == UUIDS[1]
    assert s["gpu"]["unresolved"][0]["requested_as"] == 5 and "not visible" in s["notes"][0]
