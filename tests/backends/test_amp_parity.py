"""Training parity: ampcert's AMP engine against torch's native one on real training.

Same workload, seeds, data order and hyper-parameters; only the autocast and
loss-scaler implementation differ. The policy mirrors native autocast, so the
final accuracy must agree within half a point (the issue's bar); in practice
the dtype decisions are identical and so are the numbers.
"""

from __future__ import annotations

import io

import pytest

from ampcert import mllog
from ampcert.backends import torch_backend
from ampcert.spec import expand, parse_suite


def _train(amp: str, precision: str, seed: int) -> dict:
    suite = parse_suite({"name": "parity", "amp": amp, "precisions": [precision], "seeds": [seed],
                         "train": {"steps": 120, "eval_every": 60}, "workloads": [{"workload": "digits"}]})
    (spec,) = expand(suite, "cpu")
    return torch_backend.train(spec, mllog.MLLogger(io.StringIO()))


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_ampcert_matches_native_accuracy_on_digits(precision):
    # fp16 on a CPU runs at a few percent of fp32 (~30 s a run here): one seed shows the
    # scaler's trajectory and the losses bit for bit; bf16 takes a second seed
    for seed in (0, 1) if precision == "bf16" else (0,):
        native, ours = _train("native", precision, seed), _train("ampcert", precision, seed)
        assert native.final_metric > 0.85  # it actually learned
        assert abs(ours.final_metric - native.final_metric) <= 0.005, (seed, native.final_metric,
                                                                            ours.final_metric)
        assert ours.amp_policy["name"] == "torch-cpu" and len(ours.amp_policy["sha256"]) == 64
        if precision == "fp16":
            assert ours.loss_scale == native.loss_scale
            assert ours.skipped_steps == native.skipped_steps
        # Identical dtype decisions give identical arithmetic.
        assert ours.loss == native.loss
