"""The JAX training loop: one RunSpec in, the measured run out, like the torch backend.

Precision, applied here and only here:

- fp32: the workload's loss as written;
- bf16: ``ampcert.amp.jax.autocast(loss, policy, bfloat16)``;
- fp16: the same with float16, plus :class:`~ampcert.amp.jax.DynamicLossScale`:
  the loss is scaled, gradients unscaled in fp32, and a step with non-finite
  gradients is skipped with ``select_tree`` inside the jitted step (no host
  round-trip), the scale backing off as torch's GradScaler's would. A run
  that does not scale goes through the same step with a no-op scale
  (:mod:`~ampcert.backends.jax_scaling`).

JAX has no autocast of its own, so ``amp: native`` does not exist here; the
harness refuses it at planning time.

The workload's ``build_jax`` gives a
:class:`~ampcert.workloads.jax_models.JaxTask`; for the built-in workloads
it is made from the same framework-free preparation as the torch task (same
initial weights, bit for bit, same data and optimizer settings), and batches
are drawn by :func:`ampcert.backends.loop.index_batches` and augmented from
:mod:`ampcert.workloads.rng`, as in the torch backend, so a JAX run and a
torch run of one seed see the same examples in the same order. A task that
streams (``train_data``: an iterable of numpy (x, y) batches) is drawn from
instead, epoch after epoch (:class:`ampcert.backends.loop.BatchStream`). Nothing here
imports torch. The learning rate of step k is ``base_lr * lr_lambda(k - 1)``,
torch LambdaLR's, including on skipped steps (LambdaLR advances on every
step).

Timing: each step is blocked until its results are ready and timed with
perf_counter (dispatch, compute and the wait). The first step, which traces
and compiles, is timed apart as ``compile_s`` and not counted as training.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ampcert import mllog
from ampcert.amp.precision import LOW_PRECISIONS, dtype_name
from ampcert.backends import jax_precision, loop
from ampcert.backends.contract import DoesNotFit, LossNotFinite, TrainOutcome, Unsupported
from ampcert.resources import shipped_label
from ampcert.results import EvalPoint, Measured
from ampcert.spec import RunSpec


def _configure_xla(device: str) -> dict[str, Any]:
    """Deterministic XLA before JAX starts its backend (flags are read once)."""
    if device == "cuda":
        flags = os.environ.get("XLA_FLAGS", "")
        if "--xla_gpu_deterministic_ops" not in flags:
            os.environ["XLA_FLAGS"] = (flags + " --xla_gpu_deterministic_ops=true").strip()
    else:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return {"xla_flags": os.environ.get("XLA_FLAGS", ""), "jax_platforms": os.environ.get("JAX_PLATFORMS")}


def params_digest(params: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(np.ascontiguousarray(np.asarray(params[name])).tobytes())
    return h.hexdigest()


def train(spec: RunSpec, log: mllog.MLLogger, progress: Callable[[dict], None] | None = None) -> TrainOutcome:
    """Train one run and return what it measured, as the torch backend does
    (see :mod:`ampcert.backends.contract`)."""
    from ampcert.telemetry import Telemetry, ensure_pci_bus_order, jax_memory

    xla = _configure_xla(spec.device)
    cuda = spec.device == "cuda"
    if cuda:
        ensure_pci_bus_order()  # before JAX starts CUDA, so its ordinals are NVML's
    tel = Telemetry.start(spec.device, spec.telemetry_rate_hz, gpus=[0] if cuda else None,
                          framework_memory=jax_memory if cuda else None)
    try:
        return _train(spec, log, progress, tel, xla)
    except Exception as exc:
        if _out_of_memory(exc):  # a finding at this batch, not a crash (a memory sweep's point)
            raise DoesNotFit.during(spec.device, spec.batch_size, exc) from exc
        raise
    finally:
        tel.close()


def _out_of_memory(exc: Exception) -> bool:
    """XLA's allocation failure, on any device: a JaxRuntimeError whose status is
    RESOURCE_EXHAUSTED ("Out of memory allocating N bytes" on a CPU, "Out of memory
    while trying to allocate" on a GPU). Other runtime errors stay errors."""
    import jax

    return isinstance(exc, jax.errors.JaxRuntimeError) and str(exc).lstrip().startswith("RESOURCE_EXHAUSTED")


def _train(spec: RunSpec, log: mllog.MLLogger, progress: Callable[[dict], None] | None,
           tel, xla: dict[str, Any]) -> TrainOutcome:
    progress = progress or (lambda _: None)

    import jax
    import jax.numpy as jnp
    import optax

    from ampcert.amp.jax import autocast, jax_policy
    from ampcert.backends import jax_scaling
    from ampcert.workloads import registry

    device = spec.device
    loop.log_init_start(log)
    determinism = loop.seed_host(spec.seed)  # for a user's workload that draws from numpy's global generator
    # XLA's CPU kernels are deterministic; on a GPU _configure_xla asked for
    # deterministic ops (the certify determinism check reads this field).
    determinism.update(xla, deterministic_algorithms=True, jax=jax.__version__, jax_backend=jax.default_backend())
    workload = registry.get(spec.workload)
    build_jax = getattr(workload, "build_jax", None)
    if build_jax is None:
        raise Unsupported(f"workload {spec.workload!r} has no JAX version (no build_jax)")
    params_model = workload.Params.model_validate(spec.params)

    t_build = time.perf_counter()
    task = build_jax(params_model, spec.seed, device)
    jdev = jax.devices("gpu" if device == "cuda" else "cpu")[0]
    params = jax.device_put(task.params, jdev)
    state = jax.device_put(task.state, jdev)
    opt_state = task.optimizer.init(params)
    stream = loop.train_stream(task)  # None: in memory, drawn by index
    if spec.batch_size is not None:  # a memory-sweep run trains at the sweep's batch
        task.batch_size = loop.sweep_batch(spec, len(task.train_x) if stream is None else None)
    if stream is None:
        train_x, train_y = np.asarray(task.train_x), np.asarray(task.train_y)
    eval_x, eval_y = np.asarray(task.eval_x), np.asarray(task.eval_y)
    build_s = time.perf_counter() - t_build

    policy = None
    loss_of = _loss_of(task)
    predict_fn = lambda p, s, x: task.apply(p, s, x, False)[0]  # noqa: E731
    if spec.precision in LOW_PRECISIONS:
        low = jnp.dtype(dtype_name(spec.precision))
        policy = jax_policy(spec.policy)
        loss_of = autocast(loss_of, policy, low)
        predict_fn = autocast(predict_fn, policy, low)
        amp_policy = {"name": policy.name, "sha256": policy.sha256,
                      "effective_sha256": policy.effective_sha256, "source": shipped_label(policy.source)}
    else:
        amp_policy = {"name": "none (fp32)"}
    scaling = jax_scaling.for_run(spec.precision, spec.loss_scaling)
    guard = scaling.guard

    budget = spec.train
    assert budget is not None, "ampcert trains its own workloads only; a command job trains itself"
    limit = budget.step_limit
    lr_lambda = task.lr_lambda or (lambda _: 1.0)
    lr_table = np.asarray([task.base_lr * lr_lambda(k) for k in range(limit)], np.float32)

    def step_fn(params, opt_state, state, scale, lr, x, y):
        def objective(p):
            loss, new_state = loss_of(p, state, x, y)
            return scale.scale(loss), (loss, new_state)

        grads, (loss, new_state) = jax.grad(objective, has_aux=True)(params)
        grads = scale.unscale(grads)
        updates, new_opt = task.optimizer.update(grads, opt_state, params)
        updates = jax.tree_util.tree_map(lambda u: u * lr, updates)
        new_params = optax.apply_updates(params, updates)
        (new_params, new_opt), new_scale, finite = guard(scale, grads, (new_params, new_opt), (params, opt_state))
        return new_params, new_opt, new_state, new_scale, loss, finite

    # Donating the old parameters and optimizer state lets XLA update in place
    # (CPU XLA ignores donation, with a warning, so only on GPU).
    step_jit = jax.jit(step_fn, donate_argnums=(0, 1, 2) if device == "cuda" else ())
    predict = jax.jit(predict_fn)

    n_train = len(train_x) if stream is None else loop.stream_size(task.train_data)
    loop.log_run_config(log, spec, task.batch_size, n_train, len(eval_x), amp_policy["name"],
                        [("backend", "jax")])

    durations: list[float] = []
    losses: list[float] = []
    evals: list[EvalPoint] = []
    batches = loop.index_batches(len(train_x), task.batch_size, spec.seed) if stream is None else None
    train_s = eval_s = data_s = 0.0
    trained = 0  # samples trained so far: steps x batch_size, or a stream's batches' lengths
    step_samples: list[int] | None = None if stream is None else []
    compile_s: float | None = None
    reached: loop.Reached | None = None

    lowest_precision = None
    log.start(mllog.RUN_START)
    run_start = time.perf_counter()
    step = 0
    sweep_peak: Measured | None = None
    while step < limit:
        window = min(budget.eval_every, limit - step)
        log.start(mllog.BLOCK_START, metadata=loop.block_metadata(step + 1, window, trained))
        tel.phase("train")
        window_losses: list[Any] = []
        for _ in range(window):
            step += 1
            t0 = time.perf_counter()
            if batches is not None:
                idx = next(batches)
                x, y = train_x[idx], train_y[idx]
                trained += task.batch_size
            else:  # streamed: the next batch (waiting for it is data time), as long as it is
                x, y = (v if isinstance(v, jax.Array) else np.asarray(v) for v in next(stream))
                step_samples.append(len(x))
                trained += len(x)
            if task.augment is not None:
                x, y = task.augment(x, y, step)
            x, y = jnp.asarray(x), jnp.asarray(y)
            t_data = time.perf_counter()
            data_s += t_data - t0
            if step == 1:  # traced apart from the timed step (no compile, no run): what XLA will compute in
                lowest_precision = loop.log_lowest_precision(log, jax_precision.observe(
                    step_fn, (params, opt_state, state, scaling.state, lr_table[0], x, y), device))
                t0 += time.perf_counter() - t_data  # not the step's time
            params, opt_state, state, scale_state, loss, finite_grads = step_jit(
                params, opt_state, state, scaling.state, lr_table[step - 1], x, y)
            jax.block_until_ready((params, loss))
            if spec.injected_slowdown and compile_s is not None:  # fault injection, past the compiling step
                loop.hold_step(spec.injected_slowdown, t0)
            elapsed = time.perf_counter() - t0
            if compile_s is None:
                compile_s = elapsed  # trace + compile + the first step
            else:
                durations.append(elapsed)
                train_s += elapsed
            window_losses.append(loss)
            scaling.observe(scale_state, finite_grads, step)
        log.end(mllog.BLOCK_STOP, metadata=loop.block_metadata(step - window + 1, window, trained))
        values = [float(v) for v in window_losses]
        losses.extend(values)
        scaling.check_window([math.isfinite(v) for v in values], step, spec.precision)
        if spec.is_memory_sweep and sweep_peak is None:  # training's peak, before any evaluation
            sweep_peak = _peak_memory(jdev, before_eval=True)

        tel.phase("eval")
        t_eval = time.perf_counter()
        log.start(mllog.EVAL_START, metadata=loop.eval_metadata(step, trained))
        value = float(task.evaluate(functools.partial(_predict_host, predict, params, state), eval_x, eval_y))
        eval_s += time.perf_counter() - t_eval
        samples = trained
        loop.log_eval_value(log, workload.metric, value, step, samples)
        log.end(mllog.EVAL_STOP, metadata=loop.eval_metadata(step, samples))
        evals.append(EvalPoint(step=step, samples=samples, train_time_s=train_s, value=value))
        scaling.log_eval(log, step)
        if not math.isfinite(value):
            raise LossNotFinite(f"eval {workload.metric} is {value} at step {step}")
        ok = [v for v in values if math.isfinite(v)]
        progress({"step": step, "limit": limit, "metric": value,
                  "loss": sum(ok) / len(ok) if ok else float("nan")})
        if reached is None and loop.target_hit(value, budget.target, workload.higher_is_better):
            reached = loop.Reached(steps=step, samples=samples, time_s=time.perf_counter() - run_start)
            break

    telemetry, series = loop.stop_telemetry(tel, log, trained)
    log.end(mllog.RUN_STOP, metadata=mllog.run_stop_metadata(budget.target, reached is not None, step))
    flops_per_step = _step_flops(step_jit, params, opt_state, state, scaling.state, lr_table[0], x, y)
    return loop.outcome(
        spec, workload, task.batch_size, steps=step, losses=losses, evals=evals, reached=reached,
        scaling=scaling, build_s=build_s, compile_s=compile_s, train_s=train_s, eval_s=eval_s, data_s=data_s,
        durations=durations, timing="perf_counter around each step, blocked until ready "
                                    "(the first, compiling step excluded)",
        flops_per_step=flops_per_step, peak=loop.peak_flops(spec), telemetry=telemetry, series=series,
        amp_policy=amp_policy, determinism=determinism,
        environment={
            "jax": jax.__version__, "jax_backend": jax.default_backend(),
            "device_name": jdev.device_kind, "data": task.data_note,
            "compile_s": compile_s,
            "policy_rewrite": loss_of.report(params, state, x, y).as_dict() if policy is not None else None,
        },
        peak_memory=sweep_peak or _peak_memory(jdev), weights_sha256=params_digest(params), data_info=task.data_info,
        lowest_precision=lowest_precision, step_samples=step_samples,
    )


def _predict_host(predict, params, state, xb):
    import jax.numpy as jnp

    return predict(params, state, jnp.asarray(xb))


def _loss_of(task):
    def loss_of(params, state, x, y):
        logits, new_state = task.apply(params, state, x, True)
        return task.loss_fn(logits, y), new_state

    return loss_of


def _step_flops(step_jit, *args) -> float | None:
    """FLOPs of one compiled training step, from XLA's cost analysis."""
    try:
        cost = step_jit.lower(*args).compile().cost_analysis()
    except Exception:  # noqa: BLE001 - a backend without cost analysis must not fail the run
        return None
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    flops = (cost or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


def _peak_memory(jdev, before_eval: bool = False) -> Measured:
    stats = None
    try:
        stats = jdev.memory_stats()
    except Exception:  # noqa: BLE001
        stats = None
    if stats and "peak_bytes_in_use" in stats:
        during = ", over building and training, before any evaluation" if before_eval else ""
        return Measured(value=float(stats["peak_bytes_in_use"]), unit="bytes",
                        method=f"JAX device memory_stats peak_bytes_in_use ({jdev.device_kind}){during}")
    return loop.host_peak_memory(before_eval)
