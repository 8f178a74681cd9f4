"""Tests for ampcert.amp.torch.scaler.DynamicLossScaler against torch.amp.GradScaler.

Everything runs on CPU with real torch optimizers and GradScaler as the oracle.
"""

from __future__ import annotations

import copy
import math
import pickle
import random
from array import array

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ampcert.amp.torch.scaler import DynamicLossScaler

INF = float("inf")
UNBOUNDED = dict(min_scale=0.0, max_scale=INF)
SYNC_MODES = [pytest.param(True, id="sync_free"), pytest.param(False, id="syncing")]


def make(sync_free: bool, **kw) -> DynamicLossScaler:
    return DynamicLossScaler("cpu", sync_free=sync_free, **kw)


class HostReads(TorchDispatchMode):
    """Counts device->host scalar reads (.item(), bool(), float() all lower to this op)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


# --------------------------------------------------------------------------- 1. conformance
N_STEPS = 10_000
INTERVAL = 3
COLLAPSE = 400  # final run of overflows: GradScaler's scale collapses to exactly 0


def _plan(seed: int = 1234) -> list:
    """Per step: None (clean), 'inf' / '-inf' / 'nan' (inject), or 'boundary'
    (inject inf only if this step would otherwise grow the scale)."""
    rng = random.Random(seed)
    probs = [0.0, 0.02, 0.1, 0.25, 0.05, 0.35, 0.0, 0.15]  # overflow rate per 500-step phase
    bad = ["inf", "-inf", "nan"]
    plan: list = []
    while len(plan) < N_STEPS - COLLAPSE:
        p = probs[(len(plan) // 500) % len(probs)]
        r = rng.random()
        if r < 0.004:
            plan += [rng.choice(bad) for _ in range(rng.randint(2, 40))]
        elif r < 0.054:
            plan.append("boundary")
        else:
            plan.append(rng.choice(bad) if rng.random() < p else None)
    return plan[: N_STEPS - COLLAPSE] + ["nan", "inf"] * (COLLAPSE // 2)


def _drive(scaler, plan, on_step=None):
    """One-element parameter, SGD(lr=1): the param rises by exactly 1 iff the step ran."""
    p = torch.zeros(1)
    opt = torch.optim.SGD([p], lr=1.0)
    one = torch.full((1,), -1.0)
    scales, trackers, stepped = [], [], []
    for i, kind in enumerate(plan):
        g = scaler.scale(one)
        if kind == "boundary":
            if scaler._get_growth_tracker() == INTERVAL - 1:
                g[0] = INF
        elif kind is not None:
            g[0] = float(kind)
        p.grad = g
        before = p.item()
        scaler.step(opt)
        scaler.update()
        stepped.append(p.item() != before)
        scales.append(scaler.get_scale())
        trackers.append(scaler._get_growth_tracker())
        if on_step is not None:
            on_step(i, scaler)
    return scales, trackers, stepped


@pytest.fixture(scope="module")
def reference_run():
    plan = _plan()
    ref = _drive(torch.amp.GradScaler("cpu", growth_interval=INTERVAL), plan)
    return plan, ref


def test_conformance_schedule_exercises_edge_cases(reference_run):
    plan, (scales, trackers, stepped) = reference_run
    body = N_STEPS - COLLAPSE
    grew_at_boundary_blocked = sum(
        1
        for i, k in enumerate(plan[:body])
        if k == "boundary" and i > 0 and trackers[i - 1] == INTERVAL - 1 and not stepped[i]
    )
    assert grew_at_boundary_blocked >= 50  # overflow exactly when the scale would grow
    assert scales.count(2.0**127) >= 100  # growth capped because 2**128 is inf in fp32
    assert all(math.isfinite(s) for s in scales)
    assert min(scales[:body]) < 1e-6  # deep backoff runs happened...
    assert min(scales[:body]) > 0.0  # ...but no collapse before the final phase
    assert scales[-1] == 0.0  # GradScaler has no floor: it collapses to exactly 0
    assert stepped.count(False) > 2000 and stepped.count(True) > 4000


@pytest.mark.parametrize("sync_free", SYNC_MODES)
def test_conformance_with_gradscaler_10k_steps(reference_run, sync_free):
    plan, (ref_scales, ref_trackers, ref_stepped) = reference_run
    scaler = make(sync_free, growth_interval=INTERVAL, **UNBOUNDED)
    mid = {}

    def on_step(i, s):  # materialise telemetry mid-run, across a chunk boundary
        if i == 4999:
            mid["traj"] = s.trajectory()

    scales, trackers, stepped = _drive(scaler, plan, on_step)
    for name, got, want in [
        ("scale", scales, ref_scales),
        ("growth tracker", trackers, ref_trackers),
        ("skip decision", stepped, ref_stepped),
    ]:
        if got != want:
            i = next(j for j, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            pytest.fail(f"{name} diverges at step {i}: {got[i]} != {want[i]} (plan {plan[i]})")

    traj = scaler.trajectory()
    assert traj["scale"] == ref_scales
    assert traj["skipped_steps"] == [i for i, s in enumerate(ref_stepped) if not s]
    assert traj["found_inf"] == [not s for s in ref_stepped]
    assert mid["traj"]["scale"] == ref_scales[:5000]


# --------------------------------------------------------------------------- 2. bounds
def _overflow_step(scaler, opt, p):
    p.grad = scaler.scale(torch.full_like(p, INF))
    scaler.step(opt)
    scaler.update()


def _clean_step(scaler, opt, p):
    p.grad = scaler.scale(torch.ones_like(p))
    scaler.step(opt)
    scaler.update()


@pytest.mark.parametrize("sync_free", SYNC_MODES)
def test_overflow_run_stops_at_min_scale(sync_free):
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.1)
    ours = make(sync_free, init_scale=2.0**10, min_scale=2.0**-3)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for _ in range(300):
        _overflow_step(ours, opt, p)
        _overflow_step(theirs, opt, p)
    assert ours.get_scale() == 2.0**-3
    assert theirs.get_scale() == 0.0  # the failure mode the floor exists for
    assert min(ours.trajectory()["scale"]) == 2.0**-3
    assert torch.equal(p.detach(), torch.zeros(2))  # every step was skipped
    # Recovery from the floor: clean steps grow the scale again (GradScaler can't).
    for _ in range(ours.get_growth_interval()):
        _clean_step(ours, opt, p)
    assert ours.get_scale() == 2.0**-2


def test_default_floor_is_one():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    s = DynamicLossScaler("cpu", init_scale=8.0)
    for _ in range(10):
        _overflow_step(s, opt, p)
    assert s.get_scale() == 1.0


@pytest.mark.parametrize("sync_free", SYNC_MODES)
def test_growth_stops_at_max_scale(sync_free):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1e-3)
    s = make(sync_free, init_scale=2.0**20, growth_interval=2, max_scale=3.0 * 2**22)
    for _ in range(40):
        _clean_step(s, opt, p)
    assert s.get_scale() == 3.0 * 2**22  # 2**23 would be > max: clamped, not skipped
    assert max(s.trajectory()["scale"]) == 3.0 * 2**22
    assert s.trajectory()["scale"][:4] == [2.0**20, 2.0**21, 2.0**21, 2.0**22]


def test_grown_scale_never_becomes_inf():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    s = DynamicLossScaler("cpu", init_scale=2.0**126, growth_interval=1, **UNBOUNDED)
    for _ in range(5):
        p.grad = torch.zeros(1)  # scale(loss) of a zero loss: finite at any scale
        s.scale(torch.zeros(()))
        s.step(opt)
        s.update()
    assert s.trajectory()["scale"] == [2.0**127] * 5
    assert s._get_growth_tracker() == 0


def test_init_and_manual_scale_are_clamped():
    s = DynamicLossScaler("cpu", init_scale=2.0**30, max_scale=2.0**24, min_scale=4.0)
    assert s.get_scale() == 2.0**24
    s.scale(torch.ones(()))
    s.update(new_scale=0.5)
    assert s.get_scale() == 4.0
    s.update(new_scale=torch.tensor(2.0**40))
    assert s.get_scale() == 2.0**24
    with pytest.raises(ValueError):
        DynamicLossScaler("cpu", min_scale=8.0, max_scale=2.0)


# --------------------------------------------------------------------------- 3. state_dict
def _mixed_plan(n, seed):
    rng = random.Random(seed)
    return [("inf" if rng.random() < 0.2 else None) for _ in range(n)]


@pytest.mark.parametrize("sync_free", SYNC_MODES)
def test_state_dict_round_trip_mid_run(sync_free):
    plan = _mixed_plan(60, seed=7)
    kw = dict(init_scale=2.0**8, growth_interval=2, min_scale=2.0**3, max_scale=2.0**12)

    full = _drive(make(sync_free, **kw), plan)

    k = 23
    first = make(sync_free, **kw)
    _drive(first, plan[:k])
    sd = first.state_dict()
    assert set(sd) >= {"scale", "growth_factor", "backoff_factor", "growth_interval"}
    resumed = make(sync_free)  # default knobs: all of them must come from the dict
    _drive(resumed, ["inf", None, None])  # already-initialised tensors must be overwritten
    resumed.reset_trajectory()
    resumed.load_state_dict(copy.deepcopy(sd))
    assert resumed.state_dict() == sd
    tail = _drive(resumed, plan[k:])
    assert full[0][k:] == tail[0] and full[1][k:] == tail[1] and full[2][k:] == tail[2]


def test_state_dict_interoperates_with_gradscaler():
    ours = DynamicLossScaler("cpu", init_scale=2.0**5, growth_interval=7, **UNBOUNDED)
    theirs = torch.amp.GradScaler("cpu")
    theirs.load_state_dict(ours.state_dict())
    assert theirs.get_scale() == 2.0**5 and theirs.get_growth_interval() == 7
    back = DynamicLossScaler("cpu", min_scale=2.0**6)
    back.load_state_dict(theirs.state_dict())  # no bounds in it: keep ours, clamp
    assert back.get_scale() == 2.0**6 and back.get_growth_interval() == 7


def test_pickle_round_trip_keeps_scale_and_trajectory():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    s = make(True, init_scale=2.0**9)
    _overflow_step(s, opt, p)
    _clean_step(s, opt, p)
    clone = pickle.loads(pickle.dumps(s))
    assert clone.get_scale() == s.get_scale() == 2.0**8
    assert clone.trajectory() == s.trajectory()
    _overflow_step(clone, opt, p)
    assert clone.trajectory()["skipped_steps"] == [0, 2]


def test_a_scaler_pickled_with_the_trajectory_in_the_scaler_still_loads():
    """Before the trajectory had its module (torch_scaler_trajectory), its arrays were
    the scaler's own _traj_* fields; such a pickle loads into a Trajectory."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    s = make(True, init_scale=2.0**9)
    _overflow_step(s, opt, p)
    _clean_step(s, opt, p)
    state = s.__getstate__()
    traj = state.pop("_trajectory")
    state.update(_traj_chunks=[], _traj_fill=0, _traj_scale=array("f", traj._scale),
                 _traj_found=array("b", traj._found), _traj_skipped=array("b", traj._skipped))
    old = DynamicLossScaler.__new__(DynamicLossScaler)
    old.__setstate__(state)
    assert old.trajectory() == s.trajectory() and not any(k.startswith("_traj_") for k in vars(old))
    _overflow_step(old, opt, p)
    assert old.trajectory()["skipped_steps"] == [0, 2]


# --------------------------------------------------------------------------- 4. multi-optimizer
def _two_optimizer_run(scaler, plan):
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(4))
    b = torch.nn.Parameter(torch.randn(3))
    opt_a = torch.optim.SGD([a], lr=0.1, momentum=0.9)
    opt_b = torch.optim.Adam([b], lr=0.01)
    g = torch.Generator().manual_seed(1)
    for bad in plan:
        ga = torch.randn(4, generator=g)
        gb = torch.randn(3, generator=g)
        if "a" in bad:
            ga[1] = INF
        if "b" in bad:
            gb[0] = float("nan")
        a.grad, b.grad = scaler.scale([ga, gb])
        scaler.step(opt_a)
        scaler.step(opt_b)
        scaler.update()
    return a.detach(), b.detach(), opt_a.state_dict(), opt_b.state_dict(), scaler.get_scale()


@pytest.mark.parametrize("sync_free", SYNC_MODES)
def test_multiple_optimizers_match_gradscaler(sync_free):
    # Overflow in the very first step of a only (b still steps: per-optimizer skipping),
    # then b only, then both, with clean steps in between so the scale grows back.
    plan = ["a", "", "", "b", "", "ab", "", "", "", "a", "b", "", "", "", ""]
    ref = _two_optimizer_run(torch.amp.GradScaler("cpu", growth_interval=2), plan)
    ours_scaler = make(sync_free, growth_interval=2, **UNBOUNDED)
    got = _two_optimizer_run(ours_scaler, plan)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    for sd_got, sd_ref in [(got[2], ref[2]), (got[3], ref[3])]:
        assert sd_got["state"].keys() == sd_ref["state"].keys()
        for idx in sd_ref["state"]:
            for key, val in sd_ref["state"][idx].items():
                assert torch.equal(sd_got["state"][idx][key], val), (idx, key)
    assert got[4] == ref[4]
    assert ours_scaler.trajectory()["skipped_steps"] == [0, 3, 5, 9, 10]
    # Adam's step counter counts only b's unskipped steps (15 - 3 overflows of b).
    assert got[3]["state"][0]["step"].item() == 12


# --------------------------------------------------------------------------- 5. clipping
def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 2))


def _clip_run(scaler, steps=12):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    norms = []
    for i in range(steps):
        x = torch.randn(16, 6, generator=g)
        opt.zero_grad()
        loss = model(x).pow(2).sum() * 100.0
        scaler.scale(loss).backward()
        if i == 4:
            model[0].weight.grad[0, 0] = INF
        scaler.unscale_(opt)
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5).item())
        scaler.step(opt)  # must not unscale a second time
        scaler.update()
    return [p.detach().clone() for p in model.parameters()], norms, scaler.get_scale()


@pytest.mark.parametrize("sync_free", SYNC_MODES)
def test_clipping_after_unscale_matches_gradscaler(sync_free):
    ref = _clip_run(torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=3))
    got = _clip_run(make(sync_free, init_scale=2.0**12, growth_interval=3, **UNBOUNDED))
    assert all(torch.equal(a, b) for a, b in zip(got[0], ref[0], strict=True))
    assert got[1][:4] == ref[1][:4] and got[1][5:] == ref[1][5:]  # unscaled norms
    assert all(n > 0.5 for n in ref[1][:4])  # clipping was active
    assert got[2] == ref[2]


# --------------------------------------------------------------------------- 6. errors
def _setup(scaler, dtype=torch.float32):
    p = torch.nn.Parameter(torch.zeros(2, dtype=dtype))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = scaler.scale(torch.ones(2, dtype=dtype))
    return p, opt


def _error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return type(e), str(e)
    return None, ""


SCENARIOS = {
    "unscale_twice": lambda s, o: (s.unscale_(o), s.unscale_(o)),
    "step_twice": lambda s, o: (s.step(o), s.step(o)),
    "unscale_after_step": lambda s, o: (s.step(o), s.unscale_(o)),
    "update_without_step": lambda s, o: s.update(),
    "closure": lambda s, o: s.step(o, closure=lambda: 0.0),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("sync_free", SYNC_MODES)
def test_errors_match_gradscaler(name, sync_free):
    theirs = torch.amp.GradScaler("cpu")
    ours = make(sync_free)
    ref_type, ref_msg = _error_of(lambda: SCENARIOS[name](theirs, _setup(theirs)[1]))
    got_type, got_msg = _error_of(lambda: SCENARIOS[name](ours, _setup(ours)[1]))
    assert ref_type is not None and got_type is ref_type
    if ref_type is RuntimeError and "GradScaler" not in ref_msg:
        assert got_msg == ref_msg


def test_fp16_grads_and_missing_grads_raise_like_gradscaler():
    for scaler in (torch.amp.GradScaler("cpu"), make(True)):
        _, opt = _setup(scaler, dtype=torch.float16)
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
            scaler.unscale_(opt)
        q = torch.nn.Parameter(torch.zeros(1))  # no grad at all
        with pytest.raises(AssertionError, match="No inf checks were recorded"):
            scaler.step(torch.optim.SGD([q], lr=0.1))


def test_step_after_scale_is_required():
    s = make(True)
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.ones(1)
    with pytest.raises(AssertionError, match="did not use scaler.scale"):
        s.step(torch.optim.SGD([p], lr=0.1))


# --------------------------------------------------------------------------- 7. trajectory
@pytest.mark.parametrize("sync_free", SYNC_MODES)
def test_trajectory_records_skipped_indices(sync_free):
    bad = {0, 1, 5, 9, 10, 11}
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.Adam([p], lr=0.1)
    s = make(sync_free, init_scale=2.0**10, growth_interval=2)
    expected_scale, scale = [], 2.0**10
    clean_run = 0
    for i in range(14):
        if i in bad:
            _overflow_step(s, opt, p)
            scale, clean_run = scale / 2, 0
        else:
            _clean_step(s, opt, p)
            clean_run += 1
            if clean_run == 2:
                scale, clean_run = scale * 2, 0
        expected_scale.append(scale)
    traj = s.trajectory()
    assert traj["skipped_steps"] == sorted(bad)
    assert traj["found_inf"] == [i in bad for i in range(14)]
    assert traj["scale"] == expected_scale
    assert opt.state[p]["step"].item() == 14 - len(bad)
    # unscale_ without step: inf is found but nothing was skipped
    p.grad = s.scale(torch.full((3,), INF))
    s.unscale_(opt)
    s.update()
    traj = s.trajectory()
    assert traj["found_inf"][-1] is True and 14 not in traj["skipped_steps"]
    s.reset_trajectory()
    assert s.trajectory() == {"scale": [], "found_inf": [], "skipped_steps": []}


# --------------------------------------------------------------------------- 8. training loop
OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True),
}


def _train(scaler, make_opt, steps=40):
    model = _mlp(seed=1)
    opt = make_opt(model.parameters())
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        x = torch.randn(32, 6, generator=g)
        y = torch.randn(32, 2, generator=g)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        loss = (out.float() - y).pow(2).sum() * 50.0
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return model, opt, scaler


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("sync_free", SYNC_MODES)
def test_training_loop_matches_gradscaler(opt_name, sync_free):
    # init_scale near the fp32 limit makes the first steps overflow (before any optimizer
    # state exists) and growth_interval=4 keeps probing into overflow afterwards.
    kw = dict(init_scale=2.0**127, growth_interval=4)
    ref_model, ref_opt, ref_scaler = _train(torch.amp.GradScaler("cpu", **kw), OPTIMIZERS[opt_name])
    model, opt, scaler = _train(make(sync_free, **kw, **UNBOUNDED), OPTIMIZERS[opt_name])
    for a, b in zip(model.parameters(), ref_model.parameters(), strict=True):
        assert torch.equal(a, b)
    sd, ref_sd = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert sd.keys() == ref_sd.keys() and len(sd) == 4
    for idx in ref_sd:
        assert sd[idx].keys() == ref_sd[idx].keys()
        for key in ref_sd[idx]:
            assert torch.equal(sd[idx][key], ref_sd[idx][key]), (idx, key)
    assert scaler.get_scale() == ref_scaler.get_scale()
    skipped = scaler.trajectory()["skipped_steps"]
    assert skipped[:1] == [0] and len(skipped) >= 5  # the loop really exercised skipping


@pytest.mark.parametrize("sync_free", SYNC_MODES)
def test_non_power_of_two_factors_match_gradscaler(sync_free):
    # Scales that are not powers of two make unscaling round: the reciprocal must be
    # computed exactly like GradScaler's (fp64, then fp32) for bitwise equal params.
    kw = dict(init_scale=3.7e4, growth_factor=1.9, backoff_factor=0.37, growth_interval=2)
    ref = _train(torch.amp.GradScaler("cpu", **kw), OPTIMIZERS["sgd_momentum"], steps=60)
    got = _train(make(sync_free, **kw, **UNBOUNDED), OPTIMIZERS["sgd_momentum"], steps=60)
    for a, b in zip(got[0].parameters(), ref[0].parameters(), strict=True):
        assert torch.equal(a, b)
    assert got[2].get_scale() == ref[2].get_scale()
    assert got[2].trajectory()["skipped_steps"]


# --------------------------------------------------------------------------- sync behaviour
def test_sync_free_step_path_reads_nothing_from_the_device():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(0)

    def iteration(scaler, overflow=False):
        opt.zero_grad()
        scaler.scale(model(torch.randn(8, 6, generator=g)).pow(2).sum()).backward()
        if overflow:
            model[2].bias.grad[0] = float("nan")
        scaler.step(opt)
        scaler.update()

    free = make(True, init_scale=2.0**8)
    with HostReads() as first:
        iteration(free)  # SGD creates its momentum buffers: one documented read
    assert first.count == 1
    with HostReads() as steady:
        for i in range(6):
            iteration(free, overflow=(i % 3 == 1))
    assert steady.count == 0
    assert free.trajectory()["skipped_steps"] == [2, 5]

    syncing = make(False, init_scale=2.0**8)
    with HostReads() as eager:
        for _ in range(3):
            iteration(syncing)
    assert eager.count >= 3  # GradScaler-style: one .item() per step


def test_disabled_is_a_pass_through():
    s = DynamicLossScaler("cpu", enabled=False)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=1.0)
    loss = torch.tensor(3.0)
    assert s.scale(loss) is loss
    p.grad = torch.ones(2)
    s.unscale_(opt)
    s.step(opt)
    s.update()
    assert torch.equal(p.detach(), -torch.ones(2))
    assert s.get_scale() == 1.0 and s.state_dict() == {} and not s.is_enabled()
    assert s.trajectory()["scale"] == []


def test_scale_handles_nested_outputs_like_gradscaler():
    outputs = [torch.ones(2), (torch.full((1,), 2.0), [torch.zeros(3)])]
    ours = DynamicLossScaler("cpu", init_scale=4.0)
    theirs = torch.amp.GradScaler("cpu", init_scale=4.0)
    got, ref = ours.scale(outputs), theirs.scale(outputs)
    assert type(got) is list and type(got[1]) is tuple and type(got[1][1]) is list
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1][0], ref[1][0])
    assert list(ours.scale(iter([torch.ones(1)])))[0].item() == 4.0
    with pytest.raises(ValueError):
        ours.scale([1.0])


def test_default_sync_mode_follows_device():
    assert not DynamicLossScaler("cpu").is_sync_free()
    assert DynamicLossScaler("cpu", sync_free=True).is_sync_free()
    if torch.cuda.is_available():
        assert DynamicLossScaler("cuda").is_sync_free()
    else:
        with pytest.warns(UserWarning, match="CUDA is not available"):
            disabled = DynamicLossScaler("cuda")
        assert disabled.is_sync_free() and not disabled.is_enabled()


def test_it_stands_where_a_gradscaler_is_expected():
    """Training libraries check isinstance(scaler, GradScaler); the hooks they may
    call directly keep the bounds and the sync-free step."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = DynamicLossScaler("cpu", init_scale=4.0, min_scale=2.0, sync_free=True)
    assert isinstance(scaler, torch.amp.GradScaler)
    for grad in (1.0, float("inf"), float("inf")):
        scaler.scale(model(torch.ones(1, 4)).sum()).backward()
        model.weight.grad.fill_(grad)
        before = model.weight.detach().clone()
        scaler.unscale_(opt)
        state = scaler._per_optimizer_states[id(opt)]
        scaler._maybe_opt_step(opt, state)  # GradScaler's hook, as a library would call it
        state["stage"] = torch.amp.grad_scaler.OptState.STEPPED
        scaler.update()
        opt.zero_grad()
        assert torch.equal(model.weight, before) == (grad == float("inf"))  # the overflow step undone
    assert scaler.get_scale() == 2.0  # backed off twice from 4, held at the floor
