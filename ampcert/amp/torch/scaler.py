"""Dynamic loss scaling for PyTorch mixed-precision training, bounded and sync-free.

Why loss scaling
----------------
``float16`` has 5 exponent bits: values below ~6e-8 flush to zero and values above
65504 overflow to ``inf``.  Gradients of a well-trained network are often tiny, so a
``float16`` backward pass silently *underflows* them to zero.  Loss scaling multiplies
the loss by a large factor ``S`` before ``backward()``; by the chain rule every gradient
is multiplied by ``S`` too, lifting it out of the underflow zone.  Before the optimizer
uses the gradients they are divided by ``S`` again (in ``float32``), so the update is
mathematically unchanged.

Why *dynamic* loss scaling
--------------------------
The best ``S`` is the largest one that does not make any gradient overflow, and it
drifts during training.  A dynamic scaler searches for it online:

* every step, the unscaled gradients are checked for ``inf``/``NaN``;
* on overflow the step is skipped (the parameters must not see ``inf``) and
  ``S *= backoff_factor``;
* after ``growth_interval`` consecutive clean steps, ``S *= growth_factor`` (probing
  whether a larger scale is now safe).

This is exactly ``torch.amp.GradScaler``'s rule (``torch._amp_update_scale_``), and
:class:`DynamicLossScaler` reproduces it bit for bit.  ``bfloat16`` has the exponent
range of ``float32`` and normally needs no scaling; the scaler is harmless there.

What this module adds to ``GradScaler``
---------------------------------------
1. **Bounds.**  ``GradScaler`` has no floor: a run of overflows (a genuinely diverging
   model, a bad batch, a NaN in the data) halves the scale until it reaches ``0`` --
   after which ``1/S = inf`` turns every gradient into ``inf``/``NaN`` and training can
   never recover.  Here the scale is clamped to ``[min_scale, max_scale]`` after every
   update.  ``min_scale=0.0, max_scale=float("inf")`` restores ``GradScaler`` exactly.
2. **No host synchronisation in the step path** (``sync_free=True``): the optimizer
   step always runs and is *undone on the device* when an overflow was found, instead
   of ``GradScaler``'s ``if found_inf.item()`` (:mod:`ampcert.amp.torch.scaler_step`).
   Optimizers with native AMP support (``optimizer._step_supports_amp_scaling``, e.g.
   ``fused=True`` Adam/AdamW/SGD) instead receive ``grad_scale``/``found_inf`` and skip
   inside their kernel, exactly as with ``GradScaler``.
3. **Telemetry** (:meth:`DynamicLossScaler.trajectory`): the scale after every update,
   whether the update saw an overflow and whether a step was skipped, recorded on the
   device without syncing (:mod:`ampcert.amp.torch.scaler_trajectory`).
4. **Data-parallel training**: every rank skips or applies the same steps and holds the
   same scale, because the overflow flag is all-reduced (``MAX``) across the ranks after
   each inf check (``sync_ranks``; :mod:`ampcert.amp.torch.scaler_ranks`).

Where the code is
-----------------
This module is the ``GradScaler``-compatible front: the public API, the per-optimizer
state machine below, unscaling and the inf check, the update rule, checkpointing. It
uses three modules, one concept each, each with its own account of why:

- :mod:`ampcert.amp.torch.scaler_step`: the sync-free core, a step undone on the
  device (and ``GradScaler``'s syncing step);
- :mod:`ampcert.amp.torch.scaler_ranks`: the cross-rank reduction of ``found_inf``;
- :mod:`ampcert.amp.torch.scaler_trajectory`: trajectory recording.

State machine
-------------
Each optimizer has a stage, reset to ``READY`` by :meth:`~DynamicLossScaler.update`::

    READY --unscale_()--> UNSCALED --step()--> STEPPED --update()--> READY
      \\________________________step()_______________/^

``unscale_`` twice, ``unscale_`` after ``step``, or ``step`` twice before ``update``
raise ``RuntimeError``; unscaling ``float16`` gradients raises ``ValueError`` (keep
master weights in ``float32``); ``step`` on an optimizer without gradients and
``update`` with no recorded inf checks raise ``AssertionError`` -- all as in
``GradScaler``.  Several optimizers may share one scaler: each is stepped (or skipped)
according to its *own* gradients, and ``update`` backs off if *any* of them overflowed.

Where host syncs remain
-----------------------
* ``scale``, ``unscale_``, ``update``: never.
* ``step`` with ``sync_free=True``: none in steady state; the exceptions (an optimizer
  creating its state in its first steps, state tensors on another device than the
  scale, sparse gradients) are listed in :mod:`ampcert.amp.torch.scaler_step`.  Syncs
  made by the optimizer itself are outside the scaler's control.
* ``step`` with ``sync_free=False``: one ``.item()`` per step (``GradScaler``'s
  behaviour; free on CPU, where it is the default).
* ``get_scale()``, ``state_dict()``, pickling and ``trajectory()``: one sync each
  (``trajectory()`` copies everything recorded since its last call in one transfer).

Under torch.compile
-------------------
``step`` and ``update`` run eagerly, whole, as ``GradScaler``'s do (Dynamo does not trace
torch.amp): a training step compiled as one function then falls into the graphs and
breaks native's does, no more (tests/amp/torch/test_torch_compile.py). Traced, the step's
inf check, snapshot and undo around the eager optimizer step made five graphs of
native's two, and the step up to 2.9x native's time under aot_eager. ``scale`` and
an explicit ``unscale_`` (before clipping) are traced: they hold no host sync.
"""

from __future__ import annotations

import inspect
import math
import warnings
import weakref
from collections import abc, defaultdict
from enum import Enum
from types import ModuleType
from typing import Any, cast

import torch

from .dynamo_marks import when_dynamo_imported
from .scaler_ranks import ranks_to_sync, reduce_found_inf
from .scaler_step import snapshot_for_undo, syncing_step, undo_if_overflowed
from .scaler_trajectory import Trajectory

try:  # Share GradScaler's enum so code inspecting per-optimizer stages keeps working.
    from torch.amp.grad_scaler import OptState
except ImportError:  # pragma: no cover - very old torch

    class OptState(Enum):  # type: ignore[no-redef]
        READY = 0
        UNSCALED = 1
        STEPPED = 2


__all__ = ["DynamicLossScaler", "OptState"]


class _MultiDeviceReplicator:
    """Lazily serves (cached) copies of ``master`` on the devices asked for."""

    def __init__(self, master_tensor: torch.Tensor) -> None:
        self.master = master_tensor
        self._per_device_tensors: dict[torch.device, torch.Tensor] = {}

    def get(self, device: torch.device) -> torch.Tensor:
        retval = self._per_device_tensors.get(device)
        if retval is None:
            retval = self.master.to(device=device, non_blocking=True, copy=True)
            self._per_device_tensors[device] = retval
        return retval


def _refresh_per_optimizer_state() -> dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


def _amp_definitely_not_available() -> bool:
    import importlib.util

    return not (torch.cuda.is_available() or importlib.util.find_spec("torch_xla"))


class DynamicLossScaler(torch.amp.GradScaler):
    """Drop-in replacement for ``torch.amp.GradScaler`` with a bounded, sync-free scale.

    Usage is identical to ``GradScaler``::

        scaler = DynamicLossScaler("cuda")
        for x, y in data:
            optimizer.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()      # gradients are multiplied by the scale
            scaler.unscale_(optimizer)         # optional: only to inspect/clip gradients
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)             # unscale (if needed), step or skip
            scaler.update()                    # back off / grow the scale

    It is a ``GradScaler`` subclass, so code that checks ``isinstance(scaler,
    torch.amp.GradScaler)`` (Lightning-style loops, Trainer-style helpers) takes
    it. Every method, ``GradScaler``'s private ``_maybe_opt_step`` hook included,
    is this class's own: bounds and the sync-free step hold whichever is called.
    ``GradScaler.__init__`` is not run; the state it would make is made here,
    under the same names.

    Args:
        device: device *type* of the scale tensor (``"cuda"``, ``"cpu"``, ...).  As with
            ``GradScaler``, ``"cuda"`` without CUDA disables the scaler with a warning.
        init_scale: first scale.  Large on purpose (``2**16``): the first few steps
            overflow and back off quickly, which is cheaper than starting too small
            and underflowing.  Clamped into ``[min_scale, max_scale]``.
        growth_factor: multiplier (``> 1``) applied after ``growth_interval``
            consecutive clean steps.
        backoff_factor: multiplier (``< 1``) applied on every overflowing step.
        growth_interval: clean steps needed before trying a larger scale.  Small values
            track the optimum tightly but overflow (and skip a step) more often.
        enabled: ``False`` turns every method into a pass-through: ``scale`` returns
            its input, ``step`` just calls ``optimizer.step()``, ``get_scale`` is 1.0.
        min_scale: floor of the scale (default 1.0: never *shrink* gradients, and never
            collapse to 0).  Persistent overflow at the floor means the gradients
            overflow without any scaling -- a real numerical problem, not a scale one.
        max_scale: ceiling of the scale (default ``2**24``).  Growth beyond it is
            clamped; the growth tracker still resets as in ``GradScaler``.
        sync_free: ``True`` masks overflowing steps on the device instead of asking
            the host; ``False`` uses ``GradScaler``'s ``if found_inf.item()``.
            ``None`` (default) means ``True`` unless ``device == "cpu"``, where reading
            a scalar costs nothing and masking would only add copies.
        record_trajectory: record telemetry for :meth:`trajectory` (12 bytes per
            :meth:`update` on the device until collected, then 6 bytes on the host;
            a million steps cost ~6 MB).  Call :meth:`reset_trajectory` to free it.
        sync_ranks: reduce the overflow flag across ``torch.distributed`` ranks (``MAX``)
            so all ranks skip the same steps.  ``None`` (default): when a process group
            with more than one rank is initialised.  ``process_group`` picks the group
            (default: the default group).

    Numerics: with ``min_scale=0.0, max_scale=float("inf")`` the scale, growth tracker,
    skip decisions, parameters and optimizer state match ``GradScaler`` bit for bit, on
    both the ``sync_free=True`` and ``sync_free=False`` paths.

    Cost of ``sync_free=True`` (non-fused optimizers): one copy of every parameter with
    a gradient and of its optimizer-state tensors is kept as a reusable snapshot buffer
    (e.g. +3x parameter memory for Adam), plus a copy and a ``where`` per tensor per
    step.  Fused optimizers pay nothing.  On a masked overflow step, ``step`` returns the
    optimizer's return value even though its effect was undone (the host cannot know);
    ``GradScaler`` returns ``None`` for skipped steps.
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
        sync_free: bool | None = None,
        record_trajectory: bool = True,
        sync_ranks: bool | None = None,
        process_group: Any = None,
    ) -> None:
        self._device = device
        self._sync_ranks = sync_ranks
        self._process_group = process_group
        self._enabled = enabled
        if self._device == "cuda" and enabled and _amp_definitely_not_available():
            warnings.warn(
                "DynamicLossScaler is enabled, but CUDA is not available.  Disabling.",
                stacklevel=2,
            )
            self._enabled = False

        if not (min_scale >= 0.0):
            raise ValueError(f"min_scale must be >= 0, got {min_scale}")
        if not (max_scale >= min_scale):
            raise ValueError(f"max_scale ({max_scale}) must be >= min_scale ({min_scale})")
        self._min_scale = float(min_scale)
        self._max_scale = float(max_scale)
        self._sync_free = (device != "cpu") if sync_free is None else bool(sync_free)
        self._record_trajectory = record_trajectory
        self._trajectory = Trajectory()

        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            self._init_scale = self._clamp_float(init_scale)
            # _scale/_growth_tracker are created lazily by the first scale() call, on
            # the device of the first output, like GradScaler.
            self._scale: torch.Tensor | None = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker: torch.Tensor | None = None
            self._per_optimizer_states: dict[int, dict[str, Any]] = defaultdict(
                _refresh_per_optimizer_state
            )
        # Reusable snapshot buffers for the masked step, per optimizer.
        self._snapshots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ helpers
    def _clamp_float(self, value: float) -> float:
        return min(max(float(value), self._min_scale), self._max_scale)

    def _bounds_are_trivial(self) -> bool:
        return self._min_scale <= 0.0 and self._max_scale == math.inf

    def _apply_bounds_(self) -> None:
        if self._scale is not None and not self._bounds_are_trivial():
            self._scale.clamp_(self._min_scale, self._max_scale)

    def _check_scale_growth_tracker(self, funcname: str) -> tuple[torch.Tensor, torch.Tensor]:
        fix = (
            "This may indicate your script did not use scaler.scale(loss or outputs) "
            "earlier in the iteration."
        )
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  " + fix)
        if self._growth_tracker is None:
            raise AssertionError(f"Attempted {funcname} but _growth_tracker is None.  " + fix)
        return (self._scale, self._growth_tracker)

    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        if self._growth_tracker is not None:
            raise AssertionError("_growth_tracker initialized before _scale")
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = torch.full(
            (), self._init_growth_tracker, dtype=torch.int32, device=dev
        )

    # ------------------------------------------------------------------ scale
    def scale(self, outputs: Any) -> Any:
        """Multiply a tensor, or a (nested) list/tuple/iterable of tensors, by the scale.

        Returns the scaled outputs (lists and tuples keep their type, other iterables
        become lazy ``map`` objects, as in ``GradScaler``).  Pass-through when disabled.
        Never syncs.
        """
        if not self._enabled:
            return outputs

        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            scale = cast(torch.Tensor, self._scale)
            return outputs * scale.to(device=outputs.device, non_blocking=True)

        stash: list[_MultiDeviceReplicator] = []

        def apply_scale(val: Any) -> Any:
            if isinstance(val, torch.Tensor):
                if len(stash) == 0:
                    if self._scale is None:
                        self._lazy_init_scale_growth_tracker(val.device)
                    stash.append(_MultiDeviceReplicator(cast(torch.Tensor, self._scale)))
                return val * stash[0].get(val.device)
            if isinstance(val, abc.Iterable):
                iterable = map(apply_scale, val)
                if isinstance(val, (list, tuple)):
                    return type(val)(iterable)
                return iterable
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply_scale(outputs)

    # ------------------------------------------------------------------ unscale
    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        per_device_inv_scale = _MultiDeviceReplicator(inv_scale)
        per_device_found_inf = _MultiDeviceReplicator(found_inf)
        per_device_and_dtype_grads: dict[torch.device, dict[torch.dtype, list[torch.Tensor]]]
        per_device_and_dtype_grads = defaultdict(lambda: defaultdict(list))
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if not isinstance(param, torch.Tensor):
                        raise AssertionError(
                            f"expected param to be torch.Tensor, got {type(param).__name__}"
                        )
                    if param.grad is None:
                        continue
                    if (not allow_fp16) and param.grad.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    if param.grad.is_sparse:
                        # Duplicate indices are summed by coalesce(), which may overflow
                        # in fp16, so the coalesced values are what must be checked.
                        if param.grad.dtype is torch.float16:
                            param.grad = param.grad.coalesce()
                        to_unscale = param.grad._values()
                    else:
                        to_unscale = param.grad
                    per_device_and_dtype_grads[to_unscale.device][to_unscale.dtype].append(
                        to_unscale
                    )
            for device, per_dtype_grads in per_device_and_dtype_grads.items():
                for grads in per_dtype_grads.values():
                    torch._amp_foreach_non_finite_check_and_unscale_(
                        grads,
                        per_device_found_inf.get(device),
                        per_device_inv_scale.get(device),
                    )
        return per_device_found_inf._per_device_tensors

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale, in place, and check them.

        Optional: :meth:`step` unscales if you did not.  Call it to clip or inspect the
        true gradients between ``backward()`` and :meth:`step`; :meth:`step` will then
        not unscale again.  At most once per optimizer per :meth:`update`.  Never syncs.
        """
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        elif optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")

        scale = cast(torch.Tensor, self._scale)
        # FP32 division can be imprecise under some compile options: reciprocal in FP64.
        inv_scale = (
            scale.double().reciprocal().float()
            if scale.device != torch.device("mps:0")
            else scale.reciprocal()
        )
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=scale.device)
        optimizer_state["found_inf_per_device"] = self._reduce_across_ranks(
            self._unscale_grads_(optimizer, inv_scale, found_inf, False), scale.device
        )
        optimizer_state["stage"] = OptState.UNSCALED

    # ------------------------------------------------------------------ ranks
    def _reduce_across_ranks(
        self, found_inf_per_device: dict[torch.device, torch.Tensor], device: torch.device
    ) -> dict[torch.device, torch.Tensor]:
        """The flags, made one decision for all ranks when ranks are synced
        (:mod:`ampcert.amp.torch.scaler_ranks`)."""
        if not ranks_to_sync(self._sync_ranks, self._process_group):
            return found_inf_per_device
        return reduce_found_inf(found_inf_per_device, device, self._process_group)

    # ------------------------------------------------------------------ step
    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless :meth:`unscale_` was called) and step, unless inf/NaN was found.

        ``*args``/``**kwargs`` go to ``optimizer.step``; closures are not supported.

        * Optimizers with ``_step_supports_amp_scaling`` (fused Adam/AdamW/SGD, ...)
          get ``optimizer.grad_scale``/``optimizer.found_inf`` and skip internally.
        * ``sync_free=False``: ``optimizer.step`` runs only if ``found_inf.item() == 0``.
        * ``sync_free=True``: ``optimizer.step`` always runs; on overflow its effect on
          the parameters and optimizer-state tensors is undone on the device.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)

        if "closure" in kwargs:
            raise RuntimeError(
                "Closure use is not currently supported if DynamicLossScaler is enabled."
            )
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")

        if getattr(optimizer, "_step_supports_amp_scaling", False):
            # Native path, identical to GradScaler: the optimizer unscales and skips
            # inside its own kernel using grad_scale / found_inf.
            kwargs_ = kwargs
            # grad_scale / found_inf are the fused optimizers' AMP contract (GradScaler sets
            # them too); torch.optim.Optimizer does not declare them, hence the Any view.
            amp_optimizer: Any = optimizer
            has_grad_scaler_kwarg = "grad_scaler" in inspect.signature(optimizer.step).parameters
            if has_grad_scaler_kwarg:
                warnings.warn(
                    "DynamicLossScaler passes itself as `grad_scaler` to optimizers whose "
                    "step() accepts it; this legacy contract is deprecated in PyTorch.",
                    FutureWarning,
                    stacklevel=2,
                )
                kwargs_.update({"grad_scaler": self})
            else:
                if optimizer_state["stage"] is OptState.READY:
                    self._check_inf_per_device(optimizer)
                scaler = cast(torch.Tensor, self._get_scale_async())
                found_inf = cast(
                    torch.Tensor,
                    sum(
                        t.to(scaler.device, non_blocking=True)
                        for t in optimizer_state["found_inf_per_device"].values()
                    ),
                )
                amp_optimizer.grad_scale = (
                    getattr(optimizer, "grad_scale", None)
                    if optimizer_state["stage"] == OptState.UNSCALED
                    else scaler * getattr(optimizer, "grad_scale", 1)
                )
                amp_optimizer.found_inf = found_inf
            retval = optimizer.step(*args, **kwargs_)
            optimizer_state["stage"] = OptState.STEPPED
            if not has_grad_scaler_kwarg:
                del amp_optimizer.grad_scale
                del amp_optimizer.found_inf
            return retval

        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(optimizer_state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer.")

        retval = self._maybe_opt_step(optimizer, optimizer_state, *args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def _maybe_opt_step(self, optimizer: torch.optim.Optimizer, optimizer_state: dict[str, Any],
                        *args: Any, **kwargs: Any) -> Any:
        """GradScaler's hook between the inf check and the step (some training
        libraries call it directly): the masked step when sync-free, else GradScaler's."""
        found_inf_per_device = optimizer_state["found_inf_per_device"]
        if self._sync_free:
            # The masked step (scaler_step's module doc).
            scale = cast(torch.Tensor, self._scale)
            undo = snapshot_for_undo(optimizer, found_inf_per_device, scale.device, self._snapshots)
            if undo is not None:
                return undo_if_overflowed(optimizer, undo, optimizer.step(*args, **kwargs),
                                          self._snapshots)
        return syncing_step(optimizer, found_inf_per_device, *args, **kwargs)

    # ------------------------------------------------------------------ update
    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Update the scale (GradScaler's rule, then clamp to ``[min_scale, max_scale]``).

        Overflow in any optimizer since the last update: ``scale *= backoff_factor``
        and the growth tracker resets.  Otherwise the tracker counts up and, on
        reaching ``growth_interval``, resets while ``scale *= growth_factor`` (only if
        the result is finite).  ``new_scale`` (float or 1-element tensor) sets the
        scale instead, also clamped.  Call once per iteration, after every ``step``.
        Never syncs.
        """
        if not self._enabled:
            return
        _scale, _growth_tracker = self._check_scale_growth_tracker("update")

        found_infs = [
            found_inf.to(device=_scale.device, non_blocking=True)
            for state in self._per_optimizer_states.values()
            for found_inf in state["found_inf_per_device"].values()
        ]
        skipped_infs = [
            found_inf.to(device=_scale.device, non_blocking=True)
            for state in self._per_optimizer_states.values()
            if state["stage"] is OptState.STEPPED
            for found_inf in state["found_inf_per_device"].values()
        ]
        found_inf_combined: torch.Tensor | None = None
        if found_infs:
            found_inf_combined = found_infs[0]
            for t in found_infs[1:]:
                found_inf_combined = found_inf_combined + t

        if new_scale is not None:
            if isinstance(new_scale, (float, int)):
                _scale.fill_(float(new_scale))
            else:
                reason = (
                    "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                    "torch.FloatTensor with requires_grad=False."
                )
                if new_scale.device.type != self._device:
                    raise AssertionError(reason)
                if new_scale.numel() != 1:
                    raise AssertionError(reason)
                if new_scale.requires_grad is True:
                    raise AssertionError(reason)
                _scale.copy_(new_scale)
        else:
            if found_inf_combined is None:
                raise AssertionError("No inf checks were recorded prior to update.")
            torch._amp_update_scale_(
                _scale,
                _growth_tracker,
                found_inf_combined,
                self._growth_factor,
                self._backoff_factor,
                self._growth_interval,
            )
        self._apply_bounds_()

        if self._record_trajectory:
            skipped = None
            if skipped_infs:
                skipped = skipped_infs[0]
                for t in skipped_infs[1:]:
                    skipped = skipped + t
            self._trajectory.record(_scale, found_inf_combined, skipped, self._sync_free)

        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    # ------------------------------------------------------------------ telemetry
    def trajectory(self) -> dict[str, list]:
        """Return the telemetry recorded since construction or :meth:`reset_trajectory`.

        ``{"scale": [float per update], "found_inf": [bool per update],
        "skipped_steps": [indices of updates whose step was skipped]}``.  ``scale[i]``
        is the scale *after* update ``i``; ``found_inf[i]`` says whether any optimizer's
        gradients had inf/NaN since update ``i - 1``; update ``i`` is in
        ``skipped_steps`` if some optimizer's ``step()`` was skipped (or, with
        ``sync_free=True``, undone).  One sync, transferring only what is new.
        """
        return self._trajectory.as_dict()

    def reset_trajectory(self) -> None:
        """Forget all recorded telemetry (frees its device and host memory)."""
        self._trajectory = Trajectory()

    # ------------------------------------------------------------------ accessors
    def _get_scale_async(self) -> torch.Tensor | None:
        return self._scale

    def get_scale(self) -> float:
        """Current scale as a Python float (1.0 if disabled).  Syncs."""
        if self._enabled:
            scale = self._get_scale_async()
            return self._init_scale if scale is None else cast(float, scale.item())
        return 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def get_min_scale(self) -> float:
        return self._min_scale

    def get_max_scale(self) -> float:
        return self._max_scale

    def is_sync_free(self) -> bool:
        return self._sync_free

    def _get_growth_tracker(self) -> int:
        if self._enabled:
            if self._growth_tracker is None:
                return self._init_growth_tracker
            return cast(int, self._growth_tracker.item())
        return 0

    def is_enabled(self) -> bool:
        return self._enabled

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """GradScaler's five entries plus ``min_scale``/``max_scale`` ({} if disabled).

        Loadable by ``GradScaler`` (extra keys are ignored) and vice versa.  Telemetry
        is not included.  Call after :meth:`update`.  Syncs.
        """
        if self._enabled:
            return {
                "scale": self.get_scale(),
                "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker(),
                "min_scale": self._min_scale,
                "max_scale": self._max_scale,
            }
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a dict from :meth:`state_dict` (or from ``GradScaler.state_dict``).

        Bounds absent from the dict (a ``GradScaler`` checkpoint) keep their current
        values; the loaded scale is clamped into them.  No-op if disabled.
        """
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of DynamicLossScaler."
            )
        self._min_scale = float(state_dict.get("min_scale", self._min_scale))
        self._max_scale = float(state_dict.get("max_scale", self._max_scale))
        self._init_scale = self._clamp_float(state_dict["scale"])
        if self._scale is not None:
            self._scale.fill_(self._init_scale)
        self._growth_factor = cast(float, state_dict["growth_factor"])
        self._backoff_factor = cast(float, state_dict["backoff_factor"])
        self._growth_interval = cast(int, state_dict["growth_interval"])
        self._init_growth_tracker = cast(int, state_dict["_growth_tracker"])
        if self._growth_tracker is not None:
            self._growth_tracker.fill_(state_dict["_growth_tracker"])

    def __getstate__(self) -> dict[str, Any]:
        self._trajectory.collect()
        state = self.__dict__.copy()
        state["_snapshots"] = None
        state["_process_group"] = None  # process groups do not pickle: the default group after loading
        if self._enabled:
            if len(self._per_optimizer_states) != 0:
                raise AssertionError(
                    "A DynamicLossScaler instance may only be pickled at the beginning "
                    "of an iteration, or at the end after scaler.update()."
                )
            state["_init_scale"] = self.get_scale()
            state["_init_growth_tracker"] = self._get_growth_tracker()
            state["_scale"] = None
            state["_growth_tracker"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_sync_ranks", None)  # pickled before the field existed
        state.setdefault("_process_group", None)
        if "_trajectory" not in state:  # pickled while the trajectory lived in the scaler
            state["_trajectory"] = Trajectory(state.pop("_traj_scale", ()), state.pop("_traj_found", ()),
                                              state.pop("_traj_skipped", ()))
            state.pop("_traj_chunks", None)  # empty: collected before pickling
            state.pop("_traj_fill", None)
        self.__dict__.update(state)
        self._snapshots = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ native-AMP hooks
    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        _scale, _ = self._check_scale_growth_tracker("_check_inf_per_device")
        dummy_inv_scale = torch.full((), 1.0, dtype=torch.float32, device=_scale.device)
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=_scale.device)
        self._per_optimizer_states[id(optimizer)]["found_inf_per_device"] = self._reduce_across_ranks(
            self._unscale_grads_(optimizer, dummy_inv_scale, found_inf, True), _scale.device
        )
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]

    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]


@when_dynamo_imported
def _eager_under_compile(dynamo: ModuleType) -> None:
    """The step and the update run eagerly under torch.compile (the module doc's "Under
    torch.compile"), marked once Dynamo is imported (dynamo_marks)."""
    DynamicLossScaler.step = torch.compiler.disable(  # type: ignore[method-assign]
        DynamicLossScaler.step, reason="DynamicLossScaler.step runs eagerly, as GradScaler's does")
    DynamicLossScaler.update = torch.compiler.disable(  # type: ignore[method-assign]
        DynamicLossScaler.update, reason="DynamicLossScaler.update runs eagerly, as GradScaler's does")
