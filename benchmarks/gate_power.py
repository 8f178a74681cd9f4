"""The history gate against the two-point compare: false alarms and detection on synthetic nightly histories.

The noise is this machine's. First, ``--nights`` real nights are run (the
digits suite, fp32 and bf16, ``--seeds`` seeds, ``ampcert run`` end to end, one
after another) and per metric two coefficients of variation are measured:
across nights (of each night's median over seeds: what the history gate sees)
and across seeds within a night (what the two-point compare's tests see).
``--cv-from DIR...`` measures them from existing results folders instead.

Then, per metric and both methods, on synthetic nights drawn with those CVs
(per seed: night level x (1 + seed noise); the night level: 1 + night noise):

- **false alarms**: ``--trials`` histories of ``--warmup`` nights then 30
  nights of pure noise, gated each night; the share of histories with any
  alarm in the 30 nights (and the share of nights that alarm);
- **detection within 3 nights**: a history of ``--warmup`` nights, then a 3%
  step the wrong way (throughput down, times and memory up); the share of
  histories in which one of the first 3 nights after the step alarms.

The history gate is ``ampcert.history.changepoints.judge`` (what ``ampcert gate``
runs per series); the two-point compare is ``ampcert.gate.compare_metric`` with
the shipped gate settings (what ``ampcert compare`` runs per metric), each
night against the night before. Goal (issue 23): <= 1% false alarms over 30
nights and >= 95% detection within 3 nights. Nothing is asserted; exit 0.

    python benchmarks/gate_power.py [--nights 6] [--trials 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ampcert.gate import load_gate
from ampcert.gate.metrics import compare_metric
from ampcert.gate.result import SubjectKey
from ampcert.results import Measured, RunResult, load
from ampcert.spec import expand, parse_suite

SUITE = """\
name: gate-power
device: cpu
amp: ampcert
precisions: [fp32, bf16]
seeds: {seeds}
train: {{steps: 60, eval_every: 30}}
timeout_s: 600
workloads:
  - workload: digits
"""
# Metrics simulated, and the direction that is worse.
METRICS = {"samples_per_s": -1, "peak_memory_bytes": +1}
STEP = 0.03


def run_nights(n: int, seeds: int, folder: Path) -> list[Path]:
    suite = folder / "suite.yaml"
    suite.write_text(SUITE.format(seeds=list(range(seeds))))
    out = []
    for i in range(n):
        night = folder / f"night-{i}"
        done = subprocess.run([sys.executable, "-m", "ampcert", "run", str(suite), "--out", str(night)],
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"ampcert run failed:\n{done.stdout}{done.stderr}")
        print(f"measured night {i + 1}/{n}", file=sys.stderr)
        out.append(night)
    return out


def measure_cv(folders: list[Path]) -> dict[str, tuple[float, float]]:
    """metric -> (CV across nights of the fp32 median, CV across seeds within a night, averaged)."""
    cvs = {}
    for metric in METRICS:
        nightly, within = [], []
        for folder in folders:
            values = [_value(r, metric) for r in load(folder).runs
                      if r.status == "completed" and r.spec.precision == "fp32" and r.spec.repeat == 0]
            values = [v for v in values if v is not None]
            if len(values) >= 2:
                nightly.append(statistics.median(values))
                within.append(statistics.stdev(values) / statistics.mean(values))
        if len(nightly) >= 2:
            cvs[metric] = (statistics.stdev(nightly) / statistics.mean(nightly), statistics.mean(within))
    return cvs


def _value(r: RunResult, metric: str) -> float | None:
    if metric == "samples_per_s":
        return r.samples_per_s
    return r.peak_memory.value if r.peak_memory else None


def synthetic_night(specs, level: float, cv_seed: float, metric: str, rng) -> list[RunResult]:
    runs = []
    for spec in specs:
        v = 1000.0 * level * (1 + cv_seed * rng.standard_normal())
        fields = {"samples_per_s": v} if metric == "samples_per_s" else {
            "peak_memory": Measured(value=v, unit="bytes", method="synthetic")}
        runs.append(RunResult(run_id=spec.run_id, spec=spec, status="completed", steps=60, train_samples=60 * 64,
                              metric="accuracy", higher_is_better=True, final_metric=0.9, **fields))
    return runs


def night_levels(n: int, cv_night: float, rng) -> np.ndarray:
    return 1 + cv_night * rng.standard_normal(n)


def simulate(metric: str, cv_night: float, cv_seed: float, trials: int, warmup: int, seeds: int, rng):
    from ampcert.history.changepoints import judge

    specs = expand(parse_suite({"name": "sim", "precisions": ["fp32"], "seeds": list(range(seeds)),
                                "workloads": [{"workload": "digits"}]}), "cpu")
    cfg = load_gate()
    mg = cfg.metrics[metric]
    subject = SubjectKey(workload="digits", backend="torch", amp="native", precision="fp32")
    worse = METRICS[metric]
    # The per-night level's own noise: the nightly median's CV less what the seeds explain.
    level_cv = max(cv_night ** 2 - (1.2533 * cv_seed) ** 2 / seeds, 0.0) ** 0.5

    def nights(levels):
        return [synthetic_night(specs, lv, cv_seed, metric, rng) for lv in levels]

    def history_alarm(values, k):
        return judge(values[:k + 1], higher_is_better=worse < 0).status == "REGRESSION"

    def compare_alarm(runs, k):
        row = compare_metric(metric, mg, cfg, subject, None, runs[k - 1], runs[k], rng)
        return row is not None and row.status == "REGRESSION"

    out = {}
    for name, alarm in (("history gate", history_alarm), ("two-point compare", compare_alarm)):
        fa_any = fa_nights = det = 0
        for _ in range(trials):
            levels = night_levels(warmup + 30, level_cv, rng)
            runs = nights(levels)
            values = [statistics.median(_value(r, metric) for r in night) for night in runs]
            fired = [alarm(values if name == "history gate" else runs, k) for k in range(warmup, warmup + 30)]
            fa_any += any(fired)
            fa_nights += sum(fired)
            levels = night_levels(warmup + 3, level_cv, rng)
            levels[warmup:] *= 1 + worse * STEP
            runs = nights(levels)
            values = [statistics.median(_value(r, metric) for r in night) for night in runs]
            det += any(alarm(values if name == "history gate" else runs, k) for k in range(warmup, warmup + 3))
        out[name] = {"false_alarm_30_nights": fa_any / trials, "false_alarm_per_night": fa_nights / (30 * trials),
                     "detection_within_3": det / trials}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nights", type=int, default=6, help="real nights run to measure the noise (default 6)")
    p.add_argument("--seeds", type=int, default=4, help="seeds per night, real and synthetic (default 4)")
    p.add_argument("--cv-from", nargs="+", type=Path, help="measure the noise from these results folders instead")
    p.add_argument("--trials", type=int, default=200, help="synthetic histories per figure (default 200)")
    p.add_argument("--warmup", type=int, default=15, help="nights of history before the 30 judged (default 15)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.nights < 2 or args.seeds < 2 or args.trials < 1 or args.warmup < 6:
        p.error("--nights and --seeds must be >= 2, --trials >= 1, --warmup >= 6")
    if args.cv_from:
        folders = args.cv_from
        cvs = measure_cv(folders)
    else:
        with tempfile.TemporaryDirectory(prefix="ampcert-gate-power-") as tmp:
            cvs = measure_cv(run_nights(args.nights, args.seeds, Path(tmp)))
    rng = np.random.default_rng(args.seed)
    command = "python benchmarks/gate_power.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"# {command.strip()}")
    print(f"# {os.cpu_count()} CPUs; noise from {'the given folders' if args.cv_from else f'{args.nights} nights'}; "
          f"{args.trials} synthetic histories per figure; a {STEP:.0%} step")
    print(f"{'metric':<20}{'CV night':>9}{'CV seed':>9}  {'method':<18}{'FA/30 nights':>13}{'FA/night':>10}"
          f"{'detect<=3':>11}")
    results = {}
    for metric, (cv_night, cv_seed) in cvs.items():
        sim = simulate(metric, cv_night, cv_seed, args.trials, args.warmup, args.seeds, rng)
        results[metric] = {"cv_night": cv_night, "cv_seed": cv_seed, **sim}
        for method, f in sim.items():
            print(f"{metric:<20}{cv_night:>9.2%}{cv_seed:>9.2%}  {method:<18}{f['false_alarm_30_nights']:>13.1%}"
                  f"{f['false_alarm_per_night']:>10.2%}{f['detection_within_3']:>11.1%}")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
