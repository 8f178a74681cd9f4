"""Hardware counters of this process through Linux's ``perf_event_open``: instructions
retired and CPU cycles, the per-step cost that a machine's load, its clock and its
neighbours move least (the speed probe reads them per window, ampcert/backends/speed_probe.py).

A counter is opened for every thread the process has when counting starts (the
framework's intra-op pool exists by then) and for the threads they start later
(``inherit``); a reading is their sum. Where the kernel exposes no hardware PMU, as on
most VMs, :func:`open_counters` says so in one line and nothing is counted. Software
events (task-clock) need no PMU: they are how the plumbing is tested on such machines.

No library is used: the syscall takes one struct and returns a file descriptor that
``read`` answers with a 64-bit count, and the Python packages that wrap it are either
unmaintained or wrap a C library (PAPI) that would have to be installed first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import struct
from dataclasses import dataclass, field
from pathlib import Path

# linux/perf_event.h
PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE = 0, 1
PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_HW_INSTRUCTIONS = 0, 1
PERF_COUNT_SW_TASK_CLOCK = 1
_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER8 and later kernels accept this size
# the attr's flags word: inherit (bit 1), exclude_kernel (5), exclude_hv (6); counting from the open
_FLAGS = (1 << 1) | (1 << 5) | (1 << 6)
_SYSCALL = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331}

#: The counters the probe asks for, by name: (type, config).
HARDWARE: dict[str, tuple[int, int]] = {
    "instructions": (PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS),
    "cycles": (PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES),
}
SOFTWARE: dict[str, tuple[int, int]] = {"task_clock_ns": (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK)}


def _attr(kind: int, config: int) -> bytes:
    # struct perf_event_attr: type u32, size u32, config u64, sample_period u64, sample_type u64,
    # read_format u64, flags u64, then fields left zero up to the size given.
    head = struct.pack("=IIQQQQQ", kind, _ATTR_SIZE, config, 0, 0, 0, _FLAGS)
    return head + bytes(_ATTR_SIZE - len(head))


def _syscall():
    number = _SYSCALL.get(platform.machine())
    if number is None:
        return None, f"perf_event_open: no syscall number known for {platform.machine()}"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = libc.syscall
    fn.restype = ctypes.c_long
    return (lambda attr, tid: fn(number, attr, ctypes.c_int(tid), ctypes.c_int(-1), ctypes.c_int(-1),
                                 ctypes.c_ulong(0))), ""


@dataclass
class Counters:
    """Open counters of this process's threads; :meth:`read` sums each over them."""

    names: tuple[str, ...]
    fds: dict[str, list[int]] = field(default_factory=dict)

    def read(self) -> dict[str, int]:
        return {name: sum(struct.unpack("=Q", os.read(fd, 8))[0] for fd in fds) for name, fds in self.fds.items()}

    def close(self) -> None:
        for fds in self.fds.values():
            for fd in fds:
                os.close(fd)
        self.fds = {}


def _why(err: int, events: dict[str, tuple[int, int]]) -> str:
    paranoid = _read("/proc/sys/kernel/perf_event_paranoid")
    pmus = sorted(p.name for p in Path("/sys/bus/event_source/devices").glob("*")) or ["none"]
    what = ", ".join(events)
    if err == errno.ENOENT or err == errno.EOPNOTSUPP:
        return (f"{what}: not counted: this kernel exposes no hardware PMU for them (PMUs: {', '.join(pmus)}; "
                "a VM without a virtual PMU)")
    if err in (errno.EACCES, errno.EPERM):
        return (f"{what}: not counted: perf_event_open was refused (perf_event_paranoid {paranoid}; "
                "a container's seccomp profile may also forbid it)")
    return f"{what}: not counted: perf_event_open failed ({errno.errorcode.get(err, err)})"


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "unreadable"


def open_counters(events: dict[str, tuple[int, int]] = HARDWARE) -> tuple[Counters | None, str]:
    """``events`` counted for every thread of this process (and the threads they start),
    from now on; or None and one line saying why not."""
    if not hasattr(os, "sched_getaffinity") or not Path("/proc/self/task").is_dir():
        return None, f"{', '.join(events)}: not counted: perf_event_open is Linux's"
    call, why = _syscall()
    if call is None:
        return None, why
    counters = Counters(tuple(events))
    tids = sorted(int(t.name) for t in Path("/proc/self/task").iterdir() if t.name.isdigit())
    for name, (kind, config) in events.items():
        buf = ctypes.create_string_buffer(_attr(kind, config), _ATTR_SIZE)
        fds = counters.fds.setdefault(name, [])
        for tid in tids:
            fd = call(buf, tid)
            if fd < 0:
                err = ctypes.get_errno()
                if err == errno.ESRCH:  # the thread ended meanwhile
                    continue
                counters.close()
                return None, _why(err, events)
            fds.append(int(fd))
    return counters, f"{', '.join(events)}: counted by perf_event_open over {len(tids)} threads (user space)"
