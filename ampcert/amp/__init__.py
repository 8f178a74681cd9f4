"""ampcert's AMP engine for PyTorch, usable without the harness (like jmp).

    from ampcert.amp import autocast, DynamicLossScaler

    scaler = DynamicLossScaler("cuda")
    with autocast("cuda", torch.float16):          # policy: configs/policies/torch-cuda.yaml
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

- :func:`autocast` casts per op family from a policy file you can read,
  change and audit (:mod:`ampcert.amp.audit`), built on TorchFunctionMode so
  autograd records the casts.
- :class:`DynamicLossScaler` is GradScaler's state machine with a floor and a
  ceiling on the scale and no host sync in the step path.

Nothing in this package imports the rest of ampcert. The torch exports are
loaded on first use (PEP 562), so ``import ampcert.amp.jax`` works where
torch is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ampcert.amp.policy import OpPolicy, PolicyError, load_policy, shipped_policy

if TYPE_CHECKING:  # for type checkers and IDEs; at run time see __getattr__
    from ampcert.amp.torch.autocast import autocast
    from ampcert.amp.torch.scaler import DynamicLossScaler

__all__ = ["DynamicLossScaler", "OpPolicy", "PolicyError", "autocast", "load_policy", "shipped_policy"]

# name -> the module that defines it; importing either module imports torch.
_TORCH_EXPORTS = {
    "autocast": "ampcert.amp.torch.autocast",
    "DynamicLossScaler": "ampcert.amp.torch.scaler",
}


def __getattr__(name: str) -> Any:
    module = _TORCH_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
