"""Memory per precision on this machine: a real memory sweep, its fitted lines, and how well
each line predicts a batch size it never saw.

What is measured (one `ampcert run` of a generated suite, through ``ampcert.run_suite``):

For each workload (``--workloads``, default ``digits,gpt``) in fp32 and bf16 (``--precisions``),
one short run (``--steps``, default 4) per batch size of ``--batches`` plus ``--holdout``.
ampcert reads each run's peak after training and before any evaluation: on CUDA
``torch.cuda.max_memory_reserved`` over the steps after the first (the warm-up's peak reset),
on a CPU the worker's peak RSS (which includes the framework and the data set). The lines
(fixed bytes + bytes per sample, ``ampcert.memory.fit_sweep``) are fitted on ``--batches``
alone; the held-out batch is then measured against the line's prediction.

Reported per workload and precision: the fixed bytes and the bytes per sample with their
standard errors, the largest residual, the saving per sample against fp32 with its 90%
interval (delta method), the prediction at the held-out batch against its measured peak
(prediction / measured), and the largest batch within each ``--budgets``. On CUDA, NVML's
peak used memory of the device is printed beside each point where it was sampled. Nothing
is asserted (tests/test_memory.py holds the 10% prediction on CPU); the script exits 0
once the suite ran.

Defaults per device: on a CPU, batches 32,64,128 and held-out 96 (digits and gpt tiny, a
few seconds a run); on CUDA, 64,256,1024 and held-out 512, budgets 24GiB,80GiB. The fitted
line only holds where the memory grows linearly in the batch: a run whose activations no
longer dominate (tiny batches on a GPU, where the allocator's block sizes step) shows in the
residuals.

Run from the repository root::

    .venv/bin/python benchmarks/memory_sweep.py [--device auto] [--workloads digits,gpt]
        [--batches 32,64,128] [--holdout 96] [--budgets 1GiB] [--json out.json]

48 s on 2 cores of an AVX2-only AMD EPYC (bf16 emulated: gpt tiny's bf16 steps are ~7x
fp32's); less with bf16 units.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

import yaml

DEFAULTS = {
    "cpu": {"batches": [32, 64, 128], "holdout": 96, "budgets": ["1GiB"]},
    "cuda": {"batches": [64, 256, 1024], "holdout": 512, "budgets": ["24GiB", "80GiB"]},
}
PARAMS = {"gpt": {"size": "tiny"}, "resnet": {"size": "tiny"}}


def _suite(device: str, workloads: list[str], precisions: list[str], batches: list[int], steps: int,
           budgets: list[str]) -> dict:
    return {
        "name": "memory-benchmark", "device": device, "precisions": precisions, "unaccelerated": "run",
        "memory": {"batch_sizes": batches, "steps": steps, **({"budgets": budgets} if budgets else {})},
        "workloads": [{"workload": w, **({"params": PARAMS[w]} if w in PARAMS else {}), "train": {"steps": 2}}
                      for w in workloads],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--workloads", default="digits,gpt")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--batches", help="batch sizes the lines are fitted on (comma-separated, >= 3)")
    parser.add_argument("--holdout", type=int, help="a batch size left out of the fit, to predict")
    parser.add_argument("--budgets", help="device-memory budgets, e.g. 24GiB,80GiB")
    parser.add_argument("--steps", type=int, default=4, help="steps per sweep run (the first is the warm-up)")
    parser.add_argument("--out", help="results folder (default: a temporary one)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    from ampcert.formats import budget, fine_size, size
    from ampcert.memory import fit_sweep
    from ampcert.results import load
    from ampcert.runner.planning import resolve_device
    from ampcert.session import run_suite
    from ampcert.spec import MemorySweep

    device = resolve_device(args.device)
    batches = [int(b) for b in args.batches.split(",")] if args.batches else DEFAULTS[device]["batches"]
    holdout = args.holdout or DEFAULTS[device]["holdout"]
    budgets = args.budgets.split(",") if args.budgets else DEFAULTS[device]["budgets"]
    workloads, precisions = args.workloads.split(","), args.precisions.split(",")
    if holdout in batches:
        parser.error(f"--holdout {holdout} is one of --batches: it must be a size the fit never saw")
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="memory-benchmark-")) / "out"
    suite = _suite(device, workloads, precisions, sorted([*batches, holdout]), args.steps, budgets)
    suite_file = out.parent / "memory-benchmark.yaml"
    suite_file.parent.mkdir(parents=True, exist_ok=True)
    suite_file.write_text(yaml.safe_dump(suite, sort_keys=False))

    run_suite(suite_file, out)
    rs = load(out)
    budget_bytes = [int(b) for b in MemorySweep.model_validate(suite["memory"]).budgets]
    fitted = [r for r in rs.memory_runs if r.spec.sweep.batch_size != holdout]
    held = {(r.spec.label, r.spec.precision): r for r in rs.memory_runs if r.spec.sweep.batch_size == holdout}
    fits = fit_sweep(fitted, budget_bytes)

    command = "python benchmarks/memory_sweep.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    print(f"memory sweep on {device} ({rs.memory_runs[0].peak_memory.method if rs.memory_runs else '-'})")
    print(f"fitted on batches {batches}, predicting batch {holdout}; {args.steps} steps a run\n")
    print(f"{'workload':10} {'prec':5} {'fixed':>14} {'per sample':>22} {'max resid':>9} "
          f"{'saving vs fp32 (90% CI)':>28} {'predicted/measured @' + str(holdout):>24}  largest batch per budget")
    rows = []
    for fit in fits:
        key = (fit.subject.workload, fit.subject.precision)
        run = held.get(key)
        measured = run.peak_memory.value if run is not None and run.status == "completed" else None
        predicted = fit.predict(holdout) if fit.bytes_per_sample is not None else None
        ratio = predicted / measured if predicted is not None and measured else None
        saving = fit.saving
        saving_text = "-" if saving is None else (
            f"{saving.fraction:+.1%}" + (f" [{saving.interval[0]:+.1%}, {saving.interval[1]:+.1%}]"
                                          if saving.interval else ""))
        per_sample = "-" if fit.bytes_per_sample is None else (
            fine_size(fit.bytes_per_sample)
            + (f" ± {fine_size(fit.per_sample_stderr)}" if fit.per_sample_stderr is not None else ""))
        largest = ", ".join(f"{b.largest_batch if b.largest_batch is not None else '-'} in {budget(b.budget_bytes)}"
                            for b in fit.budgets)
        print(f"{key[0]:10} {key[1]:5} {size(fit.fixed_bytes):>14} {per_sample:>22} "
              f"{'-' if fit.max_residual_share is None else f'{fit.max_residual_share:.1%}':>9} {saving_text:>28} "
              f"{'-' if ratio is None else f'{ratio:.3f} ({size(predicted)} / {size(measured)})':>24}  {largest}")
        if fit.note:
            print(f"    note: {fit.note}")
        for p in fit.points:
            if p.device_used_bytes is not None:
                print(f"    batch {p.batch}: allocator {size(p.peak_bytes)}, NVML device used {size(p.device_used_bytes)}")
        rows.append({"workload": key[0], "precision": key[1], "fit": fit.model_dump(mode="json"),
                     "holdout": holdout, "holdout_measured_bytes": measured, "holdout_predicted_bytes": predicted,
                     "predicted_over_measured": ratio})
    print(f"\nresults: {out}\ncommand: {command}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "command": command, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
