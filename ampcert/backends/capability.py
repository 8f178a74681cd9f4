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

from ampcert.amp.precision import FP8_PRECISIONS, REFERENCE, Precision, base_precision, dtype_name
from ampcert.resources import config_path

SPEEDUP_THRESHOLD = 1.1
# On CPUs, 256x256 fp32 ran ~80x below 512x512 (2 vs 160 GFLOP/s with torch 2.13, a different
# kernel below oneDNN's size threshold), which put CPU MFU above 1; 512 reaches the fast path
# and keeps the unaccelerated fp16 probe near 0.5 s.
_SIZES = {"cpu": 512, "cuda": 4096}


def _time_matmul(dtype, device: str, n: int, reps: int) -> float:
    """Best-of-``reps`` seconds for one n x n matmul: the best case is the
    peak we want, and it is the figure least disturbed by other load."""
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b  # warm-up: kernel selection, oneDNN/cuBLAS handles
    best = float("inf")
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def _time_matmul_jax(dtype: str, device: str, n: int, reps: int) -> float:
    """The same measurement through XLA, which has its own CPU kernels (on an
    AVX2 CPU it converts 16-bit operands to fp32 around an fp32 matmul)."""
    import jax
    import jax.numpy as jnp

    dev = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    key = jax.random.PRNGKey(0)
    a = jax.device_put(jax.random.normal(key, (n, n)).astype(dtype), dev)
    mm = jax.jit(lambda x, y: jnp.matmul(x, y, precision="highest"))
    mm(a, a).block_until_ready()  # compile
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        mm(a, a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best


def probe(device: str, precisions: list[str], backend: str = "torch") -> dict[str, dict[str, Any]]:
    """{precision: {accelerated, speedup_vs_fp32, note}} for ``device``, timed
    through the framework that will train (``torch`` or ``jax``)."""
    n = _SIZES[device]
    if backend == "jax":
        dtype = dtype_name  # XLA takes the name
        timer = _time_matmul_jax
    else:
        import torch

        def dtype(precision: str) -> Any:
            return getattr(torch, dtype_name(precision))

        timer = _time_matmul
        if device == "cuda":
            # Plain fp32 is the reference; TF32 would blur the comparison.
            torch.backends.cuda.matmul.allow_tf32 = False
    base = timer(dtype("fp32"), device, n, reps=20)
    flops = 2.0 * n**3
    out: dict[str, dict[str, Any]] = {
        "fp32": {"accelerated": True, "speedup_vs_fp32": 1.0, "note": "reference precision",
                 "measured_flops": flops / base}
    }
    # A recipe computes in its base precision: the base is timed (once), and the recipe
    # takes its finding.
    recipes = [p for p in precisions if base_precision(p) != p]
    timed = list(dict.fromkeys(base_precision(p) for p in precisions))
    for precision in timed:
        if precision == REFERENCE:
            continue
        if precision in FP8_PRECISIONS:
            out[precision] = _fp8_capability(precision, device, out["fp32"]["measured_flops"])
            continue
        missing = _missing_cpu_units(precision) if device == "cpu" else None
        try:
            # Slow paths are ~100x slower: a couple of repetitions is plenty. A fast one gets
            # as many as fp32 had, so that one disturbed repetition cannot flip the verdict.
            # A CPU without the instructions is slow at it whatever the timing reads: one
            # repetition is the evidence the note quotes (three made every plan with bf16 or
            # fp16 about 0.7 s longer each on an AVX2-only CPU).
            t = timer(dtype(precision), device, n, reps=1 if missing else 3 if device == "cpu" else 10)
            if t * 20 < 0.5:
                t = min(t, timer(dtype(precision), device, n, reps=20))
            speedup = base / t
        except RuntimeError as exc:  # e.g. no kernel for this dtype on this device
            out[precision] = {"accelerated": False, "speedup_vs_fp32": None,
                              "note": f"{precision} not supported on {device}: {exc}"}
            continue
        accelerated = speedup >= SPEEDUP_THRESHOLD
        verdict = "accelerated" if accelerated else f"not accelerated on {device} ({backend})"
        # "capability": one matmul's ratio, which the workload's measured speedup (its
        # samples/s over fp32's, data loading and small ops included) rarely reaches
        note = f"{verdict}: capability probe, a {n}x{n} matmul at {speedup:.3g}x fp32"
        if accelerated and missing:
            # A small matmul timed on a loaded 2-core machine once read fp16 at 1.16x fp32 on an
            # AVX2-only CPU (normally ~0.02x): a CPU without the instructions cannot be fast at it.
            accelerated = False
            note = (f"not accelerated on {device} ({backend}): the CPU has none of {missing} "
                    f"(the {n}x{n} matmul read {speedup:.3g}x fp32 throughput, taken as noise)")
        out[precision] = {
            "accelerated": accelerated,
            "speedup_vs_fp32": round(speedup, 4),
            "note": note,
            "measured_flops": flops / t,
        }
    for recipe in recipes:
        base = base_precision(recipe)
        out[recipe] = {**out[base], "note": f"{base}'s, which {recipe} computes in: {out[base]['note']}"}
    for extra in set(timed) - set(precisions) - {REFERENCE}:  # a base no run of the suite trains in
        del out[extra]
    _attach_peaks(out, device, n, backend)
    return out


def _fp8_capability(precision: Precision, device: str, fp32_flops: float) -> dict[str, Any]:
    """FP8 is not timed like a dtype: a device has FP8 tensor cores (compute
    capability >= 8.9; MX blocks >= 10.0) or the run emulates the casts with
    fp32 matmuls, and an emulated run's speed says nothing about FP8."""
    real, why = False, "CPU: no FP8 matmul units"
    if device == "cuda":
        from ampcert.amp.torch.fp8 import has_fp8_tensor_cores

        real, why = has_fp8_tensor_cores(precision)
    if real:
        return {"accelerated": True, "emulated": False, "speedup_vs_fp32": None,
                "note": f"real FP8 matmuls ({why})"}
    return {"accelerated": False, "emulated": True, "speedup_vs_fp32": None, "measured_flops": fp32_flops,
            "note": f"{precision} emulated ({why}): FP8 casts exact, matmuls in fp32; "
                    "speed, memory and energy figures of these runs are not meaningful"}


# The CPU instructions without which a 16-bit matmul has no fast path (it is converted to fp32
# around an fp32 kernel). A measured speed-up on a CPU that lacks all of them is not believed.
_CPU_UNITS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


def _missing_cpu_units(precision: Precision) -> list[str] | None:
    """The instructions of ``precision`` when the CPU reports its flags and has none of
    them; None when it has one, or when the flags cannot be read (then the timing decides)."""
    from ampcert.envinfo import cpu_info

    flags = cpu_info()["flags"]
    units = _CPU_UNITS.get(precision, ())
    if not units or not isinstance(flags, dict) or any(flags.get(u) for u in units):
        return None
    return list(units)


DEVICES_FILE = config_path("devices.yaml")


def datasheet_peaks(device_name: str) -> tuple[dict[str, float], str] | None:
    """Peak dense FLOP/s per precision for a GPU name, from configs/devices.yaml."""
    import yaml

    table = yaml.safe_load(DEVICES_FILE.read_text())["devices"]
    name = device_name.lower()
    for entry in table:
        if all(part.lower() in name for part in entry["match"]):
            peaks = {p: v * 1e12 for p, v in entry["peak_tflops"].items()}
            return peaks, f"{entry['source']} ({entry['name']})"
    return None


def _gpu_name(backend: str) -> str:
    """The first GPU's name as the training framework reports it (a JAX
    suite asks JAX, so planning it needs no torch)."""
    if backend == "jax":
        import jax

        return jax.devices("gpu")[0].device_kind
    import torch

    return torch.cuda.get_device_name()


def _attach_peaks(out: dict[str, dict[str, Any]], device: str, n: int, backend: str = "torch") -> None:
    """The peak MFU is measured against: a datasheet figure for known GPUs,
    else the calibration matmul's own throughput, stated as measured."""
    sheet = None
    if device == "cuda":
        sheet = datasheet_peaks(_gpu_name(backend))
    for precision, cap in out.items():
        base = base_precision(precision)  # a recipe's peak is its base precision's
        if sheet and base in sheet[0]:
            cap["peak_flops"], cap["peak_source"] = sheet[0][base], f"datasheet: {sheet[1]}"
        elif not cap.get("accelerated") and out["fp32"].get("measured_flops"):
            # No native units: the precision is emulated on the fp32 ones, and a
            # single emulated matmul is no ceiling (oneDNN's conv paths beat it
            # several-fold). The hardware's peak is the fp32 one.
            cap["peak_flops"] = out["fp32"]["measured_flops"]
            cap["peak_source"] = (f"measured: {n}x{n} fp32 matmul calibration on {device} "
                                  f"({precision} has no native units here)")
        elif cap.get("measured_flops"):
            cap["peak_flops"] = cap["measured_flops"]
            cap["peak_source"] = f"measured: {n}x{n} {precision} matmul calibration on {device}"
