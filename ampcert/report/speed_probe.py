"""The speed probe in the report: report.json's ``speed_probe`` and report.html's table.

One row per low-precision subject whose probe ran (ampcert/backends/speed_probe.py,
summarised by :mod:`ampcert.probe_summary`): its speed-up over FP32 measured in one
process in alternating windows, with its interval, each path's step time absolute and
in units of the calibration kernel, and the hardware counters where they were read.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ampcert.probe_summary import probe_summaries
from ampcert.results import RunResult
from ampcert.vocabulary import Subject

#: What the report says of the probe's figures, above the table.
EXPLANATION = (
    "The speed probe's steps are not the certified runs' steps: after them, one process held the FP32 model and "
    "the low precision's, built from the same state, and trained them on the same batches in turns a few steps "
    "long, with a fixed calibration kernel (a small matmul and a memory copy) timed between them. Whatever the "
    "machine did in those milliseconds moved both paths, so their ratio is the gain with the machine's drift "
    "cancelled. A step's cost in kernel units divides the machine's own speed out; it cannot see a regression "
    "that slows the kernel's library too (a slower matmul in oneDNN or cuBLAS, a slower allocator), which the "
    "absolute step time still shows.")


class SpeedProbeRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    subject: Subject
    reference: Subject
    processes: int
    rounds: int = Field(description="rounds of alternating windows, over all processes")
    window_steps: int
    seconds: float = Field(description="the budget of alternating windows per process")
    threads: str
    kernel: str = Field(description="the calibration kernel")
    kernel_ms: float
    speedup: float = Field(description="FP32's step time over this precision's: median over rounds, then processes")
    speedup_low: float = Field(description="95% bootstrap interval, resampling each process's rounds")
    speedup_high: float
    per_process: list[float] = Field(description="each process's median speed-up")
    step_ms: float
    reference_step_ms: float
    kernel_units: float = Field(description="this precision's step time in units of the kernel's")
    reference_kernel_units: float
    counters: dict[str, float] = Field(default_factory=dict, description="per step, where counted")
    reference_counters: dict[str, float] = Field(default_factory=dict)
    counters_note: str


def speed_probe_rows(probe_runs: list[RunResult]) -> list[SpeedProbeRow]:
    return [SpeedProbeRow(
        subject=s.subject, reference=s.reference, processes=s.processes, rounds=s.rounds,
        window_steps=s.window_steps, seconds=s.seconds, threads=s.threads, kernel=s.kernel, kernel_ms=s.kernel_ms,
        speedup=s.speedup, speedup_low=s.low, speedup_high=s.high, per_process=s.per_process,
        step_ms=s.path.step_ms, reference_step_ms=s.reference_path.step_ms, kernel_units=s.path.kernel_units,
        reference_kernel_units=s.reference_path.kernel_units, counters=s.path.counters,
        reference_counters=s.reference_path.counters, counters_note=s.counters_note)
        for s in probe_summaries(probe_runs)]
