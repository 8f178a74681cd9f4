"""The sync-free core of :class:`~ampcert.amp.torch.scaler.DynamicLossScaler`: an
optimizer step that is undone on the device when the gradients overflowed.

Why
---
``GradScaler`` decides whether to skip with ``if found_inf.item(): ...``, which stalls
the host until the GPU has finished the backward pass, once per step.  Instead
(``sync_free=True``) the optimizer step always runs and is *undone on the device* when
an overflow was found: the parameters and optimizer-state tensors (moments, ``step``
counters, ...) are snapshotted, the step runs, and ``torch.where(found_inf, snapshot,
current)`` restores them: :func:`snapshot_for_undo` before the step, the optimizer's
step, then :func:`undo_if_overflowed`, which the scaler's ``_maybe_opt_step`` calls in
turn. Under torch.compile all of it runs eagerly, inside the scaler's step, as
GradScaler's does (:mod:`ampcert.amp.torch.scaler`). :func:`syncing_step` is
``GradScaler``'s own path (``sync_free=False``): ask the host, then step or not.

The snapshot is kept in reusable buffers, one set per optimizer
(:func:`snapshot_buffers`): one copy of every parameter with a gradient and of its
optimizer-state tensors (e.g. +3x parameter memory for Adam), plus a copy and a
``where`` per tensor per step.  Fused optimizers never come here: they skip inside
their own kernel (the scaler's native path).  On a masked overflow step the
optimizer's return value is returned even though its effect was undone (the host
cannot know); ``GradScaler`` returns ``None`` for skipped steps.

Where host syncs remain in the masked step
------------------------------------------
None in steady state, except

- when the optimizer *creates* state or changes non-tensor state during the step
  (SGD-momentum and Adam create their buffers on the first successful step): one
  ``.item()`` decides whether to keep the new state; this repeats only while those
  first steps overflow;
- when an optimizer-state tensor lives on another device than the scale, typically
  the CPU ``step`` counters of Adam/AdamW/... with ``capturable=False`` on CUDA: the
  overflow mask is copied to the host (blocking) every step.  Use ``fused=True``
  (native path, no copy) or ``capturable=True`` to avoid it;
- sparse gradients or sparse state fall back to :func:`syncing_step`.

Syncs made by the optimizer itself are outside the scaler's control.

Imports torch and the standard library only.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch

__all__ = ["Undo", "combined_found_inf", "snapshot_buffers", "snapshot_for_undo", "syncing_step",
           "undo_if_overflowed"]


def _same_host_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - uncomparable objects count as changed
        return False


def syncing_step(
    optimizer: torch.optim.Optimizer,
    found_inf_per_device: dict[torch.device, torch.Tensor],
    *args: Any,
    **kwargs: Any,
) -> Any:
    """GradScaler's syncing path: ask the host whether to step."""
    retval = None
    if not sum(v.item() for v in found_inf_per_device.values()):
        retval = optimizer.step(*args, **kwargs)
    return retval


def combined_found_inf(found_inf_per_device: dict[torch.device, torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sum of an optimizer's per-device overflow flags, on ``device`` (no sync)."""
    found = [t.to(device, non_blocking=True) for t in found_inf_per_device.values()]
    total = found[0]
    for t in found[1:]:
        total = total + t
    return total


def snapshot_buffers(
    cache: weakref.WeakKeyDictionary, optimizer: torch.optim.Optimizer, tensors: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Copies of ``tensors``, in buffers reused from ``cache[optimizer]`` while their
    shapes, dtypes and devices stay the same."""
    signature = [(t.shape, t.dtype, t.device) for t in tensors]
    cached = cache.get(optimizer)
    if cached is not None and cached[0] == signature:
        buffers = cached[1]
    else:
        buffers = [torch.empty_like(t, memory_format=torch.preserve_format) for t in tensors]
        cache[optimizer] = (signature, buffers)
    if tensors:
        torch._foreach_copy_(buffers, tensors)
    return buffers


class Undo(NamedTuple):
    """What :func:`snapshot_for_undo` keeps for :func:`undo_if_overflowed`."""

    params: list[torch.Tensor]
    before: list[dict[str, Any]]  # shallow copy of each param's state dict
    tensor_slots: list[tuple[int, str]]  # (param index, key) of state tensors
    snaps: list[torch.Tensor]
    found_inf: torch.Tensor


def snapshot_for_undo(
    optimizer: torch.optim.Optimizer,
    found_inf_per_device: dict[torch.device, torch.Tensor],
    device: torch.device,
    cache: weakref.WeakKeyDictionary,
) -> Undo | None:
    """Before the step: the parameters and optimizer-state tensors copied into the
    reusable buffers, and the combined overflow flag on ``device`` (the scale's).
    None where a tensor is sparse: then only :func:`syncing_step` can skip."""
    params: list[torch.Tensor] = []
    seen: set[int] = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None and id(p) not in seen:
                seen.add(id(p))
                params.append(p)

    state = optimizer.state
    before: list[dict[str, Any]] = []
    tensor_slots: list[tuple[int, str]] = []
    tracked: list[torch.Tensor] = list(params)
    for i, p in enumerate(params):
        st = dict(state[p]) if p in state else {}
        before.append(st)
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensor_slots.append((i, k))
                tracked.append(v)
    if any(t.is_sparse or (t.grad is not None and t.grad.is_sparse) for t in tracked):
        return None

    found_inf = combined_found_inf(found_inf_per_device, device)
    with torch.no_grad():
        snaps = snapshot_buffers(cache, optimizer, tracked)
    return Undo(params, before, tensor_slots, snaps, found_inf)


def undo_if_overflowed(optimizer: torch.optim.Optimizer, undo: Undo, retval: Any,
                       cache: weakref.WeakKeyDictionary) -> Any:
    """After the step: where the overflow flag is set, the parameters and optimizer-state
    tensors get their snapshot back, on the device (``torch.where``); returns the step's
    ``retval`` (None where a step that changed the state's structure was undone)."""
    params, before, tensor_slots, snaps, found_inf = undo
    state = optimizer.state
    # Did the step change the *structure* of the state (new buffers, new keys,
    # changed Python values)?  That cannot be undone by a device-side select.
    changed = False
    for i, p in enumerate(params):
        old = before[i]
        new = state[p] if p in state else {}
        if old.keys() != new.keys():
            changed = True
            break
        for k, v in old.items():
            nv = new[k]
            if isinstance(v, torch.Tensor):
                if not (
                    isinstance(nv, torch.Tensor)
                    and nv.shape == v.shape
                    and nv.dtype == v.dtype
                    and nv.device == v.device
                    and not nv.is_sparse
                ):
                    changed = True
                    break
            elif not _same_host_value(v, nv):
                changed = True
                break
        if changed:
            break

    with torch.no_grad():
        if changed:
            # One sync: decide on the host whether to keep the new state.
            if found_inf.item():
                for p, snap in zip(params, snaps[: len(params)], strict=True):
                    p.copy_(snap)
                for (i, k), snap in zip(tensor_slots, snaps[len(params) :], strict=True):
                    before[i][k].copy_(snap)
                for i, p in enumerate(params):
                    if before[i]:
                        state[p] = before[i]
                    elif p in state:
                        del state[p]
                retval = None
            else:
                # The state keeps its new structure: size the snapshot buffers for it now,
                # so the next step (traced, under torch.compile) finds them made and does
                # not make them, or recompile once they exist.
                grown = list(params) + [v for p in params for v in (state[p].values() if p in state else ())
                                        if isinstance(v, torch.Tensor)]
                snapshot_buffers(cache, optimizer, grown)
            return retval

        skip = found_inf.ne(0)
        masks: dict[torch.device, torch.Tensor] = {skip.device: skip}
        currents = list(params) + [state[params[i]][k] for (i, k) in tensor_slots]
        for cur, snap in zip(currents, snaps, strict=True):
            mask = masks.get(cur.device)
            if mask is None:
                # Blocking when cur is on the host: a sync (see the module docstring).
                mask = skip.to(cur.device)
                masks[cur.device] = mask
            torch.where(mask, snap, cur, out=cur)
    return retval

