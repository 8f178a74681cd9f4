"""ampcert's torch autocast under torch.compile: every shipped torch workload's
forward and loss trace into one graph with no graph break and no recompile
from step to step, compute the same dtypes as eagerly, and the counters that
say so can fail. The whole training step compiled, with DynamicLossScaler in
both modes, breaks no more often than with torch.autocast and GradScaler,
never recompiles, and skips an overflowing step as eagerly.

Counted through torch._dynamo's own counters (``graph_break``, ``stats``),
with the ``eager`` backend: Dynamo's tracing is what is under test, not
Inductor's code generation, and the eager backend keeps these tests fast.
"""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from ampcert.amp import policy as policy_module
from ampcert.amp.torch import autocast as torch_autocast
from ampcert.amp.torch import kernels as torch_autocast_kernels
from ampcert.amp.torch.autocast import autocast
from ampcert.amp.torch.op_names import torch_version
from ampcert.amp.torch.scaler import DynamicLossScaler
from ampcert.amp.torch.support import REGION_IN_TRACE_MIN, release_name
from ampcert.workloads import registry

WORKLOADS = {
    "digits": {},
    "resnet": {"size": "tiny"},
    "gpt": {"size": "tiny", "max_bytes": 20000, "eval_windows": 4},
}


def _task(name: str):
    workload = registry.get(name)
    task = workload.build(workload.Params.model_validate(WORKLOADS[name]), 0, "cpu")
    n = min(task.batch_size, 8)
    return task, task.train_x[:n], task.train_y[:n]


def _cold(monkeypatch) -> None:
    """The engine as a fresh process has it: no policy read, no region made, no per-callable
    decision made (what the first region entry, or the first trace, does once)."""
    monkeypatch.setattr(policy_module, "_CACHE", {})
    monkeypatch.setattr(torch_autocast, "_POLICIES", {})
    monkeypatch.setattr(torch_autocast, "_SHIPPED", {})
    monkeypatch.setattr(torch_autocast_kernels, "SERIALS", [])
    monkeypatch.setattr(torch_autocast_kernels, "SERIAL_OF", {})
    monkeypatch.setattr(torch_autocast, "_REGIONS", {})
    for name in ("clones", "traced_clones"):
        monkeypatch.setattr(torch_autocast._TRACING, name, {})
    monkeypatch.setattr(torch_autocast._TRACING, "names", None)


def _compiled_steps(task, x, y, steps: int = 3, dtype=torch.bfloat16, placement: str = "around"):
    """``steps`` compiled forward+loss calls, each in its own autocast region (as a
    training loop enters one per step), and the backward of each. The region is made and
    entered around the compiled call (``around``) or inside the compiled function, as
    torch.autocast is usually written (``inside``). Compiled through AOTAutograd, whose
    forward graphs are kept (``.graphs``): what runs is the compiled graph alone, with no
    torch function mode left to decide anything."""
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    counters.clear()
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def forward_loss(x, y):
        out = task.model(x)
        return task.loss_fn(out, y), out

    def forward_loss_in_a_region(x, y):
        with autocast("cpu", dtype=dtype):
            return forward_loss(x, y)

    inside = placement == "inside"
    compiled = torch.compile(forward_loss_in_a_region if inside else forward_loss,
                             backend=aot_autograd(fw_compiler=keep, bw_compiler=lambda gm, _: gm.forward))
    results = []
    for _ in range(steps):
        with contextlib.nullcontext() if inside else autocast("cpu", dtype=dtype):
            loss, out = compiled(x, y)
        loss.backward()
        results.append((loss.detach(), out.detach()))
    return results, graphs


# The ops whose dtype autocast decides and that carry the numerics: matmuls,
# convolutions, the loss's log-softmax and reductions.
COMPUTE = {"mm", "addmm", "bmm", "convolution", "_log_softmax", "nll_loss_forward", "native_layer_norm",
           "_scaled_dot_product_flash_attention_for_cpu", "sum", "mean"}


class _AtenOps(torch.utils._python_dispatch.TorchDispatchMode):
    """The ops an eager forward ran, with their floating input dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((func.overloadpacket.__name__, _dtypes(args)))
        return func(*args, **(kwargs or {}))


def _dtypes(args) -> tuple:
    out = []
    for a in args:
        t = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            out.append(t.dtype)
    return tuple(out)


def _graph_ops(gm) -> list[tuple[str, tuple]]:
    return [(n.target.overloadpacket.__name__, _dtypes(n.args)) for n in gm.graph.nodes
            if n.op == "call_function" and hasattr(n.target, "overloadpacket")]


def _transformer_block():
    """Two pre-LN encoder layers (nn.MultiheadAttention inside), no dropout, as a task."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    task = types.SimpleNamespace(model=model, loss_fn=lambda out, y: torch.nn.functional.mse_loss(out, y))
    return task, torch.randn(2, 8, 64), torch.randn(2, 8, 64)


@pytest.mark.parametrize("engine", ["dispatcher", "python"])
@pytest.mark.parametrize("placement", ["around", "inside"])
@pytest.mark.parametrize("name", [*sorted(WORKLOADS), "transformer-block"])
def test_one_graph_no_break_no_recompile_and_the_eager_dtypes(name, placement, engine, monkeypatch, request):
    """Either placement, either engine, from an engine as cold as a fresh process's: the
    policy read, the region made and the per-callable decisions happen while the tracer reads
    the code, once, and leave nothing that differs at the next step. nn.MultiheadAttention
    (the transformer block) traces whole on the dispatcher engine only: on the Python engine
    its ``Tensor.unflatten`` breaks the graph (docs/policies.md)."""
    if engine == "python":
        if name == "transformer-block":
            pytest.skip("the Python engine breaks at nn.MultiheadAttention's unflatten (documented)")
        request.getfixturevalue("python_engine")
    task, x, y = _transformer_block() if name == "transformer-block" else _task(name)
    _cold(monkeypatch)
    compiled, graphs = _compiled_steps(task, x, y, placement=placement)
    breaks = dict(counters["graph_break"])
    assert breaks == {}, list(breaks)[:3]
    # 3 steps, 3 regions: one graph, compiled once
    assert counters["stats"]["unique_graphs"] == 1 and len(graphs) == 1
    task.model.zero_grad(set_to_none=True)
    with _AtenOps() as eager, torch.no_grad(), autocast("cpu", dtype=torch.bfloat16):
        out = task.model(x)
        loss = task.loss_fn(out, y)
    # An audit of the compiled graph: its matmuls, convolutions and loss ops, in order, take
    # the dtypes the eager forward's took. (It found F.cross_entropy's log-softmax in bf16 once:
    # torch.compile does not route torch._C._nn.cross_entropy_loss to torch function modes.)
    ours = [op for op in _graph_ops(graphs[0]) if op[0] in COMPUTE]
    assert ours and ours == [op for op in eager.ops if op[0] in COMPUTE]
    assert (compiled[0][1].dtype, compiled[0][0].dtype) == (out.dtype, loss.dtype)
    # the workloads end in a matmul (bf16); the block in a residual add of fp32 and bf16
    assert out.dtype is (torch.float32 if name == "transformer-block" else torch.bfloat16)
    assert loss.dtype is torch.float32
    torch.testing.assert_close(compiled[0][0], loss.detach(), rtol=2e-2, atol=2e-2)


def test_the_counters_can_fail(monkeypatch, python_engine):
    """Without the per-callable decisions made ahead of the tracer, the trace
    must call code it cannot trace: the same counters report the breaks."""
    task, x, y = _task("digits")
    monkeypatch.setattr(torch_autocast._TRACING, "names", {})
    monkeypatch.setattr(torch_autocast._TRACING, "traced_clones", {})
    _compiled_steps(task, x, y, steps=1, placement="inside")
    # the trace cannot go on: a graph break, or (inside a region's with-block, where Dynamo
    # cannot break) the frame given back to eager as unimplemented
    assert sum(counters["graph_break"].values()) > 0 or sum(counters["unimplemented"].values()) > 0


def test_the_eager_paths_inside_a_trace_would_recompile_every_step(monkeypatch, python_engine):
    """What the engine does differently under compile is what keeps one graph:
    taking its eager paths inside the trace (the weight-cast cache keyed by id(),
    the cast counter, the growing name cache) recompiles or breaks."""
    task, x, y = _task("digits")
    monkeypatch.setattr(torch_autocast, "_compiling", lambda: False)
    _compiled_steps(task, x, y, steps=3, placement="inside")
    assert counters["stats"]["unique_graphs"] > 1 or sum(counters["graph_break"].values()) > 0


# --------------------------------------------------------------------------- the whole step, with the loss scaler


def _whole_step(workload: str, engine: str, sync_free: bool = True, steps: int = 4, overflow_at: int = 2):
    """The training step as users write it, compiled as one function: zero_grad, the
    autocast region (made inside), forward and loss, ``scaler.scale(loss).backward()``,
    ``scaler.step(opt)``, ``scaler.update()``; torch.autocast and GradScaler (``native``)
    or ampcert's autocast and DynamicLossScaler. The first step runs eagerly (it creates
    the optimizer's state), then ``steps`` compiled ones; at ``overflow_at`` the loss is
    multiplied by inf instead of 1 (a tensor argument: no recompile), so its gradients
    overflow. Returns the graph breaks, the graph
    count after each compiled step, whether the overflowing step left the parameters and
    the optimizer's state as they were, bit for bit, and the scaler."""
    if engine == "ampcert" and torch_version() < REGION_IN_TRACE_MIN:
        pytest.skip(f"a region inside a compiled step needs torch {release_name(REGION_IN_TRACE_MIN)}+ (amp/torch/support.py); "
                    "the harness refuses `scope: step` here")
    torch.manual_seed(0)
    task, x, y = _task(workload)
    model, opt = task.model, task.make_optimizer(task.model.parameters())
    if engine == "native":
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        region = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    else:
        scaler = DynamicLossScaler("cpu", init_scale=2.0**10, growth_interval=2, sync_free=sync_free)
        region = lambda: autocast("cpu", dtype=torch.bfloat16)  # noqa: E731

    def train_step(x, y, poison):
        opt.zero_grad(set_to_none=True)
        with region():
            loss = task.loss_fn(model(x), y) * poison
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    one, inf = torch.tensor(1.0), torch.tensor(float("inf"))
    train_step(x, y, one)
    torch._dynamo.reset()
    counters.clear()
    run = torch.compile(train_step, backend="eager")
    graphs, kept = [], None

    def tensors() -> list[torch.Tensor]:  # the parameters and the optimizer's state tensors
        return [*model.parameters(), *(v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))]

    for step in range(steps):
        before = [v.detach().clone() for v in tensors()]
        run(x, y, inf if step == overflow_at else one)
        if step == overflow_at:
            kept = all(torch.equal(a, b) for a, b in zip(before, tensors(), strict=True))
        graphs.append(counters["stats"]["unique_graphs"])
    return sum(counters["graph_break"].values()), graphs, kept, scaler, [p.detach() for p in model.parameters()]


WHOLE_STEP = ("digits", "gpt")  # a CNN and a transformer, as a user's step trains them


@pytest.fixture(scope="module")
def native_whole_step() -> dict[str, tuple[int, int]]:
    """torch.autocast + GradScaler's graph breaks and graphs, per workload."""
    return {workload: (breaks, graphs[-1]) for workload in WHOLE_STEP
            for breaks, graphs, *_ in [_whole_step(workload, "native")]}


@pytest.mark.parametrize("sync_free", [True, False], ids=["sync_free", "syncing"])
@pytest.mark.parametrize("workload", WHOLE_STEP)
def test_the_whole_step_compiles_with_no_more_breaks_or_graphs_than_gradscalers(workload, sync_free,
                                                                                native_whole_step):
    breaks, graphs, kept, scaler, params = _whole_step(workload, "ampcert", sync_free)
    native_breaks, native_graphs = native_whole_step[workload]
    assert 0 < breaks <= native_breaks, (dict(counters["graph_break"]), native_whole_step)
    assert graphs[-1] <= native_graphs, (graphs, native_whole_step)
    assert graphs[-1] == graphs[0]  # traced at the first compiled step, never again
    # The step whose gradients overflowed was skipped, as eagerly (sync-free: stepped, then
    # undone on the device): parameters and optimizer state kept bit for bit, and the scale
    # trajectory of the same steps run eagerly. (Parameters are not compared with the eager
    # run's: torch.optim's compiled step rounds differently, e.g. AdamW's.)
    assert kept
    assert scaler.trajectory()["skipped_steps"] == [3]  # the eager first step is step 0
    eager = DynamicLossScaler("cpu", init_scale=2.0**10, growth_interval=2, sync_free=sync_free)
    torch.manual_seed(0)
    task, x, y = _task(workload)
    opt = task.make_optimizer(task.model.parameters())
    for step in range(5):
        opt.zero_grad(set_to_none=True)
        with autocast("cpu", dtype=torch.bfloat16):
            loss = task.loss_fn(task.model(x), y) * (float("inf") if step == 3 else 1.0)
        eager.scale(loss).backward()
        eager.step(opt)
        eager.update()
    assert scaler.trajectory() == eager.trajectory()
    assert all(torch.equal(a, b) for a, b in zip(params, task.model.parameters(), strict=True))


def test_the_scalers_step_traced_would_add_graphs_to_the_whole_step(monkeypatch, native_whole_step):
    """The counts can fail: the scaler's step traced (its inf check, snapshot and undo around
    the optimizer's eager step), not run eagerly as GradScaler's, falls into more graphs."""
    step = DynamicLossScaler.step
    monkeypatch.setattr(DynamicLossScaler, "step", getattr(step, "__wrapped__", step))
    breaks, graphs, *_ = _whole_step("digits", "ampcert", sync_free=True)
    assert graphs[-1] > native_whole_step["digits"][1], (graphs, native_whole_step)


# --------------------------------------------------------------------------- numerics, compiled


def test_compiled_ampcert_trains_like_compiled_native():
    """Same seed, same batches, both compiled: the loss trajectories agree
    within the default pack's parity margin (0.02)."""
    curves = {}
    for engine in ("native", "ampcert"):
        task, x, y = _task("digits")  # the same seeded model each time
        opt = task.make_optimizer(task.model.parameters())
        torch._dynamo.reset()
        step = torch.compile(lambda x, y, task=task: task.loss_fn(task.model(x), y), backend="aot_eager")
        region = (torch.autocast("cpu", dtype=torch.bfloat16) if engine == "native"
                  else autocast("cpu", dtype=torch.bfloat16))
        losses = []
        for _ in range(10):
            opt.zero_grad(set_to_none=True)
            with region:
                loss = step(x, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves[engine] = torch.tensor(losses)
    assert curves["native"][-1] < curves["native"][0]  # it trains
    torch.testing.assert_close(curves["ampcert"], curves["native"], rtol=0, atol=0.02)


def test_a_policy_is_read_once_and_kept_by_its_content(tmp_path):
    """An autocast made each step, or a policy file read again, finds the policy object read
    before and reuses its region: what keeps a trace's guards holding (a fresh object each
    step would recompile each step), and what keeps the regions from growing step by step.
    A file whose content changed is a policy of its own."""
    from ampcert.amp.policy import shipped_policy

    assert autocast("cpu").policy is autocast("cpu").policy is torch_autocast._POLICIES[
        shipped_policy("cpu").effective_sha256]
    path = tmp_path / "fp32-softmax.yaml"
    path.write_text("name: fp32-softmax\nextends: torch-cpu\noverrides:\n  softmax: fp32\n")
    first = autocast("cpu", policy=path)
    with first:
        pass
    regions = len(torch_autocast._REGIONS)
    for _ in range(3):
        again = autocast("cpu", policy=str(path))
        with again:
            pass
        assert again.policy is first.policy
    assert len(torch_autocast._REGIONS) == regions
    path.write_text("name: fp32-softmax\nextends: torch-cpu\noverrides:\n  softmax: fp32\n  log_softmax: fp32\n")
    changed = autocast("cpu", policy=path).policy
    assert changed is not first.policy and changed.effective_sha256 != first.policy.effective_sha256


def _region_break(x):
    with autocast("cpu", dtype=torch.bfloat16):
        y = x @ x
        torch._dynamo.graph_break()  # inside a with-block: Dynamo gives the frame back to eager
        z = y @ x
    return y, z


def test_a_graph_break_inside_the_region_keeps_the_region_and_leaves_nothing_open():
    """The frame given back to eager enters the region eagerly (its entry is never compiled
    as a frame of its own, where native autocast's state would not outlive the graph), and
    what the stopped trace opened is closed when the compile ends."""
    torch._dynamo.reset()
    x = torch.randn(4, 4)
    compiled = torch.compile(_region_break, backend="aot_eager")(x)
    eager = _region_break(x)
    assert [t.dtype for t in compiled] == [t.dtype for t in eager] == [torch.bfloat16] * 2
    assert all(torch.equal(a, b) for a, b in zip(compiled, eager, strict=True))
    state = torch_autocast._STATE
    assert state.stack == [] and state.kernel_regions == {} and not torch.is_autocast_enabled("cpu")


def test_a_trace_that_fails_inside_the_region_leaves_no_region_open():
    from ampcert.amp.policy import shipped_policy

    fp32_linear = shipped_policy("cpu").with_overrides({"linear": "fp32"})

    def f(x, w):
        with autocast("cpu", dtype=torch.bfloat16, policy=fp32_linear):
            y = torch.nn.functional.linear(x, w)
            torch._dynamo.graph_break()
        return y

    torch._dynamo.reset()
    # Where Dynamo cannot trace a region's entry (torch 2.11: amp/torch/support.py), the trace
    # fails before the region opens, on the policy passed in or on ampcert's refusal.
    fails = "graph_break|Graph break|graph break" if torch_version() >= REGION_IN_TRACE_MIN else \
        "frozen dataclass|Observed exception"
    with pytest.raises(Exception, match=fails):
        torch.compile(f, backend="aot_eager", fullgraph=True)(torch.randn(2, 4), torch.randn(3, 4))
    state = torch_autocast._STATE
    assert state.stack == [] and state.kernel_regions == {} and state.trace_base is None
    linear = next(line for line in torch._C._dispatch_dump("aten::linear").splitlines()
                  if line.startswith("AutocastCPU:"))
    assert "torch_autocast_kernels" not in linear  # native's kernel is back


def test_on_the_python_engine_a_transformer_block_compiled_gives_the_eager_values(python_engine):
    """The Python engine cannot trace nn.MultiheadAttention (its unflatten), so Dynamo gives
    the frame back to eager: the region and the mode's calls then run as plain Python (never
    compiled as frames of their own, where the mode's dispatch returned wrong values), with
    the eager run's result and nothing left open."""
    task, x, _ = _transformer_block()
    task.model.eval()

    def f(x):
        with autocast("cpu", dtype=torch.bfloat16):
            return task.model(x).float().sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager")(x)
    assert isinstance(compiled, torch.Tensor) and torch.equal(compiled, f(x))
    assert torch_autocast._STATE.stack == [] and not torch._C._is_torch_function_mode_enabled()
