"""The bytes training holds for its parameters (every run): the weights, their gradients
and the optimizer's state, read once, after the first window, outside the step's
timing (results.TrainingState). What a precision recipe saves against AMP.
:class:`TorchTrainingState` reads torch's tensors; JAX's reader is
``jax_training_state.py``."""

from __future__ import annotations

from typing import Any

from ampcert.backends.training_loop import Feature, Run, Tally
from ampcert.results import TrainingState


class TrainingStateReader(Feature):
    """Reads the state once, after the first window; a framework says how (:meth:`read`)."""

    def __init__(self) -> None:
        self.state: TrainingState | None = None

    def after_window(self, run: Run, step: int) -> None:
        if self.state is None:
            self.state = self.read(run.framework)

    def read(self, fw: Any) -> TrainingState:
        raise NotImplementedError

    def contribute(self, run: Run, tally: Tally) -> None:
        tally.training_state = self.state


class TorchTrainingState(TrainingStateReader):
    def read(self, fw: Any) -> TrainingState:
        from ampcert.amp.torch.recipe_optim import state_bytes, tensor_bytes

        params = [p for p in fw.model.parameters() if p.requires_grad]
        return TrainingState(
            parameters=sum(p.numel() for p in params),
            weights_dtype="+".join(sorted({str(p.dtype).removeprefix("torch.") for p in params})),
            optimizer=f"{type(fw.optimizer).__module__}.{type(fw.optimizer).__qualname__}",
            weights_bytes=sum(tensor_bytes(p.detach()) for p in params),
            # the last step's gradients, not yet set to None; one the step left without a
            # gradient holds none
            gradients_bytes=sum(tensor_bytes(p.grad) for p in params if p.grad is not None),
            optimizer_state_bytes=state_bytes(fw.optimizer))
