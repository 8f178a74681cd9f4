"""One overflow decision for all ranks of a data-parallel run: the cross-rank
reduction of :class:`~ampcert.amp.torch.scaler.DynamicLossScaler`'s ``found_inf``.

Why
---
Under ``torch.distributed`` every rank holds its own scaler, and the scales must never
drift apart: a rank that skips a step its peers apply ends up with different weights.
DistributedDataParallel all-reduces the gradients, so an overflow usually shows on every
rank, but not always (gradients outside DDP, ``no_sync`` accumulation, a non-finite value
that a rank's local check sees before the reduction).  So the overflow decision is reduced
explicitly: after each optimizer's inf check the flag is all-reduced with ``MAX`` across the
ranks (``sync_ranks``; by default whenever a process group of more than one rank is
initialised), and every rank skips or applies the same steps and holds the same scale.
The reduction is one collective per ``unscale_`` (one tiny ``all_reduce``, no host
sync with NCCL); every rank must unscale the same optimizers in the same order.

Imports torch only.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ranks_to_sync", "reduce_found_inf"]


def ranks_to_sync(sync_ranks: bool | None, process_group: Any = None) -> bool:
    """Whether to reduce: never with ``sync_ranks=False``; with ``None``, when a process
    group of more than one rank is initialised; ``True`` requires one."""
    if sync_ranks is False:
        return False
    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    if not initialised:
        if sync_ranks:
            raise RuntimeError("sync_ranks=True, but torch.distributed is not initialised")
        return False
    return dist.get_world_size(process_group) > 1


def reduce_found_inf(
    found_inf_per_device: dict[torch.device, torch.Tensor], device: torch.device, process_group: Any = None
) -> dict[torch.device, torch.Tensor]:
    """One overflow flag for all ranks: the MAX of every rank's flags, written back
    into each per-device flag, so every rank skips (or applies) the same step."""
    flags = [t.to(device, non_blocking=True) for t in found_inf_per_device.values()]
    # A rank without gradients still joins the collective, with a clear flag.
    combined = torch.zeros((), dtype=torch.float32, device=device)
    for t in flags:
        combined = torch.maximum(combined, t.ne(0).to(torch.float32))
    torch.distributed.all_reduce(combined, op=torch.distributed.ReduceOp.MAX, group=process_group)
    for dev, t in found_inf_per_device.items():
        t.copy_(combined.to(dev, non_blocking=True))
    return found_inf_per_device
