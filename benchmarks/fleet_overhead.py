"""Scheduling overhead per run: `ampcert run` on the local executor against Ray (and submitit's local executor).

What is measured. One small suite (the digits workload, fp32 and bf16, ``--seeds``
seeds, ``--steps`` steps: runs of about a second) is run end to end by the CLI,
``ampcert run SUITE --out DIR --executor E``, once per executor per round, the
executors interleaved round by round. For each command:

- **wall**: the command's wall time, from start to exit (planning, starting the
  engine, every run, certifying nothing, the report);
- **runs**: the sum of the runs' own ``wall_s`` (result.json: the training
  process's time from its start to its result, the same clock for every executor);
- **overhead per run** = (wall - runs) / number of runs: the issue's measure,
  what the executor adds to each run (a process per run for local; a task, its
  worker process, the run files' trip back, for Ray; a job, a fresh interpreter,
  pickles on disk, for submitit).

The executors compared:

- ``local``: the default, one run after another;
- ``ray-serial``: a Ray instance started by the command on this machine, each
  run asking for every CPU (``--cpus-per-run`` = the CPU count), so runs go one
  at a time with the threads a local run has: the like-for-like case for the
  formula above;
- ``ray``: the same with ``--cpus-per-run 1``: runs in parallel, one thread
  each; the formula then gives less than the true overhead (runs overlap), so
  its wall time is the figure to read;
- ``submitit-local`` (``--executor slurm --slurm-local``), serial like ray-serial.

Reported: the median over rounds of each figure, with the command that made them.
No timing is asserted; the script exits 0.

    python benchmarks/fleet_overhead.py [--rounds 3] [--seeds 4] [--steps 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = """\
name: fleet-overhead
device: cpu
amp: ampcert
precisions: [fp32, bf16]
seeds: {seeds}
train: {{steps: {steps}, eval_every: {steps}}}
timeout_s: 600
workloads:
  - workload: digits
"""


def executors(cpus: int) -> dict[str, list[str]]:
    return {
        "local": [],
        "ray-serial": ["--executor", "ray", "--cpus-per-run", str(cpus)],
        "ray": ["--executor", "ray", "--cpus-per-run", "1"],
        "submitit-local": ["--executor", "slurm", "--slurm-local", "--cpus-per-run", str(cpus)],
    }


def run_once(suite: Path, out: Path, args: list[str]) -> dict[str, float]:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ampcert", "run", str(suite), "--out", str(out), *args],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"ampcert run {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    results = [json.loads(p.read_text()) for p in sorted(out.glob("runs/*/result.json"))]
    runs = sum(r["wall_s"] for r in results)
    return {"wall_s": wall, "runs_s": runs, "n": len(results), "overhead_per_run_s": (wall - runs) / len(results)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--seeds", type=int, default=4, help="seeds per precision (runs = 2 x seeds; default 4)")
    p.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    p.add_argument("--executors", default="local,ray-serial,ray,submitit-local",
                   help="comma-separated subset of local, ray-serial, ray, submitit-local")
    p.add_argument("--json", type=Path, help="write all figures to this JSON file")
    args = p.parse_args(argv)
    cpus = os.cpu_count() or 1
    table = executors(cpus)
    chosen = [e.strip() for e in args.executors.split(",") if e.strip()]
    unknown = [e for e in chosen if e not in table]
    if unknown or not chosen or args.rounds < 1 or args.seeds < 1 or args.steps < 1:
        p.error(f"--executors: unknown {unknown}; --rounds, --seeds, --steps must be >= 1")
    needs = {"ray": any(e.startswith("ray") for e in chosen), "submitit": "submitit-local" in chosen}
    for module, extra in (("ray", "ray"), ("submitit", "slurm")):
        if needs[module] and importlib.util.find_spec(module) is None:
            p.error(f"{module} is not installed: pip install 'ampcert[{extra}]'")

    figures: dict[str, list[dict[str, float]]] = {e: [] for e in chosen}
    with tempfile.TemporaryDirectory(prefix="ampcert-fleet-bench-") as tmp:
        suite = Path(tmp) / "suite.yaml"
        suite.write_text(SUITE.format(seeds=list(range(args.seeds)), steps=args.steps))
        for r in range(args.rounds):
            for name in chosen:
                out = Path(tmp) / f"{name}-{r}"
                figures[name].append(run_once(suite, out, table[name]))
                shutil.rmtree(out)
                print(f"round {r + 1}/{args.rounds} {name}: {figures[name][-1]['wall_s']:.1f} s", file=sys.stderr)

    command = "python benchmarks/fleet_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"# {command.strip()}")
    print(f"# {cpus} CPUs; {2 * args.seeds} digits runs of {args.steps} steps; median of {args.rounds} rounds")
    print(f"{'executor':<16}{'wall s':>9}{'runs s':>9}{'overhead/run s':>16}")
    summary = {}
    for name, rows in figures.items():
        med = {k: statistics.median(row[k] for row in rows) for k in ("wall_s", "runs_s", "overhead_per_run_s")}
        summary[name] = {**med, "rounds": rows}
        print(f"{name:<16}{med['wall_s']:>9.2f}{med['runs_s']:>9.2f}{med['overhead_per_run_s']:>16.2f}")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "cpus": cpus, "executors": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
