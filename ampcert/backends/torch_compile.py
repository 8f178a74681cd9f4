"""A ``compile: true`` run's training step through torch.compile, with its record.

What is compiled (``torch_compile.scope``):

- ``forward`` (the default): the model's forward and the loss (a function of
  the batch), called inside the run's autocast region, whichever engine;
  AOTAutograd compiles its backward. The loss scaler and the optimizer step
  stay eager: what is certified is the AMP engine under the compiled forward
  and backward, where autocast's decisions are made, and no break there is
  anyone's but the engine's.
- ``step``: the step as a user compiles it, from the autocast region (made
  inside) to the scaler's ``update()``. Its breaks include the framework's own:
  ``Tensor.backward()``, torch.optim's deliberate ones around an optimizer step
  traced without a scaler, GradScaler's (Dynamo skips torch.amp), and
  DynamicLossScaler's eager optimizer step (``amp/torch/scaler_step.py``); the
  compile rule holds them to ``max_step_graph_breaks`` where a pack sets it.

The first step runs eagerly: the precision probe watches it, and it creates
the optimizer's state. The second compiles; its time (the run's step clock)
less the median step is the compile time. Graph breaks and graphs come from torch._dynamo's
counters (reset when compilation starts: one run per worker process);
recompiles are the frames Dynamo compiled after the first compiled step.

A compilation that fails (no C compiler for Inductor, an unsupported op)
fails the run with the reason, unless the suite says ``fallback: eager``: then
the run goes on eagerly and its result says ``compiled: false`` and why. A
run is never labelled compiled that did not run compiled.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from ampcert.backends.contract import RunFailed
from ampcert.errors import one_line
from ampcert.results import CompileStats
from ampcert.spec import TorchCompile

MAX_REASONS = 5


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


class CompiledStep:
    """``fn(x, y) -> loss``, compiled from its first call on (see the module doc)."""

    def __init__(self, settings: TorchCompile, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.settings = settings
        self.eager = fn
        self.compiled: Callable[..., torch.Tensor] | None = None
        self.failure: str | None = None
        self._frames_after_first: int | None = None

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.failure is not None:
            return self.eager(x, y)
        if self.compiled is not None:
            return self.compiled(x, y)
        import torch._dynamo
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        try:
            self.compiled = torch.compile(self.eager, mode=self.settings.mode, backend=self.settings.backend)
            return self.compiled(x, y)
        except Exception as exc:  # noqa: BLE001 - any compiler failure is the finding
            # (compiler errors append pages of advice to their first line)
            reason = f"torch.compile (backend {self.settings.backend}, mode {self.settings.mode}) failed: " \
                     f"{type(exc).__name__}: {one_line(_first_line(str(exc)))}"
            if self.settings.fallback != "eager":
                raise RunFailed(reason) from None
            self.compiled, self.failure = None, reason
            return self.eager(x, y)

    def first_step_done(self) -> None:
        """The first compiled step (compilation included) is done: what Dynamo compiles
        from here on are recompilations."""
        from torch._dynamo.utils import counters

        self._frames_after_first = counters["frames"]["total"]

    def stats(self, step_times_ms: list[float] | None) -> CompileStats:
        """From torch._dynamo's counters; ``step_times_ms`` are the run's steps in order
        (the first compiled step is the second)."""
        from torch._dynamo.utils import counters

        s = self.settings
        if self.failure is not None:
            return CompileStats(mode=s.mode, backend=s.backend, scope=s.scope, compiled=False,
                                fallback_reason=self.failure)
        reasons: list[str] = []
        for reason in counters["graph_break"]:
            if _first_line(reason) not in reasons:
                reasons.append(_first_line(reason))
        compile_s = None
        if self._frames_after_first is not None and step_times_ms and len(step_times_ms) > 1:
            # less the median step: robust to the one compiling step among them
            compile_s = max(0.0, (step_times_ms[1] - statistics.median(step_times_ms)) / 1e3)
        frames: Any = counters["frames"]["total"]
        return CompileStats(
            mode=s.mode, backend=s.backend, scope=s.scope, compiled=self.compiled is not None, compile_s=compile_s,
            graph_breaks=sum(counters["graph_break"].values()), break_reasons=reasons[:MAX_REASONS],
            graphs=counters["stats"]["unique_graphs"],
            recompiles=frames - self._frames_after_first if self._frames_after_first is not None else None)
