"""Workloads that misbehave on purpose, to test the harness's failure isolation.

They are real plugin workloads (named by import path in a suite, e.g.
``fault_workloads:raising``) wrapping the digits workload, each failing in
one way a real run can fail.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from ampcert.workloads.digits import DigitsWorkload


class _Fault(DigitsWorkload):
    summary = "digits, made to fail (test only)"

    def build(self, params, seed, device):
        task = super().build(params, seed, device)
        # The batch hook gets the true training step, so faults land exactly there.
        task.augment = lambda x, y, step: (self.at_step(step, x), y)
        return task

    def at_step(self, step: int, x: torch.Tensor) -> torch.Tensor:
        return x


class Raising(_Fault):
    name = "raising"

    def at_step(self, step, x):
        if step == 7:
            raise ValueError("injected failure at step 7")
        return x


class NaNLoss(_Fault):
    name = "nan"

    def at_step(self, step, x):
        return x * float("nan") if step >= 5 else x


class Hang(_Fault):
    name = "hang"

    def at_step(self, step, x):
        if step == 3:
            time.sleep(3600)
        return x


class Killed(_Fault):
    name = "killed"

    def at_step(self, step, x):
        if step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return x


class BadBuilder(DigitsWorkload):
    name = "badbuilder"

    def build(self, params, seed, device):
        raise RuntimeError("the user's builder is broken")


class Spiky(_Fault):
    """inf inputs on two of every three steps from step 5 to 70: with fp16 loss
    scaling those steps overflow, are skipped, and the scale falls to its floor."""

    name = "spiky"

    def at_step(self, step, x):
        return x * float("inf") if 5 <= step <= 70 and step % 3 != 0 else x


class Nondeterministic(_Fault):
    """Noise from the OS (not from the seed) on step 3: a rerun of a seed differs."""

    name = "nondeterministic"

    def at_step(self, step, x):
        if step == 3:
            noise = torch.frombuffer(bytearray(os.urandom(4 * x.numel())), dtype=torch.int32)
            return x + 1e-3 * (noise.reshape(x.shape).float() / 2**31)
        return x


raising, nan, hang, killed, badbuilder = Raising(), NaNLoss(), Hang(), Killed(), BadBuilder()
spiky, nondeterministic = Spiky(), Nondeterministic()
not_a_workload = object()


class Slow(_Fault):
    """Each step first spins for 50% of the median compute time of the steps
    before it (the last nine): the same training, 50% slower, whatever the
    machine's speed. It spins rather than sleeps, as slower code would: on a
    busy machine a sleeping process waits for a core to wake up on, which
    would slow it by more than 50%. The hook runs inside the timed step."""

    name = "slow"
    fraction = 0.50  # throughput -33%: clear of the gate's 10% threshold even when load adds noise

    def build(self, params, seed, device):
        self._last: float | None = None
        self._spun = 0.0
        self._compute: list[float] = []
        return super().build(params, seed, device)

    def at_step(self, step, x):
        now = time.perf_counter()
        if self._last is not None:
            self._compute.append(now - self._last - self._spun)
        self._last, self._spun = now, 0.0
        if self._compute:
            recent = sorted(self._compute[-9:])
            until = now + self.fraction * recent[len(recent) // 2]
            while time.perf_counter() < until:
                pass
            self._spun = time.perf_counter() - now
        return x

slow = Slow()


def after_each_update(task, finish):
    """``task`` with ``finish(started, low)`` called after each training step's optimizer
    update: ``started`` is perf_counter at the step's start (its batch drawn), ``low``
    whether the model computed in a 16-bit precision (the logits' dtype says)."""
    step = {"start": 0.0, "low": False}
    augment, loss_fn, make_optimizer = task.augment, task.loss_fn, task.make_optimizer

    def starting(x, y, i):  # called first thing in every training step
        step["start"] = time.perf_counter()
        return augment(x, y, i) if augment is not None else (x, y)

    def loss(out, y):
        step["low"] = out.dtype != torch.float32
        return loss_fn(out, y)

    def optimizer(parameters):
        opt = make_optimizer(parameters)
        update = opt.step

        def update_then_finish(*args, **kwargs):
            result = update(*args, **kwargs)
            finish(step["start"], step["low"])
            return result

        opt.step = update_then_finish
        return opt

    task.augment, task.loss_fn, task.make_optimizer = starting, loss, optimizer
    return task




REGRESSION_ENV = "AMPCERT_TEST_REGRESSION"


class Regressed(DigitsWorkload):
    """digits with a regression landed from outside the suite: the JSON file named by
    ``$AMPCERT_TEST_REGRESSION`` (read when a run or a speed probe builds the model) says
    which path is slower and by how much, ``{"low": 0.05}`` (a 16-bit path alone: the
    logits' dtype says which) or ``{"all": 0.05}``. Each such training
    step is held that fraction of its own time longer, by a busy wait at the end of its
    optimizer step: work, as a slower kernel is. The suite, and so every run id, stays
    the same: a gate must see the change in the runs' speed alone
    (tests/history/test_gate_real_nights.py)."""

    name = "regressed"
    summary = "digits slowed by a fraction named outside the suite (test only)"

    def build(self, params, seed, device):
        import json

        task = super().build(params, seed, device)
        path = os.environ.get(REGRESSION_ENV)
        regression = json.loads(open(path).read()) if path and os.path.exists(path) else {}
        if not regression:
            return task

        def spin(started: float, low: bool) -> None:
            fraction = regression.get("all", regression.get("low", 0.0) if low else 0.0)
            now = time.perf_counter()
            deadline = now + fraction * (now - started)
            while time.perf_counter() < deadline:
                pass

        return after_each_update(task, spin)


regressed = Regressed()
