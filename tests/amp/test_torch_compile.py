"""ampcert's torch autocast under torch.compile: every shipped torch workload's
forward and loss trace into one graph with no graph break and no recompile
from step to step, compute the same dtypes as eagerly, and the counters that
say so can fail.

Counted through torch._dynamo's own counters (``graph_break``, ``stats``),
with the ``eager`` backend: Dynamo's tracing is what is under test, not
Inductor's code generation, and the eager backend keeps these tests fast.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from ampcert.amp import policy as policy_module
from ampcert.amp import torch_autocast, torch_scaler_step
from ampcert.amp.torch_autocast import autocast
from ampcert.amp.torch_scaler import DynamicLossScaler
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


@pytest.mark.parametrize("placement", ["around", "inside"])
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_one_graph_no_break_no_recompile_and_the_eager_dtypes(name, placement, monkeypatch):
    """Either placement, from an engine as cold as a fresh process's: the policy read, the
    region made and the per-callable decisions happen while the tracer reads the code, once,
    and leave nothing that differs at the next step."""
    task, x, y = _task(name)
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
    assert (compiled[0][1].dtype, compiled[0][0].dtype) == (out.dtype, loss.dtype) == (torch.bfloat16, torch.float32)
    torch.testing.assert_close(compiled[0][0], loss.detach(), rtol=2e-2, atol=2e-2)


def test_the_counters_can_fail(monkeypatch):
    """Without the per-callable decisions made ahead of the tracer, the trace
    must call code it cannot trace: the same counters report the breaks."""
    task, x, y = _task("digits")
    monkeypatch.setattr(torch_autocast._TRACING, "names", {})
    monkeypatch.setattr(torch_autocast._TRACING, "traced_clones", {})
    _compiled_steps(task, x, y, steps=1)
    assert sum(counters["graph_break"].values()) > 0


def test_the_eager_paths_inside_a_trace_would_recompile_every_step(monkeypatch):
    """What the engine does differently under compile is what keeps one graph:
    taking its eager paths inside the trace (the weight-cast cache keyed by id(),
    the cast counter, the growing name cache) recompiles or breaks."""
    task, x, y = _task("digits")
    monkeypatch.setattr(torch_autocast, "_compiling", lambda: False)
    _compiled_steps(task, x, y, steps=3)
    assert counters["stats"]["unique_graphs"] > 1 or sum(counters["graph_break"].values()) > 0


# --------------------------------------------------------------------------- the loss scaler


def own_graph_breaks() -> list[str]:
    """Graph breaks other than torch.optim's deliberate ones (Optimizer.step's
    ``_use_grad`` wrapper calls ``torch._dynamo.graph_break()`` before and after
    the step, so that AOTAutograd sees a no-grad graph; any compiled
    optimizer step has them, with or without a scaler)."""
    return [reason.splitlines()[0] for reason in counters["graph_break"]
            if "torch._dynamo.graph_break()" not in reason]


def _train(compiled: bool, workload: str, steps: int = 5, overflow_at: int = 3):
    """A shipped workload's own model, optimizer and loss, ampcert's autocast (bf16)
    and the sync-free scaler; ``update`` (scaler step and update) compiled or not."""
    torch.manual_seed(0)
    task, x, y = _task(workload)
    model, opt = task.model, task.make_optimizer(task.model.parameters())
    scaler = DynamicLossScaler("cpu", init_scale=2.0**10, growth_interval=2, sync_free=True)

    def update():
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    torch._dynamo.reset()
    counters.clear()
    run = torch.compile(update, backend="eager")
    graphs, undone = [], None
    for step in range(steps):
        with autocast("cpu", dtype=torch.bfloat16):
            loss = task.loss_fn(model(x), y)
        scaler.scale(loss).backward()
        if step == overflow_at:
            next(model.parameters()).grad.view(-1)[0] = float("inf")
            before = [p.detach().clone() for p in model.parameters()]
            state = [t.clone() for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        # The first step runs eagerly, as ampcert's training loop runs it: it creates the
        # optimizer's state, which needs one host decision (torch_scaler_step's module doc).
        (run if compiled and step > 0 else update)()
        if step == overflow_at:  # the overflowing step was undone: parameters and optimizer state
            after = [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
            undone = all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)) and \
                all(torch.equal(a, b) for a, b in zip(state, after, strict=True))
        graphs.append(counters["stats"]["unique_graphs"])
    return undone, scaler, graphs, type(opt).__name__


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_the_sync_free_scaler_compiles_without_breaks_or_recompiles_of_its_own(workload):
    undone, scaler, graphs, optimizer = _train(True, workload)
    assert own_graph_breaks() == []
    assert graphs[1] > 0 and graphs[-1] == graphs[1]  # traced at the first compiled step, never again
    # Compiled, the scaler does what it does eagerly: the overflow step undone on the device,
    # bit for bit, and the same scale trajectory. (Parameters are not compared with the eager
    # run's: torch.optim's compiled step rounds differently, e.g. AdamW's, by up to 6e-4 on
    # gpt after two steps with no scaler at all.)
    assert undone, optimizer
    eager_undone, eager_scaler, _, _ = _train(False, workload)
    assert eager_undone and scaler.trajectory() == eager_scaler.trajectory()
    assert scaler.trajectory()["skipped_steps"] == [3], optimizer


def test_a_host_sync_put_back_into_the_scaler_is_a_graph_break(monkeypatch):
    combine = torch_scaler_step.combined_found_inf

    def with_item(found_inf_per_device, device):
        total = combine(found_inf_per_device, device)
        if total.item():  # GradScaler's question to the host, back in the step
            pass
        return total

    monkeypatch.setattr(torch_scaler_step, "combined_found_inf", with_item)
    _train(True, "digits")
    assert any("item()" in reason for reason in own_graph_breaks()), own_graph_breaks()


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
