"""A memory-sweep point (``RunSpec.batch_size``): the run trains at the sweep's batch,
on a card as small as the sweep emulates, and its result's peak memory is training's,
read before any evaluation (:mod:`ampcert.memory` fits the points)."""

from __future__ import annotations

from ampcert.backends import loop
from ampcert.backends.training_loop import Feature, Run, Tally
from ampcert.results import Measured


class MemorySweepPoint(Feature):
    def __init__(self) -> None:
        self.peak: Measured | None = None

    def started(self, run: Run) -> None:
        if run.spec.sweep.device_memory_limit is not None:
            run.framework.limit_device_memory(run.spec.sweep.device_memory_limit)

    def built(self, run: Run) -> None:
        # Never silently fewer than asked (loop.sweep_problem).
        fw = run.framework
        fw.set_batch_size(loop.sweep_batch(run.spec, fw.examples_in_memory()))

    def after_step(self, run: Run, step: int) -> None:
        if step == 1:  # the warm-up's peak left out, where the device can forget it
            run.framework.forget_peak_memory()

    def after_window(self, run: Run, step: int) -> None:
        if self.peak is None:  # training's peak, before any evaluation
            self.peak = run.framework.peak_memory(training_only=True)

    def contribute(self, run: Run, tally: Tally) -> None:
        tally.peak_memory = self.peak
