"""FP8 Linear training-step time: ampcert's Fp8Linear against torchao's and against bf16, on this machine.

What is measured (one process, one interleaved run per layer size):

A training step of a single Linear layer (tokens x in_features -> out_features,
bias on): the parameters' and the input's ``.grad`` set to None, the forward on
a fixed bf16 input that requires grad, then ``backward`` with a fixed bf16
grad_output, so all three matmuls run (output, grad_input, grad_weight). No
optimizer step. Every variant starts from a copy of the same seeded
``torch.nn.Linear`` (fp32 master weight and bias) and sees the same tensors:

- **bf16** (the reference): ``F.linear(x, weight.to(bf16), bias.to(bf16))``:
  explicit casts, no autocast, so neither autocast engine's dispatch cost is
  in the baseline; the weight cast is in every step, as under autocast with
  fp32 master weights.
- **ampcert**: ``Fp8Linear.from_linear(linear, RECIPES[name], real=...,
  compute_dtype=torch.bfloat16)`` (ampcert/amp/torch/fp8.py).
- **torchao**: for ``tensorwise``, ``rowwise``, ``rowwise_with_gw_hp`` its
  ``Float8Linear`` (``Float8LinearConfig.from_recipe_name`` with ``emulate``
  set as for ampcert, through ``convert_to_float8_training``); for ``mxfp8``
  its ``MXFP8Linear`` (``ScaleCalculationMode.RCEIL``). Caveat: torchao's
  MXFP8Linear holds a *bf16* copy of the weight here, because its emulated mm
  needs input and weight in one dtype (bf16 input with an fp32 weight raises
  "expected m1 and m2 to have the same dtype", under torch.autocast too);
  ampcert keeps the fp32 master weight. Both then dequantise to bf16 and
  multiply in bf16. If torchao is not importable its columns are skipped.

Reported per recipe and size: median ms/step of each variant and the ratios
ampcert / bf16, torchao / bf16 and ampcert / torchao, each a ratio of medians
with a 95% bootstrap interval over paired rounds (``ratio_stats`` of
``amp_overhead.py``). No timing is asserted; the script always exits 0.

Devices. The CPU part always runs (``--sizes``; every path is emulated: FP8
values dequantised and multiplied in fp32, MX in bf16, so its figures say how
expensive the emulation is, nothing about FP8 hardware). With a CUDA device
(``--device auto`` or ``cuda``) the same table is made for ``--cuda-sizes``;
there the fp8 recipes run real FP8 (``torch._scaled_mm``) in ampcert when
``has_fp8_tensor_cores("fp8")`` says so (compute capability >= 8.9) and in
torchao on the same condition, and ampcert / bf16 is the FP8 speed-up (< 1 is
faster). ampcert's mxfp8 is emulated on every device; torchao's MXFP8Linear
runs real only on compute capability >= 10.0. The "path" column says which
ran (ampcert/torchao). CUDA slots are timed with CUDA events after a
``torch.cuda.synchronize()``.

Method: every variant of a size runs one untimed call and ``--warmup`` timed
steps; the fastest of those sets K, the steps per slot, so that a slot lasts
about ``--target-ms``. Then R rounds (``--rounds``, default 7) run all variants
back to back, one slot each, the order rotating every round; a round does not
start past ``--budget`` seconds once 5 rounds are in. The bf16 reference is
shared by the recipes of a size. ``--json`` also keeps every round's time and
the ratio of the per-variant minima (steadier on a loaded machine).

Run from the repository root::

    .venv/bin/python benchmarks/fp8_overhead.py [--sizes 2048x256x256,...] [--rounds 7] [--json out.json]

The default CPU run takes about 1-2 minutes on a 2-core CPU. bf16 matmuls are
much slower than fp32 on CPUs without AVX512-BF16/AMX, which moves the
emulated / bf16 ratios there.
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import os
import platform
import shlex
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# torchao logs "Failed to load ... .so" for its CUDA kernels and registers Enums
# with pytree, which torch logs as a deprecation: both are noise here.
logging.getLogger("torchao").setLevel(logging.ERROR)
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

_HERE = Path(__file__).resolve().parent
for _p in (_HERE.parent, _HERE):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from timing import interleaved as interleaved_slots  # noqa: E402
from timing import ratio_stats, run_measurement, time_steps, write_json  # noqa: E402

from ampcert.amp.fp8_recipes import RECIPES  # noqa: E402
from ampcert.amp.torch.fp8 import Fp8Linear, has_fp8_tensor_cores  # noqa: E402
from ampcert.envinfo import cpu_info, load_average  # noqa: E402

BF16 = torch.bfloat16
DEFAULT_CPU_SIZES = "2048x256x256,2048x512x512,2048x1024x1024"
DEFAULT_CUDA_SIZES = "8192x4096x4096,8192x8192x8192"
MIN_ROUNDS = 5
MAX_STEPS_PER_SLOT = 50


# ---------------------------------------------------------------------------
# torchao (optional)
# ---------------------------------------------------------------------------
@dataclass
class Torchao:
    version: str | None = None
    error: str | None = None
    api: dict[str, Any] = field(default_factory=dict)


def load_torchao() -> Torchao:
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
            from torchao.float8.config import Float8LinearRecipeName
            from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
            from torchao.prototype.mx_formats.config import ScaleCalculationMode
            from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
    except Exception as exc:  # noqa: BLE001 - optional dependency: report, skip its columns
        return Torchao(error=traceback.format_exception_only(type(exc), exc)[-1].strip()[:200])
    return Torchao(version=str(getattr(torchao, "__version__", "?")), api={
        "Float8LinearConfig": Float8LinearConfig, "convert": convert_to_float8_training,
        "RecipeName": Float8LinearRecipeName, "MXFP8Linear": MXFP8Linear,
        "ScaleCalculationMode": ScaleCalculationMode, "KernelPreference": KernelPreference,
    })


def torchao_module(tao: Torchao, linear: torch.nn.Linear, recipe: str, real: bool) -> torch.nn.Module:
    """torchao's FP8 Linear for ``recipe`` with ``linear``'s weights (a copy)."""
    api = tao.api
    if recipe == "mxfp8":
        kp = api["KernelPreference"]
        mod = api["MXFP8Linear"](linear.in_features, linear.out_features, bias=linear.bias is not None,
                                 kernel_preference=kp.AUTO if real else kp.EMULATED,
                                 scale_calculation_mode=api["ScaleCalculationMode"].RCEIL,
                                 device=linear.weight.device, dtype=BF16)
        with torch.no_grad():
            mod.weight.copy_(linear.weight)
            if linear.bias is not None:
                mod.bias.copy_(linear.bias)
        return mod
    cfg_cls = api["Float8LinearConfig"]
    cfg = cfg_cls.from_recipe_name(api["RecipeName"](recipe))
    cfg = cfg_cls(**{**cfg.__dict__, "emulate": not real})
    return api["convert"](torch.nn.Sequential(copy.deepcopy(linear)), config=cfg)[0]


# ---------------------------------------------------------------------------
# variants
# ---------------------------------------------------------------------------
def make_step(forward: Callable[[torch.Tensor], torch.Tensor], params: list[torch.nn.Parameter],
              x: torch.Tensor, grad_out: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        forward(x).backward(grad_out)

    return step


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    sizes = []
    for item in text.split(","):
        dims = tuple(int(v) for v in item.lower().split("x"))
        if len(dims) != 3 or any(d <= 0 for d in dims):
            raise ValueError(f"{item!r}: expected TOKENSxINxOUT")
        sizes.append(dims)
    return sizes


def fmt_size(size: tuple[int, int, int]) -> str:
    return "x".join(str(d) for d in size)


def paths_for(device: str, recipe: str, tao: Torchao) -> tuple[bool, bool]:
    """(ampcert real, torchao real) on ``device``."""
    if device != "cuda":
        return False, False
    major, minor = torch.cuda.get_device_capability()
    if recipe == "mxfp8":
        return False, (major, minor) >= (10, 0)
    real = has_fp8_tensor_cores("fp8")[0]
    return real, real


def build_variants(size: tuple[int, int, int], recipes: list[str], device: str, tao: Torchao,
                   seed: int) -> tuple[dict[str, Callable[[], None]], dict[str, dict[str, str]], dict[str, str]]:
    """The steps of one size; per recipe the path each engine takes; construction failures."""
    tokens, d_in, d_out = size
    torch.manual_seed(seed)
    base = torch.nn.Linear(d_in, d_out).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, d_in, device=device, generator=gen).to(BF16).requires_grad_()
    grad_out = torch.randn(tokens, d_out, device=device, generator=gen).to(BF16)

    ref = copy.deepcopy(base)
    variants = {"bf16": make_step(lambda t: F.linear(t, ref.weight.to(BF16), ref.bias.to(BF16)),
                                  list(ref.parameters()), x, grad_out)}
    paths: dict[str, dict[str, str]] = {}
    failed: dict[str, str] = {}
    for name in recipes:
        amp_real, tao_real = paths_for(device, name, tao)
        paths[name] = {"ampcert": "real" if amp_real else "emu", "torchao": "real" if tao_real else "emu"}
        try:
            mod = Fp8Linear.from_linear(copy.deepcopy(base), RECIPES[name], real=amp_real, compute_dtype=BF16)
            variants[f"ampcert {name}"] = make_step(mod, list(mod.parameters()), x, grad_out)
        except Exception as exc:  # noqa: BLE001 - report, go on
            failed[f"ampcert {name}"] = _err(exc)
        if tao.version is None:
            continue
        try:
            mod = torchao_module(tao, base, name, tao_real)
            variants[f"torchao {name}"] = make_step(mod, list(mod.parameters()), x, grad_out)
        except Exception as exc:  # noqa: BLE001
            failed[f"torchao {name}"] = _err(exc)
    return variants, paths, failed


def _err(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip().splitlines()[0][:200]


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------
def interleaved(variants: dict[str, Callable[[], None]], device: str, rounds: int, warmup: int,
                target_ms: float, budget_s: float | None,
                failed: dict[str, str]) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Per-step ms of each variant, one entry per round, the order rotating every
    round; a variant that raises is dropped into ``failed``."""
    steps: dict[str, int] = {}
    for name, fn in list(variants.items()):
        try:
            fn()  # first call: allocations, lazy init
            # the fastest of the other warm-up steps sets K (one slow step under load would not)
            one = min(time_steps(fn, 1, cuda_events=device == "cuda") for _ in range(max(warmup, 1)))
        except Exception as exc:  # noqa: BLE001 - report, go on with the others
            failed[name] = _err(exc)
            del variants[name]
            continue
        steps[name] = max(1, min(MAX_STEPS_PER_SLOT, math.ceil(target_ms / max(one, 1e-3))))
    per = interleaved_slots(variants, rounds, steps, budget_s=budget_s, min_rounds=MIN_ROUNDS,
                            cuda_events=device == "cuda")
    return per, steps


def measure(device: str, sizes: list[tuple[int, int, int]], recipes: list[str], tao: Torchao,
            args: argparse.Namespace, budget_s: float) -> list[dict[str, Any]]:
    results = []
    for size in sizes:
        t0 = time.perf_counter()
        variants, paths, failed = build_variants(size, recipes, device, tao, args.seed)
        per, steps = interleaved(variants, device, args.rounds, args.warmup, args.target_ms, budget_s, failed)
        rounds = len(per.get("bf16", []))
        print(f"# {device} {fmt_size(size)}: {len(per)} variants, {rounds} rounds, "
              f"steps/slot {min(steps.values(), default=0)}-{max(steps.values(), default=0)}, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        rows = []
        for name in recipes:
            row: dict[str, Any] = {"device": device, "recipe": name, "size": fmt_size(size),
                                   "path": f"{paths[name]['ampcert']}/{paths[name]['torchao'] if tao.version else '-'}",
                                   "rounds": rounds}
            a, t, b = per.get(f"ampcert {name}"), per.get(f"torchao {name}"), per.get("bf16")
            for key, times in (("bf16", b), ("ampcert", a), ("torchao", t)):
                row[f"{key}_ms"] = statistics.median(times) if times else None
                row[f"{key}_rounds_ms"] = [round(v, 4) for v in times] if times else None
            row["ampcert/bf16"] = ratio_stats(b, a) if a and b else None
            row["torchao/bf16"] = ratio_stats(b, t) if t and b else None
            row["ampcert/torchao"] = ratio_stats(t, a) if a and t else None
            row["failed"] = {k: v for k, v in failed.items() if k.endswith(f" {name}") or k == "bf16"}
            rows.append(row)
        results.extend(rows)
        del variants
        if device == "cuda":
            torch.cuda.empty_cache()
    return results


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------
def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _ratio(r: dict[str, float] | None) -> str:
    return "-" if r is None else f"{r['ratio']:.2f} [{r['ci_lo']:.2f},{r['ci_hi']:.2f}]"


def format_table(device: str, rows: list[dict[str, Any]]) -> str:
    rounds = sorted({r["rounds"] for r in rows})
    head = (f"## {device}: one Linear training step (fwd + bwd, bf16 activations), median ms/step over "
            f"{'/'.join(map(str, rounds))} rounds; ratio of medians [95% bootstrap CI]")
    cols = (f"{'recipe':<19}{'size TxIxO':<16}{'path':<10}{'bf16 ms':>9}{'ampcert ms':>11}{'torchao ms':>11}  "
            f"{'ampcert/bf16':<21}{'torchao/bf16':<21}{'ampcert/torchao'}")
    lines = [head, cols]
    for r in rows:
        lines.append(f"{r['recipe']:<19}{r['size']:<16}{r['path']:<10}{_ms(r['bf16_ms']):>9}"
                     f"{_ms(r['ampcert_ms']):>11}{_ms(r['torchao_ms']):>11}  {_ratio(r['ampcert/bf16']):<21}"
                     f"{_ratio(r['torchao/bf16']):<21}{_ratio(r['ampcert/torchao'])}")
    for r in rows:
        for name, msg in r["failed"].items():
            lines.append(f"FAILED {r['size']} {name}: {msg}")
    return "\n".join(dict.fromkeys(lines))  # a bf16 failure is listed once per size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: the CPU part, then the CUDA part when a GPU is there (default); "
                        "cpu: the CPU part only; cuda: the CUDA part only")
    p.add_argument("--sizes", default=DEFAULT_CPU_SIZES,
                   help=f"CPU layer sizes TOKENSxINxOUT, comma-separated (default {DEFAULT_CPU_SIZES})")
    p.add_argument("--cuda-sizes", default=DEFAULT_CUDA_SIZES,
                   help=f"CUDA layer sizes (default {DEFAULT_CUDA_SIZES})")
    p.add_argument("--recipes", default=",".join(RECIPES),
                   help=f"comma-separated subset of {', '.join(RECIPES)} (default all)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds per size (default 7)")
    p.add_argument("--warmup", type=int, default=3,
                   help="warm-up steps per variant after its first call; the fastest sets K (default 3)")
    p.add_argument("--target-ms", type=float, default=150.0,
                   help="about how long one timed slot (K steps of one variant) lasts (default 150)")
    p.add_argument("--budget", type=float,
                   help="seconds per size after which no new round starts, once 5 rounds are in "
                        "(default 30 on CPU, 60 on CUDA)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads(N) first (default: leave unchanged)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write all figures to this JSON file")
    args = p.parse_args(argv)

    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown or not recipes:
        p.error(f"--recipes: unknown {unknown}; expected a subset of {list(RECIPES)}")
    try:
        cpu_sizes, cuda_sizes = parse_sizes(args.sizes), parse_sizes(args.cuda_sizes)
    except ValueError as exc:
        p.error(f"--sizes/--cuda-sizes: {exc}")
    for size in cpu_sizes + cuda_sizes:
        multiple = max(RECIPES[r].multiple for r in recipes)
        if any(d % multiple for d in size):
            p.error(f"size {fmt_size(size)}: every dimension must divide by {multiple} for "
                    f"{', '.join(recipes)} (mxfp8 blocks run along tokens too)")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    has_cuda = torch.cuda.is_available()
    if args.device == "cuda" and not has_cuda:
        p.error("--device cuda: torch sees no CUDA device")

    t_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = load_average()
    try:
        if os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1):
            print(f"WARNING: the CPU is already loaded (load average {load_start}): step times scatter and the "
                  "CIs widen; trust ratios with tight CIs only (--threads 1 is steadier).", flush=True)
    except OSError:
        pass
    tao = load_torchao()
    if tao.version is None:
        print(f"note: torchao not importable ({tao.error}): its columns are skipped")

    results: dict[str, Any] = {"rows": []}
    devices = (["cpu"] if args.device in ("auto", "cpu") else []) + \
              (["cuda"] if args.device == "cuda" or (args.device == "auto" and has_cuda) else [])
    tables = []
    for device in devices:
        sizes = cpu_sizes if device == "cpu" else cuda_sizes
        budget = args.budget if args.budget is not None else (30.0 if device == "cpu" else 60.0)
        try:
            rows = measure(device, sizes, recipes, tao, args, budget)
        except Exception:  # noqa: BLE001 - a measurement: report and go on
            print(f"## {device}: FAILED\n{traceback.format_exc()}", flush=True)
            continue
        results["rows"].extend(rows)
        tables.append(format_table(device, rows))
    if args.device == "auto" and not has_cuda:
        tables.append("## cuda: skipped (torch sees no CUDA device)")

    print()
    for table in tables:
        print(table)
        print()
    print("path = ampcert/torchao: emu = emulated (FP8 values dequantised, fp32 matmul; MX: bf16 matmul), "
          "real = FP8 tensor cores.")
    if "mxfp8" in recipes:
        print("ampcert's mxfp8 is emulated on every device." + (
            " torchao's MXFP8Linear holds a bf16 copy of the weight (its emulated mm takes no bf16 input "
            "with an fp32 weight); every other variant keeps the fp32 master weight." if tao.version else ""))
    if "cuda" in devices:
        print(f"cuda: {has_fp8_tensor_cores('fp8')[1]}; ampcert/bf16 < 1 is the FP8 speed-up.")

    arg0 = os.path.abspath(sys.argv[0])
    script = os.path.relpath(arg0) if arg0.startswith(os.getcwd() + os.sep) else sys.argv[0]
    cmd = shlex.join(["python", script, *(argv if argv is not None else sys.argv[1:])])
    gpu = "none"
    if has_cuda:
        major, minor = torch.cuda.get_device_capability()
        gpu = f"{torch.cuda.get_device_name()} (compute capability {major}.{minor}, CUDA {torch.version.cuda})"
    cpu = cpu_info()
    meta = {
        "command": cmd,
        "interpreter": sys.executable,
        "torch": torch.__version__,
        "torchao": tao.version or f"not importable: {tao.error}",
        "python": platform.python_version(),
        "cpu": cpu["model"],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": gpu,
        "rounds": args.rounds,
        "target_ms": args.target_ms,
        "seed": args.seed,
        "load_avg_start": load_start,
        "load_avg_end": load_average(),
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    results["meta"] = meta
    print(f"command: {cmd}")
    print(f"torch {meta['torch']} | torchao {meta['torchao']} | python {meta['python']} | "
          f"CPU: {meta['cpu']} ({meta['cpu_count']} logical, torch threads {meta['torch_threads']}) | GPU: {gpu}")
    print(f"load average start {load_start} end {meta['load_avg_end']} | wall time {meta['wall_s']} s")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    run_measurement(main)
