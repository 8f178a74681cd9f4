"""ampcert's callback for HF Transformers' ``Trainer``.

    from ampcert.integrations.hf import AmpcertCallback

    trainer = Trainer(model, args, ..., callbacks=[AmpcertCallback()])

What it logs to ``$AMPCERT_MLLOG`` (through :mod:`ampcert.track`; nothing
when the variable is unset, so the job runs unchanged outside ampcert; on
the world's process zero only):

- ``on_train_begin``: ``seed`` (``args.seed``), ``global_batch_size``
  (``state.train_batch_size`` or ``args.per_device_train_batch_size``, times
  ``gradient_accumulation_steps`` and ``world_size``) and ``run_start``;
- the first training step, from ``on_step_begin`` (before the first
  micro-batch's forward) to ``on_pre_optimizer_step`` (after the last
  micro-batch's backward): ampcert's PrecisionProbe, a TorchDispatchMode,
  sees every aten op after accelerate's ``torch.autocast`` (which wraps
  ``model.forward``) has cast its inputs, in the forward and in the backward
  autograd runs for it; the three ``lowest_numerical_precision_in_*``
  disclosures are logged from it;
- ``on_evaluate``: ``eval_accuracy`` = ``metrics[metric]`` (default
  ``eval_accuracy``; where absent, ``metrics[fallback_metric]``, default
  ``eval_loss``, logged with ``{"metric": "loss"}``), with ``samples_count``
  = ``state.global_step`` x the global batch and ``epoch_num`` =
  ``state.epoch``. Evaluations outside ``train()`` are not logged;
- ``on_train_end``: ``run_stop`` with status ``success``.

``AMPCERT_AMP=ampcert`` (ampcert's autocast instead of torch's): at
``on_train_begin`` the callback sets ``model.forward`` to the model's own
forward under :func:`ampcert.amp.autocast` (bf16 or fp16, as
``AMPCERT_PRECISION`` asks), with accelerate's cast of the outputs to fp32,
on every process. Where ``TrainingArguments`` has ``bf16``/``fp16`` on, that
replaces accelerate's ``torch.autocast`` wrapper (accelerate keeps the
unwrapped forward in ``model._original_forward``); where both are off, it is
added. It stays in place after training, as accelerate's does.

What HF does not let a callback do:

- replace the loss scaler. fp16 scaling is accelerate's ``GradScaler``,
  made in ``Accelerator.__init__`` from ``fp16=True`` and bound to the
  optimizer by ``accelerator.prepare`` before any callback runs; a callback
  receives neither the accelerator nor the Trainer. So fp16 with
  ``AMPCERT_AMP=ampcert`` needs ``fp16=True`` on a GPU (accelerate applies
  neither autocast nor a scaler for fp16 on a CPU), and scales with torch's
  GradScaler, not ampcert's DynamicLossScaler; fp16 without that scaler is
  refused (it would train without loss scaling).
- write ``run_stop`` with status ``aborted``: the Trainer has no exception
  hook, so a job that crashes leaves a log without ``run_stop`` (which
  ampcert reads as a failed run). Wrap ``trainer.train()`` in
  ``with ampcert.track...`` yourself for an explicit abort.
- watch the gradient all-reduce under DDP: accelerate wraps the model after
  ``model`` is handed to callbacks; ``comm`` is logged unobserved.
- loss computed outside ``model.forward`` (a custom ``compute_loss``, label
  smoothing) runs outside autocast, as it does under accelerate's.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import MethodType
from typing import Any

try:
    import torch
    from accelerate.utils import convert_outputs_to_fp32
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - exercised where transformers is absent
    raise ImportError(
        f"ampcert.integrations.hf needs HF Transformers with accelerate ({exc}): "
        "pip install 'ampcert[hf]'") from exc

from ampcert import track
from ampcert.amp.precision import REFERENCE

__all__ = ["AmpcertCallback", "install_ampcert_autocast"]


def _name_of(metric_key: str) -> str:
    """``eval_accuracy`` -> ``accuracy``: the name ampcert logs the metric by."""
    return metric_key.removeprefix("eval_")


def install_ampcert_autocast(model: Any, args: Any, precision: str, policy: Any = None) -> bool:
    """Run ``model.forward`` under ampcert's autocast in ``precision`` (bf16 |
    fp16), replacing accelerate's torch.autocast where ``args`` turned it on.
    Returns False where it was already installed."""
    from ampcert.amp import autocast

    if getattr(model, "_ampcert_autocast", None) is not None:
        return False
    if precision not in ("bf16", "fp16"):
        raise ValueError(f"AMPCERT_AMP=ampcert: the HF callback applies ampcert's autocast for bf16 or fp16, "
                         f"not {precision!r} (FP8 layers are not converted from a callback)")
    hf_mixed = "bf16" if args.bf16 else "fp16" if args.fp16 else None
    if hf_mixed is not None and hf_mixed != precision:
        raise ValueError(f"AMPCERT_PRECISION={precision} but TrainingArguments has {hf_mixed}=True")
    # accelerate wraps model.forward in torch.autocast (and keeps the bare forward in
    # model._original_forward) only where it applies mixed precision: not for fp16 on a CPU.
    native = model.__dict__.get("_original_forward") if hf_mixed is not None else None
    if precision == "fp16" and native is None:
        raise ValueError("AMPCERT_PRECISION=fp16 with AMPCERT_AMP=ampcert needs fp16=True in TrainingArguments, "
                         "on a GPU: HF scales the fp16 loss only then (its GradScaler; a callback cannot supply "
                         "one), and the callback swaps HF's torch.autocast for ampcert's")
    forward = native if native is not None else model.forward
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    region = autocast(args.device.type, dtype, policy=policy)
    # The shape accelerate gives model.forward, so its unwrap_model(keep_fp32_wrapper=False) undoes ours too.
    model._original_forward = forward
    if hasattr(forward, "__func__"):
        model.forward = MethodType(convert_outputs_to_fp32(region(forward.__func__)), model)
    else:
        model.forward = convert_outputs_to_fp32(region(forward))
    model._ampcert_autocast = region
    return True


class AmpcertCallback(TrainerCallback):
    """Writes the job's MLLOG for ampcert from the Trainer's events (see the module doc).

    Args:
        path: the MLLOG file; default ``$AMPCERT_MLLOG`` (unset: log nothing).
        metric: the key of ``on_evaluate``'s metrics to log as eval_accuracy.
        fallback_metric: the key used where ``metric`` is absent (None: none;
            a missing metric then raises KeyError).
        probe: measure the precision disclosure on the first training step.
        amp: ``native`` | ``ampcert``; default ``$AMPCERT_AMP``.
        policy: the op policy of ampcert's autocast (a name, path or OpPolicy;
            default the shipped one for the device).
    """

    def __init__(self, path: str | Path | None = None, *, metric: str = "eval_accuracy",
                 fallback_metric: str | None = "eval_loss", probe: bool = True, amp: str | None = None,
                 policy: Any = None) -> None:
        self.path = path
        self.metric = metric
        self.fallback_metric = fallback_metric
        self.probe = probe
        self.amp = amp
        self.policy = policy
        self.tracker = track.Tracker(None)
        self.global_batch_size: int | None = None
        self._started = False
        self._probe_pending = False

    # -- the run ------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._started:
            warnings.warn("AmpcertCallback: a second train() with the same callback is not logged", stacklevel=2)
            return
        self._started = True
        per_device = state.train_batch_size or args.per_device_train_batch_size
        self.global_batch_size = int(per_device * args.gradient_accumulation_steps * args.world_size)
        self._apply_amp(args, model)
        if state.is_world_process_zero:
            self.tracker = track.start(self.path, seed=args.seed, global_batch_size=self.global_batch_size)
            self._probe_pending = self.probe and self.tracker.active

    def _apply_amp(self, args, model) -> None:
        cfg = track.env()
        amp = self.amp or cfg.amp
        if amp == "ampcert" and cfg.precision != REFERENCE:
            install_ampcert_autocast(model, args, cfg.precision, self.policy)
        elif amp == "native" and cfg.mixed and model is not None and "_original_forward" not in model.__dict__:
            warnings.warn(f"AMPCERT_PRECISION={cfg.precision}, but HF applies no autocast to this model "
                          f"(bf16={args.bf16}, fp16={args.fp16}, device {args.device.type}): it trains in fp32",
                          stacklevel=3)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if self._probe_pending:
            self._probe_pending = False
            self.tracker.begin_probe(model, device=args.device.type, world_size=args.world_size)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        # After the step's last backward, before the optimizer: the probe has seen forward and backward.
        if self.tracker.probing:
            self.tracker.end_probe()

    def on_step_end(self, args, state, control, **kwargs):
        if self.tracker.probing:  # a Trainer that skips on_pre_optimizer_step
            self.tracker.end_probe()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not self.tracker.active or self.tracker.stopped:
            return
        metrics = metrics or {}
        key = self.metric if self.metric in metrics else self.fallback_metric
        if key is None or key not in metrics:
            raise KeyError(f"AmpcertCallback: no {self.metric!r}"
                           + (f" or {self.fallback_metric!r}" if self.fallback_metric else "")
                           + f" in the evaluation's metrics {sorted(metrics)}; pass metric=")
        samples = state.global_step * (self.global_batch_size or 0)
        self.tracker.eval(metrics[key], samples, metric=_name_of(key), epoch=state.epoch)

    def on_train_end(self, args, state, control, **kwargs):
        self.tracker.stop("success")
