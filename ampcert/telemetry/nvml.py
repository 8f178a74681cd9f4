"""NVIDIA GPU telemetry through NVML (the ``pynvml`` module of nvidia-ml-py).

Which devices: the caller names the devices its run uses, each either by its
CUDA ordinal (0 = the first device the process can see) or by UUID. Ordinals
are mapped to NVML devices the way CUDA itself reads ``CUDA_VISIBLE_DEVICES``
(integer indices, ``GPU-`` UUID prefixes or ``MIG-`` UUIDs; parsing stops at
the first invalid entry and a repeated entry hides every device; see
torch.cuda._parse_visible_devices, which mirrors the driver). NVML numbers
devices in PCI bus order, so integer indices only agree with CUDA's when
``CUDA_DEVICE_ORDER=PCI_BUS_ID``: :func:`ensure_pci_bus_order` sets it and
backends call it before the framework starts CUDA. A UUID from the
framework (``torch.cuda.get_device_properties(i).uuid``) is the surest
mapping and needs no assumption about order.

What is read, per device:

- power: ``nvmlDeviceGetFieldValues(NVML_FI_DEV_POWER_INSTANT)`` where the
  driver offers it (instantaneous), else ``nvmlDeviceGetPowerUsage``, which is
  a ~1 s moving average on Ampere and newer GPUs (except GA100); the method
  says which;
- energy: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver
  loaded, Volta and newer), read at phase edges;
- memory used (device-wide, every process and the CUDA context included),
  GPU and memory utilisation, temperature, SM clock, clock-event (throttle)
  reasons.

Every call is wrapped: an ``NVMLError`` leaves that value ``None`` and keeps
the first reason per metric with a count; NOT_SUPPORTED, NO_PERMISSION and
FUNCTION_NOT_FOUND stop further calls for that metric, so an unsupported
query costs nothing at 10 Hz.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

# Clock-event ("throttle") reason bits, as in nvml.h (nvmlClocksEventReason*).
THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock",
}

AVERAGED_POWER_NOTE = ("nvmlDeviceGetPowerUsage: averaged over ~1 s on Ampere and newer GPUs "
                       "(except GA100), instantaneous on older ones")
INSTANT_POWER_NOTE = "nvmlDeviceGetFieldValues(NVML_FI_DEV_POWER_INSTANT): instantaneous board power"
ENERGY_COUNTER_NOTE = "nvmlDeviceGetTotalEnergyConsumption deltas at phase edges (mJ counter, Volta and newer)"


def decode_throttle(mask: int | None) -> list[str]:
    if mask is None:
        return []
    names = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_BITS)
    if rest:
        names.append(f"other(0x{rest:x})")
    return names


def ensure_pci_bus_order(env: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA ordinals follow NVML's
    (PCI bus) order. A different order chosen by the user is kept; the
    returned note says so (UUID mapping still works then). Call it before
    the framework initialises CUDA: CUDA reads the variable once."""
    env = os.environ if env is None else env
    current = env.get("CUDA_DEVICE_ORDER")
    if current is None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return None
    if current != "PCI_BUS_ID":
        return (f"CUDA_DEVICE_ORDER={current} (set by the user): CUDA ordinals may not follow "
                "NVML's PCI bus order; devices are matched by UUID where the framework gives one")
    return None


def _nvml_error_text(nvml: Any, exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - NVMLError.__str__ may call into the library
        text = type(exc).__name__
    return f"{text} (NVML error {code})" if code is not None else f"{type(exc).__name__}: {text}"


def _strtoul(s: str) -> int:
    """Leading unsigned integer of ``s`` (``1gpu2`` -> 1), or -1, like C's strtoul as CUDA uses it."""
    digits = ""
    for c in s:
        if not c.isdigit():
            break
        digits += c
    return int(digits) if digits else -1


def _uuid(nvml: Any, handle: Any) -> str:
    u = nvml.nvmlDeviceGetUUID(handle)
    return u.decode() if isinstance(u, bytes) else str(u)


def parse_visible_devices(nvml: Any, value: str | None) -> tuple[list[int], str]:
    """NVML indices that CUDA ordinals 0, 1, ... refer to, and how they were derived.

    ``value`` is CUDA_VISIBLE_DEVICES (None: unset). MIG entries are resolved
    by :func:`resolve` (they have no NVML index of their own)."""
    count = nvml.nvmlDeviceGetCount()
    if value is None:
        return list(range(count)), f"CUDA_VISIBLE_DEVICES unset: all {count} NVML device(s) in PCI bus order"
    value = value.strip()
    entries = [e.strip() for e in value.split(",")] if value else []
    out: list[int] = []
    stop = ""
    if value.startswith("GPU-"):
        uuids = [_uuid(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        for e in entries:
            matches = [i for i, u in enumerate(uuids) if e.startswith("GPU-") and u.startswith(e)]
            if len(matches) != 1:
                stop = f"; {e!r} {'is ambiguous' if matches else 'matches no device'}, so it and later entries are ignored"
                break
            if matches[0] in out:
                return [], f"CUDA_VISIBLE_DEVICES={value!r} repeats a device, which hides every device"
            out.append(matches[0])
    else:
        for e in entries:
            i = _strtoul(e)
            if i < 0 or i >= count:
                stop = f"; entry {e!r} is not a device index below {count}, so it and later entries are ignored"
                break
            if i in out:
                return [], f"CUDA_VISIBLE_DEVICES={value!r} repeats a device, which hides every device"
            out.append(i)
    return out, f"CUDA_VISIBLE_DEVICES={value!r} -> NVML indices {out}{stop}"


@dataclass
class Resolved:
    ref: int | str
    handle: Any = None        # the device the run uses (a MIG instance's own handle for MIG)
    board: Any = None         # the physical GPU: power, energy, clocks and temperature come from it
    index: int | None = None  # NVML index of the board
    uuid: str | None = None
    mapping: str = ""
    reason: str | None = None


def resolve(nvml: Any, ref: int | str, env: Mapping[str, str] | None = None) -> Resolved:
    """The NVML device for a CUDA ordinal (int) or a UUID (str)."""
    env = os.environ if env is None else env
    try:
        if isinstance(ref, str):
            return _resolve_uuid(nvml, ref, "UUID from the framework")
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and visible.strip().startswith("MIG-"):
            entries = [e.strip() for e in visible.split(",")]
            if ref >= len(entries):
                return Resolved(ref, reason=f"CUDA ordinal {ref} is not visible (CUDA_VISIBLE_DEVICES={visible!r})")
            return _resolve_uuid(nvml, entries[ref], f"CUDA_VISIBLE_DEVICES entry {ref}")
        indices, how = parse_visible_devices(nvml, visible)
        if ref < 0 or ref >= len(indices):
            return Resolved(ref, mapping=how, reason=f"CUDA ordinal {ref} is not visible ({how})")
        handle = nvml.nvmlDeviceGetHandleByIndex(indices[ref])
        order = env.get("CUDA_DEVICE_ORDER")
        if order != "PCI_BUS_ID" and (len(indices) > 1 or nvml.nvmlDeviceGetCount() > 1):
            how += f"; CUDA_DEVICE_ORDER={order} (not PCI_BUS_ID): ordinal and NVML index may disagree"
        return Resolved(ref, handle, handle, indices[ref], _uuid(nvml, handle), f"CUDA ordinal {ref}: {how}")
    except nvml.NVMLError as exc:
        return Resolved(ref, reason=f"cannot resolve GPU {ref!r} in NVML: {_nvml_error_text(nvml, exc)}")


def _resolve_uuid(nvml: Any, uuid: str, how: str) -> Resolved:
    last: BaseException | None = None
    candidates = [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}", uuid]
    for cand in candidates:
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(cand)
        except nvml.NVMLError as exc:
            last = exc
            continue
        board, mapping = handle, f"{how}: {cand}"
        is_mig = getattr(nvml, "nvmlDeviceIsMigDeviceHandle", None)
        if is_mig is not None and is_mig(handle):
            board = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            mapping += ("; a MIG instance: power, energy, clocks and temperature are the whole GPU's, "
                        "shared with any other instance")
        try:
            index = nvml.nvmlDeviceGetIndex(board)
        except nvml.NVMLError:
            index = None
        return Resolved(uuid, handle, board, index, cand, mapping)
    assert last is not None
    return Resolved(uuid, reason=f"no NVML device with UUID {uuid!r}: {_nvml_error_text(nvml, last)}")


# Errors after which a query is not tried again for that device.
_PERMANENT = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_FUNCTION_NOT_FOUND")


class NvmlGpu:
    """One GPU in use, as a telemetry source."""

    kind = "nvml"
    columns = ("power_w", "mem_used_bytes", "util_gpu_pct", "util_mem_pct", "temp_c",
               "sm_clock_mhz", "throttle_reasons")
    power_column = "power_w"
    power_is_interval_mean = False

    def __init__(self, nvml: Any, name: str, dev: Resolved):
        self.nvml = nvml
        self.name = name
        self.dev = dev
        self.reasons: dict[str, str] = {}
        self.failures: dict[str, int] = {}
        self._disabled: set[str] = set()
        self._permanent = {getattr(nvml, c) for c in _PERMANENT if hasattr(nvml, c)}
        self.device_name = self._call("name", "nvmlDeviceGetName", dev.board)
        if isinstance(self.device_name, bytes):
            self.device_name = self.device_name.decode()
        self._instant_field = getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        self.power_method: str | None = None
        self.power_averaged = False
        if self._instant_field is not None and self._instant_power() is not None:
            self.power_method = INSTANT_POWER_NOTE
        else:
            instant_why = self.reasons.pop("power_instant", "NVML_FI_DEV_POWER_INSTANT not in this pynvml")
            if self._call("power_w", "nvmlDeviceGetPowerUsage", dev.board) is not None:
                self.power_method = AVERAGED_POWER_NOTE + f" (instant power unavailable: {instant_why})"
                self.power_averaged = True
            else:
                self.reasons["power_w"] = (f"no power reading: instant: {instant_why}; "
                                           f"averaged: {self.reasons.get('power_w')}")
        self._instant_ok = self.power_method is not None and not self.power_averaged
        self._throttle_fn = ("nvmlDeviceGetCurrentClocksEventReasons"
                             if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons")
                             else "nvmlDeviceGetCurrentClocksThrottleReasons")
        probe = self._call("energy", "nvmlDeviceGetTotalEnergyConsumption", dev.board)
        self.energy_counter = probe is not None

    # -- calls ---------------------------------------------------------------

    def _fail(self, metric: str, text: str, permanent: bool) -> None:
        self.failures[metric] = self.failures.get(metric, 0) + 1
        self.reasons.setdefault(metric, text)
        if permanent:
            self._disabled.add(metric)

    def _call(self, metric: str, fn_name: str, *args: Any) -> Any:
        if metric in self._disabled:
            return None
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            self._fail(metric, f"{fn_name} is not in this pynvml (nvidia-ml-py too old)", True)
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self._fail(metric, f"{fn_name}: {_nvml_error_text(self.nvml, exc)}",
                       getattr(exc, "value", None) in self._permanent)
            return None

    def _instant_power(self) -> float | None:
        values = self._call("power_instant", "nvmlDeviceGetFieldValues", self.dev.board, [self._instant_field])
        if values is None:
            return None
        fv = values[0]
        ret = getattr(fv, "nvmlReturn", 0)
        if ret != getattr(self.nvml, "NVML_SUCCESS", 0):
            try:
                text = _nvml_error_text(self.nvml, self.nvml.NVMLError(ret))
            except Exception:  # noqa: BLE001
                text = f"NVML error {ret}"
            self._fail("power_instant", f"NVML_FI_DEV_POWER_INSTANT: {text}", ret in self._permanent)
            return None
        return field_value(self.nvml, fv) / 1000.0  # mW -> W

    # -- the Source protocol -------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "name": self.device_name, "nvml_index": self.dev.index,
            "uuid": self.dev.uuid, "requested_as": self.dev.ref, "mapping": self.dev.mapping,
            "power_method": self.power_method,
            "energy_method": ENERGY_COUNTER_NOTE if self.energy_counter else None,
            "memory_method": "nvmlDeviceGetMemoryInfo.used (device-wide: all processes and the CUDA context)",
        }

    def energy_j(self, t: float) -> float | None:
        mj = self._call("energy", "nvmlDeviceGetTotalEnergyConsumption", self.dev.board)
        return None if mj is None else mj / 1000.0

    def energy_unavailable_reason(self) -> str | None:
        return None if self.energy_counter else self.reasons.get("energy", "energy counter unreadable")

    def sample(self, t: float) -> tuple[Any, ...]:
        h, board = self.dev.handle, self.dev.board
        if self._instant_ok:
            power = self._instant_power()
        else:
            mw = self._call("power_w", "nvmlDeviceGetPowerUsage", board)
            power = None if mw is None else mw / 1000.0
        mem = self._call("mem_used_bytes", "nvmlDeviceGetMemoryInfo", h)
        util = self._call("util_gpu_pct", "nvmlDeviceGetUtilizationRates", board)
        temp = self._call("temp_c", "nvmlDeviceGetTemperature", board,
                          getattr(self.nvml, "NVML_TEMPERATURE_GPU", 0))
        clock = self._call("sm_clock_mhz", "nvmlDeviceGetClockInfo", board, getattr(self.nvml, "NVML_CLOCK_SM", 1))
        throttle = self._call("throttle_reasons", self._throttle_fn, board)
        return (
            power,
            None if mem is None else int(mem.used),
            None if util is None else float(util.gpu),
            None if util is None else float(util.memory),
            None if temp is None else float(temp),
            None if clock is None else float(clock),
            None if throttle is None else int(throttle),
        )

    def extra_summary(self) -> dict[str, Any]:
        errs = {m: {"reason": self.reasons.get(m), "count": n} for m, n in self.failures.items()}
        return {"nvml_errors": errs} if errs else {}

    def close(self) -> None:
        pass


def field_value(nvml: Any, fv: Any) -> float:
    """The number in a c_nvmlFieldValue_t, read through the member its valueType names."""
    members = {
        getattr(nvml, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
        getattr(nvml, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }
    return float(getattr(fv.value, members.get(fv.valueType, "uiVal")))


class NvmlSession:
    """NVML started once for a run, with a source per GPU in use.

    ``reason`` is set (and ``gpus`` empty) when nothing could be read;
    ``unresolved`` lists the requested devices that could not be found."""

    def __init__(self, gpus: list[NvmlGpu], reason: str | None, unresolved: list[dict[str, Any]],
                 nvml: Any = None, device_count: int | None = None, driver: str | None = None):
        self.gpus = gpus
        self.reason = reason
        self.unresolved = unresolved
        self.device_count = device_count
        self.driver = driver
        self._nvml = nvml

    @classmethod
    def open(cls, refs: Sequence[int | str], nvml: Any = None,
             env: Mapping[str, str] | None = None) -> NvmlSession:
        if nvml is None:
            try:
                import pynvml as nvml
            except Exception as exc:  # noqa: BLE001
                return cls([], f"the pynvml module (package nvidia-ml-py) cannot be imported: {exc}", [])
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            return cls([], f"NVML could not start: {_nvml_error_text(nvml, exc)}", [])
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            count = None
            why = _nvml_error_text(nvml, exc)
        driver = None
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        except (nvml.NVMLError, AttributeError):
            pass
        if count is None:
            _shutdown(nvml)
            return cls([], f"NVML started but cannot count devices: {why}", [], driver=driver)
        gpus, unresolved = [], []
        for ref in refs:
            dev = resolve(nvml, ref, env)
            if dev.reason:
                unresolved.append({"requested_as": ref, "reason": dev.reason})
            else:
                gpus.append(NvmlGpu(nvml, f"gpu{len(gpus)}", dev))
        reason = None
        if not gpus:
            reason = ("; ".join(u["reason"] for u in unresolved) if unresolved
                      else f"no GPU requested (NVML sees {count} device(s))")
            _shutdown(nvml)
            nvml = None
        return cls(gpus, reason, unresolved, nvml, count, driver)

    def close(self) -> None:
        if self._nvml is not None:
            _shutdown(self._nvml)
            self._nvml = None


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError:
        pass


def probe(nvml: Any = None) -> str:
    """One line on what NVML sees, for runs that do not use a GPU."""
    session = NvmlSession.open([], nvml)
    if session.device_count is None:
        return f"NVML: {session.reason}"
    return f"NVML sees {session.device_count} device(s), driver {session.driver}"
