"""Cold start of the ``ampcert`` command line, measured on this machine.

What is measured: the wall time of a whole, fresh ``ampcert`` process (the
console script ``.venv/bin/ampcert``, or ``python -m ampcert`` with
``--module``) from spawn to exit, for

1. ``ampcert --version``: the floor (interpreter start, the CLI's imports);
   ``ampcert --help`` too (a checkout without ``--version``: its floor);
2. ``ampcert verify ENVELOPE --pubkey KEY``: offline verification of a real
   signed report; the envelope is made in a temporary folder by a tiny real
   run (``digits``, fp32, one seed, a few steps), ``ampcert keygen`` and
   ``ampcert sign`` before anything is timed.

Each command runs ``--warmup`` times untimed (the page cache holds the files
afterwards, as it would on a machine that runs ampcert at all: "cold" here
means a new process, not an empty disk cache), then ``--runs`` times timed
with ``time.perf_counter`` around ``subprocess.run``; reported: median, min
and max, against the goal (median <= 0.5 s). The script always exits 0: it
is a measurement, not a test.

``--checkout DIR`` measures another checkout of ampcert with this venv's
Python (``PYTHONPATH=DIR``, e.g. the committed version from ``git worktree
add /tmp/base HEAD``), so before/after figures come from one interpreter.

Run from the repository root::

    .venv/bin/python benchmarks/cli_cold_start.py [--runs 15] [--checkout DIR] [--json out.json]

About 15 s for the envelope, then about 3 x runs x 0.3 s.
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
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]

GOAL_S = 0.5

SUITE = """\
name: cold-start
amp: native
device: cpu
precisions: [fp32]
seeds: [0]
train: {steps: 4, eval_every: 4}
workloads:
  - workload: digits
"""


def _env(checkout: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(checkout), env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    return env


def _cli(args: argparse.Namespace) -> list[str]:
    if args.module:
        return [sys.executable, "-m", "ampcert"]
    script = Path(sys.executable).with_name("ampcert")
    if not script.exists():
        raise SystemExit(f"{script}: no console script beside this Python; use --module")
    return [str(script)]


def make_envelope(cli: list[str], env: dict[str, str], cwd: Path, work: Path) -> tuple[Path, Path]:
    """A real signed report in ``work``: tiny run, keygen, sign. Returns (envelope, public key)."""
    suite = work / "suite.yaml"
    suite.write_text(SUITE)
    out, key = work / "results", work / "signing.key"
    for step in (["run", str(suite), "--out", str(out)], ["keygen", str(key)], ["sign", str(out), "--key", str(key)]):
        proc = subprocess.run(cli + step, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"setup failed: {shlex.join(cli + step)}\n{proc.stdout}{proc.stderr}")
    return out / "report.dsse.json", key.with_name(key.name + ".pub")


def time_command(argv: list[str], env: dict[str, str], cwd: Path, runs: int, warmup: int) -> list[float]:
    times = []
    for i in range(warmup + runs):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{shlex.join(argv)}: exit {proc.returncode}\n{proc.stderr.decode(errors='replace')}")
        if i >= warmup:
            times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command (default 15)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    parser.add_argument("--checkout", type=Path, default=_ROOT, help="ampcert checkout to measure (default: this one)")
    parser.add_argument("--module", action="store_true", help="run `python -m ampcert` instead of the console script")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be >= 1 and --warmup >= 0")

    checkout = args.checkout.resolve()
    env, cli = _env(checkout), _cli(args)
    sys.path.insert(0, str(_ROOT))
    from ampcert.envinfo import cpu_info, load_average

    command = shlex.join(["python", *sys.argv])
    print(f"# cli cold start: {command}")
    print(f"# {sys.implementation.name} {sys.version.split()[0]}, {cpu_info()['model']}, {os.cpu_count()} logical "
          f"CPUs, load avg {load_average()}; checkout {checkout}; cli {shlex.join(cli)}")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ampcert-cold-") as tmp:
        envelope, pub = make_envelope(cli, env, checkout, Path(tmp))
        cases = {"ampcert --version": ["--version"], "ampcert --help": ["--help"],
                 "ampcert verify ENVELOPE --pubkey KEY": ["verify", str(envelope), "--pubkey", str(pub)]}
        if subprocess.run(cli + ["--version"], cwd=checkout, env=env, capture_output=True).returncode != 0:
            del cases["ampcert --version"]  # a version of ampcert before --version: --help is its floor
        print(f"\n## {args.runs} timed runs each (after {args.warmup} untimed), seconds of wall time per process")
        print(f"{'command':<40}{'median':>8}{'min':>8}{'max':>8}  goal <= {GOAL_S} s")
        for name, extra in cases.items():
            times = time_command(cli + extra, env, checkout, args.runs, args.warmup)
            med = statistics.median(times)
            results[name] = {"median_s": med, "min_s": min(times), "max_s": max(times), "times_s": times}
            print(f"{name:<40}{med:>8.3f}{min(times):>8.3f}{max(times):>8.3f}  {'met' if med <= GOAL_S else 'NOT met'}")
    print(f"# load avg at the end {load_average()}")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "checkout": str(checkout), "cli": cli,
                                         "cpu": cpu_info()["model"], "results": results}, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
