"""A suite's inject_slowdown: each slowed step is held for its fraction of its own time."""

from __future__ import annotations

import time

from ampcert.backends.loop import hold_step


def test_a_step_is_held_for_its_fraction_of_the_time_it_took():
    started = time.perf_counter() - 0.040  # a step that has taken 40 ms so far
    t0 = time.perf_counter()
    hold_step(0.25, started)
    held = time.perf_counter() - t0
    assert held >= 0.010  # 25% of 40 ms (and a little more: the call itself is part of the step)
    assert held < 0.5     # a busy wait ends at its deadline, not at some later wake-up


def test_a_cpu_time_busy_wait_not_a_sleep():
    started = time.perf_counter() - 0.040
    cpu = time.thread_time()
    hold_step(0.5, started)
    assert time.thread_time() - cpu >= 0.005  # held by work (a sleep would take ~0 CPU), as slower code would be
