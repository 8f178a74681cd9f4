"""The PyTorch training loop: one RunSpec in, the measured run out.

Precision is applied here and only here, so a workload runs unchanged in
every precision:

- fp32: no autocast, no loss scaling;
- bf16: autocast to bfloat16 (its fp32-sized exponent needs no loss scaling);
- fp16: autocast to float16 plus dynamic loss scaling.

``amp: native`` uses torch.autocast and torch.amp.GradScaler; ``amp: ampcert``
uses ampcert's own engine. Per-step values (losses, step-end events) stay on
the device and are read once per evaluation, so the loop does not force a
host sync every step.

Batches are drawn by :func:`ampcert.backends.loop.index_batches` (numpy),
as in the JAX backend, so a torch run and a JAX run of one seed train on the
same examples in the same order. A task that streams (``train_data``, a
DataLoader or any iterable of (x, y) batches) is drawn from instead
(:class:`ampcert.backends.loop.BatchStream`), epoch after epoch: waiting for
a batch is data time, and the samples counted are the batches' lengths.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ampcert import mllog
from ampcert.amp.precision import REFERENCE, autocast_precision, dtype_name
from ampcert.backends import features, loop, torch_mkl, training_loop
from ampcert.backends.contract import (  # noqa: F401 - RunFailed: part of this module's API
    DoesNotFit,
    LossNotFinite,
    RunFailed,
    TrainOutcome,
    Unsupported,
)
from ampcert.resources import shipped_label
from ampcert.results import Measured
from ampcert.spec import RunSpec
from ampcert.telemetry import Telemetry, ensure_pci_bus_order, torch_cuda_gpu_ref, torch_cuda_memory
from ampcert.workloads import registry


def seed_everything(seed: int, device: str) -> dict[str, Any]:
    """Seed python, numpy and torch and ask for deterministic kernels.

    The built-in workloads draw their weights, batches and augmentation from
    :mod:`ampcert.workloads.rng`, not from these global generators; seeding
    them is for a user's workload that draws from torch's (its initial
    weights then still follow the seed). MKL is asked for its reproducible
    mode first, before anything in the run calls it (:mod:`torch_mkl`).
    Returns what was set, for the run result."""
    mkl_cnr = torch_mkl.request_reproducible()
    loop.seed_host(seed)
    torch.manual_seed(seed)
    if device == "cuda":
        # cuBLAS needs a fixed workspace to be deterministic; it must be set
        # before the first cuBLAS call in this process.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)
    return {
        "seed": seed,
        "deterministic_algorithms": True,
        "cudnn_benchmark": False if device == "cuda" else None,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG") if device == "cuda" else None,
        "torch_threads": torch.get_num_threads(),
        "mkl_cnr": mkl_cnr,
    }


class NoLossScaler(loop.NoLossScaling):
    """The loss scaler of a run that does not scale its loss (fp32, bf16, and
    fp16 with ``loss_scaling: false``): GradScaler's interface, doing nothing.
    ``scale`` returns the loss, ``step`` steps the optimizer, ``update`` and
    the recording are empty (the result's ``loss_scale`` stays None)."""

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def step(self, optimizer: torch.optim.Optimizer) -> Any:
        return optimizer.step()

    def update(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class NativeLossScaler(loop.DynamicLossScaling):
    """``torch.amp.GradScaler``, recording the scale after each update and
    the steps it skipped. GradScaler syncs with the host every step anyway,
    so reading its scale costs nothing more."""

    def __init__(self, device: str):
        self.scaler = torch.amp.GradScaler(device)
        self._scales: list[float] = []
        self._skipped: list[int] = []

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def step(self, optimizer: torch.optim.Optimizer) -> Any:
        return self.scaler.step(optimizer)

    def update(self) -> None:
        before = self.scaler.get_scale()
        self.scaler.update()
        after = self.scaler.get_scale()
        self._scales.append(after)
        if after < before:  # it backed off: this step overflowed and was skipped
            self._skipped.append(len(self._scales))

    def trajectory(self) -> tuple[list[float], list[int]]:
        return self._scales, self._skipped

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state)


class AmpcertLossScaler(loop.DynamicLossScaling):
    """ampcert's :class:`~ampcert.amp.DynamicLossScaler`, which keeps its own
    trajectory on the device (read at each evaluation)."""

    def __init__(self, device: str):
        from ampcert.amp import DynamicLossScaler

        self.scaler = DynamicLossScaler(device)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def step(self, optimizer: torch.optim.Optimizer) -> Any:
        return self.scaler.step(optimizer)

    def update(self) -> None:
        self.scaler.update()

    def trajectory(self) -> tuple[list[float], list[int]]:
        traj = self.scaler.trajectory()
        return traj["scale"], [i + 1 for i in traj["skipped_steps"]]

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state)


LossScaler = NoLossScaler | NativeLossScaler | AmpcertLossScaler


@dataclass
class Amp:
    """How a run applies mixed precision: an autocast factory and a loss scaler
    (:class:`NoLossScaler` when the run does not scale)."""

    autocast: Callable[[], contextlib.AbstractContextManager]
    scaler: LossScaler
    policy: dict[str, Any] = field(default_factory=dict)


def make_amp(spec: RunSpec) -> Amp:
    compute = autocast_precision(spec.precision)
    if compute == REFERENCE:  # fp32, or a recipe whose model is in its low precision itself
        name = "none (fp32)" if spec.precision == REFERENCE else f"none ({spec.precision}: the model is in its dtype)"
        return Amp(contextlib.nullcontext, NoLossScaler(), {"name": name})
    # fp8/mxfp8: bf16 autocast around the FP8 Linear layers (backends/torch_fp8.py).
    dtype = getattr(torch, dtype_name(compute))
    use_scaler = spec.precision == "fp16" and spec.loss_scaling
    if spec.amp == "native":
        return Amp(
            lambda: torch.autocast(spec.device, dtype=dtype),
            NativeLossScaler(spec.device) if use_scaler else NoLossScaler(),
            {"name": f"torch.autocast ({spec.device})", "torch": torch.__version__},
        )
    from ampcert.amp import autocast, load_policy, shipped_policy
    from ampcert.amp.torch.autocast import engine_of

    policy = load_policy(spec.policy) if spec.policy else shipped_policy(spec.device)
    return Amp(
        lambda: autocast(spec.device, dtype=dtype, policy=policy),
        AmpcertLossScaler(spec.device) if use_scaler else NoLossScaler(),
        {"name": policy.name, "sha256": policy.sha256, "effective_sha256": policy.effective_sha256,
         "source": shipped_label(policy.source),
         # which engine decided the casts: native's kernels with ampcert's where the policy
         # differs, or the Python engine (docs/policies.md, "Two engines")
         **engine_of(spec.device, dtype, policy)},
    )


def weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        if hasattr(tensor, "full_tensor"):  # a sharded DTensor (FSDP2): every rank gathers the whole
            tensor = tensor.full_tensor()
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _StepClock:
    """Per-step durations without a per-step host sync: CUDA events on GPU,
    perf_counter on CPU (where kernels run synchronously). Every step is timed as
    training, and a window's training time is its wall time (the loop has synced)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self._pending: list[tuple[Any, Any]] = []
        self.method = "CUDA events around each step" if self.cuda else "perf_counter around each step"

    def start(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def counts(self, step: int) -> bool:
        return True

    def stop(self, token: Any, step: int, tally: training_loop.Tally) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._pending.append((token, ev))
        else:
            tally.durations.append(time.perf_counter() - token)

    def window(self, wall_s: float, tally: training_loop.Tally) -> float:
        """Resolve pending CUDA events (the loop has synchronised)."""
        for start, end in self._pending:
            tally.durations.append(start.elapsed_time(end) / 1e3)
        self._pending.clear()
        return wall_s


def train(spec: RunSpec, log: mllog.MLLogger, progress: Callable[[dict], None] | None = None) -> TrainOutcome:
    """Train one run and return what it measured (see :mod:`ampcert.backends.contract`);
    raise :class:`RunFailed` (or another exception) when it cannot go on.

    Telemetry samples the whole run (phases init, train, eval); the outcome
    holds its summary and its samples."""
    if spec.device == "cuda":
        ensure_pci_bus_order()  # before CUDA starts in this process, so torch and NVML agree
    if spec.is_speed_probe:
        return _speed_probe(spec)
    run = training_loop.Run(spec, log, registry.get(spec.workload), TorchFramework(spec),
                            features.for_run(spec, "torch"))
    try:
        return training_loop.train(run, progress)
    except torch.OutOfMemoryError as exc:  # a finding at this batch, not a crash (a memory sweep's point)
        raise DoesNotFit.during(spec, exc) from exc


def _speed_probe(spec: RunSpec) -> TrainOutcome:
    """A speed-probe run (ampcert/backends/speed_probe.py), on a CPU with the probe's threads."""
    from ampcert.backends import calibration, speed_probe

    threads = spec.probe.probe_cpu_threads
    if spec.device == "cpu" and threads is not None:
        torch.set_num_threads(threads)  # this worker process only
    said = (f"{torch.get_num_threads()} intra-op thread(s) (torch.set_num_threads)" if spec.device == "cpu"
            else "the GPU's streams; host threads as the runs")
    return speed_probe.measure(spec, registry.get(spec.workload), TorchFramework, "torch",
                               calibration.torch_kernel(spec.device), said)


class TorchFramework(loop.TaskData):
    """The torch side of the training loop (:class:`~ampcert.backends.training_loop.Framework`).

    The step is ``run_step(x, y)``: by default :meth:`train_step` (the autocast region
    around ``forward(x, y)``, then the loss scaler's backward, step and update). Features
    replace its parts: the compile scope ``forward`` or the whole ``run_step``,
    torchrun the ``train_model``, ``shard``, ``reduce_losses`` and ``evaluates``, a
    precision recipe the ``optimizer_for`` the workload's optimizer, the gradients'
    ``comm_hook`` (which the precision probe wraps to see what is communicated) and the
    ``data_parallel`` that shares the model over torchrun's ranks."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.device = spec.device
        self.clock = _StepClock(spec.device)
        self.amp = make_amp(spec)
        self.scaling: loop.NoLossScaling = self.amp.scaler
        self.losses: list[torch.Tensor] = []  # per step, on the device until the window is read
        self.evaluates = True  # False on a torchrun rank other than 0
        self.shard: Callable[[Any, Any, int], tuple[Any, Any]] | None = None
        self.reduce_losses: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.first: tuple[torch.Tensor, torch.Tensor] | None = None
        self.run_step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self.train_step
        self.forward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self.forward_loss
        # The workload's optimizer, as the run trains with it (a precision recipe remakes it).
        self.optimizer_for: Callable[[torch.optim.Optimizer], torch.optim.Optimizer] = lambda optimizer: optimizer
        # How a data-parallel wrapper communicates gradients (a DDP communication hook; None:
        # DDP's own allreduce), registered once the features have had the model.
        self.comm_hook: Callable[[Any, Any], Any] | None = None
        # How torchrun's ranks share the model: None, DistributedDataParallel; a recipe may
        # shard it instead (FSDP2), a callable (model, device) -> the model as it trains.
        self.data_parallel: Callable[[torch.nn.Module, str], torch.nn.Module] | None = None

    # ---------------------------------------------------------------- building
    def start_telemetry(self, gpus: list[int | None]) -> Telemetry:
        cuda = self.device == "cuda"
        return Telemetry.start(self.device, self.spec.telemetry_rate_hz,
                               gpus=[torch_cuda_gpu_ref(g) for g in gpus] if cuda else None,
                               framework_memory=torch_cuda_memory if cuda else None)

    def build(self, run: training_loop.Run) -> None:
        spec, tally, device = self.spec, run.tally, self.device
        tally.determinism = seed_everything(spec.seed, device)
        params = run.workload.Params.model_validate(spec.params)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t_build = time.perf_counter()
        self.task = task = run.workload.build(params, spec.seed, device)
        self.model = self.train_model = task.model
        self.stream = loop.train_stream(task)  # None: in memory, drawn by index
        if self.stream is not None:
            tally.step_samples = []
        run.built()  # the features' turn: a memory-sweep point's batch size
        # A streamed task's FLOPs are counted on its first batch, drawn now; its wait
        # is step 1's data time (added to the training and data time below).
        first_wait_s = 0.0
        if self.stream is not None and not task.flops_per_step:
            t_first = time.perf_counter()
            self.first = _device_batch(next(self.stream), device)
            first_wait_s = time.perf_counter() - t_first
        # Counted on the model as built: an FP8 layer does the same matmuls.
        tally.flops_per_step = task.flops_per_step or count_train_flops(task, self.first)
        run.model_ready()  # the features' turn: FP8 conversion, DDP, the precision probe
        if self.comm_hook is not None:
            self.train_model.register_comm_hook(None, self.comm_hook)
        self.optimizer = self.optimizer_for(task.make_optimizer(self.model.parameters()))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, task.lr_lambda) if task.lr_lambda else None
        tally.build_s = time.perf_counter() - t_build - first_wait_s
        tally.train_s = tally.data_s = first_wait_s  # 0 but for a streamed first batch drawn while building
        tally.batch_size, tally.amp_policy, tally.data_info = task.batch_size, self.amp.policy, task.data_info
        tally.peak = loop.peak_flops(spec)
        loop.log_run_config(run.log, spec, task.batch_size, self.train_examples(), len(task.eval_x),
                            self.amp.policy.get("name"), run.config)
        self.batches = self.indexed_batches(spec.seed)
        self.model.train()

    def limit_device_memory(self, limit: int) -> None:
        """Let this process use only ``limit`` bytes of its GPU, as a card that small would:
        the caching allocator raises out of memory past it (a memory sweep's emulated card)."""
        if self.device != "cuda":
            return
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        if limit > total:
            raise Unsupported(f"memory.device_memory: {limit} bytes is more than this GPU's {total}; "
                              "a smaller card can be emulated, a larger one cannot")
        torch.cuda.set_per_process_memory_fraction(limit / total)

    def forget_peak_memory(self) -> None:
        if self.device == "cuda":
            self.sync()
            torch.cuda.reset_peak_memory_stats()

    # ---------------------------------------------------------------- training
    def batch(self, step: int, run: training_loop.Run) -> tuple[Any, int]:
        task = self.task
        if self.batches is not None:
            idx = torch.from_numpy(next(self.batches))
            x, y = task.train_x[idx], task.train_y[idx]
            samples = task.batch_size
        else:  # streamed: the next batch (waiting for it is data time), as long as it is
            assert self.stream is not None
            x, y = self.first if self.first is not None else _device_batch(next(self.stream), self.device)
            self.first = None
            samples = len(x)
        if task.augment is not None:
            x, y = task.augment(x, y, step)
        if self.shard is not None:  # this rank's shard of the global batch
            x, y = self.shard(x, y, step)
        return (x, y), samples

    def forward_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.task.loss_fn(self.train_model(x), y)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training step as a user writes it (and compiles it, `torch_compile: {scope:
        step}`): the autocast region around ``forward``, the scaler's backward, step, update."""
        with self.amp.autocast():
            loss = self.forward(x, y)
        scaler = self.amp.scaler
        scaler.scale(loss).backward()
        scaler.step(self.optimizer)
        scaler.update()
        return loss

    def step(self, batch: Any, step: int) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.run_step(*batch)
        if self.scheduler is not None:
            self.scheduler.step()
        self.losses.append(loss.detach().float())

    def window_losses(self) -> list[float]:
        window = torch.stack(self.losses)
        if self.reduce_losses is not None:  # the global batch's loss: the mean of the ranks' shard means
            window = self.reduce_losses(window)
        self.losses.clear()
        return window.cpu().tolist()

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    # ---------------------------------------------------------------- checkpointing
    def checkpoint(self) -> dict[str, Any]:
        """What training needs to go on exactly as it would have: the weights, the optimizer's
        state (in its own dtypes), the schedule, the loss scaler, every random generator."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "scaler": self.amp.scaler.state_dict(), "rng": _rng_state(self.device)}

    def scramble(self) -> None:
        """Make the live training state wrong (weights, optimizer state, generators), so that
        only a complete :meth:`restore` can carry the run on as it was."""
        with torch.no_grad():
            for p in self.model.parameters():
                p.normal_()
        self.optimizer.state.clear()
        loop.seed_host(987654321)
        torch.manual_seed(987654321)

    def restore(self, state: dict[str, Any], step: int) -> None:
        """Training as it stood after ``step`` steps, from :meth:`checkpoint`: the batches
        drawn again from the seed up to that step."""
        batches = self.batches_after(self.spec.seed, step)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.amp.scaler.load_state_dict(state["scaler"])
        _set_rng_state(state["rng"], self.device)
        self.batches = batches

    def evaluate(self) -> float:
        if not self.evaluates:
            return math.nan
        task, model = self.task, self.model
        model.eval()
        with torch.no_grad(), self.amp.autocast():
            value = float(task.evaluate(model, task.eval_x, task.eval_y))
        model.train()
        return value

    def peak_memory(self, training_only: bool = False) -> Measured:
        return _peak_memory(self.device, after_warmup=training_only)

    def finish(self, tally: training_loop.Tally) -> None:
        tally.weights_sha256 = weights_digest(self.model)
        tally.environment = {
            "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name() if self.device == "cuda" else _cpu_name(),
            "data": self.task.data_note,
        }


def count_train_flops(task, batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> float | None:
    """FLOPs of one training step (forward + backward on one batch), counted
    by torch.utils.flop_counter on a copy of the model, so the run's own
    weights and batch-norm statistics are untouched. Counted in fp32: the
    count depends on the ops and shapes, not on the precision. The batch is
    ``batch`` (a streamed task's first) or else the first ``batch_size``
    examples in memory."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    model = copy.deepcopy(task.model)
    model.train()
    if batch is not None:
        x, y = batch
    else:
        x, y = task.train_x[: task.batch_size], task.train_y[: task.batch_size]
    try:
        with FlopCounterMode(display=False) as counter:
            task.loss_fn(model(x), y).backward()
    except Exception:  # noqa: BLE001 - an op without a FLOP formula must not fail the run
        return None
    total = counter.get_total_flops()
    return float(total) if total else None


def _device_batch(pair: tuple[Any, Any], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A streamed (x, y) batch as tensors on the run's device (a DataLoader's
    come on the host; numpy arrays are taken as they are)."""
    x, y = pair
    return torch.as_tensor(x).to(device), torch.as_tensor(y).to(device)


def _cpu_name() -> str:
    from ampcert.envinfo import cpu_info

    return cpu_info()["model"]


def _rng_state(device: str) -> dict[str, Any]:
    return {**loop.host_rng_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if device == "cuda" else None}


def _set_rng_state(state: dict[str, Any], device: str) -> None:
    loop.set_host_rng_state(state)
    torch.set_rng_state(state["torch"])
    if device == "cuda":
        torch.cuda.set_rng_state_all(state["cuda"])


def _peak_memory(device: str, after_warmup: bool = False) -> Measured:
    if device == "cuda":
        if after_warmup:  # a memory sweep's: what the caching allocator held, which is what a card must hold
            return Measured(value=float(torch.cuda.max_memory_reserved()), unit="bytes",
                            method="torch.cuda.max_memory_reserved over the steps after the first (the caching "
                                   "allocator's segments: tensors and cache; not the CUDA context)")
        return Measured(value=float(torch.cuda.max_memory_allocated()), unit="bytes",
                        method="torch.cuda.max_memory_allocated (tensors only, excludes allocator cache)")
    return loop.host_peak_memory(before_eval=after_warmup)
