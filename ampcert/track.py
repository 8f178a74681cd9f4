"""Report a training job's results to ampcert from the job itself.

A suite entry can run a team's own training command (an own job).
ampcert hands the job its settings in ``AMPCERT_*`` environment variables
and reads back one file, the MLLOG the job writes to ``$AMPCERT_MLLOG``.
This module writes that file from a plain script::

    import ampcert.track

    cfg = ampcert.track.env()                  # precision, seed, amp, device, ...
    with ampcert.track.start(seed=cfg.seed, global_batch_size=64) as tracker:
        tracker.probe(model, train_step, batch)    # the first step, measured
        for step in ...:
            ...
            tracker.eval(accuracy, samples=step * 64)
    # run_stop: "success", or "aborted" if the block raised

Outside ampcert (no ``path`` and no ``$AMPCERT_MLLOG``) :func:`start` gives
a tracker whose every call does nothing (``probe`` still runs the step), so
the script runs unchanged. Under torchrun only rank 0 writes (``$RANK``).

The lines are MLPerf's own format (:mod:`ampcert.mllog`): ``seed`` and
``global_batch_size``, ``run_start``, ``eval_accuracy`` with ``samples_count``
and ``epoch_num`` (and ``metric`` for a metric that is not accuracy), the
three ``lowest_numerical_precision_in_{linear,attn,comm}`` disclosures, and
``run_stop`` with ``status``. Importing this module does not import torch;
:meth:`Tracker.probe` does.

For HF Transformers and Lightning, :mod:`ampcert.integrations` has callbacks
that do all of this from the trainer's hooks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from ampcert import mllog
from ampcert.amp.recipes import RECIPES

__all__ = ["Env", "Tracker", "env", "start"]

# A precision recipe's name (amp/recipes.py) is a precision too: a job told `bf16-true`
# trains that recipe its own way (the Lightning integration: Lightning's bf16-true).
PRECISIONS = ("fp32", "bf16", "fp16", "fp8", *RECIPES)
AMPS = ("native", "ampcert")
DEVICES = ("cpu", "cuda")
STATUSES = ("success", "aborted")

# MLPerf's spelling of each precision (its rules accept `bfloat16`, not `bf16`).
_MLPERF_PRECISION = {
    "fp64": "fp64", "float64": "fp64", "double": "fp64",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
    "tf32": "tf32",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
}

T = TypeVar("T")


@dataclass(frozen=True)
class Env:
    """What ampcert asked of this job (the ``AMPCERT_*`` variables).

    Outside ampcert every field has its "plain run" value: precision
    ``fp32``, amp ``native``, the rest None; :attr:`under_ampcert` tells.
    """

    precision: str = "fp32"       # AMPCERT_PRECISION: fp32 | bf16 | fp16 | fp8 | a recipe (bf16-true, ...)
    seed: int | None = None       # AMPCERT_SEED
    amp: str = "native"           # AMPCERT_AMP: native (the framework's AMP) | ampcert (ampcert.amp)
    run_dir: Path | None = None   # AMPCERT_RUN_DIR: a folder for the job's own files
    device: str | None = None     # AMPCERT_DEVICE: cpu | cuda
    mllog: Path | None = None     # AMPCERT_MLLOG: the MLLOG file to write
    run_id: str | None = None     # AMPCERT_RUN_ID

    @property
    def under_ampcert(self) -> bool:
        return self.mllog is not None

    @property
    def mixed(self) -> bool:
        """Whether the job should train in mixed precision (bf16 or fp16)."""
        return self.precision in ("bf16", "fp16")

    def dtype(self) -> Any:
        """The autocast dtype asked for: ``torch.bfloat16``, ``torch.float16``,
        or None for fp32 and fp8 (fp8 is no autocast dtype). Imports torch."""
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)


def _choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(name, "").strip() or default
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
    return value


def env() -> Env:
    """The ``AMPCERT_*`` settings of this process. A malformed value (an
    unknown precision, a seed that is not an integer) raises ValueError
    naming the variable."""
    seed_text = os.environ.get("AMPCERT_SEED", "").strip()
    try:
        seed = int(seed_text) if seed_text else None
    except ValueError:
        raise ValueError(f"AMPCERT_SEED: expected an integer, got {seed_text!r}") from None
    device = os.environ.get("AMPCERT_DEVICE", "").strip() or None
    if device is not None and device not in DEVICES:
        raise ValueError(f"AMPCERT_DEVICE: expected one of {', '.join(DEVICES)}, got {device!r}")
    run_dir, log = os.environ.get("AMPCERT_RUN_DIR"), os.environ.get("AMPCERT_MLLOG")
    return Env(precision=_choice("AMPCERT_PRECISION", "fp32", PRECISIONS), seed=seed,
               amp=_choice("AMPCERT_AMP", "native", AMPS), run_dir=Path(run_dir) if run_dir else None,
               device=device, mllog=Path(log) if log else None,
               run_id=os.environ.get("AMPCERT_RUN_ID") or None)


def mlperf_precision(value: Any) -> str:
    """MLPerf's name for a precision given as text (``bf16``, ``float32``) or a torch dtype."""
    text = str(value).removeprefix("torch.").lower()
    try:
        return _MLPERF_PRECISION[text]
    except KeyError:
        raise ValueError(f"precision: expected one of {', '.join(sorted(set(_MLPERF_PRECISION.values())))} "
                         f"(or a torch dtype), got {value!r}") from None


def _rank_zero() -> bool:
    return os.environ.get("RANK", "0").strip() in ("", "0")


def _world_size() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


class Tracker:
    """Writes one run's MLLOG events; see :func:`start`. Every method is a
    no-op on an inactive tracker (:attr:`active` False)."""

    def __init__(self, logger: mllog.MLLogger | None):
        self._log = logger
        self._stopped = False
        self._probe: tuple[Any, int, bool] | None = None
        self.disclosed: dict[str, dict[str, Any]] | None = None  # what the last disclose/probe logged

    @property
    def active(self) -> bool:
        """Whether this tracker writes (a path was given and this is rank 0)."""
        return self._log is not None

    @property
    def path(self) -> Path | None:
        return self._log.path if self._log is not None else None

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _writer(self) -> mllog.MLLogger | None:
        if self._log is None:
            return None
        if self._stopped:
            raise RuntimeError(f"ampcert.track: the run was stopped; nothing more can be logged to {self.path}")
        return self._log

    def event(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        """Any other MLLOG event (POINT_IN_TIME), e.g. ``train_samples``."""
        if (log := self._writer()) is not None:
            log.event(key, value, metadata)

    def eval(self, value: float, samples: int, *, metric: str = "accuracy", epoch: float | None = None) -> None:
        """One evaluation: ``eval_accuracy`` with ``samples_count`` (training
        samples seen so far) and ``epoch_num`` (``epoch``, else 0 as ampcert's
        own runs log). A ``metric`` other than accuracy (``"loss"``,
        ``"perplexity"``) is logged as ``eval_<metric>`` and as
        ``eval_accuracy`` with ``{"metric": metric}`` in its metadata, so no
        reader takes the value for an accuracy."""
        if (log := self._writer()) is None:
            return
        if isinstance(samples, bool) or int(samples) != samples or samples < 0:
            raise ValueError(f"samples: expected a count of training samples (an integer >= 0), got {samples!r}")
        meta: dict[str, Any] = {"samples_count": int(samples), "epoch_num": 0 if epoch is None else epoch}
        value = float(value)
        if metric != "accuracy":
            log.event(f"eval_{metric}", value, meta)
            meta["metric"] = metric
        log.event(mllog.EVAL_ACCURACY, value, meta)

    def disclose(self, linear: Any, attn: Any = None, comm: Any = None) -> None:
        """Declare the lowest precision of matmuls (``linear``), attention
        (``attn``, default: as linear) and gradient communication (``comm``,
        default: fp32) without measuring it; the events say so
        (``observed: false``). :meth:`probe` measures instead."""
        declared = {"observed": False, "reason": "declared by the job, not measured"}
        lin = mlperf_precision(linear)
        self._log_disclosure({
            "linear": {"value": lin, **declared},
            "attn": {"value": mlperf_precision(attn) if attn is not None else lin, **declared},
            "comm": {"value": mlperf_precision(comm) if comm is not None else "fp32", **declared},
        })

    def _log_disclosure(self, disclosed: dict[str, dict[str, Any]]) -> None:
        if (log := self._writer()) is None:
            return
        keys = {"linear": mllog.LOWEST_PRECISION_LINEAR, "attn": mllog.LOWEST_PRECISION_ATTN,
                "comm": mllog.LOWEST_PRECISION_COMM}
        for part, key in keys.items():
            log.event(key, disclosed[part]["value"], {k: v for k, v in disclosed[part].items() if k != "value"})
        self.disclosed = disclosed

    def probe(self, model: Any, step_fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``step_fn(*args, **kwargs)`` (one whole training step: forward,
        backward, optimizer step) under ampcert's PrecisionProbe, log the
        measured disclosure and return what ``step_fn`` returned.

        The probe sees every aten op after autocast has cast its inputs: the
        lowest dtype matmuls took (linear) and attention ops took (attn). For
        a DDP ``model`` the gradient buckets' dtype is recorded too (comm)
        where DDP accepts ampcert's comm hook. On an inactive tracker the
        step just runs."""
        self.begin_probe(model)
        try:
            result = step_fn(*args, **kwargs)
        except BaseException:
            self._close_probe()
            raise
        self.end_probe()
        return result

    def begin_probe(self, model: Any, *, device: str | None = None, world_size: int | None = None) -> None:
        """Start measuring (for loops whose step is not one function, and for
        callbacks): every torch op from here to :meth:`end_probe`, on this
        thread and in the backward it starts, is watched. ``device`` (cpu |
        cuda) defaults to the model's; ``world_size`` to ``$WORLD_SIZE``."""
        if self._writer() is None:
            return
        if self._probe is not None:
            raise RuntimeError("ampcert.track: a probe is already running")
        from ampcert.backends import torch_precision

        world = _world_size() if world_size is None else int(world_size)
        probe = torch_precision.PrecisionProbe(model, device or _device_of(model))
        watched_comm = False
        if world > 1 and hasattr(model, "register_comm_hook"):
            try:
                model.register_comm_hook(None, torch_precision.observing_comm(None, probe.observed))
                watched_comm = True
            except RuntimeError:  # the job registered its own comm hook
                pass
        probe.__enter__()
        self._probe = (probe, world, watched_comm)

    @property
    def probing(self) -> bool:
        return self._probe is not None

    def _close_probe(self) -> Any:
        probe = self._probe
        self._probe = None
        if probe is not None:
            probe[0].__exit__(None, None, None)
            probe[0].remove_hooks()
        return probe

    def end_probe(self) -> dict[str, dict[str, Any]] | None:
        """Stop measuring and log the three disclosures; returns them (None
        where no probe ran)."""
        closed = self._close_probe()
        if closed is None:
            return None
        from ampcert.backends import torch_precision

        probe, world, watched_comm = closed
        disclosed = torch_precision.disclosure(probe.observed, world)
        if world > 1 and not watched_comm:
            disclosed["comm"] = {"value": disclosed["comm"]["value"], "observed": False,
                                 "reason": "the gradient all-reduce was not watched; DDP reduces gradients "
                                           "in the parameters' dtype unless a comm hook compresses them"}
        self._log_disclosure(disclosed)
        return disclosed

    def stop(self, status: str = "success") -> None:
        """Log ``run_stop`` with ``status`` (success | aborted) and close the
        file. A second stop does nothing."""
        if status not in STATUSES:
            raise ValueError(f"status: expected one of {', '.join(STATUSES)}, got {status!r}")
        if self._log is None or self._stopped:
            return
        self._close_probe()
        try:
            self._log.end(mllog.RUN_STOP, metadata={"status": status})
        finally:
            self._stopped = True
            self._log.close()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop("success" if exc_type is None else "aborted")


def _device_of(model: Any) -> str:
    for p in model.parameters():
        return p.device.type
    return "cpu"


def start(path: str | os.PathLike[str] | None = None, *, seed: int | None = None,
          global_batch_size: int | None = None) -> Tracker:
    """Open the MLLOG and log ``seed``, ``global_batch_size`` (each where
    known) and ``run_start``.

    ``path`` defaults to ``$AMPCERT_MLLOG``; ``seed`` to ``$AMPCERT_SEED``.
    Without a path, or on a torchrun rank other than 0, the tracker writes
    nothing. Lines are appended, so a job that restarts keeps what it had
    logged."""
    if path is None:
        path = os.environ.get("AMPCERT_MLLOG") or None
    if path is None or not _rank_zero():
        return Tracker(None)
    if seed is None:
        seed = env().seed
    log = mllog.MLLogger.open(Path(path))
    if seed is not None:
        log.event(mllog.SEED, int(seed))
    if global_batch_size is not None:
        log.event(mllog.GLOBAL_BATCH_SIZE, int(global_batch_size))
    log.start(mllog.RUN_START)
    return Tracker(log)
