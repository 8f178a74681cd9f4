"""A FAKE pynvml module for tests (no GPU, no NVML library needed).

It reproduces what ampcert.telemetry.nvml relies on in the real module
(``pynvml`` from nvidia-ml-py): the function names and signatures, the
return types (pynvml's own ctypes structures: ``c_nvmlMemory_t``,
``c_nvmlUtilization_t``, arrays of ``c_nvmlFieldValue_t``; plain ints for
power in mW and energy in mJ; ``str`` UUIDs and names), and the errors
(pynvml's own ``NVMLError`` classes, raised with the real ``NVML_ERROR_*``
codes, so ``NVMLError(3)`` is an ``NVMLError_NotSupported``).

Each fake GPU draws power from a schedule ``[(t_from, watts), ...]`` (times
in seconds of ``time.perf_counter`` since :func:`make`), and its energy
counter is the exact integral of that schedule, so tests know the answer.
"""

from __future__ import annotations

import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml as real

NOT_SUPPORTED = real.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION = real.NVML_ERROR_NO_PERMISSION
LIBRARY_NOT_FOUND = real.NVML_ERROR_LIBRARY_NOT_FOUND
TIMEOUT = real.NVML_ERROR_TIMEOUT
GPU_IS_LOST = real.NVML_ERROR_GPU_IS_LOST


@dataclass
class FakeGPU:
    uuid: str
    name: str = "NVIDIA Fake H100 80GB HBM3"
    power: list[tuple[float, float]] = field(default_factory=lambda: [(0.0, 300.0)])
    instant_power: bool = True          # NVML_FI_DEV_POWER_INSTANT offered
    mem_used: int = 12 * 2**30
    mem_total: int = 80 * 2**30
    util_gpu: int = 97
    util_mem: int = 41
    temp_c: int = 61
    sm_clock_mhz: int = 1980
    throttle: int = 0x4                 # sw_power_cap
    # function name -> NVML error code it raises (every call), or a list of
    # codes raised by successive calls (then it succeeds).
    errors: dict[str, int | list[int]] = field(default_factory=dict)

    def watts(self, t: float) -> float:
        w = self.power[0][1]
        for start, value in self.power:
            if t >= start:
                w = value
        return w

    def joules(self, t: float) -> float:
        """Exact integral of the power schedule over [0, t]."""
        total = 0.0
        for i, (start, value) in enumerate(self.power):
            end = self.power[i + 1][0] if i + 1 < len(self.power) else float("inf")
            if t <= start:
                break
            total += value * (min(t, end) - max(start, 0.0))
        return total


class _Handle:
    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice_t {self.index}>"


def make(gpus: list[FakeGPU], *, init_error: int | None = None,
         clock: Callable[[], float] = time.perf_counter) -> types.ModuleType:
    """A module object that stands in for ``pynvml``."""
    mod = types.ModuleType("fake_pynvml")
    # The real constants and error classes: NVML_*, NVMLError, NVMLError_*.
    for name in dir(real):
        if name.startswith(("NVML_", "NVMLError", "nvmlClocks")):
            setattr(mod, name, getattr(real, name))
    t0 = clock()
    state = {"init": 0}
    calls: Counter[str] = Counter()
    mod.calls = calls
    mod.gpus = gpus
    handles = [_Handle(i) for i in range(len(gpus))]

    def api(fn: Callable) -> Callable:
        name = fn.__name__

        def wrapper(*args):
            calls[name] += 1
            if name not in ("nvmlInit", "nvmlShutdown") and state["init"] <= 0:
                raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
            if args and isinstance(args[0], _Handle):
                spec = gpus[args[0].index].errors.get(name)
                if isinstance(spec, list) and spec:
                    raise real.NVMLError(spec.pop(0))
                if isinstance(spec, int):
                    raise real.NVMLError(spec)
            return fn(*args)

        wrapper.__name__ = name
        setattr(mod, name, wrapper)
        return wrapper

    @api
    def nvmlInit():
        if init_error is not None:
            raise real.NVMLError(init_error)
        state["init"] += 1

    @api
    def nvmlShutdown():
        if state["init"] <= 0:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        state["init"] -= 1

    @api
    def nvmlSystemGetDriverVersion():
        return "555.42.06"

    @api
    def nvmlDeviceGetCount():
        return len(gpus)

    @api
    def nvmlDeviceGetHandleByIndex(index):
        if not 0 <= index < len(gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return handles[index]

    @api
    def nvmlDeviceGetHandleByUUID(uuid):
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for h, g in zip(handles, gpus, strict=True):
            if g.uuid == uuid:
                return h
        raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)

    @api
    def nvmlDeviceGetIndex(handle):
        return handle.index

    @api
    def nvmlDeviceIsMigDeviceHandle(handle):
        return False

    @api
    def nvmlDeviceGetUUID(handle):
        return gpus[handle.index].uuid

    @api
    def nvmlDeviceGetName(handle):
        return gpus[handle.index].name

    @api
    def nvmlDeviceGetFieldValues(handle, field_ids):
        g = gpus[handle.index]
        values = (real.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            values[i].fieldId = fid
            values[i].timestamp = int(clock() * 1e6)
            if fid == real.NVML_FI_DEV_POWER_INSTANT and g.instant_power:
                values[i].nvmlReturn = real.NVML_SUCCESS
                values[i].valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = int(round(g.watts(clock() - t0) * 1000))
            else:
                values[i].nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return values

    @api
    def nvmlDeviceGetPowerUsage(handle):
        return int(round(gpus[handle.index].watts(clock() - t0) * 1000))  # mW

    @api
    def nvmlDeviceGetTotalEnergyConsumption(handle):
        return int(gpus[handle.index].joules(clock() - t0) * 1000)  # mJ

    @api
    def nvmlDeviceGetMemoryInfo(handle, version=None):
        g = gpus[handle.index]
        mem = real.c_nvmlMemory_t()
        mem.total, mem.used, mem.free = g.mem_total, g.mem_used, g.mem_total - g.mem_used
        return mem

    @api
    def nvmlDeviceGetUtilizationRates(handle):
        g = gpus[handle.index]
        util = real.c_nvmlUtilization_t()
        util.gpu, util.memory = g.util_gpu, g.util_mem
        return util

    @api
    def nvmlDeviceGetTemperature(handle, sensor):
        if sensor != real.NVML_TEMPERATURE_GPU:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpus[handle.index].temp_c

    @api
    def nvmlDeviceGetClockInfo(handle, clock_type):
        if clock_type != real.NVML_CLOCK_SM:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return gpus[handle.index].sm_clock_mhz

    @api
    def nvmlDeviceGetCurrentClocksEventReasons(handle):
        return gpus[handle.index].throttle

    @api
    def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
        return gpus[handle.index].throttle

    return mod
