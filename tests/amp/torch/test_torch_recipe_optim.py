"""ampcert's own recipe optimizers (amp/torch/recipe_optim.py): torchao's AdamW bit for
bit, torch's SGD, stochastic rounding that keeps the expectation, and state counted in
the bytes it really holds."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ampcert.amp.torch.recipe_optim import (  # noqa: E402
    SGD,
    AdamW,
    recipe_optimizer,
    state_bytes,
    stochastic_round_bf16,
)


def _model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(96, 80), torch.nn.GELU(), torch.nn.Linear(80, 10)).to(dtype)


def _train(model, optimizer, steps=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 96, generator=g).to(next(model.parameters()).dtype)
        y = torch.randint(0, 10, (16,), generator=g)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        optimizer.step()


def test_stochastic_rounding_lands_on_a_neighbour_and_keeps_the_expectation():
    x = torch.full((200_000,), 1.0 + 2**-10, dtype=torch.float32)  # a quarter of the way to the next bf16
    torch.manual_seed(0)
    rounded = stochastic_round_bf16(x).float()
    assert set(rounded.unique().tolist()) == {1.0, 1.0 + 2**-7}
    assert abs(rounded.mean().item() - x[0].item()) < 2e-5  # round to nearest would give 1.0 every time
    assert abs((rounded > 1).float().mean().item() - 0.125) < 0.005
    exact = torch.tensor([1.5, -3.0, 0.0])  # bf16 numbers stay what they are
    assert torch.equal(stochastic_round_bf16(exact).float(), exact)


def test_adamw_with_bf16_weights_is_torchaos_update_bit_for_bit():
    """torchao's single_param_adam, run eagerly, on the same weights, gradients and random numbers."""
    pytest.importorskip("torchao")
    from torchao.optim.adam import single_param_adam

    ours, theirs = _model(torch.bfloat16), _model(torch.bfloat16)
    opt = AdamW(ours.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, state_dtype="bf16",
                stochastic_round=True)
    state = {p: (torch.tensor(0.0), torch.zeros_like(p), torch.zeros_like(p)) for p in theirs.parameters()}
    g = torch.Generator().manual_seed(3)
    for step in range(5):
        x, y = torch.randn(16, 96, generator=g).bfloat16(), torch.randint(0, 10, (16,), generator=g)
        for m in (ours, theirs):
            m.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(m(x).float(), y).backward()
        torch.manual_seed(100 + step)
        opt.step()
        torch.manual_seed(100 + step)
        with torch.no_grad():
            for p in theirs.parameters():
                count, exp_avg, exp_avg_sq = state[p]
                count += 1
                single_param_adam(p.detach(), p.grad, count, exp_avg, exp_avg_sq, None,
                                  torch.tensor(3e-3), 0.9, 0.95, 0.1, 1e-8, True, True)
        for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert torch.equal(a, b), f"step {step + 1}"
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(opt.state[p]["exp_avg"], state[q][1])
        assert torch.equal(opt.state[p]["exp_avg_sq"], state[q][2])


def test_sgd_in_fp32_is_torchs_sgd_and_keeps_its_momentum_in_the_state_dtype():
    ours, theirs = _model(), _model()
    _train(ours, SGD(ours.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3))
    _train(theirs, torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3))
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    half = _model()
    opt = SGD(half.parameters(), lr=0.05, momentum=0.9, state_dtype="bf16")
    _train(half, opt)
    assert {s["momentum_buffer"].dtype for s in opt.state.values()} == {torch.bfloat16}
    assert {p.dtype for p in half.parameters()} == {torch.float32}  # fp32 master weights


def test_bf16_true_sr_learns_where_round_to_nearest_loses_every_update():
    """Weights near 4 (bf16's step there: 2**-5) with updates of about 1e-4."""
    def run(stochastic):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.full((1000,), 4.0, dtype=torch.bfloat16))
        opt = SGD([w], lr=1e-4, stochastic_round=stochastic)
        for _ in range(200):
            w.grad = torch.full_like(w, -1.0)  # every step asks for +1e-4
            opt.step()
        return w.float().mean().item()

    assert run(stochastic=False) == 4.0  # 200 updates, all lost
    assert abs(run(stochastic=True) - (4.0 + 200 * 1e-4)) < 2e-3


def test_recipe_optimizer_remakes_the_workloads_optimizer_with_its_groups():
    model = _model()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    torch_opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                  lr=2e-3, betas=(0.9, 0.95))
    remade = recipe_optimizer(torch_opt, state_dtype="bf16", stochastic_round=False)
    assert isinstance(remade, AdamW)
    assert [g["weight_decay"] for g in remade.param_groups] == [0.1, 0.0]
    assert [len(g["params"]) for g in remade.param_groups] == [len(decay), len(rest)]
    assert remade.param_groups[0]["betas"] == (0.9, 0.95) and remade.defaults["lr"] == 2e-3
    with pytest.raises(ValueError, match="nesterov"):
        recipe_optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True),
                         state_dtype="bf16", stochastic_round=False)
    with pytest.raises(ValueError, match="trains with SGD"):
        recipe_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), state_dtype="int8", stochastic_round=False)
    with pytest.raises(ValueError, match="trains with Adagrad"):
        recipe_optimizer(torch.optim.Adagrad(model.parameters()), state_dtype="bf16", stochastic_round=False)


def test_state_bytes_count_what_the_state_holds():
    fp32, bf16 = _model(), _model()
    a, b = torch.optim.AdamW(fp32.parameters()), AdamW(bf16.parameters(), state_dtype="bf16")
    _train(fp32, a, steps=1)
    _train(bf16, b, steps=1)
    n = sum(p.numel() for p in fp32.parameters())
    steps = 4 * len(a.state)  # one fp32 step count per parameter tensor
    assert state_bytes(a) == 8 * n + steps
    assert state_bytes(b) == 4 * n + steps


def test_a_loaded_state_keeps_its_own_dtype_and_the_updates_that_follow_are_the_same():
    """torch's Optimizer.load_state_dict casts the moments to the parameters' fp32: the
    recipe's optimizer holds them in bf16 again, so a resumed run goes on as it was."""
    def train(steps, resume_at=None):
        model = _model()
        opt = AdamW(model.parameters(), lr=1e-3, state_dtype="bf16")
        g = torch.Generator().manual_seed(7)
        for step in range(steps):
            if step == resume_at:
                saved = opt.state_dict()
                opt = AdamW(model.parameters(), lr=1e-3, state_dtype="bf16")
                opt.load_state_dict(saved)
            x, y = torch.randn(16, 96, generator=g), torch.randint(0, 10, (16,), generator=g)
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return model, opt

    straight, _ = train(6)
    resumed, opt = train(6, resume_at=3)
    assert {s["exp_avg"].dtype for s in opt.state.values()} == {torch.bfloat16}
    assert all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters(), strict=True))
