"""The one training loop (backends/training_loop.py): what it trains is what a plain loop
trains, and a feature plugs in through the Feature protocol alone, its hooks in order."""

from __future__ import annotations

import io
import math

import pytest
import torch

from ampcert import mllog
from ampcert.backends import loop, torch_backend, training_loop
from ampcert.backends.training_loop import Decision, Feature, Run, Tally
from ampcert.spec import expand, parse_suite
from ampcert.workloads import registry


def _spec(precision: str = "fp32", steps: int = 6, eval_every: int = 3, **suite):
    doc = {"name": "loop", "amp": "native", "device": "cpu", "precisions": [precision], "seeds": [2],
           "train": {"steps": steps, "eval_every": eval_every}, "workloads": [{"workload": "digits"}], **suite}
    (spec,) = expand(parse_suite(doc), "cpu")
    return spec


def _plain_loop(spec) -> tuple[str, list[float]]:
    """The training a run of ``spec`` stands for, written out: seeded, built, the seeded
    batches, autocast where the precision asks, the optimizer and its schedule."""
    torch_backend.seed_everything(spec.seed, "cpu")
    workload = registry.get(spec.workload)
    task = workload.build(workload.Params.model_validate(spec.params), spec.seed, "cpu")
    model = task.model
    opt = task.make_optimizer(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, task.lr_lambda) if task.lr_lambda else None
    batches = loop.index_batches(len(task.train_x), task.batch_size, spec.seed)
    amp = torch_backend.make_amp(spec)
    losses = []
    model.train()
    for step in range(1, spec.train.step_limit + 1):
        idx = torch.from_numpy(next(batches))
        x, y = task.train_x[idx], task.train_y[idx]
        if task.augment is not None:
            x, y = task.augment(x, y, step)
        opt.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = task.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss.detach().float()))
    return torch_backend.weights_digest(model), losses


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_loop_trains_what_a_plain_loop_trains(precision):
    spec = _spec(precision)
    out = torch_backend.train(spec, mllog.MLLogger(io.StringIO()))
    digest, losses = _plain_loop(spec)
    assert out.weights_sha256 == digest
    assert out.loss == losses
    assert [e.step for e in out.evals] == [3, 6] and out.steps == 6


class Recorder(Feature):
    """A feature that records its hooks and ends the run at its first decision."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.stop_at = stop_at

    def started(self, run: Run) -> None:
        self.calls.append(("started", 0))

    def built(self, run: Run) -> None:
        self.calls.append(("built", 0))

    def model_ready(self, run: Run) -> None:
        self.calls.append(("model_ready", 0))

    def before_step(self, run: Run, step: int) -> None:
        self.calls.append(("before_step", step))

    def after_step(self, run: Run, step: int) -> None:
        self.calls.append(("after_step", step))

    def after_window(self, run: Run, step: int) -> None:
        self.calls.append(("after_window", step))

    def decide(self, run: Run, step: int, decision: Decision) -> Decision:
        self.calls.append(("decide", step))
        return Decision.STOP if step == self.stop_at else decision

    def contribute(self, run: Run, tally: Tally) -> None:
        self.calls.append(("contribute", tally.steps))
        tally.environment["recorded"] = len(self.calls)


def _run_with(spec, *features: Feature) -> tuple[Run, object]:
    run = Run(spec, mllog.MLLogger(io.StringIO()), registry.get(spec.workload),
              torch_backend.TorchFramework(spec), list(features))
    return run, training_loop.train(run)


def test_a_feature_sees_its_hooks_in_order_and_adds_to_the_result():
    rec = Recorder()
    _, out = _run_with(_spec(steps=4, eval_every=2), rec)
    steps = [c for s in (1, 2) for c in (("before_step", s), ("after_step", s))]
    later = [c for s in (3, 4) for c in (("before_step", s), ("after_step", s))]
    assert rec.calls == [("started", 0), ("built", 0), ("model_ready", 0), *steps, ("after_window", 2),
                         ("decide", 2), *later, ("after_window", 4), ("decide", 4), ("contribute", 4)]
    assert out.environment["recorded"] == len(rec.calls)  # what contribute added reached the result


def test_a_features_stop_ends_the_run_after_that_evaluation_without_a_target():
    _, out = _run_with(_spec(steps=9, eval_every=3), Recorder(stop_at=3))
    assert out.steps == 3 and [e.step for e in out.evals] == [3]
    assert out.target_reached is None and out.steps_to_target is None  # stopped, not reached


def test_a_non_finite_metric_fails_the_run_unless_a_feature_rules_for_it():
    """The loop's own decision on a metric that is not finite is FAIL; a feature may rule
    otherwise, as torchrun does on a rank that does not evaluate (rank 0 decides)."""
    from ampcert.backends.contract import LossNotFinite

    class NanEval(Feature):
        def model_ready(self, run: Run) -> None:
            run.framework.evaluate = lambda: math.nan  # type: ignore[method-assign]

    class RankZeroSaysGoOn(Feature):
        def decide(self, run: Run, step: int, decision: Decision) -> Decision:
            assert decision is Decision.FAIL
            return Decision.CONTINUE

    with pytest.raises(LossNotFinite, match=r"^eval accuracy is nan at step 3$"):
        _run_with(_spec(steps=6), NanEval())
    _, out = _run_with(_spec(steps=6), NanEval(), RankZeroSaysGoOn())
    assert out.steps == 6 and all(math.isnan(e.value) for e in out.evals)
