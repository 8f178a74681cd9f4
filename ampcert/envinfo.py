"""Environment fingerprint: what a result was measured on.

Everything here is read, never assumed: a GPU driver that cannot be queried
is reported as unavailable with the reason.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

# CPU features that decide whether low precision is fast on a CPU (f16c: hardware
# fp16 <-> fp32 conversion; fma: the fp32 baseline's fused multiply-add).
CPU_FLAGS_OF_INTEREST = (
    "avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_fp16",
    "f16c", "fma",
)
PACKAGES = ("torch", "numpy", "pandas", "pydantic", "jax", "jaxlib", "optax", "nvidia-ml-py", "scikit-learn")


def load_average() -> str:
    """The 1/5/15-minute load averages, for stating how busy a machine was during a measurement."""
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def cpu_info() -> dict[str, Any]:
    model, flags, sockets = platform.processor() or platform.machine(), set(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name":
                model = value.strip()
            elif key == "physical id":  # one id per CPU package (socket)
                sockets.add(value.strip())
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
        memory = psutil.virtual_memory().total
    except Exception:  # noqa: BLE001 - best effort on exotic platforms
        physical, memory = None, None
    return {
        "model": model,
        "logical_cores": os.cpu_count(),
        "physical_cores": physical,
        "sockets": len(sockets) or None,
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": memory,
        "flags": {f: (f in flags) for f in CPU_FLAGS_OF_INTEREST} if flags else "unknown",
    }


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def installed_packages() -> list[str]:
    """Every distribution this interpreter can import, as ``name==version``, sorted by
    name (normalised as pip does): the resolved environment a run ran in."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").strip()
        if name:
            found.setdefault(name.lower().replace("_", "-"), f"{name}=={dist.version}")
    return [found[k] for k in sorted(found)]


def gpu_info() -> dict[str, Any]:
    """GPUs as NVML and torch see them; each source says why when it cannot."""
    info: dict[str, Any] = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["devices"] = [
                {
                    "index": i,
                    "name": torch.cuda.get_device_name(i),
                    "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                    "memory_bytes": torch.cuda.get_device_properties(i).total_memory,
                }
                for i in range(torch.cuda.device_count())
            ]
            info["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:  # noqa: BLE001
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
            info["nvml_device_count"] = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound on CPU-only boxes
        info["nvml"] = f"unavailable: {type(exc).__name__}: {exc}"
    return info


def fingerprint() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu": cpu_info(),
        "gpu": gpu_info(),
        "packages": package_versions(),
    }


def software_stack(fingerprint: dict[str, Any], tool: str = "") -> dict[str, str]:
    """The software a night ran on, by name, from its plan's fingerprint (and the ``tool``
    that planned it, ``ampcert X``): torch, JAX, CUDA, the NVIDIA driver, ampcert, and
    each own job's commit (``code_jobs``). Names a plan does not record are left out."""
    def text(value: Any) -> str | None:
        return str(value) if isinstance(value, (str, int, float)) and str(value) else None

    packages = fingerprint.get("packages") if isinstance(fingerprint.get("packages"), dict) else {}
    gpu = fingerprint.get("gpu") if isinstance(fingerprint.get("gpu"), dict) else {}
    found = {"torch": text(packages.get("torch")), "jax": text(packages.get("jax")),
             "CUDA": text(gpu.get("torch_cuda")), "driver": text(gpu.get("driver")),
             "ampcert": text(tool.removeprefix("ampcert ").strip())}
    jobs = fingerprint.get("code_jobs") if isinstance(fingerprint.get("code_jobs"), dict) else {}
    for label, source in sorted(jobs.items()):
        git = source.get("git") if isinstance(source, dict) and isinstance(source.get("git"), dict) else {}
        if text(git.get("commit")):
            found[f"job {label} commit"] = str(git["commit"])[:12] + ("+dirty" if git.get("dirty") else "")
    return {k: v for k, v in found.items() if v}


def stack_changes(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """One phrase per name whose value differs (a name only one side records is not a
    difference, but for a job, which one side may not have run)."""
    keys = [k for k in sorted(set(before) | set(now)) if (k in before and k in now) or k.startswith("job ")]
    return [f"{k} {before.get(k, 'absent')} -> {now.get(k, 'absent')}" for k in keys if before.get(k) != now.get(k)]
