"""GPU evidence in one command: what ampcert measures on the card at hand, in about 7 minutes.

Made for a GPU machine lent for ~15 minutes, with no network (docs/gpus.md says how to get
there: the checkout and the wheels ``benchmarks/gpu_wheels.sh`` downloads). It runs, each
step in a process of its own with its own time limit, out of one budget (``--budget-s``;
a step that would start past it is recorded "not run: budget"):

1. **machine**: GPU, driver, CUDA, torch, clocks seen (SM and memory, now and their
   maximum, from NVML), power limit; on a CPU its model and flags;
2. **matmul rates**: the capability probe's matmul per precision (``backends/capability``),
   and TF32's, which ampcert certifies as no precision of its own (fp32 runs keep it off);
3. **suites**: the vision (``resnet``) and language (``gpt``) workloads trained through
   ``ampcert run`` in every precision the card has (fp32, bf16, fp16, and fp8 and mxfp8
   where it runs them; ``unaccelerated: skip`` leaves out what it does not), and a memory
   sweep in fp32 and bf16, each suite with its own time limit (what a suite cut short
   stored is still read). Per precision: samples/s and speedup over fp32, MFU, joules per sample (NVML's
   energy counter), peak memory, and the sweep's fitted bytes per sample;
4. **AMP engine against native**: ``dispatch_overhead.py`` (per-op dispatch),
   ``gpt_step_overhead.py`` in bf16 and in fp16 (whose row prices the loss scaler), and
   its whole step compiled (``--compile``: Inductor on a GPU, aot_eager on a CPU; not run
   before torch 2.13, which cannot trace ampcert's region);
5. **checks**: ``ampcert audit`` on the device (every op's dtype, native against ampcert)
   and, on CUDA, the gpu-marked tests (a shrunk card that overflows, FP8 parity).

Writes ``evidence.json`` (every figure, each step's command, seconds and exit code) and
``evidence.md`` (the page docs/gpu/ keeps) into ``--out``. ``--quick --device cpu`` runs
the same steps small, in CI (tests/test_gpu_evidence.py), so the script cannot rot unseen.
Always exits 0 once it wrote its files: a failed step is recorded, not raised.

Run from the repository root::

    python benchmarks/gpu_evidence.py --out gpu-evidence            # on the GPU machine
    python benchmarks/gpu_evidence.py --quick --device cpu --out /tmp/ev
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
TAIL = 4000  # characters of a step's output kept in evidence.json
# Per device: the suites' size and budget, and the small settings of --quick.
SIZES = {
    "cuda": {"size": "small", "steps": 200, "eval_every": 100, "precisions": ["fp32", "bf16", "fp16", "fp8", "mxfp8"],
             "sweep": [64, 128, 256], "rounds": 10, "gpt_steps": 10},
    "cpu": {"size": "tiny", "steps": 60, "eval_every": 30, "precisions": ["fp32", "bf16"],
            "sweep": [16, 32, 64], "rounds": 6, "gpt_steps": 3},
}
QUICK = {"steps": 10, "eval_every": 10, "sweep": [8, 16, 24], "rounds": 2, "gpt_steps": 2}


def _step(record: dict, name: str, argv: list[str], timeout_s: float, deadline: float) -> subprocess.CompletedProcess | None:
    """Run one step as a process of its own, within its timeout and the budget's deadline."""
    left = deadline - time.monotonic()
    entry: dict = {"command": shlex.join(argv)}
    record["steps"][name] = entry
    if left < 5:
        entry.update(status="not run", reason="budget spent")
        return None
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=min(timeout_s, left),
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        entry.update(status="failed", reason=f"timed out after {min(timeout_s, left):.0f} s",
                     seconds=round(time.monotonic() - start, 1), tail=out[-TAIL:])
        return None
    entry.update(status="ok" if proc.returncode == 0 else "failed", rc=proc.returncode,
                 seconds=round(time.monotonic() - start, 1), tail=(proc.stdout + proc.stderr)[-TAIL:])
    print(f"{name}: {entry['status']} in {entry['seconds']} s", flush=True)
    return proc


def machine(device: str) -> dict:
    """The fingerprint ampcert records (envinfo: CPU, GPUs, driver), and what it does not:
    NVML's clocks, now and their maximum, and the power limit."""
    import torch

    from ampcert.envinfo import cpu_info, gpu_info

    cpu = cpu_info()
    info: dict = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "host": platform.node(),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "cpu": cpu["model"], "cores": cpu["usable_cores"],
                  "cpu_flags": sorted(flag for flag, on in cpu["flags"].items() if on)}
    if device != "cuda":
        return info
    gpus = gpu_info()
    first = gpus["devices"][0]
    info.update(gpu=first["name"], capability=first["capability"], memory_bytes=first["memory_bytes"],
                driver=gpus.get("driver"))
    try:
        import pynvml as nv

        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        info.update(power_limit_w=nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
                    clocks_mhz={"sm": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                                "sm_max": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
                                "memory": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                                "memory_max": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)})
    except Exception as exc:  # noqa: BLE001 - NVML missing or refusing: said, not fatal
        info["nvml"] = f"unavailable: {exc}"
    return info


def matmul_rates(device: str, precisions: list[str]) -> dict:
    """TFLOP/s of one square matmul per precision (the planner's capability probe), and TF32's."""
    import torch

    from ampcert.backends.capability import _SIZES, _time_matmul, probe

    found = probe(device, precisions)
    rates = {p: {"tflops": v.get("measured_flops", 0) / 1e12 if v.get("measured_flops") else None,
                 "speedup_vs_fp32": v.get("speedup_vs_fp32"), "note": v.get("note")} for p, v in found.items()}
    n = _SIZES[device]
    if device == "cuda":  # TF32: fp32 tensors, the tensor cores' 10-bit mantissa
        torch.backends.cuda.matmul.allow_tf32 = True
        t = _time_matmul(torch.float32, device, n, reps=10)
        torch.backends.cuda.matmul.allow_tf32 = False
        rates["tf32"] = {"tflops": 2 * n**3 / t / 1e12, "speedup_vs_fp32": rates["fp32"]["tflops"] and
                         (2 * n**3 / t / 1e12) / rates["fp32"]["tflops"], "note": "allow_tf32, not an ampcert precision"}
    else:
        rates["tf32"] = {"tflops": None, "speedup_vs_fp32": None, "note": "CUDA only"}
    return rates


def suites(device: str, cfg: dict) -> dict[str, dict]:
    """Two suites, so that each has its own time limit: every precision trained once (speed,
    MFU, energy, peak memory), and the memory sweep in fp32 and bf16 (bytes per sample)."""
    train = {"steps": cfg["steps"], "eval_every": cfg["eval_every"]}
    workloads = [{"workload": "resnet", "params": {"size": cfg["size"]}, "train": train},
                 {"workload": "gpt", "params": {"size": cfg["size"]}, "train": train}]
    common = {"amp": "native", "device": device, "seeds": [0], "unaccelerated": "skip", "timeout_s": 300}
    return {
        "precisions": {"name": "gpu-evidence", "description": "benchmarks/gpu_evidence.py: every precision",
                       **common, "precisions": cfg["precisions"], "workloads": workloads},
        # The sweep's suite trains its own runs too: 2 steps each, as benchmarks/memory_sweep.py does.
        "memory": {"name": "gpu-evidence-memory", "description": "benchmarks/gpu_evidence.py: the memory sweep",
                   **common, "precisions": ["fp32", "bf16"],
                   "workloads": [{**w, "train": {"steps": 2, "eval_every": 2}} for w in workloads],
                   "memory": {"batch_sizes": cfg["sweep"], "steps": 4, "confirm": False}},
    }


def suite_figures(out: Path, memory: Path) -> dict:
    """Per workload and precision: speed, MFU, energy, memory, and the sweep's fitted line;
    from whatever each folder holds (a suite cut short by its time limit is evidence too, and
    its step says it was cut)."""
    from ampcert.memory import fit_sweep
    from ampcert.results import load

    rs = load(out) if out.is_dir() else None
    rows = rs.frame().to_dict("records") if rs is not None and rs.runs else []
    fp32 = {r["workload"]: r["samples_per_s"] for r in rows if r["precision"] == "fp32" and r["samples_per_s"]}
    figures = []
    for r in rows:
        base = fp32.get(r["workload"])
        figures.append({k: r.get(k) for k in ("workload", "precision", "status", "reason", "samples_per_s", "mfu",
                                              "energy_j_per_sample", "peak_memory_bytes", "final_metric")}
                       | {"speedup_vs_fp32": r["samples_per_s"] / base if base and r["samples_per_s"] else None})
    swept = load(memory).memory_runs if memory.is_dir() else []
    fits = [{"workload": f.subject.workload, "precision": f.subject.precision, "bytes_per_sample": f.bytes_per_sample,
             "fixed_bytes": f.fixed_bytes, "note": f.note} for f in fit_sweep(swept)]
    return {"runs": figures, "memory_fits": fits}


def _json_file(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def markdown(ev: dict) -> str:
    m = ev["machine"]
    what = m.get("gpu") or m.get("cpu", "?")
    lines = [f"# GPU evidence: {what}", "",
             f"`{ev['command']}` on {m['date']}; torch {m['torch']}, CUDA {m.get('cuda')}, "
             f"driver {m.get('driver', '-')}, Python {m['python']}."
             + (" **Quick mode: small settings, figures for the script's own check only.**" if ev["quick"] else ""), ""]
    if m.get("clocks_mhz"):
        c = m["clocks_mhz"]
        lines += [f"Clocks seen: SM {c['sm']} MHz (max {c['sm_max']}), memory {c['memory']} MHz (max "
                  f"{c['memory_max']}); power limit {m['power_limit_w']:.0f} W.", ""]
    if m.get("cpu_flags") is not None:
        lines += [f"CPU: {m.get('cpu')}, {m.get('cores')} cores, flags {', '.join(m['cpu_flags']) or 'none of note'}.", ""]
    lines += ["## Matmul rate per precision", "", "| precision | TFLOP/s | × fp32 | note |", "|---|---|---|---|"]
    for p, r in (ev.get("matmul") or {}).items():
        lines.append(f"| {p} | {_num(r['tflops'])} | {_num(r['speedup_vs_fp32'])} | {r['note'] or ''} |")
    lines += ["", "## Workloads per precision (`ampcert run`)", "",
              "| workload | precision | status | samples/s | × fp32 | MFU | J/sample | peak memory | bytes/sample (sweep) |",
              "|---|---|---|---|---|---|---|---|---|"]
    fits = {(f["workload"], f["precision"]): f["bytes_per_sample"] for f in (ev.get("suites") or {}).get("memory_fits", [])}
    for r in (ev.get("suites") or {}).get("runs", []):
        lines.append(f"| {r['workload']} | {r['precision']} | {r['status']} | {_num(r['samples_per_s'])} | "
                     f"{_num(r['speedup_vs_fp32'])} | {_num(r['mfu'])} | {_num(r['energy_j_per_sample'])} | "
                     f"{_num(r['peak_memory_bytes'])} | {_num(fits.get((r['workload'], r['precision'])))} |")
    lines += ["", "## ampcert's AMP against native", ""]
    for name, figures in (ev.get("amp_vs_native") or {}).items():
        lines.append(f"- **{name}**: " + (", ".join(f"{k} {_num(v)}" for k, v in figures.items()) if figures else "no figures"))
    lines += ["", "## Checks", ""]
    for name, check in (ev.get("checks") or {}).items():
        lines.append(f"- **{name}**: {check}")
    lines += ["", "## Steps", "", "| step | status | seconds | command |", "|---|---|---|---|"]
    for name, s in ev["steps"].items():
        lines.append(f"| {name} | {s['status']}{': ' + s['reason'] if s.get('reason') else ''} | {s.get('seconds', '-')} "
                     f"| `{s['command']}` |")
    return "\n".join(lines) + "\n"


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _ratio(comparison: dict, variant: str) -> float | None:
    """The ratio to the baseline of the row of a gpt_step_overhead comparison whose variant
    names ``variant``."""
    return next((row.get("ratio") for row in comparison.get("rows", []) if variant in row["variant"]), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true", help="small settings (CI's check of the script)")
    ap.add_argument("--out", type=Path, default=Path("gpu-evidence"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="the whole run's time (default 7 minutes)")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device here (use --device cpu)")
    deadline = time.monotonic() + args.budget_s
    cfg = SIZES[args.device] | (QUICK if args.quick else {})
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # The runs' folders stay outside --out, which holds the two files alone (what a lent
    # machine sends back is a few files, not a results tree).
    work = Path(tempfile.mkdtemp(prefix="gpu-evidence-"))
    py = sys.executable
    ev: dict = {"command": shlex.join(["python", "benchmarks/gpu_evidence.py", *(sys.argv[1:] if argv is None else argv)]),
                "quick": args.quick, "work": str(work), "machine": machine(args.device), "steps": {}}
    ev["matmul"] = matmul_rates(args.device, cfg["precisions"])

    folders = {}
    for name, doc in suites(args.device, cfg).items():
        suite_file, folders[name] = work / f"{name}.yaml", work / name
        suite_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        _step(ev, f"suite: {name}", [py, "-m", "ampcert", "run", str(suite_file), "--out", str(folders[name])],
              {"precisions": 200, "memory": 100}[name], deadline)
    try:
        ev["suites"] = suite_figures(folders["precisions"], folders["memory"])
    except Exception as exc:  # noqa: BLE001 - a folder a timed-out run left unreadable: said, not fatal
        ev["suites"] = {"runs": [], "memory_fits": [], "unreadable": f"{type(exc).__name__}: {exc}"}

    amp: dict = {}
    dispatch = work / "dispatch.json"
    _step(ev, "dispatch", [py, str(BENCH / "dispatch_overhead.py"), "--device", args.device, "--rounds",
                           str(cfg["rounds"]), "--json", str(dispatch)], 90, deadline)
    got = _json_file(dispatch)
    if got:
        amp["per-op dispatch, ampcert / native"] = {label: w["ampcert_over_native"]["ratio"]
                                                    for label, w in got.get("workloads", {}).items()}
    for dtype in ("bf16", "fp16"):
        step_json = work / f"gpt-step-{dtype}.json"
        _step(ev, f"gpt step {dtype}", [py, str(BENCH / "gpt_step_overhead.py"), "--device", args.device,
                                        "--size", "tiny" if args.quick else cfg["size"], "--dtype", dtype,
                                        "--rounds", str(cfg["rounds"]), "--steps", str(cfg["gpt_steps"]),
                                        "--json", str(step_json)], 90, deadline)
        got = _json_file(step_json)
        if got:
            amp[f"GPT step eager {dtype}" + (" (scaler included)" if dtype == "fp16" else "")] = {
                "ampcert / native": _ratio(got["comparison"], "ampcert"),
                "control": _ratio(got["comparison"], "again"), "host-bound ratio": got.get("host_bound_ratio")}
    # The GPT step compiled whole (Inductor on a GPU; aot_eager on a CPU, which needs no C compiler).
    from ampcert.amp.torch.support import REGION_IN_TRACE_MIN, release, release_name

    backend = "inductor" if args.device == "cuda" else "aot_eager"
    if release(torch.__version__) < REGION_IN_TRACE_MIN:
        ev["steps"]["gpt step compiled"] = {
            "command": f"benchmarks/gpt_step_overhead.py --compile {backend}", "status": "not run",
            "reason": f"ampcert's region inside a compiled step needs torch {release_name(REGION_IN_TRACE_MIN)}+"}
    else:
        step_json = work / "gpt-step-compiled.json"
        _step(ev, "gpt step compiled", [py, str(BENCH / "gpt_step_overhead.py"), "--device", args.device,
                                        "--size", "tiny" if args.quick else cfg["size"], "--dtype", "bf16",
                                        "--compile", backend, "--rounds", str(cfg["rounds"]),
                                        "--steps", str(cfg["gpt_steps"]), "--json", str(step_json)], 150, deadline)
        got = _json_file(step_json)
        if got:
            amp[f"GPT step compiled ({backend}) bf16"] = {
                "ampcert / native": _ratio(got["comparison"], "ampcert"),
                "control": _ratio(got["comparison"], "again")}
    ev["amp_vs_native"] = amp

    checks: dict = {}
    audit = work / "audit.json"
    proc = _step(ev, "audit", [py, "-m", "ampcert", "audit", "--device", args.device, "--json-out", str(audit)],
                 120, deadline)
    rows = (_json_file(audit) or {}).get("rows", [])
    if proc is not None and rows:
        checks["audit"] = (f"{sum(r['agree'] for r in rows)}/{len(rows)} ops agree with native "
                           f"(exit {proc.returncode}; every row in evidence.json)")
        ev["audit_rows"] = rows
    if args.device == "cuda":
        proc = _step(ev, "gpu tests", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/amp",
                                       "tests/test_memory.py"], 150, deadline)
        if proc is not None:
            checks["gpu-marked tests"] = (proc.stdout.strip().splitlines() or ["no output"])[-1]
    else:
        ev["steps"]["gpu tests"] = {"command": "pytest -m gpu tests/amp tests/test_memory.py", "status": "not run",
                                    "reason": "no GPU"}
    ev["checks"] = checks
    (out / "evidence.json").write_text(json.dumps(ev, indent=1, default=str) + "\n")
    (out / "evidence.md").write_text(markdown(ev))
    print(f"wrote {out / 'evidence.json'} and {out / 'evidence.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
