"""ampcert's own optimizers for precision recipes (amp/recipes.py): SGD and AdamW whose
update is computed in fp32, whatever the weights' dtype, with the optimizer's state
kept in a dtype of its own and the new weights written back to the nearest value of
the weights' dtype or, for bf16 weights, stochastically rounded.

They do what torchao's ``_AdamW(bf16_stochastic_round=True)`` does (the tests hold
:class:`AdamW` to torchao's ``single_param_adam`` bit for bit, run eagerly with the
same random numbers), without torch.compile: torchao compiles the update once per
parameter shape, which costs a CPU run more than its training. torchao has no SGD;
:class:`SGD` is ``torch.optim.SGD``'s (momentum, dampening 0, L2 weight decay added to
the gradient) in fp32.

:func:`stochastic_round_bf16` is torchao's rounding: the 16 bits bf16 drops, read as
an integer, against a uniform random integer below 2**16; the bf16 value away from
zero with the probability of the dropped fraction, so that the expected result is the
fp32 input, and an update too small for one bf16 step still moves the weight in
expectation (round to nearest would lose it every time).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from ..precision import dtype_name

STATE_DTYPES = ("fp32", "bf16")  # what ampcert's own optimizers keep their state in; int8 is torchao's


def stochastic_round_bf16(x: Tensor) -> Tensor:
    """``x`` (fp32) to bf16, rounded up or down at random with the probabilities that
    keep its expectation (see the module docstring); draws from torch's generator."""
    rand = torch.randint(0, 1 << 16, x.shape, device=x.device, dtype=torch.int32)
    bits = x.view(torch.int32)
    toward_zero = bits & -65536  # 0xFFFF0000: the bf16 bits
    rounded = torch.where(rand < (bits & 0xFFFF), toward_zero + 0x10000, toward_zero)
    return rounded.view(torch.float32).to(torch.bfloat16)


class _RecipeOptimizer(torch.optim.Optimizer):
    """The shared part: the state's dtype, the rounding, and writing an fp32 result back."""

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], *, state_dtype: str = "fp32",
                 stochastic_round: bool = False) -> None:
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype {state_dtype!r}: expected one of {list(STATE_DTYPES)}")
        super().__init__(params, defaults)
        self.state_dtype = getattr(torch, dtype_name(state_dtype))
        self.stochastic_round = stochastic_round

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's loading casts every floating state tensor to its parameter's dtype (fp32
        moments beside fp32 master weights); they go back to the state's own dtype, exactly
        (the values were that dtype's), or the update would no longer round through it and
        a resumed run would drift from the one that never stopped."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for name, value in state.items():
                if name != "step" and isinstance(value, Tensor) and value.is_floating_point():
                    state[name] = value.to(self.state_dtype)

    def _buffer(self, p: Tensor) -> Tensor:
        return torch.zeros_like(p, dtype=self.state_dtype, memory_format=torch.preserve_format)

    def _write(self, p: Tensor, value_f32: Tensor) -> None:
        """The new weights, computed in fp32, into ``p`` in its own dtype."""
        if self.stochastic_round and p.dtype == torch.bfloat16:
            p.copy_(stochastic_round_bf16(value_f32))
        else:
            p.copy_(value_f32)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: Tensor, group: dict[str, Any]) -> None:
        raise NotImplementedError


class SGD(_RecipeOptimizer):
    """``torch.optim.SGD`` (momentum, L2 weight decay; no dampening, no Nesterov) in fp32,
    with its momentum buffer in ``state_dtype``."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0,
                 *, state_dtype: str = "fp32", stochastic_round: bool = False) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay},
                         state_dtype=state_dtype, stochastic_round=stochastic_round)

    def _update(self, p: Tensor, group: dict[str, Any]) -> None:
        lr, momentum, decay = float(group["lr"]), group["momentum"], group["weight_decay"]
        p_f32, grad = p.float(), p.grad.float()
        if decay:
            grad = grad + decay * p_f32
        if momentum:
            state = self.state[p]
            if "momentum_buffer" not in state:  # torch's first step: the buffer is the gradient
                buf = grad
            else:
                buf = state["momentum_buffer"].float() * momentum + grad
            state["momentum_buffer"] = buf.to(self.state_dtype)
            grad = buf
        self._write(p, p_f32 - lr * grad)


class AdamW(_RecipeOptimizer):
    """AdamW as torchao's ``single_param_adam`` computes it (decoupled decay; both moments
    by ``lerp``; the bias corrections from the step count), in fp32, with both moments
    in ``state_dtype``."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, state_dtype: str = "fp32",
                 stochastic_round: bool = False) -> None:
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay},
                         state_dtype=state_dtype, stochastic_round=stochastic_round)

    def _update(self, p: Tensor, group: dict[str, Any]) -> None:
        # lr as an fp32 tensor, as torchao holds it: the products with it round as torchao's do
        lr, (beta1, beta2) = torch.as_tensor(group["lr"], dtype=torch.float32), group["betas"]
        decay, eps = group["weight_decay"], group["eps"]
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"], state["exp_avg_sq"] = self._buffer(p), self._buffer(p)
        state["step"] += 1
        step = state["step"]
        p_f32, grad = p.float(), p.grad.float()
        p_f32 = p_f32 - lr * decay * p_f32
        correction1, correction2 = 1 - beta1**step, 1 - beta2**step
        exp_avg = state["exp_avg"].float().lerp(grad, 1 - beta1)
        exp_avg_sq = state["exp_avg_sq"].float().lerp(grad.square(), 1 - beta2)
        state["exp_avg"].copy_(exp_avg)
        state["exp_avg_sq"].copy_(exp_avg_sq)
        denom = exp_avg_sq.sqrt() / correction2.sqrt() + eps
        self._write(p, p_f32 - lr * (exp_avg / correction1) / denom)


def recipe_optimizer(optimizer: torch.optim.Optimizer, *, state_dtype: str, stochastic_round: bool
                     ) -> torch.optim.Optimizer:
    """The workload's ``optimizer`` (torch's SGD or AdamW) remade as ampcert's, with the same
    parameter groups and hyperparameters, its state in ``state_dtype``; ``state_dtype``
    ``"int8"`` is torchao's AdamW8bit (blockwise 8-bit moments; AdamW only). Raises
    ValueError, naming the optimizer, for one it cannot remake (its hyperparameters would
    not carry over)."""
    groups = [dict(group) for group in optimizer.param_groups]
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.SGD):
        d = optimizer.defaults
        if d.get("nesterov") or d.get("dampening") or d.get("maximize"):
            raise ValueError("torch.optim.SGD with nesterov, dampening or maximize: the recipe's SGD has none")
        if state_dtype == "int8":
            raise ValueError("8-bit optimizer state is torchao's AdamW8bit: the workload trains with SGD")
        return SGD(groups, lr=d["lr"], momentum=d["momentum"], weight_decay=d["weight_decay"],
                   state_dtype=state_dtype, stochastic_round=stochastic_round)
    if isinstance(optimizer, torch.optim.AdamW):
        d = optimizer.defaults
        if d.get("amsgrad") or d.get("maximize"):
            raise ValueError("torch.optim.AdamW with amsgrad or maximize: the recipe's AdamW has neither")
        if state_dtype == "int8":
            from torchao.optim import AdamW8bit

            return AdamW8bit(groups, lr=d["lr"], betas=d["betas"], eps=d["eps"], weight_decay=d["weight_decay"],
                             bf16_stochastic_round=stochastic_round)
        return AdamW(groups, lr=d["lr"], betas=d["betas"], eps=d["eps"], weight_decay=d["weight_decay"],
                     state_dtype=state_dtype, stochastic_round=stochastic_round)
    raise ValueError(f"the workload trains with {name}; a recipe that replaces the optimizer remakes "
                     "torch.optim.SGD or torch.optim.AdamW only")


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes the optimizer's state holds: every tensor in it, a tensor subclass (torchao's
    8-bit state) counted by the plain tensors it is made of. A step count is a tensor too."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, Tensor):
                total += tensor_bytes(value)
    return total


def tensor_bytes(t: Tensor) -> int:
    """The bytes ``t`` holds; a wrapper subclass (``__tensor_flatten__``) by its inner tensors."""
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None and type(t) is not Tensor and not isinstance(t, torch.nn.Parameter):
        names, _ = flatten()  # a DTensor also names its mesh: only the tensors hold bytes
        inner = (getattr(t, name) for name in names)
        return sum(tensor_bytes(value) for value in inner if isinstance(value, Tensor))
    return t.numel() * t.element_size()
