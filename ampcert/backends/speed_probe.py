"""The speed probe: a low precision's speed against FP32's, measured inside one process.

A nightly gate compares nights, and a machine's speed moves within a second (a shared
VM's neighbours, a GPU's clocks and temperature). Two whole runs side by side do not see
the same machine; two models in one process, timed in turns a few steps long, do. So a
probe process (``RunSpec.is_speed_probe``) builds both models of its entry and seed, the
low precision's and FP32's (:meth:`~ampcert.spec.RunSpec.probe_reference`), through the
framework's own adapter with their features, from the same state, and then, for its
budget of seconds, takes rounds of::

    kernel, FP32 window, low-precision window      (even rounds)
    kernel, low-precision window, FP32 window      (odd rounds)

where a window is ``window_steps`` training steps (batch, the features' step hooks, the
step; the device waited for) and the kernel is the fixed calibration work of
:mod:`ampcert.backends.calibration`. Each path is as often first after the kernel as
second, so whatever the kernel leaves behind in the caches falls on both alike. Each
model draws its own seeded batches, the same for both. Where the kernel exposes hardware
counters, instructions and cycles are read around each window
(:mod:`ampcert.telemetry.perf_counters`).

The probe's steps are not the certified runs' steps: no verdict reads them, and the
models' losses are not kept. What the probe records is each round's mean step time of
both paths and the kernel's time (:class:`~ampcert.results.SpeedProbeResult`);
``ampcert.probe_summary.probe_summaries`` turns a subject's processes into its speed-up
over FP32 with a bootstrap interval and its step cost in kernel units.
"""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from typing import Any

from ampcert import mllog
from ampcert.backends import features as registry
from ampcert.backends.calibration import Kernel
from ampcert.backends.contract import PhaseTimes, TrainOutcome
from ampcert.backends.training_loop import Framework, Run
from ampcert.results import SpeedProbeResult
from ampcert.spec import ProbePoint, RunSpec
from ampcert.telemetry.perf_counters import open_counters
from ampcert.workloads.base import Workload

WARMUP_WINDOWS = 3  # per model, untimed: first steps compile, allocate, fill caches
MIN_ROUNDS = 8      # even where the budget is spent sooner: a median of fewer says little


class _Path:
    """One model of the probe, built as a run of its spec would build it."""

    def __init__(self, spec: RunSpec, workload: Workload, framework: Framework, framework_name: str) -> None:
        # The models' MLLOG (their config events) goes nowhere: the probe trains no certified run.
        self.run = Run(spec, mllog.MLLogger(io.StringIO()), workload, framework,
                       registry.for_run(spec, framework_name))
        self.step = 0
        for feature in self.run.features:
            feature.started(self.run)
        framework.build(self.run)

    def window(self, steps: int, counters: Any) -> tuple[float, dict[str, int] | None]:
        """``steps`` training steps, the device waited for: seconds per step, counters per window."""
        run, fw = self.run, self.run.framework
        limit = run.spec.step_limit or 1
        before = counters.read() if counters is not None else None
        start = time.perf_counter()
        for _ in range(steps):
            self.step += 1
            # The framework numbers the step within the run's budget, over and over (a
            # learning-rate schedule is a table of the budget's steps); the batches go on. The
            # features count on: what they do once (step 1: the precision probe watches every
            # op) must not come round again.
            step = (self.step - 1) % limit + 1
            run.step_started = time.perf_counter()
            batch, _ = fw.batch(step, run)
            for feature in run.features:
                feature.before_step(run, self.step)
            fw.step(batch, step)
            for feature in run.features:
                feature.after_step(run, self.step)
        fw.sync()
        seconds = (time.perf_counter() - start) / steps
        counted = None
        if before is not None:
            after = counters.read()
            counted = {name: after[name] - before[name] for name in after}
        fw.window_losses()  # read and let go (outside the timing): a probe keeps no losses
        for feature in run.features:
            feature.after_window(run, self.step)
        return seconds, counted


def measure(spec: RunSpec, workload: Workload, make_framework: Callable[[RunSpec], Framework], framework_name: str,
            kernel: Kernel, threads: str) -> TrainOutcome:
    """Run the probe of ``spec`` (a speed-probe run) and return its outcome."""
    probe = spec.probe
    assert probe.probe_process is not None and probe.probe_window_steps is not None, "a speed-probe run"
    assert probe.probe_seconds is not None, "a probe's budget is resolved before it runs (runner/speed_probes.py)"
    steps, budget = probe.probe_window_steps, probe.probe_seconds
    t_build = time.perf_counter()
    plain = spec.model_copy(update={"probe": ProbePoint()})
    reference_spec = spec.probe_reference()
    paths = {"reference": _Path(reference_spec, workload, make_framework(reference_spec), framework_name),
             "probe": _Path(plain, workload, make_framework(plain), framework_name)}
    for _ in range(WARMUP_WINDOWS):
        for path in paths.values():
            path.window(steps, None)
        kernel.time_ms()
    build_s = time.perf_counter() - t_build

    counters, counters_note = open_counters()
    times: dict[str, list[float]] = {"reference": [], "probe": [], "kernel": []}
    counts: dict[str, list[dict[str, int]]] = {"reference": [], "probe": []}
    first: list[bool] = []
    start = time.perf_counter()
    deadline = start + budget
    try:
        while time.perf_counter() < deadline or len(first) < MIN_ROUNDS:
            order = ("reference", "probe") if len(first) % 2 == 0 else ("probe", "reference")
            first.append(order[0] == "reference")
            times["kernel"].append(kernel.time_ms())
            for name in order:
                seconds, counted = paths[name].window(steps, counters)
                times[name].append(seconds * 1e3)
                if counted is not None:
                    counts[name].append(counted)
    finally:
        if counters is not None:
            counters.close()
    probe_s = time.perf_counter() - start

    per_step = None
    if counters is not None:
        per_step = {precision: {event: statistics.median(c[event] for c in counts[name]) / steps
                                for event in counters.names}
                    for name, precision in (("reference", "fp32"), ("probe", spec.precision))}
    result = SpeedProbeResult(
        reference="fp32", precision=spec.precision, window_steps=steps, seconds=budget, threads=threads,
        kernel=kernel.description, reference_step_ms=[round(t, 5) for t in times["reference"]],
        step_ms=[round(t, 5) for t in times["probe"]], kernel_ms=[round(t, 5) for t in times["kernel"]],
        reference_first=first, counters=per_step, counters_note=counters_note)
    tally = paths["probe"].run.tally
    paths["probe"].run.framework.finish(tally)  # the environment (framework, device name)
    return TrainOutcome(
        steps=paths["probe"].step, train_samples=paths["probe"].step * tally.batch_size,
        accelerated=spec.accelerated, capability_note=spec.capability_note, amp_policy=tally.amp_policy,
        determinism=tally.determinism, environment=tally.environment, speed_probe=result,
        phases=PhaseTimes(build_s=build_s, train_s=probe_s, eval_s=0.0), telemetry_series=None)
