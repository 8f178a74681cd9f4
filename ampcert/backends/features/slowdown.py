"""Fault injection (``inject_slowdown``): this precision's path made slower on purpose,
by holding each timed step for the given fraction of its own time, so that a gate can
be shown to see a slowdown whose run ids do not change (``benchmarks/gate_power.py``)."""

from __future__ import annotations

from ampcert.backends import loop
from ampcert.backends.training_loop import Feature, Run


class InjectedSlowdown(Feature):
    def after_step(self, run: Run, step: int) -> None:
        fw = run.framework
        if fw.clock.counts(step):  # not a first step timed apart (JAX's compiling step)
            fw.sync()
            loop.hold_step(run.spec.fault.injected_slowdown, run.step_started)
