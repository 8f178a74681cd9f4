"""FP8 and MXFP8 (``precisions: [fp8, mxfp8]``, torch): eligible Linear layers converted
before the optimizer sees them (:mod:`ampcert.backends.torch_fp8`), their scales kept
before each step, the eligibility map and the conversion in the result."""

from __future__ import annotations

from typing import Any

from ampcert.backends.training_loop import Feature, Run, Tally
from ampcert.results import Fp8Stats


class Fp8Layers(Feature):
    def __init__(self) -> None:
        self.model: Any = None

    def model_ready(self, run: Run) -> None:
        from ampcert.backends import torch_fp8

        self.model = torch_fp8.prepare(run.framework.model, run.spec)  # type: ignore[attr-defined]
        run.fp8_layers = self.model.converted()

    def before_step(self, run: Run, step: int) -> None:
        self.model.before_step(step)

    def contribute(self, run: Run, tally: Tally) -> None:
        tally.fp8 = Fp8Stats.model_validate(self.model.summary())
