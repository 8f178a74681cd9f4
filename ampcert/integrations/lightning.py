"""ampcert's callback and precision plugin for Lightning (``lightning.pytorch``).

    from ampcert.integrations.lightning import AmpcertCallback, trainer_precision

    trainer = L.Trainer(..., callbacks=[AmpcertCallback(monitor="val_accuracy")],
                        **trainer_precision())     # precision= or plugins=, from AMPCERT_*

What :class:`AmpcertCallback` logs to ``$AMPCERT_MLLOG`` (through
:mod:`ampcert.track`; nothing when the variable is unset; global rank zero
only):

- ``on_train_start``: ``seed`` (``$PL_GLOBAL_SEED``, which
  ``seed_everything`` sets, else ``$AMPCERT_SEED``), ``global_batch_size``
  (the train loader's batch size x ``accumulate_grad_batches`` x
  ``world_size``; where the loader has no ``batch_size``, from the first
  batch) and ``run_start``;
- the first training batch, from ``on_train_batch_start`` to
  ``on_before_optimizer_step`` (after its backward; else
  ``on_train_batch_end``): the three ``lowest_numerical_precision_in_*``
  disclosures, measured by ampcert's PrecisionProbe, which sees every aten
  op after autocast (Lightning's or ampcert's) cast its inputs, forward and
  backward. Under DDP the gradient buckets' dtype is recorded by a comm hook
  on ``trainer.strategy.model`` (where the job set no hook of its own);
- ``on_validation_end`` (not the sanity check): ``eval_accuracy`` =
  ``trainer.callback_metrics[monitor]``, ``samples_count`` =
  ``trainer.global_step`` x the global batch, ``epoch_num`` =
  ``trainer.current_epoch``; a ``metric`` other than ``accuracy`` is named in
  the metadata;
- ``on_train_end``: ``run_stop`` success; ``on_exception``: ``run_stop`` aborted.

:class:`AmpcertPrecision` is Lightning's ``MixedPrecision`` plugin with
ampcert's autocast (:func:`ampcert.amp.autocast`, its op policy) in
``forward_context`` (training, validation, test and predict steps) and, for
``16-mixed``, ampcert's :class:`~ampcert.amp.DynamicLossScaler` as the
scaler. :func:`trainer_precision` picks it when ``AMPCERT_AMP=ampcert``.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.plugins.precision import MixedPrecision
except ImportError as exc:  # pragma: no cover - exercised where lightning is absent
    raise ImportError(f"ampcert.integrations.lightning needs Lightning ({exc}): "
                      "pip install 'ampcert[lightning]'") from exc

from ampcert import mllog, track
from ampcert.amp.recipes import RECIPES

__all__ = ["AmpcertCallback", "AmpcertPrecision", "trainer_precision"]

# ampcert's precision -> Lightning's flag; a precision recipe by the name Lightning gives it
# (amp/recipes.py: bf16-true), which runs no autocast, so ampcert's plugin has no part in it.
_LIGHTNING_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed",
                        **{name: r.lightning for name, r in RECIPES.items() if r.lightning}}


class AmpcertPrecision(MixedPrecision):
    """Lightning's mixed precision with ampcert's autocast and loss scaler.

    Args:
        precision: ``"bf16-mixed"`` or ``"16-mixed"``.
        device: the autocast device type, ``"cpu"`` or ``"cuda"``; default
            ``$AMPCERT_DEVICE``, else cuda where available.
        scaler: for ``16-mixed``; default ``DynamicLossScaler(device)``.
        policy: the op policy (name, path or OpPolicy); default the shipped
            one for the device.
    """

    def __init__(self, precision: str = "bf16-mixed", device: str | None = None, scaler: Any = None,
                 *, policy: Any = None) -> None:
        if device is None:
            device = track.env().device or ("cuda" if torch.cuda.is_available() else "cpu")
        if scaler is None and precision == "16-mixed":
            from ampcert.amp import DynamicLossScaler

            scaler = DynamicLossScaler(device)
        super().__init__(precision, device, scaler)  # type: ignore[arg-type]
        from ampcert.amp import autocast

        dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
        self._autocast = autocast(device, dtype, policy=policy)  # checks device and policy now

    def autocast_context_manager(self) -> Any:  # type: ignore[override]
        return self._autocast

    @contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        with self._autocast:
            yield


def trainer_precision(env: track.Env | None = None, device: str | None = None) -> dict[str, Any]:
    """The ``Trainer`` keyword for what ampcert asks: ``{"precision": "32-true"
    | "bf16-mixed" | "16-mixed"}`` for ``AMPCERT_AMP=native`` (and for fp32),
    ``{"plugins": [AmpcertPrecision(...)]}`` for ``ampcert``; the recipe
    ``bf16-true`` is Lightning's own ``{"precision": "bf16-true"}`` (the model in
    bf16, no autocast). fp8 and recipes Lightning has no flag for raise ValueError."""
    cfg = env if env is not None else track.env()
    if cfg.precision not in _LIGHTNING_PRECISION:
        raise ValueError(f"AMPCERT_PRECISION={cfg.precision}: ampcert.integrations.lightning supports "
                         f"{', '.join(_LIGHTNING_PRECISION)}")
    flag = _LIGHTNING_PRECISION[cfg.precision]
    if cfg.amp == "ampcert" and cfg.mixed:
        return {"plugins": [AmpcertPrecision(flag, device or cfg.device)]}
    return {"precision": flag}


def _batch_size(batch: Any) -> int | None:
    for leaf in torch.utils._pytree.tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return None


class AmpcertCallback(pl.Callback):
    """Writes the job's MLLOG for ampcert from Lightning's hooks (see the module doc).

    Args:
        path: the MLLOG file; default ``$AMPCERT_MLLOG`` (unset: log nothing).
        monitor: the ``trainer.callback_metrics`` key logged at each
            validation (what the module ``self.log``-s).
        metric: the name ampcert gives it: ``accuracy`` (logged as plain
            eval_accuracy) or another (``loss``: named in the metadata).
        probe: measure the precision disclosure on the first training batch.
        global_batch_size: where the loader's batch size does not tell it.
    """

    def __init__(self, path: str | Path | None = None, *, monitor: str = "val_accuracy",
                 metric: str = "accuracy", probe: bool = True, global_batch_size: int | None = None) -> None:
        self.path = path
        self.monitor = monitor
        self.metric = metric
        self.probe = probe
        self.global_batch_size = global_batch_size
        self.tracker = track.Tracker(None)
        self._started = False
        self._probe_pending = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._started or not trainer.is_global_zero:
            return
        self._started = True
        if self.global_batch_size is None:
            loader_batch = getattr(trainer.train_dataloader, "batch_size", None)
            if loader_batch:
                self.global_batch_size = loader_batch * trainer.accumulate_grad_batches * trainer.world_size
        seed = os.environ.get("PL_GLOBAL_SEED")
        self.tracker = track.start(self.path, seed=int(seed) if seed else None,
                                   global_batch_size=self.global_batch_size)
        self._probe_pending = self.probe and self.tracker.active

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if not self.tracker.active or self.tracker.stopped:
            return
        if self.global_batch_size is None and (size := _batch_size(batch)) is not None:
            self.global_batch_size = size * trainer.accumulate_grad_batches * trainer.world_size
            self.tracker.event(mllog.GLOBAL_BATCH_SIZE, self.global_batch_size)
        if self._probe_pending:
            self._probe_pending = False
            model = trainer.strategy.model if trainer.strategy.model is not None else pl_module
            self.tracker.begin_probe(model, device=pl_module.device.type, world_size=trainer.world_size)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self.tracker.probing:
            self.tracker.end_probe()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.tracker.probing:  # manual optimization, or accumulation that has not stepped yet
            self.tracker.end_probe()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self.tracker.active or self.tracker.stopped:
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            raise KeyError(f"AmpcertCallback: no {self.monitor!r} in trainer.callback_metrics {sorted(metrics)}; "
                           "log it in validation_step (self.log) or pass monitor=")
        value = metrics[self.monitor]
        value = float(value.item() if isinstance(value, torch.Tensor) else value)
        samples = trainer.global_step * (self.global_batch_size or 0)
        self.tracker.eval(value, samples, metric=self.metric, epoch=trainer.current_epoch)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.tracker.stop("success")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.tracker.stop("aborted")
