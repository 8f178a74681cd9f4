"""``compile: true`` (torch): from step 2 on, the forward and loss, or the whole step
(``torch_compile.scope``), run through torch.compile (:mod:`ampcert.backends.torch_compile`,
which keeps its graphs, breaks and recompiles for the result). Step 1 runs eagerly: the
precision probe watches it and it creates the optimizer's state."""

from __future__ import annotations

from typing import Any

from ampcert.backends.training_loop import Feature, Run, Tally


class CompileScope(Feature):
    def __init__(self) -> None:
        self.compiled: Any = None

    def model_ready(self, run: Run) -> None:
        from ampcert.backends.torch_compile import CompiledStep

        settings = run.spec.torch_compile
        assert settings is not None
        fw: Any = run.framework
        self.whole = settings.scope == "step"
        self.compiled = CompiledStep(settings, fw.train_step if self.whole else fw.forward_loss)

    def before_step(self, run: Run, step: int) -> None:
        if step == 2:
            fw: Any = run.framework
            if self.whole:
                fw.run_step = self.compiled
            else:
                fw.forward = self.compiled

    def after_step(self, run: Run, step: int) -> None:
        if step == 2:
            self.compiled.first_step_done()

    def contribute(self, run: Run, tally: Tally) -> None:
        tally.compile_stats = self.compiled.stats(tally.step_times_ms())
