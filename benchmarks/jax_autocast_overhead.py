"""Step time of ampcert's JAX autocast against the same model hand-cast to bf16, after jit.

What is measured (one process, interleaved rounds): a full jitted training
step (loss, ``jax.grad``, SGD-momentum update via optax) of the tiny GPT of
``ampcert.workloads.jax_models`` (2 pre-LN blocks, d_model 64, 64-byte context,
batch 32 of real text), in four variants that see the same batch:

``fp32``
    the model as written.
``hand-cast``
    jmp-style: parameters and inputs cast to bfloat16 by hand, the whole
    forward in bf16, logits cast to fp32 for the loss. What a careful user
    writes without an autocast.
``autocast``
    ``ampcert.amp.jax.autocast(loss, dtype=bfloat16)`` with the shipped policy
    (``configs/policies/jax.yaml``): bf16 matmuls with fp32 accumulation,
    and fp32 exp/log/reductions/normalisation statistics.
``autocast-matmul-only``
    autocast with a policy whose only entries are the two products (no fp32
    family, no fp32 accumulation), so its dtype decisions are the hand-cast
    ones and the ratio isolates what the rewrite itself costs after jit.

After compilation and a warm-up, R rounds run the variants back to back
(rotating the order), each timing K steps with ``block_until_ready``.
Reported: median ms/step per variant, ratios of medians with a 95% bootstrap
interval over rounds, and ratios of the per-variant minima. The goal of
issue 5 is autocast-matmul-only / hand-cast <= 1.02 (the rewrite leaves no
runtime cost); autocast / hand-cast shows what the policy's fp32 islands cost.
The script always exits 0: it is a measurement, not a test.

Run from the repository root::

    .venv/bin/python benchmarks/jax_autocast_overhead.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from timing import interleaved, ratio_stats, run_measurement, write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds (< 1 minute)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="steps timed per variant per round")
    ap.add_argument("--json", type=str, default=None, help="also write the figures here")
    args = ap.parse_args()
    rounds = args.rounds or (6 if args.quick else 15)
    steps = args.steps or (5 if args.quick else 10)

    import jax
    import jax.numpy as jnp
    import optax

    from ampcert.amp.jax import autocast
    from ampcert.amp.policy import OpPolicy
    from ampcert.workloads import gpt

    task = gpt.WORKLOAD.build_jax(gpt.GPTParams(size="tiny"), 0, "cpu")
    x = jnp.asarray(task.train_x[: task.batch_size])
    y = jnp.asarray(task.train_y[: task.batch_size])
    bf16 = jnp.bfloat16

    def loss_fp32(p, x, y):
        return task.loss_fn(task.apply(p, {}, x, True)[0], y)

    def loss_hand(p, x, y):
        p16 = jax.tree_util.tree_map(lambda a: a.astype(bf16), p)
        logits = task.apply(p16, {}, x, True)[0]
        return task.loss_fn(logits.astype(jnp.float32), y)

    matmul_only = OpPolicy(name="matmul-only", device_type="any", framework="jax",
                           ops={"dot_general": "lower_precision", "conv_general_dilated": "lower_precision"})
    variants = {
        "fp32": loss_fp32,
        "hand-cast": loss_hand,
        "autocast": autocast(loss_fp32, dtype=bf16),
        "autocast-matmul-only": autocast(loss_fp32, matmul_only, dtype=bf16),
    }
    tx = optax.sgd(0.03, momentum=0.9)

    def make_step(loss):
        @jax.jit
        def step(p, opt_state, x, y):
            value, grads = jax.value_and_grad(loss)(p, x, y)
            updates, opt_state = tx.update(grads, opt_state, p)
            return optax.apply_updates(p, updates), opt_state, value
        return step

    steps_fn = {name: make_step(fn) for name, fn in variants.items()}
    states = {name: (task.params, tx.init(task.params)) for name in variants}
    t_compile = {}
    for name, fn in steps_fn.items():
        t0 = time.perf_counter()
        p, o, v = fn(*states[name], x, y)
        jax.block_until_ready(v)
        t_compile[name] = time.perf_counter() - t0
        states[name] = (p, o)
        for _ in range(3):  # warm-up
            p, o, v = fn(p, o, x, y)
        jax.block_until_ready(p)

    names = list(variants)

    def one_step(name: str) -> Callable[[], None]:
        def step() -> None:  # one jitted step, blocked until ready, its state carried to the next
            p, o, v = steps_fn[name](*states[name], x, y)
            jax.block_until_ready(v)
            states[name] = (p, o)
        return step

    per_round = interleaved({n: one_step(n) for n in names}, rounds, steps)

    def ratio(a: str, b: str) -> dict:
        r = ratio_stats(per_round[b], per_round[a])  # a over b, rounds resampled in pairs
        return {"median_ratio": r["ratio"], "ci95": [r["ci_lo"], r["ci_hi"]], "min_ratio": r["ratio_of_min"]}

    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "jax": jax.__version__, "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
        "cpu_count": os.cpu_count(), "platform": platform.platform(),
        "rounds": rounds, "steps_per_round": steps,
        "median_ms": {n: statistics.median(v) for n, v in per_round.items()},
        "min_ms": {n: min(v) for n, v in per_round.items()},
        "compile_s": t_compile,
        "ratios": {
            "autocast-matmul-only / hand-cast": ratio("autocast-matmul-only", "hand-cast"),
            "autocast / hand-cast": ratio("autocast", "hand-cast"),
            "autocast / fp32": ratio("autocast", "fp32"),
            "hand-cast / fp32": ratio("hand-cast", "fp32"),
        },
    }
    print(f"$ {result['command']}")
    print(f"jax {result['jax']} on {result['backend']} ({result['device']}), {rounds} rounds x {steps} steps, "
          "tiny GPT training step (jit, grad, SGD momentum)")
    for n in names:
        print(f"  {n:<22} median {result['median_ms'][n]:8.2f} ms/step   min {result['min_ms'][n]:8.2f}   "
              f"compile {t_compile[n]:.2f} s")
    for label, rr in result["ratios"].items():
        lo, hi = rr["ci95"]
        print(f"  {label:<34} {rr['median_ratio']:.3f}  (95% CI {lo:.3f}-{hi:.3f}; ratio of minima "
              f"{rr['min_ratio']:.3f})")
    goal = result["ratios"]["autocast-matmul-only / hand-cast"]["median_ratio"]
    print(f"goal: autocast-matmul-only / hand-cast <= 1.02: {'met' if goal <= 1.02 else 'NOT met'} ({goal:.3f})")
    write_json(Path(args.json) if args.json else None, result)


if __name__ == "__main__":
    run_measurement(main)
