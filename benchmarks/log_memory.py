"""Logs of any size in bounded memory: what reading a big log costs, against a small one.

What is measured (issue 52's bounds), each in a process of its own, so its peak
resident memory (``ru_maxrss`` from ``wait4``) is its own:

1. **Importing a 200 MB MLPerf result log** (``ampcert import mlperf``, MLPerf's five
   checkers included) in a copy of the Dell llama2_70b_lora folder the tests ship,
   its ``result_1.txt`` (a whole run) grown to ``--mlperf-mb`` (default 200) two ways:

   - ``noisy``: the log as a job writes it: its 100 ``:::MLLOG`` events spread through
     the training's other output (NCCL and framework lines), as published logs hold;
   - ``dense``: the same 200 MB of ``:::MLLOG`` events alone (``tracked_stats``, one per
     step, ~900,000 of them), the worst case for a reader of events.

   Bounds: 60 s and 300 MB. The dense log holds more events than MLPerf's checkers are
   run over (``certify.mlperf.MAX_CHECKED_EVENTS``): its import reports them "not run",
   which is what keeps it in bounds (they took 1.8 GB and 5 minutes over it).
2. **Reading a 50 MB own-job log** (``ampcert.own_job.result.read_log``, what a
   run's result is made from): an ampcert-written MLLOG with an evaluation every 100
   steps and a loss and a throughput event every step. Bound: 200 MB.

Control: each command again over the unchanged small log (the fixture's, a 40-step
job log). Reported per case: seconds, peak RSS, and the peak's excess over the
control's (what the log's size costs), with the bound. The script always exits 0: it
is a measurement, not a test.

Run from the repository root (installed or editable)::

    .venv/bin/python benchmarks/log_memory.py [--quick] [--mlperf-mb 200] [--job-mb 50] [--json out.json]

``--quick`` uses 20 MB and 5 MB logs (CI-sized). The full run takes about 2 minutes
on a 2-core CPU and writes ~450 MB to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "mlperf" / "training_results_v5.1" / "Dell"
BENCH = "llama2_70b_lora"
NOISE = [
    "0: NCCL INFO Channel 03/32 : 0[0] -> 1[1] via P2P/CUMEM/read\n",
    "3: [NeMo W 2025-10-08 00:31:25 nemo_logging:349] /usr/local/lib/python3.12/dist-packages/torch/"
    "utils/checkpoint.py:86: UserWarning: None of the inputs have requires_grad=True. Gradients will be None\n",
    "0: Epoch 0: :  41%|####1     | 412/1000 [12:41<18:06, reduced_train_loss=1.230, global_step=411]\n",
]


def _measure(argv: list[str]) -> dict:
    """Run ``argv``; its wall seconds, exit code and peak RSS (MB), from its own rusage."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"seconds": round(time.perf_counter() - start, 2), "rc": proc.returncode,
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "tail": output.decode("utf-8", "replace").strip().splitlines()[-1:]}


def _grow_mlperf_log(source: Path, dest: Path, size: int, kind: str) -> None:
    """``source``'s lines in ``dest``, grown to ``size`` bytes by lines written between its
    events inside the run (see the module's doc)."""
    lines = source.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if '"key": "run_start"' in line) + 1
    last = next(i for i, line in enumerate(lines) if '"key": "run_stop"' in line)
    per_gap = (size - sum(map(len, lines))) // (last - first)
    with dest.open("w") as out:
        out.writelines(lines[:first])
        for index in range(first, last):
            event = json.loads(lines[index].split(":::MLLOG ", 1)[1])
            written = 0
            while written < per_gap:
                if kind == "noisy":
                    filler = NOISE[written % len(NOISE)]
                else:  # a tracked_stats event per step, at the time of the event before
                    filler = "0: :::MLLOG " + json.dumps({
                        "namespace": "", "time_ms": event["time_ms"], "event_type": "POINT_IN_TIME",
                        "key": "tracked_stats", "value": {"train_loss": 1.25},
                        "metadata": {"file": "custom_callbacks.py", "lineno": 273, "step": written}}) + "\n"
                out.write(filler)
                written += len(filler)
            out.write(lines[index])
        out.writelines(lines[last:])


def _job_log(dest: Path, size: int) -> None:
    """An ampcert-written job MLLOG of about ``size`` bytes (see the module's doc)."""
    from ampcert import mllog

    log = mllog.MLLogger.open(dest)
    log.event(mllog.SUBMISSION_BENCHMARK, "bench")
    log.start(mllog.RUN_START)
    step = 0
    while dest.stat().st_size < size:
        for _ in range(100):
            step += 1
            log.event("train_loss", 1.0 / step, {"step": step, "samples_count": 32 * step})
            log.event("throughput", 512.0, {"step": step})
        log.start(mllog.EVAL_START, metadata={"samples_count": 32 * step})
        log.event(mllog.EVAL_ACCURACY, min(0.99, step / 1e6), {"samples_count": 32 * step, "epoch_num": 0})
        log.end(mllog.EVAL_STOP, metadata={"samples_count": 32 * step})
    log.end(mllog.RUN_STOP, metadata={"status": "success"})
    log.close()


_READ_JOB_LOG = ("import sys; from pathlib import Path; from ampcert.own_job.result import read_log; "
                 "log = read_log(Path(sys.argv[1])); print(len(log.evals), 'evals,', log.event_count, 'events')")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mlperf-mb", type=int, default=200)
    parser.add_argument("--job-mb", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    mlperf_mb, job_mb = (20, 5) if args.quick else (args.mlperf_mb, args.job_mb)
    ampcert = [sys.executable, "-m", "ampcert"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ampcert-logmem-") as tmp:
        work = Path(tmp)
        for case in ("control", "noisy", "dense"):
            sub = work / case / "training_results_v5.1" / "Dell"
            shutil.copytree(FIXTURE, sub)
            folder = next((sub / "results").glob(f"*/{BENCH}"))
            if case != "control":
                _grow_mlperf_log(FIXTURE / folder.relative_to(sub) / "result_1.txt", folder / "result_1.txt",
                                 mlperf_mb << 20, case)
            size = (folder / "result_1.txt").stat().st_size
            got = _measure([*ampcert, "import", "mlperf", str(folder), "--out", str(work / f"out-{case}")])
            rows.append({"case": f"import mlperf, {case}", "log_mb": round(size / 2**20, 1), **got,
                         "bounds": {"seconds": 60, "peak_rss_mb": 300}})
            shutil.rmtree(work / case)
            shutil.rmtree(work / f"out-{case}", ignore_errors=True)
        for case, size in (("control", 0), ("job log", job_mb << 20)):
            path = work / f"{case.replace(' ', '-')}.mllog"
            _job_log(path, size or 20_000)
            got = _measure([sys.executable, "-c", _READ_JOB_LOG, str(path)])
            rows.append({"case": f"read an own job's log, {case}", "log_mb": round(path.stat().st_size / 2**20, 1),
                         **got, "bounds": {"peak_rss_mb": 200}})
    controls = {"import": rows[0]["peak_rss_mb"], "read": rows[3]["peak_rss_mb"]}
    print(f"{'case':44} {'log MB':>7} {'s':>7} {'peak MB':>8} {'over control':>13}  bound   rc")
    for row in rows:
        control = controls["import" if row["case"].startswith("import") else "read"]
        row["over_control_mb"] = round(row["peak_rss_mb"] - control, 1)
        bound = ", ".join(f"{k.split('_')[0] if k != 'peak_rss_mb' else 'MB'} <= {v}" for k, v in row["bounds"].items())
        print(f"{row['case']:44} {row['log_mb']:7.1f} {row['seconds']:7.2f} {row['peak_rss_mb']:8.1f} "
              f"{row['over_control_mb']:13.1f}  {bound}   {row['rc']}  {' '.join(row['tail'])[:60]}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
