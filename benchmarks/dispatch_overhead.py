"""Per-op cost of ampcert's torch autocast against torch.autocast, where the host is the step.

What is measured: on tiny tensors (8x8), an op's kernel is shorter than its dispatch, so
the time per op is the host's cost of getting to the kernel: the regime of every GPU step
whose kernels are shorter than their launch (small models, small batches, decode-like
shapes). One thread (``torch.set_num_threads(1)``); each variant runs the same chains:

* ``linear+relu``: ``relu(linear(x, w, b))``, the weights fp32 leaves that require grad
  (autocast casts them once per region, through its weight cache); ``linear`` is cast to
  the low dtype, ``relu`` is in no family and runs as it is;
* ``mixed``: ``linear`` then ``add`` (promote) of an fp32 tensor and ``softmax`` (fp32);
* ``einsum+relu``: ``relu(einsum("ij,kj->ik", x, w))``; ``einsum`` is in ampcert's CPU
  policy and in no native list (natively its inner ``bmm`` is cast), so ampcert's own
  kernel at the dispatcher's Autocast key decides it: the cost of an op where a policy
  differs from native;

each under no autocast (``none``), ``torch.autocast("cpu", torch.bfloat16)`` (``native``),
a TorchFunctionMode that only calls the op (``mode-only``: the floor of any autocast built
on one, as ampcert's Python engine is) and ``ampcert.amp.autocast("cpu", torch.bfloat16)``
(``ampcert``: the dispatcher engine, native's kernels for ``linear``, ``add``, ``softmax``),
the region entered once
around a chain of ``--ops`` ops, outside the timed loop's per-op cost. After a warm-up,
``--rounds`` rounds run the variants back to back, the order rotating each round; reported:
median microseconds per op of each variant, the ratio ampcert/native of the medians with a
95% bootstrap interval over rounds (resampled as pairs, so load shared by a round cancels),
and the overhead over ``none`` of each. Goal (issue 34): ampcert/native <= 1.25 per op.

The script prints the CPU flags it ran on and its own command line, and always exits 0:
it is a measurement, not a test. Run from the repository root::

    .venv/bin/python benchmarks/dispatch_overhead.py [--rounds 15] [--ops 3000] [--json out.json]
    python benchmarks/dispatch_overhead.py --device cuda [--dtype fp16]   # on a GPU

On CUDA the regions are ``torch.autocast("cuda")`` and ``ampcert.amp.autocast("cuda")``
(fp16 by default), the device is synchronized before each round's clock stops, and the
third chain is ``relu(matrix_power(y, 2))``: native CUDA autocast lists ``einsum``, and
``matrix_power`` is the op ampcert's kernel decides there.

About 30 s with the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from timing import interleaved  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from ampcert.amp import autocast as amp_autocast  # noqa: E402
from ampcert.envinfo import cpu_info, load_average  # noqa: E402

GOAL = 1.25
SIZE = 8


def chains(ops: int, device: str = "cpu") -> dict[str, tuple[Callable[[], object], int]]:
    """Each workload: a function running about ``ops`` ops, and how many it runs."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(SIZE, SIZE, generator=g).to(device).requires_grad_()
    b = torch.randn(SIZE, generator=g).to(device).requires_grad_()
    x = torch.randn(SIZE, SIZE, generator=g).to(device)
    r = torch.randn(SIZE, SIZE, generator=g).to(device)
    pairs, triples = ops // 2, ops // 3

    def linear_relu() -> object:
        y = x
        with torch.no_grad():
            for _ in range(pairs):
                y = torch.relu(F.linear(y, w, b))
        return y

    def mixed() -> object:
        y = x
        with torch.no_grad():
            for _ in range(triples):
                y = torch.softmax(F.linear(y, w, b) + r, dim=-1)
        return y

    def kernel_op() -> object:
        y = x
        with torch.no_grad():
            for _ in range(pairs):
                y = torch.relu(torch.einsum("ij,kj->ik", y, w))
        return y

    def kernel_op_cuda() -> object:
        y = x
        with torch.no_grad():
            for _ in range(pairs):
                y = torch.relu(torch.matrix_power(y, 2))
        return y

    if device == "cuda":  # native CUDA autocast lists einsum; matrix_power is ampcert's kernel there
        return {"linear+relu": (linear_relu, 2 * pairs), "mixed": (mixed, 3 * triples),
                "matrix_power+relu": (kernel_op_cuda, 2 * pairs)}
    return {"linear+relu": (linear_relu, 2 * pairs), "mixed": (mixed, 3 * triples),
            "einsum+relu": (kernel_op, 2 * pairs)}


class PassThrough(TorchFunctionMode):
    """A TorchFunctionMode that decides nothing: the floor of any autocast built on one."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def variants(device: str, dtype: torch.dtype) -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    return {
        "none": contextlib.nullcontext,
        "native": lambda: torch.autocast(device, dtype=dtype),
        "mode-only": PassThrough,
        "ampcert": lambda: amp_autocast(device, dtype),
    }


def measure(fn: Callable[[], object], n_ops: int, rounds: int, device: str = "cpu",
            dtype: torch.dtype = torch.bfloat16) -> dict[str, list[float]]:
    """Microseconds per op of each variant, one figure per round, order rotating (on CUDA
    the device is synchronized before the clock stops)."""
    regions = variants(device, dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for region in regions.values():  # warm-up: caches, the op-name map, the policy file
        with region():
            fn()
    # Each slot runs fn once inside its region, entered outside the clock.
    per_ms = interleaved(dict.fromkeys(regions, fn), rounds, 1, sync=sync, around=lambda name: regions[name]())
    return {name: [ms * 1e3 / n_ops for ms in times] for name, times in per_ms.items()}


def ratio(base: list[float], other: list[float], n_boot: int = 2000) -> dict[str, float]:
    a, b = np.asarray(base), np.asarray(other)
    idx = np.random.default_rng(0).integers(0, len(a), size=(n_boot, len(a)))
    boots = np.median(b[idx], axis=1) / np.median(a[idx], axis=1)
    return {"ratio": float(np.median(b) / np.median(a)),
            "ci_lo": float(np.percentile(boots, 2.5)), "ci_hi": float(np.percentile(boots, 97.5))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ops", type=int, default=3000, help="ops per timed chain")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), help="default: bf16 on cpu, fp16 on cuda")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype or ("fp16" if args.device == "cuda" else "bf16")]
    torch.set_num_threads(1)
    cpu = cpu_info()
    flags = cpu["flags"] if isinstance(cpu["flags"], dict) else {}
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"cpu: {cpu['model']}; flags: {', '.join(f for f, on in flags.items() if on) or 'unknown'}")
    where = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, 1 thread; {where}, {dtype}; tensors {SIZE}x{SIZE}; load before: {load_average()}")
    out: dict[str, object] = {"torch": torch.__version__, "cpu": cpu["model"], "flags": flags, "device": where,
                              "dtype": str(dtype), "workloads": {}}
    for label, (fn, n_ops) in chains(args.ops, args.device).items():
        per = measure(fn, n_ops, args.rounds, args.device, dtype)
        med = {n: float(np.median(v)) for n, v in per.items()}
        vs_native = ratio(per["native"], per["ampcert"])
        verdict = "meets" if vs_native["ratio"] <= GOAL else "misses"
        print(f"\n{label} ({n_ops} ops a chain, {args.rounds} rounds): median us/op  "
              + "  ".join(f"{n} {m:.2f}" for n, m in med.items()))
        print(f"  ampcert/native {vs_native['ratio']:.2f} [95% CI {vs_native['ci_lo']:.2f}, {vs_native['ci_hi']:.2f}]"
              f" ({verdict} the goal <= {GOAL}); overhead over none: native {med['native'] - med['none']:+.2f} us,"
              f" a mode that decides nothing {med['mode-only'] - med['none']:+.2f} us,"
              f" ampcert {med['ampcert'] - med['none']:+.2f} us")
        out["workloads"][label] = {"us_per_op": med, "ampcert_over_native": vs_native, "rounds": per}  # type: ignore[index]
    print(f"\nload after: {load_average()}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
