"""The training loop's plug-ins, registered once: which apply to a run, in the order
their hooks run (:mod:`ampcert.backends.training_loop` names none of them).

Adding a feature (the next precision recipe, say) is a module here with one
:class:`~ampcert.backends.training_loop.Feature` subclass and one line in
:data:`REGISTRY`: which frameworks it serves and when a run has it. Neither
framework's adapter nor the loop changes.

The order matters where one feature builds on another's work: FP8 converts the
model's layers, and a recipe its weights' dtype, before torchrun wraps it in
DistributedDataParallel (whose buckets take the parameters' dtype); a recipe's
reduction hooks the wrapper torchrun made; the precision probe watches the
wrapped model (its gradient buckets' dtype).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ampcert.amp.precision import FP8_PRECISIONS
from ampcert.amp.recipes import RECIPES
from ampcert.spec import RunSpec

if TYPE_CHECKING:
    from ampcert.backends.training_loop import Feature


@dataclass(frozen=True)
class Entry:
    """One feature: its name, the frameworks it serves, whether a run has it, and its class
    (``module:Class`` in this package, imported only for a run that has it)."""

    name: str
    frameworks: tuple[str, ...]
    applies: Callable[[RunSpec], bool]
    implementation: str

    def make(self) -> Feature:
        module, _, cls = self.implementation.partition(":")
        return getattr(importlib.import_module(f"{__name__}.{module}"), cls)()


REGISTRY: tuple[Entry, ...] = (
    Entry("memory sweep", ("torch", "jax"), lambda spec: spec.is_memory_sweep, "memory_sweep:MemorySweepPoint"),
    Entry("fp8", ("torch",), lambda spec: spec.precision in FP8_PRECISIONS, "fp8:Fp8Layers"),
    Entry("recipe weights", ("torch",), lambda spec: spec.precision in RECIPES, "recipe:RecipeWeights"),
    Entry("recipe weights", ("jax",), lambda spec: spec.precision in RECIPES, "jax_recipe:JaxRecipeWeights"),
    Entry("torchrun", ("torch",), lambda spec: spec.launch.launcher == "torchrun", "torchrun:TorchrunRanks"),
    Entry("recipe reduction", ("torch",), lambda spec: spec.precision in RECIPES and RECIPES[spec.precision].reduces_by_hook,
          "recipe:RecipeReduction"),
    Entry("precision probe", ("torch",), lambda spec: True, "precision_probe:TorchPrecisionProbe"),
    Entry("precision probe", ("jax",), lambda spec: True, "precision_probe:JaxPrecisionProbe"),
    Entry("compile scope", ("torch",), lambda spec: spec.torch_compile is not None, "compile_scope:CompileScope"),
    Entry("injected slowdown", ("torch", "jax"), lambda spec: bool(spec.fault.injected_slowdown),
          "slowdown:InjectedSlowdown"),
    Entry("resume from checkpoint", ("torch", "jax"), lambda spec: spec.resume.resume_after_window is not None,
          "resume:ResumeFromCheckpoint"),
    Entry("training state", ("torch",), lambda spec: True, "training_state:TorchTrainingState"),
    Entry("training state", ("jax",), lambda spec: True, "jax_training_state:JaxTrainingState"),
)


def for_run(spec: RunSpec, framework: str) -> list[Feature]:
    """The features ``spec`` has on ``framework``, in hook order."""
    return [entry.make() for entry in REGISTRY if framework in entry.frameworks and entry.applies(spec)]
