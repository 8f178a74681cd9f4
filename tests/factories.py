"""Synthetic run results: RunSpecs planned by the real planner (``parse_suite`` +
``expand``, so run ids, repeats and the seeds a rule pack adds are what
``ampcert run`` would plan) and RunResults filled in by hand, for tests of what
is computed *from* results (certification, loading) without training anything.

    specs = plan({"name": "s", "precisions": ["fp32", "bf16"], "seeds": [0, 1, 2],
                  "certify": "default", "workloads": [{"workload": "underflow"}]})
    runs = [completed(s, final_metric=0.95) for s in specs]
    cert = evaluate(runs, load_rules("default"))

Two ready-made sets mirror real suites, each result shaped like what the
runner records for such a run:

- :func:`numerics_runs`: ``suites/numerics.yaml`` on a CPU that does not
  accelerate bf16/fp16 (fp16 with loss scaling learns, fp16 without it never
  does, fp16 with overflowing activations stops on a non-finite loss);
- :func:`faults_runs`: a scaled fp16 run that skips most updates and sits at
  the scale floor, and a workload whose repeat differs from step 3.

``write_results`` stores a list of results as a results folder (plan.json,
runs/<id>/result.json) that ``ampcert.results.load`` reads back.

Two helpers for the tests that do run things:

- :func:`built_once`: a folder (say, a real results folder) built once per test
  session however many pytest-xdist workers ask for it;
- :data:`warm_cli`: ``ampcert ARGS`` as ``conftest.run_cli`` runs it, forked from an
  interpreter with the heavy libraries already imported (0.5 s, not 3, a command).
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import inspect
import json
import math
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warm_server import WarmServer

from ampcert.certify.rules import load_rules
from ampcert.results import EvalPoint, Measured, ResultsDir, RunResult, StepTimes, atomic_write_json
from ampcert.spec import RunSpec, apply_capabilities, expand, parse_suite

# A CPU without bf16/fp16 units (the CI machines): both run, neither is accelerated.
CPU_CAPS = {"fp32": {"accelerated": True, "note": "reference precision"},
            "bf16": {"accelerated": False, "note": "bf16 not accelerated on cpu: 0.09x fp32"},
            "fp16": {"accelerated": False, "note": "fp16 not accelerated on cpu: 0.05x fp32"}}


def plan(suite: dict[str, Any], device: str = "cpu",
         capabilities: dict[str, dict[str, Any]] | None = CPU_CAPS) -> list[RunSpec]:
    """The run matrix ``ampcert run`` plans for ``suite`` (a suite file's mapping)."""
    parsed = parse_suite(suite, "synthetic.yaml")
    needs = {}
    if parsed.certify is not None and "repeats" in inspect.signature(expand).parameters:
        # as the planner does: the seeds and repeats the suite's rule pack needs
        pack = load_rules(parsed.certify)
        needs = {"min_seeds": pack.min_seeds(), "repeats": pack.repeats(), "resumes": pack.resumes()}
    specs = expand(parsed, device, **needs)  # type: ignore[arg-type]
    return apply_capabilities(parsed, specs, capabilities) if capabilities else specs


def _digest(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _noise(spec: RunSpec, salt: str = "") -> float:
    """A reproducible number in [0, 1) for this run's seed: the same for a repeat."""
    return int(_digest(spec.label, spec.precision, spec.seed, salt)[:8], 16) / 2**32


def _step_times(n: int, mean_ms: float) -> tuple[StepTimes, list[float]]:
    times = [round(mean_ms * (1 + 0.02 * ((i % 5) - 2)), 3) for i in range(n)]
    s = sorted(times)
    mean = sum(times) / n
    std = math.sqrt(sum((t - mean) ** 2 for t in times) / n)
    pct = lambda q: s[min(n - 1, int(q * n))]  # noqa: E731
    return StepTimes(n=n, mean_ms=mean, std_ms=std, p50_ms=pct(0.5), p90_ms=pct(0.9), p99_ms=pct(0.99),
                     min_ms=s[0], max_ms=s[-1], method="synthetic"), times


def completed(spec: RunSpec, *, final_metric: float, steps: int | None = None,
              loss: list[float | None] | None = None, batch: int = 64, samples_per_s: float = 5000.0,
              peak_memory: float = 300e6, weights: str | None = None, metric: str = "accuracy",
              loss_scale: list[float] | None = None, skipped_steps: list[int] | None = None,
              target_reached: bool | None = None, steps_to_target: int | None = None,
              **fields: Any) -> RunResult:
    """A completed run of ``spec``. Unless given: the step budget's limit, a falling
    loss and weights that depend on (label, precision, seed) only, so a repeat of
    a seed reproduces its original bit for bit; for a target budget, the target is
    reached iff ``final_metric`` meets it, at ``steps_to_target`` (default: the
    second-to-last eval)."""
    train = spec.train
    steps = steps or train.step_limit
    if loss is None:
        loss = [round(2.3 * math.exp(-3 * i / steps) + 0.01 * _noise(spec, "loss"), 6) for i in range(steps)]
    evals = [EvalPoint(step=s, samples=s * batch, train_time_s=s * batch / samples_per_s,
                       value=final_metric if s == steps else final_metric * s / steps)
             for s in range(train.eval_every, steps + 1, train.eval_every)] or [
        EvalPoint(step=steps, samples=steps * batch, train_time_s=steps * batch / samples_per_s, value=final_metric)]
    if train.target is not None:
        if target_reached is None:
            target_reached = final_metric >= train.target
        if target_reached and steps_to_target is None:
            steps_to_target = evals[-2].step if len(evals) > 1 else evals[-1].step
    step_time, step_times_ms = _step_times(steps, 1000 * batch / samples_per_s)
    result = RunResult(
        run_id=spec.run_id, spec=spec, status="completed", steps=steps, train_samples=steps * batch,
        metric=metric, higher_is_better=True, final_metric=final_metric,
        target=train.target, target_reached=target_reached if train.target is not None else None,
        steps_to_target=steps_to_target if target_reached else None,
        samples_to_target=steps_to_target * batch if target_reached and steps_to_target else None,
        samples_per_s=samples_per_s, loss=loss, evals=evals, step_time=step_time, step_times_ms=step_times_ms,
        peak_memory=Measured(value=peak_memory, unit="bytes", method="synthetic peak RSS"),
        loss_scale=loss_scale, skipped_steps=skipped_steps, accelerated=spec.accelerated,
        capability_note=spec.capability_note, determinism={"deterministic_algorithms": True},
        weights_sha256=weights or _digest("weights", spec.label, spec.precision, spec.seed),
    )
    return result.model_copy(update=fields) if fields else result


def failed(spec: RunSpec, reason: str, *, steps: int = 0, loss: list[float | None] | None = None,
           **fields: Any) -> RunResult:
    """A failed run of ``spec`` with the runner's ``reason``."""
    return RunResult(run_id=spec.run_id, spec=spec, status="failed", reason=reason, steps=steps,
                     loss=loss or [], accelerated=spec.accelerated, capability_note=spec.capability_note,
                     **fields)


def scaler_history(steps: int, *, skipped: list[int] = (), start: float = 65536.0, floor: float = 1.0,
                   growth_interval: int = 2000) -> list[float]:
    """The loss scale after each step of a dynamic scaler (halve on a skipped
    step, down to ``floor``; double after ``growth_interval`` clean steps)."""
    scale, clean, out, skip = start, 0, [], set(skipped)
    for step in range(1, steps + 1):
        if step in skip:
            scale, clean = max(scale / 2, floor), 0
        else:
            clean += 1
            if clean == growth_interval:
                scale, clean = scale * 2, 0
        out.append(scale)
    return out


# --------------------------------------------------------------------------- ready-made sets

NUMERICS_SUITE = {
    "name": "numerics", "amp": "ampcert", "device": "cpu", "precisions": ["fp32", "bf16", "fp16"],
    "seeds": [0, 1, 2], "unaccelerated": "run", "certify": "default",
    "workloads": [{"workload": "underflow"},
                  {"workload": "underflow", "id": "underflow-noscale", "loss_scaling": False,
                   "precisions": ["fp32", "fp16"]},
                  {"workload": "overflow"}],
}


def numerics_runs() -> list[RunResult]:
    """``suites/numerics.yaml`` as a CPU runs it: 3 seeds and a repeat of seed 0 per
    (entry, precision). fp32, bf16 and scaled fp16 reach the target (accuracy 0.9)
    after 50 or 75 steps with final accuracies within half a point of each other;
    unscaled fp16 never learns (chance accuracy, about -0.8 against fp32, for all
    300 steps); overflow's fp16 runs stop on a non-finite loss."""
    runs = []
    for spec in plan(NUMERICS_SUITE):
        base = 0.91 + 0.03 * _noise(spec.model_copy(update={"precision": "fp32"}))  # per seed, paired
        steps = 50 if spec.seed % 2 == 0 else 75
        if spec.label == "overflow" and spec.precision == "fp16":
            runs.append(failed(spec, "loss non-finite for all 25 steps up to step 25 despite loss scaling",
                               failure="non_finite"))
        elif spec.label == "underflow-noscale" and spec.precision == "fp16":
            runs.append(completed(spec, final_metric=0.06 + 0.04 * _noise(spec), target_reached=False))
        else:
            delta = 0.004 * (_noise(spec, "delta") - 0.5) if spec.precision != "fp32" else 0.0
            kw = {}
            if spec.precision == "fp16":
                kw = {"loss_scale": scaler_history(steps), "skipped_steps": []}
            runs.append(completed(spec, final_metric=round(base + delta, 4), steps=steps, steps_to_target=steps,
                                  samples_per_s=80000.0 if spec.precision == "fp32" else 42000.0,
                                  peak_memory=300e6 if spec.precision == "fp32" else 310e6, **kw))
    return runs


FAULTS_SUITE = {
    "name": "faults", "amp": "ampcert", "device": "cpu", "seeds": [0], "unaccelerated": "run",
    "certify": "default", "train": {"steps": 90, "eval_every": 30},
    "workloads": [{"workload": "digits", "id": "spiky", "precisions": ["fp32", "fp16"]},
                  {"workload": "digits", "id": "nondeterministic", "precisions": ["fp32"]}],
}


def faults_runs() -> list[RunResult]:
    """What tests/fault_workloads.py's ``spiky`` and ``nondeterministic`` record:
    spiky's inputs are infinite on two steps in three from step 5 to 70, so its
    fp32 runs stop on a non-finite loss at step 5 and its fp16 runs skip those
    updates (the scale falls to its floor, the loss is non-finite on those
    steps); nondeterministic's
    repeat of seed 0 draws different numbers from step 3 on."""
    runs = []
    for spec in plan(FAULTS_SUITE):
        steps = spec.train.step_limit
        if spec.label == "spiky" and spec.precision == "fp16":
            skipped = [s for s in range(5, 71) if s % 3]
            loss = [None if (i + 1) in skipped else 1.0 for i in range(steps)]
            runs.append(completed(spec, final_metric=0.9 + 0.01 * spec.seed, loss=loss, skipped_steps=skipped,
                                  loss_scale=scaler_history(steps, skipped=skipped)))
        elif spec.label == "spiky":
            runs.append(failed(spec, "non-finite loss at step 5 (fp32, no loss scaling)", steps=5,
                               loss=[1.0] * 4 + [None], failure="non_finite"))
        elif spec.label == "nondeterministic" and spec.repeat:
            original = completed(spec.model_copy(update={"repeat": 0}), final_metric=0.9)
            loss = original.loss[:2] + [v + 1e-3 for v in original.loss[2:]]
            runs.append(completed(spec, final_metric=0.9, loss=loss, weights=_digest("other weights")))
        else:
            runs.append(completed(spec, final_metric=0.9 + 0.01 * spec.seed))
    return runs


# --------------------------------------------------------------------------- on disk


def write_results(root: Path, runs: list[RunResult], suite: str | None = None) -> Path:
    """``runs`` as a results folder: plan.json (their specs) and one result.json each."""
    rd = ResultsDir(Path(root))
    specs = [r.spec.model_dump(mode="json") for r in runs]
    atomic_write_json(rd.plan_file, {"suite": suite or (runs[0].spec.suite if runs else "synthetic"),
                                     "runs": specs})
    for r in runs:
        atomic_write_json(rd.result_file(r.run_id), r)
    return rd.root


def dump(runs: list[RunResult]) -> str:
    """The results as JSON, for messages."""
    return json.dumps([r.model_dump(mode="json", include={"run_id", "status", "final_metric"}) for r in runs])


# --------------------------------------------------------------------------- built once per test session


def session_dir(tmp_path_factory) -> Path:
    """A folder every process of this test session sees: pytest's base temp folder,
    or under pytest-xdist its parent, which all the workers' base folders share."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` filled by ``build(folder)`` once per test session, however
    many processes (xdist workers) ask: the first builds it while the others wait
    on a lock, then all read it. A build that raised is retried by the next asker."""
    shared = session_dir(tmp_path_factory)
    root, done = shared / name, shared / f"{name}.built"
    with open(shared / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.exists():
                if root.exists():
                    shutil.rmtree(root)
                root.mkdir()
                build(root)
                done.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return root


# --------------------------------------------------------------------------- the CLI, warm

class WarmCLI:
    """``ampcert ARGS`` as a user runs it, forked from the tests' one warm server
    (tests/warm_server.py): about 0.5 s a command instead of 3. For tests of what commands
    do and print; how a command starts cold is tested by test_cli_imports.py and
    test_wheel.py with real interpreters."""

    def __init__(self, env: dict[str, str] | None = None):
        self._env = env
        self._server: WarmServer | None = None

    @property
    def env(self) -> dict[str, str]:
        if self._env is None:
            from conftest import cli_env

            self._env = cli_env()
        return self._env

    @property
    def server(self) -> WarmServer:
        if self._server is None:
            self._server = WarmServer(self.env)
            atexit.register(self._server.close)
        return self._server

    def bin_dir(self) -> Path:
        """A folder holding an ``ampcert`` executable that runs through the server (put it
        first on PATH)."""
        return self.server.bin_dir(("ampcert",))

    def __call__(self, *args: Any, cwd: Path | None = None, timeout: float = 300,
                 env: dict[str, str] | None = None, text: bool = True) -> subprocess.CompletedProcess:
        """As conftest.run_cli: ``env`` is laid over the server's environment."""
        from conftest import REPO, run_cli

        full_env = self.env | (env or {})
        if full_env.get("PYTHONPATH") != self.env.get("PYTHONPATH"):
            return run_cli(*args, cwd=cwd, timeout=timeout, env=env)  # another sys.path: a cold start
        return self.server.run(["ampcert", *(str(a) for a in args)], cwd or REPO, full_env, timeout, text)


warm_cli = WarmCLI()
