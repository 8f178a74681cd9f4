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
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ampcert import mllog
from ampcert.amp.precision import LOW_PRECISIONS, autocast_precision, dtype_name
from ampcert.backends import features, loop, training_loop
from ampcert.backends.contract import DoesNotFit, TrainOutcome, Unsupported
from ampcert.resources import shipped_label
from ampcert.results import Measured
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
    from ampcert.telemetry import ensure_pci_bus_order
    from ampcert.workloads import registry

    xla = _configure_xla(spec.device)
    if spec.device == "cuda":
        ensure_pci_bus_order()  # before JAX starts CUDA, so its ordinals are NVML's
    if spec.is_speed_probe:  # ampcert/backends/speed_probe.py
        from ampcert.backends import calibration, speed_probe

        return speed_probe.measure(spec, registry.get(spec.workload), lambda s: JaxFramework(s, xla), "jax",
                                   calibration.jax_kernel(spec.device),
                                   "XLA's own threads, as the runs (a JAX process sets them when it starts)")
    run = training_loop.Run(spec, log, registry.get(spec.workload), JaxFramework(spec, xla),
                            features.for_run(spec, "jax"))
    try:
        return training_loop.train(run, progress)
    except Exception as exc:
        if _out_of_memory(exc):  # a finding at this batch, not a crash (a memory sweep's point)
            raise DoesNotFit.during(spec, exc) from exc
        raise


def _out_of_memory(exc: Exception) -> bool:
    """XLA's allocation failure, on any device: a JaxRuntimeError whose status is
    RESOURCE_EXHAUSTED ("Out of memory allocating N bytes" on a CPU, "Out of memory
    while trying to allocate" on a GPU). Other runtime errors stay errors."""
    import jax

    return isinstance(exc, jax.errors.JaxRuntimeError) and str(exc).lstrip().startswith("RESOURCE_EXHAUSTED")


class _FirstStepApart:
    """JAX's step clock: perf_counter once the step's results are ready; the first step,
    which traces and compiles, is timed apart as ``compile_s``."""

    method = "perf_counter around each step, blocked until ready (the first, compiling step excluded)"

    def __init__(self) -> None:
        self._window_s = 0.0

    def start(self) -> float:
        return time.perf_counter()

    def counts(self, step: int) -> bool:
        return step > 1

    def stop(self, token: float, step: int, tally: training_loop.Tally) -> None:
        elapsed = time.perf_counter() - token
        if not self.counts(step):
            tally.compile_s = elapsed  # trace + compile + the first step
        else:
            tally.durations.append(elapsed)
            self._window_s += elapsed

    def window(self, wall_s: float, tally: training_loop.Tally) -> float:
        seconds, self._window_s = self._window_s, 0.0
        return seconds


class JaxFramework(loop.TaskData):
    """The JAX side of the training loop (:class:`~ampcert.backends.training_loop.Framework`):
    one jitted step (the loss, autocast where the precision is low, its gradients, the
    loss scale's guard, optax's update), blocked until ready."""

    def __init__(self, spec: RunSpec, xla: dict[str, Any]) -> None:
        from ampcert.backends import jax_scaling

        self.spec = spec
        self.xla = xla
        self.clock = _FirstStepApart()
        self.scaling = jax_scaling.for_run(spec.precision, spec.loss_scaling)
        self.losses: list[Any] = []  # per step, on the device until the window is read
        self.last: tuple[Any, Any] | None = None  # the latest batch: the probe's and the FLOP count's input
        # The dtype floating inputs reach the model in (None: as the data holds them); a
        # precision recipe whose parameters are bf16 sets it, so that JAX does not promote.
        self.input_dtype: Any = None

    # ---------------------------------------------------------------- building
    def start_telemetry(self, gpus: list[int | None]) -> Any:
        from ampcert.telemetry import Telemetry, jax_memory

        cuda = self.spec.device == "cuda"  # one process, one GPU: JAX's first
        return Telemetry.start(self.spec.device, self.spec.telemetry_rate_hz, gpus=[0] if cuda else None,
                               framework_memory=jax_memory if cuda else None)

    def build(self, run: training_loop.Run) -> None:
        import jax
        import jax.numpy as jnp
        import optax

        from ampcert.amp.jax import autocast, jax_policy

        spec, tally, device = self.spec, run.tally, self.spec.device
        # Numpy's global generator seeded for a user's workload that draws from it. XLA's CPU
        # kernels are deterministic; on a GPU _configure_xla asked for deterministic ops
        # (the certify determinism check reads this field).
        tally.determinism = loop.seed_host(spec.seed)
        tally.determinism.update(self.xla, deterministic_algorithms=True, jax=jax.__version__,
                                 jax_backend=jax.default_backend())
        build_jax = getattr(run.workload, "build_jax", None)
        if build_jax is None:
            raise Unsupported(f"workload {spec.workload!r} has no JAX version (no build_jax)")
        params_model = run.workload.Params.model_validate(spec.params)

        t_build = time.perf_counter()
        self.task = task = build_jax(params_model, spec.seed, device)
        self.jdev = jax.devices("gpu" if device == "cuda" else "cpu")[0]
        self.params = jax.device_put(task.params, self.jdev)
        self.state = jax.device_put(task.state, self.jdev)
        self.opt_state = task.optimizer.init(self.params)
        self.stream = loop.train_stream(task)  # None: in memory, drawn by index
        if self.stream is not None:
            tally.step_samples = []
        run.built()  # the features' turn: a memory-sweep point's batch size
        run.model_ready()
        if self.stream is None:
            self.train_x, self.train_y = np.asarray(task.train_x), np.asarray(task.train_y)
        self.eval_x, self.eval_y = np.asarray(task.eval_x), np.asarray(task.eval_y)
        tally.build_s = time.perf_counter() - t_build

        self.policy = None
        loss_of = _loss_of(task)
        predict_fn = lambda p, s, x: task.apply(p, s, x, False)[0]  # noqa: E731
        compute = autocast_precision(spec.precision)  # a recipe whose params are bf16: none
        if compute in LOW_PRECISIONS:
            low = jnp.dtype(dtype_name(compute))
            self.policy = policy = jax_policy(spec.policy)
            loss_of = autocast(loss_of, policy, low)
            predict_fn = autocast(predict_fn, policy, low)
            tally.amp_policy = {"name": policy.name, "sha256": policy.sha256,
                                "effective_sha256": policy.effective_sha256, "source": shipped_label(policy.source)}
        else:
            tally.amp_policy = {"name": "none (fp32)" if spec.precision == compute
                                else f"none ({spec.precision}: the parameters are in its dtype)"}
        self.loss_of = loss_of
        guard = self.scaling.guard

        budget = spec.train
        assert budget is not None, "ampcert trains its own workloads only; an own job trains itself"
        lr_lambda = task.lr_lambda or (lambda _: 1.0)
        self.lr_table = np.asarray([task.base_lr * lr_lambda(k) for k in range(budget.step_limit)], np.float32)

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

        self.step_fn = step_fn
        # Donating the old parameters and optimizer state lets XLA update in place
        # (CPU XLA ignores donation, with a warning, so only on GPU).
        self.step_jit = jax.jit(step_fn, donate_argnums=(0, 1, 2) if device == "cuda" else ())
        self.predict = jax.jit(predict_fn)

        tally.batch_size, tally.data_info, tally.peak = task.batch_size, task.data_info, loop.peak_flops(spec)
        loop.log_run_config(run.log, spec, task.batch_size, self.train_examples(), len(self.eval_x),
                            tally.amp_policy["name"], [("backend", "jax"), *run.config])
        self.batches = self.indexed_batches(spec.seed)

    def limit_device_memory(self, limit: int) -> None:
        raise Unsupported("memory.device_memory: an emulated smaller card is torch's (its caching allocator's "
                          "memory fraction); JAX has no per-process limit to set after start")

    def forget_peak_memory(self) -> None:
        """JAX's peak cannot be reset: a sweep point's includes its first step."""

    # ---------------------------------------------------------------- training
    def batch(self, step: int, run: training_loop.Run) -> tuple[Any, int]:
        import jax
        import jax.numpy as jnp

        task = self.task
        if self.batches is not None:
            idx = next(self.batches)
            x, y = self.train_x[idx], self.train_y[idx]
            samples = task.batch_size
        else:  # streamed: the next batch (waiting for it is data time), as long as it is
            assert self.stream is not None
            x, y = (v if isinstance(v, jax.Array) else np.asarray(v) for v in next(self.stream))
            samples = len(x)
        if task.augment is not None:
            x, y = task.augment(x, y, step)
        self.last = self._input(jnp.asarray(x)), jnp.asarray(y)
        return self.last, samples

    def _input(self, x: Any) -> Any:
        import jax.numpy as jnp

        if self.input_dtype is not None and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(self.input_dtype)
        return x

    def step_args(self, batch: tuple[Any, Any], step: int) -> tuple[Any, ...]:
        """``step_fn``'s arguments for ``batch`` at ``step``: the state as it stands."""
        return (self.params, self.opt_state, self.state, self.scaling.state, self.lr_table[step - 1], *batch)

    def step(self, batch: Any, step: int) -> None:
        import jax

        self.params, self.opt_state, self.state, scale_state, loss, finite_grads = self.step_jit(
            *self.step_args(batch, step))
        jax.block_until_ready((self.params, loss))
        self.losses.append(loss)
        self.scaling.observe(scale_state, finite_grads, step)

    def window_losses(self) -> list[float]:
        values = [float(v) for v in self.losses]
        self.losses.clear()
        return values

    def sync(self) -> None:
        """Every step has waited for its results already."""

    # ---------------------------------------------------------------- checkpointing
    def checkpoint(self) -> dict[str, Any]:
        """What training needs to go on exactly as it would have, on the host: the
        parameters, the optimizer's state (in its own dtypes), the model's state, the loss
        scale, the host's generators (a JAX workload's own keys derive from seed and step)."""
        import jax

        return {"params": jax.device_get(self.params), "opt_state": jax.device_get(self.opt_state),
                "state": jax.device_get(self.state), "scale": jax.device_get(self.scaling.state),
                "rng": loop.host_rng_state()}

    def scramble(self) -> None:
        """Make the live training state wrong, so that only a complete :meth:`restore` can
        carry the run on as it was."""
        import jax
        import jax.numpy as jnp

        self.params = jax.tree_util.tree_map(lambda leaf: jnp.full_like(leaf, 0.5), self.params)
        self.opt_state = self.task.optimizer.init(self.params)
        loop.seed_host(987654321)

    def restore(self, state: dict[str, Any], step: int) -> None:
        import jax

        batches = self.batches_after(self.spec.seed, step)
        self.params = jax.device_put(state["params"], self.jdev)
        self.opt_state = jax.device_put(state["opt_state"], self.jdev)
        self.state = jax.device_put(state["state"], self.jdev)
        self.scaling.state = jax.device_put(state["scale"], self.jdev)
        loop.set_host_rng_state(state["rng"])
        self.batches = batches

    def evaluate(self) -> float:
        task = self.task
        return float(task.evaluate(functools.partial(_predict_host, self.predict, self.params, self.state,
                                                     self._input), self.eval_x, self.eval_y))

    def peak_memory(self, training_only: bool = False) -> Measured:
        return _peak_memory(self.jdev, before_eval=training_only)

    def finish(self, tally: training_loop.Tally) -> None:
        import jax

        assert self.last is not None
        tally.flops_per_step = _step_flops(self.step_jit, *self.step_args(self.last, 1))
        tally.weights_sha256 = params_digest(self.params)
        tally.environment = {
            "jax": jax.__version__, "jax_backend": jax.default_backend(),
            "device_name": self.jdev.device_kind, "data": self.task.data_note,
            "compile_s": tally.compile_s,
            "policy_rewrite": self.loss_of.report(self.params, self.state, *self.last).as_dict()
            if self.policy is not None else None,
        }


def _predict_host(predict, params, state, to_input, xb):
    import jax.numpy as jnp

    return predict(params, state, to_input(jnp.asarray(xb)))


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
