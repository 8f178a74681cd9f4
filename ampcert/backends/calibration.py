"""The speed probe's calibration kernel: a fixed piece of work that does not depend on
the code under test, timed beside the training steps so that a step's cost can also be
expressed in units of it (ampcert/backends/speed_probe.py).

It is a small matmul and a memory copy on the run's device, in the run's framework (the
machine the step runs on is the machine the kernel must see: a GPU's clock, a CPU's
neighbours), and, in torch, a chain of tiny ops (a 16x16 matmul, a tanh and an add, 50
times), whose time is the framework's dispatch and the host's, as most of a small
model's step is. Across ten processes on a 2-core VM, a digits step in units of the
matmul and copy alone varied 1.23%, in units of the tiny ops alone 1.26%, in units of
both 0.87% (the step itself: 3.4%): each part follows a side of the machine that the
other misses. Its size is fixed per device kind, never tuned to the machine, so that its
time is a unit: sized to a CPU's cache (a bigger copy between two windows would evict
what the next window needs, and slow whichever path comes after it), and to a GPU's
launch latency. (A JAX step is one compiled program, with no dispatch per op: its kernel
is the matmul and the copy.) What a unit can hide is in docs/gate.md: a regression in the library
both use (oneDNN's or cuBLAS's matmul, the allocator) slows the kernel too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

#: (matmul size n: an n x n fp32 matmul, copy: fp32 elements) per device kind.
SIZES = {"cpu": (256, 1 << 18), "cuda": (4096, 1 << 26)}
TINY_OPS = 50  # links of the chain of tiny ops (torch)


@dataclass(frozen=True)
class Kernel:
    description: str
    run: Callable[[], None]  # one call of the kernel, finished on the device when it returns

    def time_ms(self) -> float:
        start = time.perf_counter()
        self.run()
        return (time.perf_counter() - start) * 1e3


def _describe(framework: str, device: str, copy_op: str = "copy", tiny: bool = False) -> str:
    n, copy = SIZES[device]
    chain = f", then {TINY_OPS} tiny ops (16x16 matmul, tanh, add)" if tiny else ""
    return f"{framework}: an fp32 {n}x{n} matmul and a {copy * 4 / 2**20:g} MiB {copy_op}{chain} on {device}"


def torch_kernel(device: str) -> Kernel:
    import torch

    n, copy = SIZES[device]
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=generator).to(device) for _ in range(2))
    out = torch.empty(n, n, device=device)
    src = torch.randn(copy, generator=generator).to(device)
    dst = torch.empty_like(src)
    x, w = (torch.randn(16, 16, generator=generator).to(device) for _ in range(2))

    def run() -> None:
        torch.mm(a, b, out=out)
        dst.copy_(src)
        y = x
        for _ in range(TINY_OPS):
            y = torch.tanh(y @ w) + 0.5
        if device == "cuda":
            torch.cuda.synchronize()

    return Kernel(_describe("torch", device, tiny=True), run)


def jax_kernel(device: str) -> Kernel:
    import jax
    import jax.numpy as jnp
    import numpy as np

    n, copy = SIZES[device]
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((n, n), dtype=np.float32)) for _ in range(2))
    src = jnp.asarray(rng.standard_normal(copy, dtype=np.float32))
    # The copy as one elementwise pass into a new buffer (an identity XLA would elide).
    step = jax.jit(lambda a, b, x: (a @ b, x + jnp.float32(1.0)))
    jax.block_until_ready(step(a, b, src))

    def run() -> None:
        jax.block_until_ready(step(a, b, src))

    return Kernel(_describe("jax", device, "elementwise pass"), run)
