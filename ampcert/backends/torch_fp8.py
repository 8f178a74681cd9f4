"""An fp8 or mxfp8 run's model: which layers convert, through whose code, and
the eligibility map it records (the harness side of ``amp/torch/fp8.py``).

``amp: ampcert`` swaps eligible layers for ampcert's
:class:`~ampcert.amp.torch.fp8.Fp8Linear` (emulated, or real FP8 through
``torch._scaled_mm`` where the GPU has FP8 tensor cores); ``amp: native``
swaps the same layers for torchao's ``Float8Linear`` / ``MXFP8Linear`` (its
emulation where there are no FP8 units), so the two implementations certify
against each other like the autocast pair does. Either way the layer policy
is ampcert's (:func:`~ampcert.amp.torch.fp8.plan_layers`), and the rest of
the model runs in bf16 autocast.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

import torch

from ampcert.amp.fp8_recipes import Recipe, recipe_for
from ampcert.amp.fp8_screen import EligibilityRecorder
from ampcert.amp.precision import FP8_BASE, Precision, dtype_name
from ampcert.amp.torch.fp8 import (
    LayerPlan,
    LayerPolicy,
    LayerPolicyError,
    convert,
    has_fp8_tensor_cores,
    plan_layers,
)
from ampcert.errors import UserError
from ampcert.spec import Fp8, RunSpec

#: What an fp8 run computes in around (and feeds to) its FP8 layers: bf16 (amp.precision.FP8_BASE).
COMPUTE_DTYPE: torch.dtype = getattr(torch, dtype_name(FP8_BASE))


def policy_of(cfg: Fp8) -> LayerPolicy:
    return LayerPolicy(include=tuple(cfg.include), exclude=tuple(cfg.exclude), first_last=cfg.first_last)


def torchao_installed() -> bool:
    return importlib.util.find_spec("torchao") is not None


def check_layers(model: torch.nn.Module, precision: Precision, cfg: Fp8, where: str) -> list[LayerPlan]:
    """The layer plan, or the one-line UserError naming the layer the policy
    cannot convert (planning calls this, so a bad policy exits 2 before any run)."""
    try:
        return plan_layers(model, recipe_for(precision, cfg.recipe), policy_of(cfg))
    except LayerPolicyError as exc:
        raise UserError(f"{where}: {exc}") from None


@dataclass
class Fp8Model:
    """What an fp8 run trains: the converted model's plan, the path it takes,
    and the recorder of its eligibility map."""

    recipe: Recipe
    plans: list[LayerPlan]
    implementation: str
    real: bool
    note: str
    recorder: EligibilityRecorder
    record_every: int

    def converted(self) -> int:
        return sum(p.convert for p in self.plans)

    def before_step(self, step: int) -> None:
        self.recorder.record(step, on=step == 1 or step % self.record_every == 0)

    def summary(self) -> dict[str, Any]:
        layers = self.recorder.layers()
        converted = [layer for layer in layers if layer["converted"]]
        nonfinite = sum(layer["nonfinite_steps"] or 0 for layer in converted)
        return {"recipe": self.recipe.name, "implementation": self.implementation,
                "matmuls": "real FP8" if self.real else "emulated", "note": self.note,
                "converted_layers": len(converted), "linear_layers": len(layers),
                "nonfinite_amax_steps": nonfinite, "layers": layers}


def prepare(model: torch.nn.Module, spec: RunSpec) -> Fp8Model:
    """Convert ``model`` in place for ``spec`` (an fp8 or mxfp8 run)."""
    cfg = spec.fp8 or Fp8()
    recipe = recipe_for(spec.precision, cfg.recipe)
    real, why = has_fp8_tensor_cores(spec.precision) if spec.device == "cuda" else (False, "CPU: no FP8 units")
    if spec.amp == "native":
        plans = check_layers(model, spec.precision, cfg, f"workload {spec.label!r}")
        implementation = _convert_torchao(model, recipe, plans, spec.device)
        real = spec.device == "cuda" and _torchao_real(spec.precision)
    else:
        plans = convert(model, recipe, policy_of(cfg), real=real, compute_dtype=COMPUTE_DTYPE)
        implementation = f"ampcert Fp8Linear ({recipe.name})"
    note = why if spec.amp == "ampcert" else f"torchao {_torchao_version()}"
    return Fp8Model(recipe, plans, implementation, real, note, EligibilityRecorder(model, recipe, plans),
                    cfg.record_every)


def _torchao_version() -> str:
    import torchao

    return str(getattr(torchao, "__version__", "?"))


def _torchao_real(precision: Precision) -> bool:
    major, minor = torch.cuda.get_device_capability()
    return (major, minor) >= ((10, 0) if precision == "mxfp8" else (8, 9))


def _quiet_torchao() -> None:
    """torchao's import logs a warning per CUDA extension it cannot load (all of
    them on a CPU machine) and torch one per enum torchao registers: noise in
    every worker's stderr, not news."""
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)


def _mxfp8_linear_class() -> type:
    """torchao's MXFP8Linear, taking the weight in the input's dtype: its emulated
    gemm multiplies both operands in one dtype, and an fp8 run keeps fp32 master
    weights under bf16 compute (torchtitan gets bf16 weights from FSDP's
    mixed precision; this is the same cast, done per step)."""
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear, _to_mxfp8_then_scaled_mm

    class MXFP8LinearComputeDtype(MXFP8Linear):
        def forward(self, input: torch.Tensor) -> torch.Tensor:
            output = _to_mxfp8_then_scaled_mm(input, self.weight.to(input.dtype),
                                              kernel_preference=self.kernel_preference,
                                              scale_calculation_mode=self.scale_calculation_mode,
                                              wgrad_with_hp=self.wgrad_with_hp)
            return output + self.bias.to(output.dtype) if self.bias is not None else output

    return MXFP8LinearComputeDtype


def _convert_torchao(model: torch.nn.Module, recipe: Recipe, plans: list[LayerPlan], device: str) -> str:
    """Swap the planned layers for torchao's own FP8 Linear."""
    if not torchao_installed():
        raise UserError("`amp: native` with an FP8 precision trains torchao's Float8Linear: "
                        "install it with `pip install 'ampcert[fp8]'`, or use `amp: ampcert`, "
                        "whose FP8 layers need only torch")
    _quiet_torchao()
    names = {p.name for p in plans if p.convert}
    real = device == "cuda" and _torchao_real(recipe.precision)
    if recipe.precision == "mxfp8":
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

        layer_class = _mxfp8_linear_class()
        for name in sorted(names):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            old = getattr(parent, child)
            with torch.device("meta"):
                new = layer_class(old.in_features, old.out_features, bias=False,
                                  kernel_preference=KernelPreference.AUTO if real else KernelPreference.EMULATED,
                                  scale_calculation_mode=ScaleCalculationMode.RCEIL)
            new.weight, new.bias = old.weight, old.bias
            setattr(parent, child, new)
            if not real:
                _emulate_as_scaled_mm(new, device)
        return "torchao MXFP8Linear (RCEIL)" + ("" if real else ", emulated")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.config import Float8LinearRecipeName

    config = Float8LinearConfig.from_recipe_name(Float8LinearRecipeName(recipe.name))
    config = Float8LinearConfig(**{**config.__dict__, "emulate": not real})
    convert_to_float8_training(model, config=config, module_filter_fn=lambda _mod, fqn: fqn in names)
    if not real:
        for name in names:
            _emulate_as_scaled_mm(model.get_submodule(name), device)
    return f"torchao Float8Linear ({recipe.name})" + ("" if real else ", emulated")


def _emulate_as_scaled_mm(layer: torch.nn.Module, device: str) -> None:
    """Run torchao's emulated FP8 layer (Float8Linear, MXFP8Linear) as torch._scaled_mm
    computes: its input in COMPUTE_DTYPE (as ampcert's Fp8Linear takes it) and
    autocast off inside. Under the run's bf16 autocast, torchao's emulated matmul of the
    dequantized operands was itself lowered to bf16, where _scaled_mm (and ampcert's
    emulation) accumulate in fp32: on a CPU the two engines' fp8 runs emulated different
    arithmetic (gpt tiny's layers differed by up to 0.032 on the first step). So done, the
    first step's layer outputs and gradients are ampcert's bit for bit (tensorwise, rowwise
    and mxfp8; tests/backends/test_fp8_engines.py)."""
    forward = layer.forward

    def forward_as_scaled_mm(input: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device, enabled=False):
            return forward(input.to(COMPUTE_DTYPE))

    layer.forward = forward_as_scaled_mm  # type: ignore[method-assign]


@dataclass
class Screen:
    """``ampcert screen``: the eligibility map of a workload's model after a
    few training steps, without a run."""

    workload: str
    precision: str
    recipe: str
    steps: int
    device: str
    implementation: str
    layers: list[dict[str, Any]]


def screen(workload_name: str, params: dict[str, Any], precision: Precision, cfg: Fp8, *, steps: int = 3,
           seed: int = 0, device: str = "cpu") -> Screen:
    """Train ``steps`` steps of the workload as an fp8/mxfp8 run would (the
    policy's layers converted, bf16 autocast around them, every step recorded)
    and return the map. Bad input (an unknown workload, params the workload
    refuses, a policy naming a layer the recipe cannot take) raises UserError."""
    from pydantic import ValidationError

    from ampcert.amp import autocast, shipped_policy
    from ampcert.backends import loop
    from ampcert.configio import validation_message
    from ampcert.workloads import registry

    workload = registry.get(workload_name)
    try:
        parsed = workload.Params.model_validate(params)
    except ValidationError as err:
        raise UserError(validation_message("--params", err, params)) from None
    torch.manual_seed(seed)
    task = workload.build(parsed, seed, device)
    model = task.model
    recipe = recipe_for(precision, cfg.recipe)
    real = has_fp8_tensor_cores(precision)[0] if device == "cuda" else False
    try:
        plans = convert(model, recipe, policy_of(cfg), real=real, compute_dtype=COMPUTE_DTYPE)
    except LayerPolicyError as exc:
        raise UserError(f"workload {workload_name!r}: {exc}") from None
    recorder = EligibilityRecorder(model, recipe, plans)
    optimizer = task.make_optimizer(model.parameters())
    batches = loop.index_batches(len(task.train_x), task.batch_size, seed)
    policy = shipped_policy(device)
    model.train()
    for step in range(1, steps + 1):
        idx = torch.from_numpy(next(batches))
        x, y = task.train_x[idx], task.train_y[idx]
        if task.augment is not None:
            x, y = task.augment(x, y, step)
        recorder.record(step)
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, dtype=COMPUTE_DTYPE, policy=policy):
            loss = task.loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    recorder.remove()
    return Screen(workload_name, precision, recipe.name, steps, device,
                  f"ampcert Fp8Linear ({recipe.name}, {'real FP8' if real else 'emulated'})", recorder.layers())
