"""Re-entrant clones of torch's Python composites, and what torch.compile needs of them.

Why
---
ampcert's autocast (:mod:`.autocast`) is a ``TorchFunctionMode``, which pops
itself while it handles a call. An op outside the policy that is a Python
composite of torch (``F.cross_entropy``, ``F.interpolate``,
``F.multi_head_attention_forward``) must nevertheless have the ops it calls
decided one by one, as native autocast decides them at the ATen level. So it is
re-run with the mode active, as a *clone*: the same code object, with globals in
which the three ``has_torch_function*`` checks answer False, so that the clone
does not hand itself back to the mode. Eagerly a clone's globals are a dict
subclass that reads everything else live from the function's module.

torch.compile adds three constraints, because Dynamo traces the mode's
``__torch_function__`` as plain Python:

1. Per-callable decisions (callable -> op name, callable -> clone) are made from
   attributes the tracer cannot read as constants (``__name__``, ``__module__``,
   ``__code__``): a cache miss inside a compiled region is a graph break.
   :meth:`Tracing.prepare` makes them all ahead of the tracer, once (about 30 ms,
   on the first entry to a region), and the snapshot never changes afterwards:
   the tracer guards on the dict it reads, so a growing one would recompile.
2. The tracer resolves a function's globals only from a plain dict, and guards on
   them through the module they belong to: a traced clone gets a plain copy of
   its module's globals, in a module registered under its own name
   (``ampcert.amp._traced.<module>``).
3. Under torch.compile, the ``torch._C._nn`` builtins that are missing from
   ``torch.overrides.get_overridable_functions()`` (``cross_entropy_loss`` inside
   ``F.cross_entropy``) never reach a torch function mode. In a traced clone's
   globals ``torch`` is a shim whose ``torch._C._nn`` calls those builtins
   through the mode explicitly, so the policy decides them in the compiled graph
   as it does eagerly.

(The mode itself also behaves differently while compiling: it skips the weight
cache and the cast counter, whose Python-side checks would break or re-guard the
graph every step. That is in :mod:`.autocast`, where the casting is.)

Everything kept between calls is in one :class:`Tracing` object, owned by the mode.

Imports torch, the standard library and its siblings :mod:`.policy`, :mod:`.op_names`.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from ..policy import OpPolicy
from .dynamo_marks import when_dynamo_imported
from .op_names import canonical_op_name, public_callables
from .support import REGION_IN_TRACE_MIN, release, release_name

__all__ = ["Tracing", "compiling", "never_compiled_alone", "refuse_untraceable_region"]

#: True while Dynamo traces (a constant inside the trace), False eagerly.
compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

# A region entered inside a compiled function, on a torch whose Dynamo cannot trace its entry
# (support.REGION_IN_TRACE_MIN; torch 2.11): refused while tracing, before any state is
# touched, so Dynamo runs the frame eagerly (a graph break), or with fullgraph=True fails
# naming this. None where the installed torch traces it.
_UNTRACEABLE_REGION = None if release(torch.__version__) >= REGION_IN_TRACE_MIN else (
    f"ampcert.autocast entered inside a torch.compile'd function needs torch "
    f"{release_name(REGION_IN_TRACE_MIN)} or newer (this is {torch.__version__}, whose Dynamo cannot "
    "trace the region's entry): enter the region around the compiled call, or upgrade torch")


def refuse_untraceable_region() -> None:
    """Raise RuntimeError where Dynamo is tracing a region's entry it cannot trace."""
    if _UNTRACEABLE_REGION is not None and compiling():
        raise RuntimeError(_UNTRACEABLE_REGION)


_HTF_NAMES = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")
_NO_REENTER_MODULES = ("torch.autograd", "torch.utils", "torch._dynamo", "torch.distributed",
                       "torch.testing", "torch.nn.init", "torch.fx", "torch.jit")
_NO_REENTER = frozenset({
    "backward", "register_hook", "register_post_accumulate_grad_hook", "__deepcopy__",
    "__reduce_ex__", "_reduce_ex_internal", "__setstate__", "__repr__", "__format__",
    "__dlpack__", "__dlpack_device__", "__array__", "__array_wrap__", "storage",
    "untyped_storage", "_typed_storage", "share_memory_", "module_load",
})
_FunctionType = types.FunctionType


def _never(*_args: Any, **_kwargs: Any) -> bool:
    return False


class _Globals(dict):
    """Globals for an eager clone: the skip-overrides names here, everything else live from the module."""

    def __init__(self, base: dict, overrides: dict) -> None:
        super().__init__(overrides)
        self._base = base

    def __missing__(self, key: str) -> Any:
        return self._base[key]


class Tracing:
    """The clone caches and the ahead-of-tracer snapshot (process-wide, like torch's callables).

    ``mode`` is the torch function mode whose ``__torch_function__`` the shim's
    un-routed builtins call (point 3 of the module doc)."""

    def __init__(self, mode: Any) -> None:
        self.mode = mode
        #: callable -> its eager clone, or None when it has none (asked once per callable)
        self.clones: dict[Any, Callable | None] = {}
        #: the same for clones run under the tracer (plain-dict globals; point 2)
        self.traced_clones: dict[Any, Callable | None] = {}
        #: callable -> op name for every public torch callable, read while compiling;
        #: None until :meth:`prepare` ran, fixed afterwards (point 1)
        self.names: dict[Any, str | None] | None = None
        #: ``torch`` as traced clones see it, built on first need (point 3)
        self.torch_shim: types.ModuleType | None = None

    def clone(self, func: Any, traced: bool = False) -> Callable | None:
        """``func`` with its ``has_torch_function*`` checks answering False, or None."""
        clones = self.traced_clones if traced else self.clones
        try:
            return clones[func]
        except KeyError:
            pass
        clone = None
        code = getattr(func, "__code__", None)
        module = getattr(func, "__module__", None) or ""
        if (
            code is not None
            and (module == "torch" or module.startswith("torch."))
            and not module.startswith(_NO_REENTER_MODULES)
            # Traced, Tensor's Python methods stay whole: their bodies forward to
            # torch._VF builtins (Tensor.split -> _VF.split), which torch.compile's
            # tracer cannot call; whole, it records them as the Tensor method.
            and not (traced and module == "torch._tensor")
            and func.__name__ not in _NO_REENTER
            and any(func.__globals__.get(n) is getattr(torch.overrides, n) for n in _HTF_NAMES if n in code.co_names)
        ):
            base = func.__globals__
            overrides = {n: _never for n in _HTF_NAMES}
            overrides["__builtins__"] = base.get("__builtins__", __builtins__)
            scope = self._traced_globals(base, overrides) if traced else _Globals(base, overrides)
            clone = types.FunctionType(code, scope, func.__name__, func.__defaults__, func.__closure__)
            clone.__kwdefaults__ = func.__kwdefaults__
        clones[func] = clone
        return clone

    def prepare(self, policy: OpPolicy) -> None:
        """Make every per-callable decision ahead of the tracer, once (point 1):
        the op name and the traced clone of every public torch callable."""
        if self.names is not None:
            return
        names: dict[Any, str | None] = {}
        for func in public_callables():
            name = canonical_op_name(func)
            if type(func) is _FunctionType:
                self.clone(func, True)
            try:
                # The tracer looks callables up by equality, and a few distinct builtins
                # compare equal (torch.mm == torch.dsmm): the name a policy knows wins.
                if func not in names or (name in policy.ops and names[func] not in policy.ops):
                    names[func] = name
            except TypeError:  # unhashable: looked up by identity only
                continue
        self.names = names

    def _traced_globals(self, base: dict, overrides: dict) -> dict:
        """Globals for traced clones of one module's functions: a plain copy, taken
        once (torch's modules are fully imported by the time any op runs), with
        ``torch`` as the shim, in a module registered under its own name (point 2)."""
        name = f"ampcert.amp._traced.{base.get('__name__', 'unknown')}"
        module = sys.modules.get(name)
        if module is None:
            module = types.ModuleType(name)
            module.__dict__.update(base)
            module.__dict__.update(overrides)
            module.__dict__["__name__"] = name
            if module.__dict__.get("torch") is torch:
                module.__dict__["torch"] = self._torch_shim()
            sys.modules[name] = module
        return module.__dict__

    def _torch_shim(self) -> types.ModuleType:
        """``torch`` whose ``torch._C._nn`` builtins that torch.compile does not
        route to torch function modes call the mode explicitly (point 3)."""
        if self.torch_shim is not None:
            return self.torch_shim
        routed = {f for fs in torch.overrides.get_overridable_functions().values() for f in fs}
        mode = self.mode

        def through_mode(builtin: Any) -> Callable:
            def call(*args: Any, **kwargs: Any) -> Any:
                return mode.__torch_function__(builtin, (), args, kwargs)
            return call

        nn = types.ModuleType("torch._C._nn")
        nn.__dict__.update(torch._C._nn.__dict__)
        for attr, obj in torch._C._nn.__dict__.items():
            if callable(obj) and not attr.startswith("_") and obj not in routed:
                setattr(nn, attr, through_mode(obj))
        c = types.ModuleType("torch._C")
        c.__dict__.update(torch._C.__dict__)
        c._nn = nn  # type: ignore[attr-defined]
        shim = types.ModuleType("torch")
        shim.__dict__.update(torch.__dict__)
        shim._C = c  # type: ignore[attr-defined]
        self.torch_shim = shim
        return shim


def never_compiled_alone(*functions: Callable) -> None:
    """Dynamo compiles every Python frame it meets, also the frames of a function it gave
    back to eager (a graph break it cannot take inside a with-block). An entry or exit
    compiled as a frame of its own would set native autocast's state inside a graph, which
    does not outlive it: the region would be lost. These run as plain Python then, and are
    still traced when inlined into a compiled function (Dynamo's per-code skip, which
    affects only frames it is handed whole; a torch without it keeps the default). Applied
    once torch._dynamo is imported (dynamo_marks)."""
    when_dynamo_imported(lambda dynamo: _skip_frames(dynamo, functions))


def _skip_frames(dynamo: ModuleType, functions: tuple[Callable, ...]) -> None:
    eval_frame = getattr(dynamo, "eval_frame", None)
    strategy = getattr(eval_frame, "set_code_exec_strategy", None)
    frame_strategy = getattr(eval_frame, "FrameExecStrategy", None)
    action = getattr(eval_frame, "FrameAction", None)
    for fn in functions:
        if strategy is not None and frame_strategy is not None and action is not None:
            strategy(fn.__code__, frame_strategy(action.SKIP, action.SKIP))  # and what it calls
        elif eval_frame is not None and hasattr(eval_frame, "skip_code"):
            eval_frame.skip_code(fn.__code__)
