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

Nothing in this package imports the rest of ampcert.
"""

from ampcert.amp.policy import OpPolicy, PolicyError, load_policy, shipped_policy
from ampcert.amp.torch_autocast import autocast
from ampcert.amp.torch_scaler import DynamicLossScaler

__all__ = ["DynamicLossScaler", "OpPolicy", "PolicyError", "autocast", "load_policy", "shipped_policy"]
