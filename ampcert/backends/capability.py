"""Does this device accelerate a precision? Measured, not assumed.

CPU support for bf16/fp16 varies by generation (AVX512-BF16 and AMX make bf16
fast; AVX2-only parts run bf16 and fp16 matmuls ~100x slower than fp32), so
a lookup table would be wrong somewhere. We time one square matmul per
precision and call a precision accelerated when it beats fp32's throughput
by ``SPEEDUP_THRESHOLD``. The ratio goes into the plan so a reader sees the
evidence, and the plan is stored so that ``--resume`` never re-decides.
"""

from __future__ import annotations

import time
from typing import Any

SPEEDUP_THRESHOLD = 1.1
_SIZES = {"cpu": 256, "cuda": 4096}


def _time_matmul(dtype, device: str, n: int, reps: int) -> float:
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b  # warm-up: kernel selection, oneDNN/cuBLAS handles
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


def probe(device: str, precisions: list[str]) -> dict[str, dict[str, Any]]:
    """{precision: {accelerated, speedup_vs_fp32, note}} for ``device``."""
    import torch

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    n = _SIZES[device]
    if device == "cuda":
        # Plain fp32 is the reference; TF32 would blur the comparison.
        torch.backends.cuda.matmul.allow_tf32 = False
    base = _time_matmul(torch.float32, device, n, reps=10)
    out: dict[str, dict[str, Any]] = {
        "fp32": {"accelerated": True, "speedup_vs_fp32": 1.0, "note": "reference precision"}
    }
    for precision in precisions:
        if precision == "fp32":
            continue
        try:
            # Slow paths are ~100x slower: a couple of repetitions is plenty.
            t = _time_matmul(dtypes[precision], device, n, reps=2 if device == "cpu" else 10)
            speedup = base / t
        except RuntimeError as exc:  # e.g. no kernel for this dtype on this device
            out[precision] = {"accelerated": False, "speedup_vs_fp32": None,
                              "note": f"{precision} not supported on {device}: {exc}"}
            continue
        accelerated = speedup >= SPEEDUP_THRESHOLD
        verdict = "accelerated" if accelerated else f"not accelerated on {device}"
        out[precision] = {
            "accelerated": accelerated,
            "speedup_vs_fp32": round(speedup, 4),
            "note": f"{verdict}: {n}x{n} matmul runs at {speedup:.3g}x fp32 throughput",
        }
    return out
