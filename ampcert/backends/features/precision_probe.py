"""What precision a run really computed in (MLPerf's ``lowest_numerical_precision``
disclosure), measured on its first step: torch watches the step's ops
(:mod:`ampcert.backends.torch_precision`), JAX traces the step apart and reads the
jaxpr (:mod:`ampcert.backends.jax_precision`)."""

from __future__ import annotations

from typing import Any

from ampcert.backends import loop
from ampcert.backends.training_loop import Feature, Run


class TorchPrecisionProbe(Feature):
    """Watches step 1's forward and backward (only matmul, convolution and attention ops
    count), and under DDP the dtype of the gradient buckets. The watch ends as the
    optimizer's step begins: an update multiplies no matrices, and one that compiles
    itself (torchao's low-bit AdamW) cannot compile under the watch's dispatch mode."""

    def __init__(self) -> None:
        self.probe: Any = None
        self.watching = False

    def model_ready(self, run: Run) -> None:
        from ampcert.backends import torch_precision

        fw: Any = run.framework
        self.probe = torch_precision.PrecisionProbe(fw.model, run.spec.device)
        if fw.train_model is not fw.model:  # wrapped for data parallelism: its collective's dtype
            fw.comm_hook = torch_precision.observing_comm(fw.comm_hook, self.probe.observed)
        wire = getattr(fw.data_parallel, "wire_dtype", None)  # sharded in its place: its reduce dtype
        if wire is not None:
            torch_precision.note_comm_dtype(self.probe.observed, wire)

    def before_step(self, run: Run, step: int) -> None:
        if step == 1:
            fw: Any = run.framework
            self.unhook = fw.optimizer.register_step_pre_hook(lambda *_: self._stop_watching())
            self.probe.__enter__()
            self.watching = True

    def _stop_watching(self) -> None:
        if self.watching:
            self.probe.__exit__(None, None, None)
            self.watching = False

    def after_step(self, run: Run, step: int) -> None:
        if step != 1:
            return
        from ampcert.backends import torch_precision

        self._stop_watching()  # a step whose update was skipped (an fp16 overflow) never reached it
        self.unhook.remove()
        self.probe.remove_hooks()
        run.tally.lowest_precision = loop.log_lowest_precision(
            run.log, torch_precision.disclosure(self.probe.observed, run.spec.world_size,
                                                fp8_layers=run.fp8_layers))


class JaxPrecisionProbe(Feature):
    """Traces step 1 apart before it runs (no compile, no run) and reads what XLA will compute in."""

    def before_step(self, run: Run, step: int) -> None:
        if step != 1:
            return
        from ampcert.backends import jax_precision

        fw: Any = run.framework
        run.tally.lowest_precision = loop.log_lowest_precision(
            run.log, jax_precision.observe(fw.step_fn, fw.step_args(fw.last, 1), run.spec.device))
