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
from ampcert.amp.precision import FP8_PRECISIONS, REFERENCE, autocast_precision, dtype_name
from ampcert.backends import distributed, loop, torch_fp8, torch_mkl, torch_precision
from ampcert.backends.contract import (  # noqa: F401 - RunFailed: part of this module's API
    DoesNotFit,
    LossNotFinite,
    RunFailed,
    TrainOutcome,
    Unsupported,
)
from ampcert.backends.loop import step_times_ms
from ampcert.backends.torch_compile import CompiledStep
from ampcert.resources import shipped_label
from ampcert.results import EvalPoint, Fp8Stats, Measured
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


LossScaler = NoLossScaler | NativeLossScaler | AmpcertLossScaler


@dataclass
class Amp:
    """How a run applies mixed precision: an autocast factory and a loss scaler
    (:class:`NoLossScaler` when the run does not scale)."""

    autocast: Callable[[], contextlib.AbstractContextManager]
    scaler: LossScaler
    policy: dict[str, Any] = field(default_factory=dict)


def make_amp(spec: RunSpec) -> Amp:
    if spec.precision == REFERENCE:
        return Amp(contextlib.nullcontext, NoLossScaler(), {"name": "none (fp32)"})
    # fp8/mxfp8: bf16 autocast around the FP8 Linear layers (backends/torch_fp8.py).
    dtype = getattr(torch, dtype_name(autocast_precision(spec.precision)))
    use_scaler = spec.precision == "fp16" and spec.loss_scaling
    if spec.amp == "native":
        return Amp(
            lambda: torch.autocast(spec.device, dtype=dtype),
            NativeLossScaler(spec.device) if use_scaler else NoLossScaler(),
            {"name": f"torch.autocast ({spec.device})", "torch": torch.__version__},
        )
    from ampcert.amp import autocast, load_policy, shipped_policy
    from ampcert.amp.torch_autocast import engine_of

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
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _StepClock:
    """Per-step durations without a per-step host sync: CUDA events on GPU,
    perf_counter on CPU (where kernels run synchronously)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.durations: list[float] = []
        self._pending: list[tuple[Any, Any]] = []
        self.method = "CUDA events around each step" if self.cuda else "perf_counter around each step"

    def start(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, token: Any) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._pending.append((token, ev))
        else:
            self.durations.append(time.perf_counter() - token)

    def collect(self) -> None:
        """Resolve pending CUDA events (the caller has synchronised)."""
        for start, end in self._pending:
            self.durations.append(start.elapsed_time(end) / 1e3)
        self._pending.clear()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train(spec: RunSpec, log: mllog.MLLogger, progress: Callable[[dict], None] | None = None) -> TrainOutcome:
    """Train one run and return what it measured (see :mod:`ampcert.backends.contract`);
    raise :class:`RunFailed` (or another exception) when it cannot go on.

    Telemetry samples the whole run (phases init, train, eval); the outcome
    holds its summary and its samples."""
    cuda = spec.device == "cuda"
    if cuda:
        ensure_pci_bus_order()  # before CUDA starts in this process, so torch and NVML agree
    dctx = distributed.current() if spec.launcher == "torchrun" else None
    if dctx is not None and not dctx.is_main:  # rank 0 samples every device of its node
        tel = distributed.NullTelemetry(dctx.rank)
    else:
        tel = Telemetry.start(spec.device, spec.telemetry_rate_hz,
                              gpus=_local_gpus(dctx) if cuda else None,
                              framework_memory=torch_cuda_memory if cuda else None)
    try:
        return _train(spec, log, progress, tel)
    except torch.OutOfMemoryError as exc:  # a finding at this batch, not a crash (a memory sweep's point)
        raise DoesNotFit.during(spec.device, spec.batch_size, exc) from exc
    finally:
        tel.close()  # a failed run stops the sampler too


def _local_gpus(dctx: distributed.DistContext | None) -> list[int | str]:
    """The GPUs to sample: this process's, or under torchrun every local rank's."""
    if dctx is None:
        return [torch_cuda_gpu_ref()]
    return [torch_cuda_gpu_ref(i) for i in range(dctx.local_world)]


def _train(spec: RunSpec, log: mllog.MLLogger, progress: Callable[[dict], None] | None,
           tel: Telemetry) -> TrainOutcome:
    progress = progress or (lambda _: None)
    device = spec.device
    loop.log_init_start(log)
    determinism = seed_everything(spec.seed, device)
    workload = registry.get(spec.workload)
    params = workload.Params.model_validate(spec.params)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        if spec.device_memory_limit is not None:
            _shrink_device(spec.device_memory_limit)

    t_build = time.perf_counter()
    task = workload.build(params, spec.seed, device)
    model = task.model
    stream = loop.train_stream(task)  # None: in memory, drawn by index
    if spec.batch_size is not None:  # a memory-sweep run trains at the sweep's batch
        task.batch_size = loop.sweep_batch(spec, len(task.train_x) if stream is None else None)
    # A streamed task's FLOPs are counted on its first batch, drawn now; its wait
    # is step 1's data time (added to the training and data time below).
    first, first_wait_s = None, 0.0
    if stream is not None and not task.flops_per_step:
        t_first = time.perf_counter()
        first = _device_batch(next(stream), device)
        first_wait_s = time.perf_counter() - t_first
    # Counted on the model as built: an FP8 layer does the same matmuls.
    flops_per_step = task.flops_per_step or count_train_flops(task, first)
    fp8 = torch_fp8.prepare(model, spec) if spec.precision in FP8_PRECISIONS else None
    optimizer = task.make_optimizer(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, task.lr_lambda) if task.lr_lambda else None
    amp = make_amp(spec)
    build_s = time.perf_counter() - t_build - first_wait_s
    # Under torchrun: train through DistributedDataParallel, evaluate `model` on rank 0.
    dctx = distributed.current() if spec.launcher == "torchrun" else None
    train_model, rank0 = model, dctx is None or dctx.is_main
    # Watches the first step: what precision the run really computed in (MLPerf's disclosure).
    probe = torch_precision.PrecisionProbe(model, device)
    if dctx is not None:
        dctx.check_batch(task.batch_size)
        train_model = dctx.wrap(model, device)
        torch_precision.record_comm_dtype(train_model, probe.observed)
    lowest_precision = None

    budget = spec.train
    assert budget is not None, "ampcert trains its own workloads only; a command job trains itself"
    limit = budget.step_limit
    n_train = len(task.train_x) if stream is None else loop.stream_size(task.train_data)
    loop.log_run_config(log, spec, task.batch_size, n_train, len(task.eval_x), amp.policy.get("name"),
                        [("world_size", dctx.world)] if dctx is not None else [])

    clock = _StepClock(device)
    losses: list[torch.Tensor] = []
    evals: list[EvalPoint] = []
    batches = loop.index_batches(len(task.train_x), task.batch_size, spec.seed) if stream is None else None
    eval_s = 0.0
    train_s = data_s = first_wait_s  # 0 but for a streamed first batch drawn while building
    trained = 0  # samples trained so far: steps x batch_size, or a stream's batches' lengths
    step_samples: list[int] | None = None if stream is None else []
    reached: loop.Reached | None = None
    scaler = amp.scaler

    def forward_loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return task.loss_fn(train_model(xb), yb)

    def whole_step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """The training step as a user compiles it (`torch_compile: {scope: step}`)."""
        with amp.autocast():
            loss = forward_loss(xb, yb)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    # compile: true runs compile one of these from step 2 on (backends/torch_compile.py).
    step_scope = spec.torch_compile is not None and spec.torch_compile.scope == "step"
    compiled = CompiledStep(spec.torch_compile, whole_step if step_scope else forward_loss) \
        if spec.torch_compile is not None else None

    log.start(mllog.RUN_START)
    run_start = time.perf_counter()
    step = 0
    sweep_peak: Measured | None = None
    model.train()
    while step < limit:
        window = min(budget.eval_every, limit - step)
        log.start(mllog.BLOCK_START, metadata=loop.block_metadata(step + 1, window, trained))
        tel.phase("train")
        t_window = time.perf_counter()
        for _ in range(window):
            step += 1
            tok = clock.start()
            t_step = t_data = time.perf_counter()
            if batches is not None:
                idx = torch.from_numpy(next(batches))
                x, y = task.train_x[idx], task.train_y[idx]
                trained += task.batch_size
            else:  # streamed: the next batch (waiting for it is data time), as long as it is
                x, y = first if first is not None else _device_batch(next(stream), device)
                first = None
                if dctx is not None and len(x) % dctx.world:
                    raise Unsupported(f"train_data: batch {step} has {len(x)} examples, which do not split "
                                      f"into {dctx.world} equal per-rank shards (drop the ragged last batch)")
                step_samples.append(len(x))
                trained += len(x)
            if task.augment is not None:
                x, y = task.augment(x, y, step)
            if dctx is not None:  # this rank's shard of the global batch
                x, y = dctx.shard(x), dctx.shard(y)
            data_s += time.perf_counter() - t_data
            optimizer.zero_grad(set_to_none=True)
            if fp8 is not None:
                fp8.before_step(step)
            whole = step_scope and step > 1  # this step is whole_step, compiled
            # Step 1's time includes the probe's per-op bookkeeping (it also holds the warm-up).
            with probe if step == 1 else contextlib.nullcontext():
                if whole:
                    assert compiled is not None
                    loss = compiled(x, y)
                else:
                    with amp.autocast():
                        loss = (compiled if compiled is not None and step > 1 else forward_loss)(x, y)
                    scaler.scale(loss).backward()
            if compiled is not None and step == 2:
                compiled.first_step_done()
            if step == 1:
                probe.remove_hooks()
                lowest_precision = loop.log_lowest_precision(
                    log, torch_precision.disclosure(probe.observed, spec.world_size,
                                                    fp8_layers=fp8.converted() if fp8 is not None else 0))
            if not whole:
                scaler.step(optimizer)
                scaler.update()
            if scheduler is not None:
                scheduler.step()
            losses.append(loss.detach().float())
            if spec.injected_slowdown:  # fault injection: this precision's path made slower on purpose
                _sync(device)
                loop.hold_step(spec.injected_slowdown, t_step)
            if spec.is_memory_sweep and step == 1 and device == "cuda":  # the warm-up's peak left out
                _sync(device)
                torch.cuda.reset_peak_memory_stats()
            clock.stop(tok)
        _sync(device)
        train_s += time.perf_counter() - t_window
        if spec.is_memory_sweep and sweep_peak is None:  # training's peak, before any evaluation
            sweep_peak = _peak_memory(device, after_warmup=True)
        clock.collect()
        log.end(mllog.BLOCK_STOP, metadata=loop.block_metadata(step - window + 1, window, trained))

        window_losses = torch.stack(losses[-window:])
        if dctx is not None:  # the global batch's loss: the mean of the ranks' shard means
            window_losses = dctx.mean(window_losses)
            losses[-window:] = list(window_losses)
        finite = torch.isfinite(window_losses)
        scaler.check_window(finite.tolist(), step, spec.precision)

        tel.phase("eval")
        t_eval = time.perf_counter()
        log.start(mllog.EVAL_START, metadata=loop.eval_metadata(step, trained))
        model.eval()
        with torch.no_grad(), amp.autocast():
            value = float(task.evaluate(model, task.eval_x, task.eval_y)) if rank0 else math.nan
        model.train()
        _sync(device)
        eval_s += time.perf_counter() - t_eval
        samples = trained
        loop.log_eval_value(log, workload.metric, value, step, samples)
        log.end(mllog.EVAL_STOP, metadata=loop.eval_metadata(step, samples))
        evals.append(EvalPoint(step=step, samples=samples, train_time_s=train_s, value=value))
        scaler.log_eval(log, step)
        if dctx is not None:  # every rank follows rank 0's evaluation
            decision = dctx.decide(_decision(value, budget.target, workload.higher_is_better, reached), device)
            if not rank0:
                if decision == distributed.FAIL:
                    raise RunFailed(f"rank 0 ended the run at step {step}")
                if decision == distributed.STOP:
                    break
                continue
        if not math.isfinite(value):
            raise LossNotFinite(f"eval {workload.metric} is {value} at step {step}")
        progress({"step": step, "limit": limit, "metric": value,
                  "loss": float(window_losses[finite].mean()) if finite.any() else float("nan")})

        if reached is None and loop.target_hit(value, budget.target, workload.higher_is_better):
            reached = loop.Reached(steps=step, samples=samples, time_s=time.perf_counter() - run_start)
            break

    telemetry, series = loop.stop_telemetry(tel, log, trained)
    log.end(mllog.RUN_STOP, metadata=mllog.run_stop_metadata(budget.target, reached is not None, step))
    all_losses = torch.stack(losses).cpu().tolist()
    peak_memory, weights_sha256 = sweep_peak or _peak_memory(device), weights_digest(model)
    environment: dict[str, Any] = {
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else _cpu_name(),
        "data": task.data_note,
    }
    if dctx is not None:
        determinism["world_size"] = dctx.world
        environment["distributed"] = dctx.describe(spec, task.batch_size)
    return loop.outcome(
        spec, workload, task.batch_size, steps=step, losses=all_losses, evals=evals,
        reached=reached, scaling=scaler, build_s=build_s, train_s=train_s, eval_s=eval_s, data_s=data_s,
        durations=clock.durations, timing=clock.method, flops_per_step=flops_per_step,
        # Under torchrun on GPUs every GPU contributes to the achieved FLOP/s.
        peak=loop.peak_flops(spec, dctx.world if dctx is not None and device == "cuda" else 1),
        telemetry=telemetry, series=series, amp_policy=amp.policy, determinism=determinism,
        environment=environment, peak_memory=peak_memory, weights_sha256=weights_sha256,
        data_info=task.data_info, lowest_precision=lowest_precision,
        compile_stats=compiled.stats(step_times_ms(clock.durations)) if compiled is not None else None,
        fp8=Fp8Stats.model_validate(fp8.summary()) if fp8 is not None else None,
        step_samples=step_samples,
    )


def _decision(value: float, target: float | None, higher_is_better: bool, reached: loop.Reached | None) -> int:
    """Rank 0's verdict after an evaluation, as the other ranks must follow it."""
    if not math.isfinite(value):
        return distributed.FAIL
    if reached is None and loop.target_hit(value, target, higher_is_better):
        return distributed.STOP
    return distributed.CONTINUE


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


def _shrink_device(limit: int) -> None:
    """Let this process use only ``limit`` bytes of its GPU, as a card that small would:
    the caching allocator raises out of memory past it (a memory sweep's emulated card)."""
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if limit > total:
        raise Unsupported(f"memory.device_memory: {limit} bytes is more than this GPU's {total}; "
                          "a smaller card can be emulated, a larger one cannot")
    torch.cuda.set_per_process_memory_fraction(limit / total)


def _peak_memory(device: str, after_warmup: bool = False) -> Measured:
    if device == "cuda":
        if after_warmup:  # a memory sweep's: what the caching allocator held, which is what a card must hold
            return Measured(value=float(torch.cuda.max_memory_reserved()), unit="bytes",
                            method="torch.cuda.max_memory_reserved over the steps after the first (the caching "
                                   "allocator's segments: tensors and cache; not the CUDA context)")
        return Measured(value=float(torch.cuda.max_memory_allocated()), unit="bytes",
                        method="torch.cuda.max_memory_allocated (tensors only, excludes allocator cache)")
    return loop.host_peak_memory(before_eval=after_warmup)
