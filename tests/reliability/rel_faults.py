"""Workloads that run out of memory on purpose, boundedly (test only).

Plugin workloads named in suites as ``reliability.rel_faults:oom`` (tests/ is on
the workers' path, and tests/reliability is a namespace package). Each caps
its own address space at what it already uses plus a little, with
RLIMIT_AS, then allocates past it: a real out-of-memory failure inside the
worker that can never take the machine's memory.
"""

from __future__ import annotations

import os
import resource
import time

import torch

from ampcert.workloads.digits import DigitsWorkload

HEADROOM = 256 << 20


def _cap_address_space() -> None:
    """Let this process map at most HEADROOM more bytes than it maps now (for good)."""
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = mapped + HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


class _OutOfMemory(DigitsWorkload):
    summary = "digits, made to run out of memory at step 2 (test only)"

    def build(self, params, seed, device):
        task = super().build(params, seed, device)
        task.augment = lambda x, y, step: (self.at_step(step, x), y)
        return task

    def at_step(self, step: int, x: torch.Tensor) -> torch.Tensor:
        if step == 2:
            _cap_address_space()
            self.exhaust()
        return x

    def exhaust(self) -> None:
        raise NotImplementedError


class TensorOOM(_OutOfMemory):
    """One large tensor the allocator cannot get (torch's "can't allocate memory")."""

    name = "oom"

    def exhaust(self) -> None:
        torch.empty(8 << 30, dtype=torch.uint8)


class GrowingOOM(_OutOfMemory):
    """Python objects growing until the interpreter raises MemoryError."""

    name = "oom_python"

    def exhaust(self) -> None:
        hoard = []
        while True:
            hoard.append(bytearray(16 << 20))


oom, oom_python = TensorOOM(), GrowingOOM()


class Gate(DigitsWorkload):
    """Digits that waits at step 2 until the file named by $AMPCERT_TEST_GATE
    exists: a run that is certainly in progress while a test looks at it."""

    name = "gate"
    summary = "digits, paused at step 2 until a file appears (test only)"

    def build(self, params, seed, device):
        task = super().build(params, seed, device)
        task.augment = lambda x, y, step: (self.at_step(step, x), y)
        return task

    def at_step(self, step: int, x: torch.Tensor) -> torch.Tensor:
        if step == 2:
            gate = os.environ["AMPCERT_TEST_GATE"]
            deadline = time.monotonic() + 300
            while not os.path.exists(gate):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{gate} never appeared")
                time.sleep(0.05)
        return x


gate = Gate()
