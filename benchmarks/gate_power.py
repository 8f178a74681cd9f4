"""How well the nightly gates work on this machine: false alarms and detection, signal by signal.

**The question.** A nightly benchmark is only useful if its gate is quiet on
noise and loud on a real slow-down. The goal (issues 23 and 36): at most 1% of
30-night stretches of pure noise raise any alarm, and at least 95% of 3% steps
the wrong way are caught within 3 nights. Whether a signal can reach it
depends on its noise, so this measures the noise first, on real nights.

**The signals** are every throughput figure the nightly history keeps per
subject (``ampcert.history.records.METRICS``; ``ampcert.aggregate.FIGURES``
defines them), for the fp32 and for the bf16 subject:

- ``samples_per_s``: training samples over training time, the whole run
  (warm-up, data loading and evals' interruptions included);
- ``step_samples_per_s``: the steady state, the median of each step's
  samples/s after the run's own warm-up (MSER-5, ``ampcert.steady_state``);
- ``paired_speedup_vs_fp32`` (bf16 only): per seed, bf16's steady throughput
  over fp32's of the same seed, the night's value the median over seeds.
  ``spec.expand`` interleaves the matrix (fp32 s0, bf16 s0, fp32 s1, ...), so
  the two runs of a pair ran seconds apart: whatever slows the machine for
  minutes (a neighbour VM, a throttled clock, a busy disk) slows both, and
  their ratio cancels it. It cannot cancel what changes faster than a pair
  takes to run, and it measures a precision's gain, not the machine's speed:
  a regression that slows fp32 and bf16 alike leaves it unmoved;
- the speed probe's (``ampcert.probe_summary``; ampcert/backends/speed_probe.py),
  measured after the certified runs in one process per probe, the fp32 and bf16
  models alternating in windows of a few steps with a calibration kernel timed
  between them: ``probe_speedup_vs_fp32`` (bf16 only: the gain, with the machine's
  drift cancelled within milliseconds), ``probe_step_ms`` and
  ``probe_step_kernel_units`` (each path's step time, absolute and in units of the
  kernel's), and ``instructions_per_step``/``cycles_per_step`` where the kernel
  exposes hardware counters. A probe's "seeds" are its processes;
- ``peak_memory_bytes``, a control: nearly deterministic, so any gate should
  do well on it.

**Measuring the noise.** ``--nights`` real nights are run one after another
(``ampcert run`` of a digits suite, fp32 and bf16, ``--seeds`` seeds, 60 steps;
``--keep DIR`` keeps their folders so the figures can be recomputed with
``--cv-from DIR/night-*``). Each night is read exactly as the gate reads it,
``read_night(folder).points``: per (subject, metric) a ``value`` (the median
over seeds) and its ``samples`` (one per seed). Per signal, two coefficients
of variation: across nights (of ``value``: what the history gate sees) and
across seeds within a night (of ``samples``, averaged over the nights: what
the two-point compare's tests see). For ``step_samples_per_s`` also the CV of
a run's steady steps, which the compare's bootstrap resamples. Nights run back
to back share an afternoon; real nights on different days drift more, so the
night-to-night figures here are if anything optimistic.

**Simulating.** Per signal, synthetic nights with its own CVs: each seed's
value is ``level x (1 + cv_seed x N(0,1))``, with ``level = 1 + cv_level x
N(0,1)`` per night, where ``cv_level`` is the night-to-night CV less what the
median of the seeds already explains. ``--trials`` histories of ``--warmup``
nights then 30 nights of pure noise give the false alarms (the share of
histories with any alarm in the 30 nights, and the share of judged nights
that alarm); as many histories of ``--warmup`` nights then a 3% step the wrong
way (throughput down, memory up) give the detection (the share in which one
of the 3 nights after the step alarms). Two gates judge the same histories:

- the **history gate**, ``ampcert.history.changepoints.judge`` on the series
  of nightly values, what ``ampcert gate`` runs per series;
- the **two-point compare**, ``ampcert.gate.metrics.compare_metric`` with the
  shipped settings (``load_gate()``), what ``ampcert compare`` runs per
  metric, each night's runs against the night before's. It needs runs, so each
  synthetic seed is a copy of a real run with its figure replaced (for
  ``step_samples_per_s``: 60 step times with the measured per-step CV). The
  compare gates a subject's own figures between two folders (throughput,
  memory, time, quality, energy): it has no paired speed-up, a ratio inside
  one folder, so that row reads n/a.

Nothing is asserted; exit 0. The header names the command, the CPU and its
relevant flags, and whether hardware counters (instructions retired, a signal
that ignores the clock) could be read here: a ``cpu`` PMU under
/sys/bus/event_source/devices. Each night's line says how much of its wall time
the speed probe took (its processes' first start to last end) against the rest:
the probe's cost, measured in the same night as its control. ``--probe-share``,
``--probe-max-seconds`` and ``--probe-processes`` set the suite's ``speed_probe``
(default: the suite's defaults).

    python benchmarks/gate_power.py [--nights 6] [--seeds 4] [--trials 200]
        [--probe-share F] [--probe-max-seconds S] [--probe-processes N]
        [--keep DIR | --cv-from DIR...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ampcert.aggregate import group_key, is_repeat, step_throughputs
from ampcert.gate import load_gate
from ampcert.gate.metrics import compare_metric
from ampcert.gate.samples import collect_samples
from ampcert.gate.settings import GateConfig
from ampcert.history.changepoints import judge
from ampcert.history.records import read_night
from ampcert.results import RunResult, load
from ampcert.steady_state import steady_steps
from ampcert.vocabulary import Subject

STEPS = 60
SUITE = """\
name: gate-power
device: cpu
amp: ampcert
precisions: [fp32, bf16]
seeds: {seeds}
train: {{steps: {steps}, eval_every: 30}}
timeout_s: 600
{probe}workloads:
  - workload: digits
"""
# The signals, with the direction that is worse (-1: down).
SIGNALS = {"samples_per_s": -1, "step_samples_per_s": -1, "paired_speedup_vs_fp32": -1,
           "probe_speedup_vs_fp32": -1, "probe_step_ms": +1, "probe_step_kernel_units": +1,
           "instructions_per_step": +1, "cycles_per_step": +1, "peak_memory_bytes": +1}
STEP = 0.03
JUDGED = 30
WITHIN = 3
GOAL_FALSE_ALARMS, GOAL_DETECTION = 0.01, 0.95
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
PMU_DIR = Path("/sys/bus/event_source/devices")
HISTORY, COMPARE = "history gate", "two-point compare"


# --------------------------------------------------------------------------- the machine


def cpu_line() -> tuple[str, dict[str, bool]]:
    model, flags = "unknown CPU", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return model, {f: f in flags for f in CPU_FLAGS}


def counters_line() -> tuple[bool, str]:
    """Whether a hardware PMU (instructions retired) is exposed, and one line saying so."""
    pmus = sorted(p.name for p in PMU_DIR.iterdir()) if PMU_DIR.is_dir() else []
    try:
        paranoid = Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
    except OSError:
        paranoid = "unreadable"
    where = f"PMUs under {PMU_DIR}: {', '.join(pmus) or 'none'}; perf_event_paranoid {paranoid}"
    if "cpu" in pmus:
        return True, (f"instructions retired: a `cpu` PMU is exposed here ({where}): the speed probe "
                      "counts instructions and cycles per step")
    return False, (f"instructions retired: not available here (no `cpu` PMU; {where}): "
                   "the time-based signals are all there is")


# --------------------------------------------------------------------------- real nights


def steal_s() -> float | None:
    """CPU time the hypervisor gave to others (all CPUs, /proc/stat), in seconds."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def probe_span_s(folder: Path) -> float:
    """Seconds from the first speed-probe process's start to the last one's end (0: none ran)."""
    from datetime import datetime

    runs = load(folder).probe_runs
    if not runs:
        return 0.0
    start = min(datetime.fromisoformat(r.started_at or "") for r in runs)
    end = max(datetime.fromisoformat(r.finished_at or "") for r in runs)
    return (end - start).total_seconds()


def run_nights(n: int, seeds: int, folder: Path, probe: dict[str, Any]) -> tuple[list[Path], list[dict[str, Any]]]:
    """``n`` nights run one after another into ``folder``; each night's wall time, load and steal time."""
    suite = folder / "suite.yaml"
    settings = f"speed_probe: {json.dumps(probe)}\n" if probe else ""
    suite.write_text(SUITE.format(seeds=list(range(seeds)), steps=STEPS, probe=settings))
    out, log = [], []
    for i in range(n):
        night = folder / f"night-{i}"
        start, steal = time.monotonic(), steal_s()
        done = subprocess.run([sys.executable, "-m", "ampcert", "run", str(suite), "--out", str(night)],
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"ampcert run failed:\n{done.stdout}{done.stderr}")
        after = steal_s()
        wall = time.monotonic() - start
        probe_s = probe_span_s(night)
        entry = {"folder": str(night), "wall_s": round(wall, 1), "probe_s": round(probe_s, 2),
                 "probe_overhead": round(probe_s / (wall - probe_s), 4),
                 "loadavg_1m": os.getloadavg()[0],
                 "steal_s": None if steal is None or after is None else round(after - steal, 2)}
        print(f"measured night {i + 1}/{n}: {entry['wall_s']:.0f} s, the speed probe {probe_s:.1f} s of it "
              f"(+{entry['probe_overhead']:.1%} on the rest), load {entry['loadavg_1m']:.2f}, "
              f"steal {entry['steal_s']} s", file=sys.stderr)
        out.append(night)
        log.append(entry)
    return out, log


@dataclass
class Signal:
    """One (subject, metric) series of real nights, as the gate reads it."""

    subject: Subject
    metric: str
    values: list[float] = field(default_factory=list)         # per night: the median over seeds
    samples: list[list[float]] = field(default_factory=list)  # per night: one value per seed
    step_cvs: list[float] = field(default_factory=list)       # per run: CV of its steady steps
    templates: list[RunResult] = field(default_factory=list)  # the subject's runs of its first night

    @property
    def seeds(self) -> int:
        return int(statistics.median(len(s) for s in self.samples))

    @property
    def mean(self) -> float:
        return statistics.mean(self.values)

    @property
    def cv_night(self) -> float:
        return statistics.stdev(self.values) / abs(self.mean)

    @property
    def cv_seed(self) -> float:
        return statistics.mean(statistics.stdev(s) / abs(statistics.mean(s)) for s in self.samples if len(s) >= 2)

    @property
    def cv_step(self) -> float | None:
        return statistics.mean(self.step_cvs) if self.step_cvs and self.metric == "step_samples_per_s" else None


def measure(folders: list[Path]) -> list[Signal]:
    signals: dict[tuple[Subject, str], Signal] = {}
    sources: dict[Subject, Path] = {}  # the folder whose runs of a subject are its templates: its first
    for folder in folders:
        for p in read_night(folder).points:
            if p.metric in SIGNALS and p.samples:
                sig = signals.setdefault((p.subject, p.metric), Signal(p.subject, p.metric))
                sig.values.append(p.value)
                sig.samples.append(list(p.samples))
        for r in load(folder).runs:
            if r.status != "completed" or is_repeat(r):
                continue
            steps = steady_steps(step_throughputs(r))
            for (subject, _), sig in signals.items():
                if subject == group_key(r):
                    if len(steps) >= 2:
                        sig.step_cvs.append(float(np.std(steps, ddof=1) / np.mean(steps)))
                    if sources.setdefault(subject, folder) == folder:
                        sig.templates.append(r)
    return [s for s in signals.values() if len(s.values) >= 2 and any(len(x) >= 2 for x in s.samples)]


# --------------------------------------------------------------------------- synthetic nights


def synthetic_run(template: RunResult, metric: str, value: float, cv_step: float | None, rng) -> RunResult:
    """A copy of a real run whose ``metric`` reads ``value``."""
    if metric == "samples_per_s":
        return template.model_copy(update={"samples_per_s": value})
    if metric == "peak_memory_bytes":
        assert template.peak_memory is not None
        return template.model_copy(update={"peak_memory": template.peak_memory.model_copy(update={"value": value})})
    if metric == "step_samples_per_s":
        steps = template.steps or STEPS
        batch = template.train_samples / steps
        rates = value * (1 + (cv_step or 0.0) * rng.standard_normal(steps))
        return template.model_copy(update={"step_times_ms": [float(ms) for ms in batch * 1e3 / np.maximum(rates, 1e-9)]})
    raise KeyError(metric)


@dataclass
class SyntheticNight:
    value: float                     # what the history keeps: the median over seeds
    runs: list[RunResult] | None     # what the compare reads (None where it has no such metric)


def simulate(sig: Signal, cfg: GateConfig, trials: int, warmup: int, rng: np.random.Generator) -> dict[str, Any]:
    worse = SIGNALS[sig.metric]
    seeds = sig.seeds
    compared = sig.metric in cfg.metrics and len(sig.templates) >= seeds
    # the night level's own noise: the nightly median's CV less what the seeds explain
    # (the median of n normal values has a standard deviation of about 1.2533 sigma / sqrt(n))
    level_cv = max(sig.cv_night ** 2 - (1.2533 * sig.cv_seed) ** 2 / seeds, 0.0) ** 0.5

    def night(level: float) -> SyntheticNight:
        per_seed = sig.mean * level * (1 + sig.cv_seed * rng.standard_normal(seeds))
        if not compared:
            return SyntheticNight(float(np.median(per_seed)), None)
        runs = [synthetic_run(t, sig.metric, float(v), sig.cv_step, rng) for t, v in zip(sig.templates, per_seed, strict=False)]
        return SyntheticNight(float(np.median(collect_samples(sig.metric, runs).per_run)), runs)

    def history(n: int, step_at: int | None = None) -> list[SyntheticNight]:
        levels = 1 + level_cv * rng.standard_normal(n)
        if step_at is not None:
            levels[step_at:] *= 1 + worse * STEP
        return [night(lv) for lv in levels]

    def history_alarm(nights: list[SyntheticNight], k: int) -> bool:
        return judge([n.value for n in nights[:k + 1]], higher_is_better=worse < 0).status == "REGRESSION"

    def compare_alarm(nights: list[SyntheticNight], k: int) -> bool:
        base, cand = nights[k - 1].runs, nights[k].runs
        assert base is not None and cand is not None
        mg = cfg.metrics[sig.metric]  # type: ignore[index]  # (compared: a gate metric)
        row = compare_metric(sig.metric, mg, cfg, sig.subject, None, base, cand, rng)
        return row is not None and row.status == "REGRESSION"

    methods = {HISTORY: history_alarm, **({COMPARE: compare_alarm} if compared else {})}
    counts = {m: {"any": 0, "nights": 0, "caught": 0} for m in methods}
    for _ in range(trials):
        quiet = history(warmup + JUDGED)
        stepped = history(warmup + WITHIN, step_at=warmup)
        for name, alarm in methods.items():
            fired = [alarm(quiet, k) for k in range(warmup, warmup + JUDGED)]
            counts[name]["any"] += any(fired)
            counts[name]["nights"] += sum(fired)
            counts[name]["caught"] += any(alarm(stepped, k) for k in range(warmup, warmup + WITHIN))
    out: dict[str, Any] = {}
    for name in (HISTORY, COMPARE):
        c = counts.get(name)
        out[name] = None if c is None else {
            "false_alarm_30_nights": c["any"] / trials, "false_alarm_per_night": c["nights"] / (JUDGED * trials),
            "detection_within_3": c["caught"] / trials}
    return out


# --------------------------------------------------------------------------- the report


def meets(f: dict[str, float] | None) -> bool:
    return f is not None and f["false_alarm_30_nights"] <= GOAL_FALSE_ALARMS and f["detection_within_3"] >= GOAL_DETECTION


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nights", type=int, default=6, help="real nights run to measure the noise (default 6)")
    p.add_argument("--seeds", type=int, default=4, help="seeds per real night (default 4)")
    p.add_argument("--cv-from", nargs="+", type=Path, metavar="DIR",
                   help="measure the noise from these results folders instead of running nights")
    p.add_argument("--keep", type=Path, metavar="DIR", help="run the real nights into DIR and keep them there")
    p.add_argument("--trials", type=int, default=200, help="synthetic histories per figure (default 200)")
    p.add_argument("--warmup", type=int, default=15, help="nights of history before the 30 judged (default 15)")
    p.add_argument("--seed", type=int, default=0, help="the simulation's random seed")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="processes simulating signals side by side (default: the CPU count)")
    p.add_argument("--json", type=Path, help="write the figures, the CVs and the nightly values here")
    p.add_argument("--probe-share", type=float, help="the suite's speed_probe.share (default: its default)")
    p.add_argument("--probe-max-seconds", type=float, help="the suite's speed_probe.max_seconds")
    p.add_argument("--probe-processes", type=int, help="the suite's speed_probe.processes")
    args = p.parse_args(argv)
    probe = {key: value for key, value in (("share", args.probe_share), ("max_seconds", args.probe_max_seconds),
                                           ("processes", args.probe_processes)) if value is not None}
    if args.nights < 2 or args.seeds < 2 or args.trials < 1 or args.warmup < 6:
        p.error("--nights and --seeds must be >= 2, --trials >= 1, --warmup >= 6")
    if args.cv_from and args.keep:
        p.error("--keep keeps nights this script runs; with --cv-from it runs none")
    if args.keep and args.keep.exists() and any(args.keep.iterdir()):
        p.error(f"--keep {args.keep}: not empty (give a new or empty folder)")
    command = shlex.join(["python", "benchmarks/gate_power.py", *(sys.argv[1:] if argv is None else argv)])

    log: list[dict[str, Any]] = []
    if args.cv_from:
        folders, source = list(args.cv_from), f"{len(args.cv_from)} given results folders"
        signals = measure(folders)
    elif args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        folders, log = run_nights(args.nights, args.seeds, args.keep, probe)
        source = f"{args.nights} real nights, kept in {args.keep}"
        signals = measure(folders)
    else:
        with tempfile.TemporaryDirectory(prefix="ampcert-gate-power-") as tmp:
            folders, log = run_nights(args.nights, args.seeds, Path(tmp), probe)
            source = f"{args.nights} real nights (not kept: --keep DIR keeps them)"
            signals = measure(folders)
    measured = time.monotonic()
    if not signals:
        print("no signal with >= 2 nights of >= 2 seeds in the folders: nothing to simulate", file=sys.stderr)
        return 0

    model, flags = cpu_line()
    has_counters, counters = counters_line()
    cores = len([ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("processor")]) \
        if Path("/proc/cpuinfo").exists() else 0
    steps = sorted({r.steps for s in signals for r in s.templates if r.steps})
    seeds = sorted({s.seeds for s in signals})
    print(f"# {command}")
    print(f"# CPU: {model}, {cores} logical cores; " + ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in flags.items()))
    print(f"# {counters}")
    print(f"# noise from {source}: {', '.join(sorted({s.subject.workload for s in signals}))}, "
          f"{'+'.join(sorted({s.subject.precision for s in signals}, reverse=True))}, "
          f"{'/'.join(map(str, seeds))} seeds, {'/'.join(map(str, steps))} steps a run")
    if log:
        steal = [e["steal_s"] for e in log if e["steal_s"] is not None]
        overhead = [e["probe_overhead"] for e in log]
        print(f"# the speed probe ({json.dumps(probe) if probe else 'the suite defaults'}): "
              f"+{min(overhead):.1%} to +{max(overhead):.1%} on the rest of a night's wall time")
        print(f"# the nights: {min(e['wall_s'] for e in log):.0f}-{max(e['wall_s'] for e in log):.0f} s each, "
              f"1-minute load {min(e['loadavg_1m'] for e in log):.2f}-{max(e['loadavg_1m'] for e in log):.2f}, "
              f"CPU steal {f'{sum(steal):.2f} s in all' if steal else 'not reported'}")
    print(f"# {args.trials} synthetic histories per figure: {args.warmup} nights, then {JUDGED} judged "
          f"(false alarms) or a {STEP:.0%} step the wrong way (caught within {WITHIN} nights?)")
    print(f"# goal: false alarms over {JUDGED} nights <= {GOAL_FALSE_ALARMS:.0%}, "
          f"detection within {WITHIN} nights >= {GOAL_DETECTION:.0%}")
    head = (f"{'subject':<26}{'metric':<24}{'CV night':>9}{'CV seed':>9}{'CV step':>9}  {'method':<18}"
            f"{'FA/30 nights':>13}{'FA/night':>10}{'detect<=3':>11}")
    print(head)
    print("-" * len(head))
    cfg = load_gate()
    results = []
    # each signal its own random stream: the figures do not depend on --jobs
    with ProcessPoolExecutor(max(1, min(args.jobs, len(signals)))) as pool:
        sims = list(pool.map(simulate, signals, [cfg] * len(signals), [args.trials] * len(signals),
                        [args.warmup] * len(signals), [np.random.default_rng([args.seed, i]) for i in range(len(signals))]))
    for sig, sim in zip(signals, sims, strict=True):
        cv_step = f"{sig.cv_step:>9.2%}" if sig.cv_step is not None else f"{'':>9}"
        for method, f in sim.items():
            figures = (f"{f['false_alarm_30_nights']:>13.1%}{f['false_alarm_per_night']:>10.2%}"
                       f"{f['detection_within_3']:>11.1%}") if f else f"{'n/a':>13}{'n/a':>10}{'n/a':>11}"
            print(f"{str(sig.subject):<26}{sig.metric:<24}{sig.cv_night:>9.2%}{sig.cv_seed:>9.2%}{cv_step}  "
                  f"{method:<18}{figures}")
        results.append({"subject": str(sig.subject), "metric": sig.metric, "nights": len(sig.values),
                        "seeds": sig.seeds, "mean": sig.mean, "cv_night": sig.cv_night, "cv_seed": sig.cv_seed,
                        "cv_step": sig.cv_step, "values": sig.values, "samples": sig.samples, **sim})
    met = [f"{r['subject']} {r['metric']} ({m})" for r in results for m in (HISTORY, COMPARE) if meets(r[m])]
    print(f"# meets the goal: {'; '.join(met) if met else 'no signal, with either gate'}")
    done = time.monotonic()
    print(f"# {done - started:.0f} s in all: measuring {measured - started:.0f} s, simulating {done - measured:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({
            "command": command, "cpu": model, "cores": cores, "flags": flags, "hardware_counters": has_counters,
            "counters": counters, "source": source, "folders": [str(f) for f in folders],
            "nights": log, "trials": args.trials, "warmup": args.warmup, "step": STEP, "seed": args.seed,
            "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
