"""What the speed probe adds to a suite's wall time, at the suite's own probe settings.

Runs ``ampcert run SUITE`` once (default: the smoke suite) and splits its wall time into
the speed probe's share (its processes' first start to last end: they run after the
certified runs, one after another) and the rest (planning, the certified runs, the
report), the control measured in the same invocation. The goal (issue 55): at most +15%
at the default budget. Prints the figures and the CPU's relevant flags; exit 0.

    python benchmarks/probe_overhead.py [SUITE] [--out DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gate_power import cpu_line, probe_span_s

from ampcert.probe_summary import probe_summaries
from ampcert.results import load


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suite", nargs="?", default="smoke", help="a suite file or a shipped suite (default: smoke)")
    p.add_argument("--out", type=Path, help="the results folder (default: a temporary one)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ampcert-probe-overhead-") as tmp:
        out = args.out or Path(tmp) / "run"
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "ampcert", "run", args.suite, "--out", str(out)],
                              capture_output=True, text=True)
        wall = time.monotonic() - start
        if done.returncode not in (0, 1):
            raise SystemExit(f"ampcert run failed:\n{done.stdout}{done.stderr}")
        probe_s = probe_span_s(out)
        rs = load(out)
        model, flags = cpu_line()
        print(f"# python benchmarks/probe_overhead.py {args.suite}")
        print(f"# CPU: {model}; " + ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in flags.items()))
        print(f"suite {rs.suite_name}: {wall:.1f} s in all, {len(rs.runs)} certified runs, "
              f"{len(rs.probe_runs)} probe processes")
        print(f"speed probe: {probe_s:.1f} s; the rest {wall - probe_s:.1f} s; "
              f"the probe adds {probe_s / (wall - probe_s):+.1%}")
        for s in probe_summaries(rs.probe_runs):
            print(f"  {s.subject}: speed-up {s.speedup:.4f} [{s.low:.4f}, {s.high:.4f}] over {s.processes} "
                  f"processes of {s.seconds:g} s, {s.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
