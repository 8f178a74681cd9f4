"""Overhead of ampcert's AMP engine against PyTorch's own, measured on this machine.

What is measured (one process, one interleaved run):

1. **Autocast step time.**  A full eager training step (zero_grad, forward + loss
   under autocast, backward, SGD-momentum step) with ``ampcert.amp.autocast("cpu",
   torch.bfloat16)`` against ``torch.autocast("cpu", dtype=torch.bfloat16)``, on
   (a) the digits CNN (``DigitsCNN(16, 64)``, batch 64 of the real digits data from
   ``load_digits_tensors``) and (b) a pre-LN transformer block (LayerNorm ->
   causal multi-head self-attention via ``F.scaled_dot_product_attention`` ->
   residual -> LayerNorm -> GELU MLP -> residual).  The context manager is built
   inside every step, as user code does.  Goal (issue 34): ampcert/native <= 1.00.
   A control row times torch.autocast again on its own copy of the model: its
   ratio is the noise two identical engines show in the same run.
2. **Loss-scaler step overhead.**  ``DynamicLossScaler("cpu")`` (default: sync_free
   off on CPU) and ``DynamicLossScaler("cpu", sync_free=True)`` against
   ``torch.amp.GradScaler("cpu")``; fp32 digits CNN, SGD momentum; a step is
   ``scale(loss).backward(); step(opt); update()``.  Goal (default): <= 1.02.
3. **torch.compile compatibility.**  ``torch._dynamo.explain`` on a forward (and,
   in the full run, a training step and the transformer block) under ampcert's
   autocast vs ``torch.autocast``: graph count, graph-break count, deduplicated
   break reasons.  Then ``torch.compile`` (``aot_eager``; the full run also tries
   ``eager`` and ``inductor``) of the ampcert forward, checked against eager.
   Failures are reported as text, never raised.

Method: every variant of a comparison gets a deepcopy of the same seeded model
and sees the same batches.  After a warm-up, R rounds run the variants back to
back, the order rotating every round, each timing K steps with
``time.perf_counter``.  Reported: median ms/step per variant, ratio of medians,
a 95% bootstrap interval of that ratio (rounds resampled as pairs, so load drift
shared by a round cancels), and the ratio of the per-variant minima.  The torch
thread count is left as it is and printed.  The script always exits 0: it is a
measurement, not a test.

Run from the repository root::

    .venv/bin/python benchmarks/amp_overhead.py [--quick] [--json out.json]

``--quick`` (< 60 s) uses fewer rounds and only the cheapest compile checks; the
full run takes about 2-3 minutes on a 2-core CPU.  Note that bf16 matmuls are
much slower than fp32 on CPUs without AVX512-BF16/AMX, so absolute times there
say little; the ratios are the point.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import itertools
import logging
import os
import platform
import re
import shlex
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from timing import comparison, format_table, interleaved, run_measurement, write_json  # noqa: E402
from torch import nn  # noqa: E402

from ampcert.amp import DynamicLossScaler  # noqa: E402
from ampcert.amp import autocast as amp_autocast  # noqa: E402
from ampcert.envinfo import cpu_info, load_average  # noqa: E402
from ampcert.workloads.digits import DigitsCNN, load_digits_tensors  # noqa: E402

AUTOCAST_GOAL = 1.00
#: Section 1's control: torch.autocast again, on its own copy of the model. Its ratio to the
#: baseline is what this machine's noise gives two identical engines in the same run, the
#: yardstick for judging ampcert's ratio against a goal of 1.00.
AGAIN = "torch.autocast bf16, again"
SCALER_GOAL = 1.02
DTYPE = torch.bfloat16


# ---------------------------------------------------------------------------
# machine info
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# models and steps
# ---------------------------------------------------------------------------
class PreLNBlock(nn.Module):
    """LN -> causal MHSA (SDPA) -> residual -> LN -> GELU MLP -> residual."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_ratio * d_model)
        self.fc2 = nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def native_ctx() -> Any:
    return torch.autocast("cpu", dtype=DTYPE)


def ampcert_ctx() -> Any:
    return amp_autocast("cpu", DTYPE)


def digits_batches(x: torch.Tensor, y: torch.Tensor, bs: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    out = []
    for i in range(n):
        idx = order[(i * bs) % (len(x) - bs):][:bs]
        out.append((x[idx].contiguous(), y[idx].contiguous()))
    return out


def make_train_step(model: nn.Module, batches: list, loss_fn: Callable, ctx: Callable[[], Any]) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    it = itertools.cycle(batches)

    def step() -> None:
        xb, yb = next(it)
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()

    return step


def make_scaler_step(model: nn.Module, batches: list, scaler: Any) -> Callable[[], None]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    it = itertools.cycle(batches)

    def step() -> None:
        xb, yb = next(it)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step


# ---------------------------------------------------------------------------
# torch.compile compatibility
# ---------------------------------------------------------------------------
class _DynamoLogCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.recompile_limit_hits = 0
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "recompile_limit" in msg or "cache_size_limit" in msg:
            self.recompile_limit_hits += 1
        if len(self.messages) < 20:
            self.messages.append(msg.splitlines()[0][:200])


@contextlib.contextmanager
def quiet_dynamo():
    """Silence dynamo's warnings on the console, but count recompile-limit hits."""
    handler = _DynamoLogCounter()
    loggers = [logging.getLogger(n) for n in ("torch._dynamo", "torch._inductor", "torch.fx")]
    saved = [(lg, lg.handlers[:], lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers = [handler]
        lg.propagate = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield handler
        finally:
            for lg, handlers, prop in saved:
                lg.handlers = handlers
                lg.propagate = prop


def _short_reason(text: str) -> str:
    """First line of a dynamo reason plus its 'Developer debug context', shortened."""
    text = str(text)
    head = text.strip().splitlines()[0].strip() if text.strip() else "?"
    ctx = ""
    for line in text.splitlines():
        if "Developer debug context:" in line:
            ctx = line.split("Developer debug context:", 1)[1].strip()
            break
    ctx = ctx.replace("TorchInGraphFunctionVariable(", "").replace("GetAttrVariable(", "")
    ctx = re.sub(r" of type object at 0x[0-9a-f]+| objects>|, kind=AllowInGraphKind\.\w+\)|<built-in method |<method ", "", ctx)
    return head + (f" [{ctx[:110]}]" if ctx else "")


def explain_case(fn: Callable, args: tuple, outer: Callable[[], Any] | None = None, max_reasons: int = 4) -> dict[str, Any]:
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        with quiet_dynamo() as logs, (outer() if outer else contextlib.nullcontext()):
            t0 = time.perf_counter()
            ex = dynamo.explain(fn)(*args)
            secs = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - report, don't crash
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
    # where explain() saw each break (file:line of the innermost user frame)
    where: dict[str, set[str]] = {}
    for br in ex.break_reasons:
        stack = getattr(br, "user_stack", None) or []
        if stack:
            f = stack[-1]
            where.setdefault(_short_reason(br.reason), set()).add(f"{Path(f.filename).name}:{f.lineno} ({f.name})")
    # dynamo's counters hold every break (explain's list is partial), deduplicated
    breaks: dict[str, int] = {}
    for reason, n in counters["graph_break"].items():
        key = _short_reason(reason)
        breaks[key] = breaks.get(key, 0) + n
    reasons = [f"{n}x {k}" + (f" @ {', '.join(sorted(where[k]))}" if k in where else "")
               for k, n in sorted(breaks.items(), key=lambda kv: -kv[1])]
    skipped: dict[str, int] = {}
    for reason, n in counters["unimplemented"].items():
        key = _short_reason(reason)
        if key not in breaks:
            skipped[key] = skipped.get(key, 0) + n
    return {
        "ok": True,
        "graph_count": ex.graph_count,
        "graph_break_count": ex.graph_break_count,
        "op_count": ex.op_count,
        "distinct_break_reasons": len(reasons),
        "break_reasons": reasons[:max_reasons],
        "other_unsupported": [f"{n}x {k}" for k, n in sorted(skipped.items(), key=lambda kv: -kv[1])][:max_reasons],
        "recompile_limit_hits": logs.recompile_limit_hits,
        "seconds": round(secs, 2),
    }


def compile_case(fn: Callable, args: tuple, backend: str, check: Callable[[Any, Any], dict[str, Any]], timing_calls: int) -> dict[str, Any]:
    torch._dynamo.reset()
    try:
        with quiet_dynamo() as logs:
            cfn = torch.compile(fn, backend=backend)
            t0 = time.perf_counter()
            out_c = cfn(*args)
            compile_s = time.perf_counter() - t0
            out_e = fn(*args)
            result = check(out_c, out_e)
            # steady state: compiled vs eager, interleaved
            per = interleaved({"compiled": lambda: cfn(*args), "eager": lambda: fn(*args)},
                              rounds=timing_calls, steps=2, warmup=1)
    except Exception as exc:  # noqa: BLE001 - report, don't crash
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip().splitlines()[0][:300]
        return {"ok": False, "backend": backend, "error": tb}
    result.update({
        "ok": True,
        "backend": backend,
        "first_call_s": round(compile_s, 2),
        "compiled_ms": round(statistics.median(per["compiled"]), 3),
        "eager_ms": round(statistics.median(per["eager"]), 3),
        "recompile_limit_hits": logs.recompile_limit_hits,
    })
    return result


def _check_outputs(out_c: Any, out_e: Any) -> dict[str, Any]:
    oc, oe = out_c.detach(), out_e.detach()
    return {
        "dtype_compiled": str(oc.dtype).replace("torch.", ""),
        "dtype_eager": str(oe.dtype).replace("torch.", ""),
        "max_abs_diff": float((oc.float() - oe.float()).abs().max()),
        "match": oc.dtype == oe.dtype and torch.allclose(oc.float(), oe.float(), rtol=1e-2, atol=1e-2),
    }


def compile_section(quick: bool, digits_x: torch.Tensor, digits_y: torch.Tensor, tf_dims: tuple[int, int, int, int]) -> dict[str, Any]:
    torch.manual_seed(0)
    model = DigitsCNN(16, 64)
    xb, yb = digits_x[:64].contiguous(), digits_y[:64].contiguous()

    def fwd_ampcert(x):
        with amp_autocast("cpu", DTYPE):
            return model(x)

    def fwd_native(x):
        with torch.autocast("cpu", dtype=DTYPE):
            return model(x)

    def train_ampcert(x, y):
        with amp_autocast("cpu", DTYPE):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    def train_native(x, y):
        with torch.autocast("cpu", dtype=DTYPE):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    explains: dict[str, Any] = {}
    cases: list[tuple[str, Callable, tuple, Callable | None]] = [
        ("digits fwd | torch.autocast inside fn", fwd_native, (xb,), None),
        ("digits fwd | ampcert autocast inside fn", fwd_ampcert, (xb,), None),
    ]
    if not quick:
        d, h, t, b = tf_dims
        block = PreLNBlock(d, h)
        xt = torch.randn(b, t, d)
        cases += [
            ("digits fwd | ampcert autocast entered outside", model, (xb,), ampcert_ctx),
            ("digits train step | torch.autocast", train_native, (xb, yb), None),
            ("digits train step | ampcert autocast", train_ampcert, (xb, yb), None),
            ("block fwd | torch.autocast entered outside", block, (xt,), native_ctx),
            ("block fwd | ampcert autocast entered outside", block, (xt,), ampcert_ctx),
        ]
    for name, fn, args, outer in cases:
        explains[name] = explain_case(fn, args, outer)
        model.zero_grad(set_to_none=True)

    compiles: dict[str, Any] = {}
    backends = ["aot_eager"] if quick else ["eager", "aot_eager", "inductor"]
    for be in backends:
        compiles[f"digits fwd | ampcert | {be}"] = compile_case(fwd_ampcert, (xb,), be, _check_outputs, 3 if quick else 6)
    if not quick:
        # training step: compare the gradients of one compiled step with one eager step
        def grads_after(fn: Callable) -> list[torch.Tensor]:
            model.zero_grad(set_to_none=True)
            fn(xb, yb)
            return [p.grad.detach().clone() for p in model.parameters()]

        torch._dynamo.reset()
        key = "digits train step | ampcert | aot_eager"
        try:
            with quiet_dynamo() as logs:
                ctrain = torch.compile(train_ampcert, backend="aot_eager")
                t0 = time.perf_counter()
                g_c = grads_after(ctrain)
                secs = time.perf_counter() - t0
                g_e = grads_after(train_ampcert)
            diff = max(float((a - b).abs().max()) for a, b in zip(g_c, g_e, strict=True))
            compiles[key] = {"ok": True, "backend": "aot_eager", "first_call_s": round(secs, 2),
                             "max_abs_grad_diff": diff,
                             "match": all(torch.allclose(a, b, rtol=1e-2, atol=1e-3) for a, b in zip(g_c, g_e, strict=True)),
                             "recompile_limit_hits": logs.recompile_limit_hits}
        except Exception as exc:  # noqa: BLE001
            compiles[key] = {"ok": False, "backend": "aot_eager",
                             "error": traceback.format_exception_only(type(exc), exc)[-1].strip()[:300]}
        model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    return {"explain": explains, "compile": compiles}


def format_compile(res: dict[str, Any]) -> str:
    lines = ["## torch.compile compatibility (bf16, torch._dynamo.explain, then torch.compile)"]
    for name, r in res["explain"].items():
        if not r["ok"]:
            lines.append(f"- explain {name}: FAILED: {r['error']}")
            continue
        lines.append(f"- explain {name}: graphs={r['graph_count']} breaks={r['graph_break_count']} "
                     f"ops={r['op_count']} recompile-limit hits={r['recompile_limit_hits']} ({r['seconds']} s)")
        for reason in r["break_reasons"]:
            lines.append(f"    reason: {reason}")
        if r["distinct_break_reasons"] > len(r["break_reasons"]):
            lines.append(f"    ... {r['distinct_break_reasons'] - len(r['break_reasons'])} more distinct reasons")
        for reason in r["other_unsupported"]:
            lines.append(f"    other (frame skipped / fell back): {reason}")
    for name, r in res["compile"].items():
        if not r["ok"]:
            lines.append(f"- compile {name}: FAILED: {r['error']}")
            continue
        if "max_abs_diff" in r:
            lines.append(f"- compile {name}: first call {r['first_call_s']} s; output {r['dtype_compiled']} vs eager "
                         f"{r['dtype_eager']}, max|diff|={r['max_abs_diff']:.3g} -> {'MATCH' if r['match'] else 'MISMATCH'}; "
                         f"steady {r['compiled_ms']} ms vs eager {r['eager_ms']} ms; "
                         f"recompile-limit hits={r['recompile_limit_hits']}")
        else:
            lines.append(f"- compile {name}: first call {r['first_call_s']} s; grads max|diff|={r['max_abs_grad_diff']:.3g}"
                         f" -> {'MATCH' if r['match'] else 'MISMATCH'}; recompile-limit hits={r['recompile_limit_hits']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds, cheapest compile checks (< 60 s)")
    p.add_argument("--json", type=Path, help="write all figures to this JSON file")
    p.add_argument("--rounds", type=int, help="interleaved rounds per comparison (default 20, quick 8)")
    p.add_argument("--budget", type=float, help="seconds per comparison after which no new round starts "
                   "(at least 5 rounds run; default 35, quick 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch.set_num_threads(N) first (default: leave unchanged); "
                   "1 is far steadier when other processes load the CPU")
    p.add_argument("--tf", default="64,4,64,8", help="transformer block d_model,heads,seq,batch")
    p.add_argument("--skip-compile", action="store_true", help="skip the torch.compile section")
    args = p.parse_args(argv)

    t_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    quick = args.quick
    rounds = args.rounds or (6 if quick else 20)
    budget = args.budget if args.budget is not None else (8.0 if quick else 35.0)
    tf_dims = tuple(int(v) for v in args.tf.split(","))
    if len(tf_dims) != 4 or tf_dims[0] % tf_dims[1]:
        p.error("--tf: expected d_model,heads,seq,batch with heads dividing d_model")

    out = io.StringIO()

    def emit(text: str = "") -> None:
        print(text, flush=True)
        out.write(text + "\n")

    cmd = shlex.join([os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else sys.executable,
                      *sys.argv])
    meta = {
        "command": cmd,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_info()["model"],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_start": load_average(),
        "quick": quick,
        "rounds": rounds,
        "budget_s": budget,
        "seed": args.seed,
    }
    emit(f"$ {cmd}")
    emit(f"torch {meta['torch']} | python {meta['python']} | CPU: {meta['cpu']} ({meta['cpu_count']} logical) | "
         f"torch threads: {meta['torch_threads']}")
    emit(f"load average at start (1/5/15 min): {meta['load_avg_start']}")
    try:
        if os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1):
            emit("WARNING: the CPU is already loaded; with several torch threads, OpenMP contention inflates and "
                 "scatters step times (try --threads 1). Trust ratios with tight CIs only.")
    except OSError:
        pass
    emit(f"method: up to {rounds} interleaved rounds per comparison (time budget {budget:g} s each), "
         "order rotated each round; 95% CI = bootstrap over paired rounds")
    emit()

    torch.manual_seed(args.seed)
    dx, dy = load_digits_tensors()
    batches = digits_batches(dx, dy, 64, 16)
    results: dict[str, Any] = {"meta": meta, "comparisons": []}

    # 1a. digits CNN, autocast
    torch.manual_seed(args.seed)
    base = DigitsCNN(16, 64)
    steps_digits = 8 if quick else 15
    per = interleaved({
        "torch.autocast bf16": make_train_step(copy.deepcopy(base), batches, F.cross_entropy, native_ctx),
        "ampcert autocast bf16": make_train_step(copy.deepcopy(base), batches, F.cross_entropy, ampcert_ctx),
        AGAIN: make_train_step(copy.deepcopy(base), batches, F.cross_entropy, native_ctx),
    }, rounds=rounds, steps=steps_digits, warmup=5, budget_s=budget)
    comp = comparison(f"1a. train step, digits CNN (batch 64), {steps_digits} steps/round", "torch.autocast bf16",
                      per, {"ampcert autocast bf16": AUTOCAST_GOAL})
    results["comparisons"].append(comp)
    emit(format_table(comp))
    emit()

    # 1b. transformer block, autocast
    d, h, t, b = tf_dims
    torch.manual_seed(args.seed)
    block = PreLNBlock(d, h)
    gen = torch.Generator().manual_seed(args.seed)
    tf_batches = [(torch.randn(b, t, d, generator=gen), torch.randn(b, t, d, generator=gen)) for _ in range(4)]
    steps_tf = 2 if quick else 3
    per = interleaved({
        "torch.autocast bf16": make_train_step(copy.deepcopy(block), tf_batches, F.mse_loss, native_ctx),
        "ampcert autocast bf16": make_train_step(copy.deepcopy(block), tf_batches, F.mse_loss, ampcert_ctx),
        AGAIN: make_train_step(copy.deepcopy(block), tf_batches, F.mse_loss, native_ctx),
    }, rounds=rounds, steps=steps_tf, warmup=2, budget_s=budget)
    comp = comparison(f"1b. train step, pre-LN block d={d} heads={h} seq={t} batch={b}, {steps_tf} steps/round",
                      "torch.autocast bf16", per, {"ampcert autocast bf16": AUTOCAST_GOAL})
    results["comparisons"].append(comp)
    emit(format_table(comp))
    emit()

    # 2. scalers (fp32 forward)
    torch.manual_seed(args.seed)
    base = DigitsCNN(16, 64)
    steps_sc = 10 if quick else 20
    per = interleaved({
        "torch.amp.GradScaler": make_scaler_step(copy.deepcopy(base), batches, torch.amp.GradScaler("cpu")),
        "DynamicLossScaler default": make_scaler_step(copy.deepcopy(base), batches, DynamicLossScaler("cpu")),
        "DynamicLossScaler sync_free": make_scaler_step(copy.deepcopy(base), batches,
                                                        DynamicLossScaler("cpu", sync_free=True)),
    }, rounds=rounds, steps=steps_sc, warmup=5, budget_s=budget)
    comp = comparison(f"2. scaler full step, digits CNN fp32, SGD momentum, {steps_sc} steps/round",
                      "torch.amp.GradScaler", per,
                      {"DynamicLossScaler default": SCALER_GOAL, "DynamicLossScaler sync_free": None})
    results["comparisons"].append(comp)
    emit(format_table(comp))
    emit()

    # 3. torch.compile
    if args.skip_compile:
        emit("## torch.compile compatibility: skipped (--skip-compile)")
    else:
        try:
            comp_res = compile_section(quick, dx, dy, tf_dims)
            results["compile"] = comp_res
            emit(format_compile(comp_res))
        except Exception as exc:  # noqa: BLE001 - never crash the report
            msg = traceback.format_exception_only(type(exc), exc)[-1].strip()
            results["compile"] = {"error": msg}
            emit(f"## torch.compile compatibility: section FAILED: {msg}")
    emit()

    meta["load_avg_end"] = load_average()
    meta["wall_s"] = round(time.perf_counter() - t_start, 1)
    emit(f"load average at end: {meta['load_avg_end']} | wall time {meta['wall_s']} s")
    write_json(args.json, results, emit)
    return 0


if __name__ == "__main__":
    run_measurement(main)
