"""An eager GPT training step under ampcert's autocast against torch.autocast, host-bound.

What is measured (issue 34, deliverable 5): at a small batch a GPU runs each of the step's
kernels faster than the host launches it, so the step's time is the host's: dispatch,
autograd and the autocast's decisions, op by op. An autocast that costs more per op than
native shows there first, so this is where ampcert's must cost no more than native's.

The model is the ``gpt`` workload's (``ampcert.workloads.torch_models.gpt_model``); the
default ``--size base`` is GPT-2 small's shape (12 layers x 768, 12 heads) with the
workload's 256-byte vocabulary and 256-byte context. A step is what users write:
``zero_grad``, forward and loss inside the autocast (the context manager made each step),
``backward``, AdamW's step; with ``--dtype fp16`` the loss is scaled, by
``torch.amp.GradScaler`` under torch.autocast and by ampcert's ``DynamicLossScaler`` under
ampcert's (so that row prices the scaler too). Three variants, each on its own copy of one
seeded model, see the same batches:

* ``torch.autocast`` (the baseline);
* ``ampcert.amp.autocast``;
* ``torch.autocast, again``: the baseline on a third copy, whose ratio is the noise two
  identical engines show in this run.

Method: a warm-up, then ``--rounds`` rounds, the variants back to back in an order that
rotates each round, each timing ``--steps`` steps with ``time.perf_counter`` and a device
synchronize before the clock stops. Reported: median ms per step, the ratio of medians to
the baseline with a 95% bootstrap interval over rounds (resampled as pairs), and the
ratio of minima. Whether the host bounds the step is measured, not assumed: the
baseline's step at ``4 x --batch`` against its step at ``--batch`` (near 1: the host
bounds it; near 4: the device does). Goal (issue 34): ampcert / native <= 1.00 within the
control's noise. ``--compile BACKEND`` compiles each variant's whole step (forward, loss,
backward, the scaler's or optimizer's step) as one ``torch.compile``d function, the first
step eager; ampcert's region inside it needs torch 2.13+. The script prints its command, device and CPU flags, and always exits 0:
it is a measurement, not a test. Run from the repository root::

    python benchmarks/gpt_step_overhead.py --device cuda [--size base] [--batch 1] [--json out.json]
    .venv/bin/python benchmarks/gpt_step_overhead.py --device cpu --size tiny --rounds 5   # a CPU check
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
for _path in (_ROOT, _ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch  # noqa: E402
from timing import comparison, format_table, interleaved, run_measurement  # noqa: E402

from ampcert.amp import DynamicLossScaler  # noqa: E402
from ampcert.amp import autocast as amp_autocast  # noqa: E402
from ampcert.amp.torch.support import REGION_IN_TRACE_MIN, release, release_name  # noqa: E402
from ampcert.envinfo import cpu_info, load_average  # noqa: E402
from ampcert.workloads.gpt_prep import GPTParams  # noqa: E402
from ampcert.workloads.torch_models import gpt_model, loss_fn  # noqa: E402

GOAL = 1.00
NATIVE, AMPCERT, AGAIN = "torch.autocast", "ampcert autocast", "torch.autocast, again"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def make_step(model: torch.nn.Module, batches: list, device: str, dtype: torch.dtype, engine: str,
              compile_backend: str | None = None) -> Callable[[], None]:
    """One training step as users write it, for ``engine`` ("native" or "ampcert"); with
    ``compile_backend``, the whole step compiled as one function (its first call eager:
    it creates the optimizer's state), as users compile one."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler: Any = None
    if dtype is torch.float16:
        scaler = torch.amp.GradScaler(device) if engine == "native" else DynamicLossScaler(device)
    it = itertools.count()

    def train(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        region = torch.autocast(device, dtype=dtype) if engine == "native" else amp_autocast(device, dtype)
        with region:
            loss = loss_fn(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    compiled = torch.compile(train, backend=compile_backend) if compile_backend else train

    def step() -> None:
        n = next(it)
        (train if n == 0 else compiled)(*batches[n % len(batches)])

    return step


def batches_of(params: GPTParams, batch: int, device: str, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    seq = params.seq_len
    out = []
    for _ in range(n):
        tokens = torch.randint(0, 256, (batch, seq + 1), generator=gen)
        out.append((tokens[:, :-1].to(device), tokens[:, 1:].to(device)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--size", choices=("tiny", "small", "base"), default="base",
                    help="the gpt workload's size (base: GPT-2 small's 12 x 768)")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    ap.add_argument("--batch", type=int, default=1, help="sequences per step (small: the host bounds the step)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10, help="steps per variant per round")
    ap.add_argument("--compile", metavar="BACKEND", help="compile each variant's whole step with this "
                    "torch.compile backend (inductor, aot_eager); needs torch 2.13+ for ampcert's region")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    if args.compile and release(torch.__version__) < REGION_IN_TRACE_MIN:
        ap.error(f"--compile: ampcert's region inside a compiled step needs torch "
                 f"{release_name(REGION_IN_TRACE_MIN)}+ (this is {torch.__version__})")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (use --device cpu for a CPU check)")
    if args.batch < 1 or args.rounds < 2 or args.steps < 1:
        ap.error("--batch and --steps: at least 1; --rounds: at least 2")
    device, dtype = args.device, DTYPES[args.dtype]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    params = GPTParams(size=args.size)
    cpu = cpu_info()
    flags = cpu["flags"] if isinstance(cpu["flags"], dict) else {}
    where = torch.cuda.get_device_name() if device == "cuda" else cpu["model"]
    print(f"command: {shlex.join([Path(sys.executable).name, *sys.argv])}")
    print(f"device: {where}; cpu: {cpu['model']}; flags: {', '.join(f for f, on in flags.items() if on) or 'unknown'}")
    print(f"torch {torch.__version__}; load before: {load_average()}")

    torch.manual_seed(0)
    base = gpt_model(params, seed=0).to(device)
    n_params = sum(p.numel() for p in base.parameters())
    print(f"model: gpt {args.size} ({params.n_layer} x {params.d_model}, {params.n_head} heads, context "
          f"{params.seq_len}; {n_params / 1e6:.1f} M parameters), {args.dtype}, batch {args.batch}")

    # Does the host bound the step? The baseline at 4x the batch against at the batch.
    probe = {f"batch {b}": make_step(copy.deepcopy(base), batches_of(params, b, device), device, dtype, "native")
             for b in (args.batch, 4 * args.batch)}
    per = interleaved(probe, rounds=3, steps=args.steps, warmup=3, sync=sync)
    small, large = (min(v) for v in per.values())
    print(f"host-bound check: the step at batch {4 * args.batch} takes {large / small:.2f}x the step at batch "
          f"{args.batch} ({small:.2f} vs {large:.2f} ms; ~1: the host bounds it, ~4: the device does)")

    batches = batches_of(params, args.batch, device)
    variants = {
        NATIVE: make_step(copy.deepcopy(base), batches, device, dtype, "native", args.compile),
        AMPCERT: make_step(copy.deepcopy(base), batches, device, dtype, "ampcert", args.compile),
        AGAIN: make_step(copy.deepcopy(base), batches, device, dtype, "native", args.compile),
    }
    per = interleaved(variants, rounds=args.rounds, steps=args.steps, warmup=3, sync=sync)
    comp = comparison(f"gpt {args.size} train step{' compiled (' + args.compile + ')' if args.compile else ''} "
                      f"on {device}, {args.dtype}, batch {args.batch}, "
                      f"{args.steps} steps/round", NATIVE, per, {AMPCERT: GOAL})
    print()
    print(format_table(comp))
    print(f"\nload after: {load_average()}")
    if args.json:
        args.json.write_text(json.dumps({"command": sys.argv, "device": where, "torch": torch.__version__,
                                         "flags": flags, "host_bound_ratio": large / small, "comparison": comp},
                                        indent=1, default=str))


if __name__ == "__main__":
    run_measurement(main)
