"""What MKL's reproducible mode costs: gpt tiny's fp32 training step with ``MKL_CBWR=AUTO``
(what every ampcert run asks for, backends/torch_mkl.py) against MKL's default, and
whether each mode gives the same bits in every process.

Each round trains gpt tiny (fp32, seed 0, batch and optimizer as the workload defines
them) for ``--steps`` steps in two fresh processes, one per mode, the order alternating
by round; a process times its steps after ``--warmup`` untimed ones (perf_counter; CPU
kernels run synchronously) and reports its median step time, its final weights' digest
and the mode MKL reports. Reported: the median over rounds of AUTO's step time over the
default's in the same round (the control), with the rounds' range, and how many distinct
digests each mode gave, and whether the modes agree. The CPU's flags decide what MKL runs (on AMD CPUs both modes
take the same generic path), so quote them with the figures. Always exits 0.

Run from the repository root::

    .venv/bin/python benchmarks/mkl_cnr.py [--rounds 5] [--steps 30] [--warmup 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
import torch
from ampcert.backends import torch_mkl
from ampcert.backends.torch_backend import weights_digest
from ampcert.backends.loop import index_batches
from ampcert.workloads import registry

steps, warmup = int(sys.argv[1]), int(sys.argv[2])
mode = torch_mkl.cnr_mode()  # before any MKL call: read from the environment as given
workload = registry.get("gpt")
task = workload.build(workload.Params.model_validate({"size": "tiny"}), 0, "cpu")
model, opt = task.model, task.make_optimizer(task.model.parameters())
batches = index_batches(len(task.train_x), task.batch_size, 0)
times = []
for step in range(warmup + steps):
    idx = torch.from_numpy(next(batches))
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    task.loss_fn(model(task.train_x[idx]), task.train_y[idx]).backward()
    opt.step()
    if step >= warmup:
        times.append(time.perf_counter() - t0)
print(json.dumps({"mode": mode, "ms": 1e3 * statistics.median(times), "digest": weights_digest(model)}))
"""


def _child(mode: str | None, steps: int, warmup: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if mode is not None:
        env["MKL_CBWR"] = mode
    out = subprocess.run([sys.executable, "-c", CHILD, str(steps), str(warmup)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    ratios, digests = [], {"AUTO": set(), "default": set()}
    reported = {}
    for r in range(args.rounds):
        order = [("AUTO", "AUTO"), ("default", None)]
        got = {name: _child(mode, args.steps, args.warmup) for name, mode in (order if r % 2 == 0 else order[::-1])}
        for name, res in got.items():
            digests[name].add(res["digest"])
            reported[name] = res["mode"]
        ratios.append(got["AUTO"]["ms"] / got["default"]["ms"])
        print(f"round {r + 1}: AUTO {got['AUTO']['ms']:.2f} ms/step, default {got['default']['ms']:.2f} ms/step "
              f"(MKL reports {got['AUTO']['mode']} / {got['default']['mode']})", flush=True)
    print(f"AUTO / default step time: median {statistics.median(ratios):.3f} "
          f"(rounds {min(ratios):.3f}-{max(ratios):.3f}, {args.rounds} rounds of {args.steps} steps)")
    for name in ("AUTO", "default"):
        print(f"{name} (MKL: {reported[name]}): {len(digests[name])} distinct weight digest(s) over "
              f"{args.rounds} processes")
    print("the two modes computed the same weights" if digests["AUTO"] == digests["default"]
          else "the two modes computed different weights (MKL took other paths)")


if __name__ == "__main__":
    main()
