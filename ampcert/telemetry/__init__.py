"""Power, energy and memory telemetry around a training run.

    from ampcert.telemetry import Telemetry, ensure_pci_bus_order, torch_cuda_memory

    ensure_pci_bus_order()                        # before the framework starts CUDA
    tel = Telemetry.start(device="cuda", rate_hz=10.0, gpus=[0],
                          framework_memory=torch_cuda_memory)   # phase "init"
    tel.phase("train"); ...; tel.phase("eval"); ...
    summary = tel.stop(train_samples=n)          # JSON-able dict -> RunResult.telemetry
    tel.series().write("runs/<id>/telemetry.csv")  # plain data, pandas.read_csv-able

``sampler`` holds the thread and the summary, ``nvml`` the GPUs (pynvml),
``host`` RAPL, RSS and CPU use. What cannot be read is None with a reason.
"""

from __future__ import annotations

from typing import Any

from ampcert.telemetry.host import HostSource, RaplReader
from ampcert.telemetry.nvml import NvmlSession, ensure_pci_bus_order
from ampcert.telemetry.sampler import DEFAULT_RATE_HZ, Series, Telemetry
from ampcert.telemetry.summary import Recording, integrate_trapezoid, summarize

__all__ = [
    "DEFAULT_RATE_HZ", "HostSource", "NvmlSession", "RaplReader", "Recording", "Series", "Telemetry",
    "ensure_pci_bus_order", "integrate_trapezoid", "jax_memory", "summarize", "torch_cuda_gpu_ref",
    "torch_cuda_memory",
]


def torch_cuda_memory(device: Any = None) -> dict[str, Any]:
    """torch's peak CUDA memory for ``device`` (default: the current one),
    as ``framework_memory`` entries for :meth:`Telemetry.start`."""
    import torch

    return {
        "torch.cuda.max_memory_allocated": {
            "value": float(torch.cuda.max_memory_allocated(device)), "unit": "bytes",
            "method": "torch.cuda.max_memory_allocated: peak of live tensors (excludes the allocator cache)"},
        "torch.cuda.max_memory_reserved": {
            "value": float(torch.cuda.max_memory_reserved(device)), "unit": "bytes",
            "method": "torch.cuda.max_memory_reserved: peak held by the caching allocator "
                      "(excludes the CUDA context)"},
    }


def torch_cuda_gpu_ref(device: Any = None) -> int | str:
    """The current torch CUDA device as :meth:`Telemetry.start` wants it: its
    UUID (matched in NVML whatever CUDA_DEVICE_ORDER says), else its ordinal."""
    import torch

    index = torch.cuda.current_device() if device is None else torch.device(device).index or 0
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # noqa: BLE001 - older torch: no uuid property
        return index
    return uuid or index


def jax_memory(devices: Any = None) -> dict[str, Any]:
    """Peak memory per JAX device from ``Device.memory_stats()`` (GPU/TPU
    backends; None with the reason where the backend keeps none, e.g. CPU),
    as ``framework_memory`` entries for :meth:`Telemetry.start`."""
    import jax

    out: dict[str, Any] = {}
    for d in devices if devices is not None else jax.local_devices():
        key = f"jax.{d.platform}{d.id}.peak_bytes_in_use"
        try:
            stats = d.memory_stats()
        except Exception as exc:  # noqa: BLE001
            stats, why = None, f"memory_stats() failed: {type(exc).__name__}: {exc}"
        else:
            why = f"{d.platform} backend keeps no memory_stats()"
        if stats and "peak_bytes_in_use" in stats:
            out[key] = {"value": float(stats["peak_bytes_in_use"]), "unit": "bytes",
                        "method": "jax Device.memory_stats()['peak_bytes_in_use'] (allocator peak)"}
        else:
            out[key] = {"value": None, "unit": "bytes", "method": "jax Device.memory_stats()", "reason": why}
    return out
