"""ampcert's autocast at the dispatcher: native's C++ casts every op the policy agrees on,
kernels at the Autocast key decide the ops where it differs.

Why
---
A :class:`~torch.overrides.TorchFunctionMode` costs a Python call per torch call, even
one that decides nothing (``benchmarks/dispatch_overhead.py``: 1.2x native autocast per
op on tiny tensors before any decision is made). Native autocast decides below Python,
at the dispatcher's ``AutocastCPU``/``AutocastCUDA`` keys. So in eager code an ampcert
region turns native autocast on for its device type and dtype, and only the ops where
its policy and native's lists disagree get a kernel of ours at that key
(``torch.library``, as :func:`torch.library.register_autocast` does for custom ops):

* an op the policy puts in another family than native's, or in a family where native
  has none (``einsum``, ``tensordot`` on the CPU), or lists as ``uncast_if_mixed``:
  the kernel casts the call as its family says (the handlers of
  :mod:`.families`, the same the Python engine uses) and runs the op
  with the Autocast key excluded, so the ops inside it are not cast again;
* an op native lists and the policy does not (``_convolution`` on the CPU): the
  kernel runs it with the key excluded, untouched, as the policy says.

Every other op is native's: the ops both list in the same family, and the ops neither
lists (ATen composites decompose, and the ops inside are decided one by one).

Kernels are process-wide (the dispatcher has one table). For an op native has no kernel
for, ours is registered the first time a region needs it and kept: outside ampcert's
regions it passes the call on to the next key, as the dispatcher does without it. For an
op native has a kernel for (:attr:`Overrides.shadowed`), ours replaces native's only while
a region of such a policy is open (:meth:`Kernels.open`/:meth:`Kernels.close`), so native
autocast keeps its own kernel, and its weight cache, everywhere else; in that window a
plain ``torch.autocast`` on another thread gets native's family for it, from
``ampcert/amp/data/torch_autocast_reference.yaml``. The native ops the shipped policy
leaves out because only native's C++ reaches them (:attr:`Kernels.native_only`) stay
native's unless a policy lists them. A policy an ATen kernel cannot express (an op that is
a Python function, not an ATen op) is refused here, and the region uses the Python engine
(:mod:`.autocast`).

The engine's entry and exit (:func:`open_region`, :func:`close_region`) are plain calls
eagerly; under torch.compile they are nodes of the graph (``allow_in_graph``, marked as
side effects), around native's ``_enter_autocast``/``_exit_autocast``. They run again
while AOTAutograd traces the graph, so ampcert's kernels decide the traced ops with the
region's policy and the compiled graph holds their casts: a region traces as
``torch.autocast`` does, ``nn.MultiheadAttention`` included.

Imports torch, the standard library and its ``ampcert.amp`` siblings.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from ..audit_samples import DATA_DIR, SampleError, read_data
from ..policy import FAMILIES, OpPolicy, shipped_policy
from .dynamo_marks import when_dynamo_imported
from .families import HANDLERS, Family, Region, dtype_slot, fixed_target
from .op_names import op_in_torch, torch_version
from .state import STATE, kernel_cast_args
from .support import release
from .tracing import compiling as is_compiling

__all__ = ["KERNELS", "KNOWN_DIVERGENCES", "NATIVE_REFERENCE", "REFERENCE_FILE", "Kernels", "Overrides", "close_region",
           "kernels_for", "open_region", "read_reference", "serial_of"]

REFERENCE_FILE = "torch_autocast_reference.yaml"


def read_reference() -> tuple[dict[str, dict[str, tuple[str, ...]]], dict[str, dict[str, str]]]:
    """(native op lists per device type and family, known divergences per device type)."""
    data = read_data(REFERENCE_FILE)
    where = DATA_DIR / REFERENCE_FILE
    try:
        # An op native lists only from a later release than the installed one is left out.
        later = {dev: {op for op, first in ops.items() if torch_version() < release(str(first))}
                 for dev, ops in (data.get("native_from") or {}).items()}
        native = {dev: {fam: tuple(op for op in ops if op not in later.get(dev, ())) for fam, ops in fams.items()}
                  for dev, fams in data["native_reference"].items()}
        known = {dev: dict(ops) for dev, ops in data["known_divergences"].items()}
    except (TypeError, KeyError, AttributeError, ValueError) as exc:
        raise SampleError(f"{where}: expected native_reference: {{device: {{family: [op, ...]}}}}, "
                          "native_from: {device: {op: \"major.minor\"}} and known_divergences: "
                          f"{{device: {{op: why}}}}, got {type(exc).__name__}: {exc}") from None
    for dev, fams in native.items():
        if set(fams) != set(FAMILIES) or not all(isinstance(op, str) for ops in fams.values() for op in ops):
            raise SampleError(f"{where}: native_reference.{dev}: expected op-name lists for the families "
                              f"{[f.value for f in FAMILIES]}, got {sorted(fams)}")
    return native, known


NATIVE_REFERENCE, KNOWN_DIVERGENCES = read_reference()

#: Casts a call's arguments for a region: (dtype, region, args, kwargs) -> (args, kwargs).
CastArgs = Callable[[torch.dtype, Region, tuple, dict], tuple[list, dict]]


def _overloads(name: str) -> list[torch._ops.OpOverload]:
    """The functional overloads of ``aten::name`` (out= and in-place ones are never cast)."""
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return []
    found = []
    for overload in packet.overloads():
        op = getattr(packet, overload)
        if not op._schema.is_mutable:
            found.append(op)
    return found


def _has_native_kernel(op: torch._ops.OpOverload, key_name: str) -> bool | None:
    """Whether native autocast has a kernel for ``op`` at ``key_name`` (None: an overload
    the dispatcher does not know, such as einsum.sublist, which only TorchScript has)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key_name)
    except RuntimeError:
        return None


def _with_dtype(slot: int, dtype: torch.dtype, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with ``dtype`` set, as native's fp32_set_opt_dtype makes it (the handler
    made sure the call passed none: a positional one is None there)."""
    if 0 <= slot < len(args):
        return args[:slot] + (dtype,) + args[slot + 1:], kwargs
    return args, {**kwargs, "dtype": dtype}


@dataclass(frozen=True)
class Overrides:
    """Where a policy differs from native at one device type's Autocast key.

    ``added``: ops native has no kernel for there (``einsum`` on the CPU). Ours stay
    registered for the process: outside ampcert's regions they fall through to the next
    key, exactly as the dispatcher does without them.
    ``shadowed``: ops native has a kernel for and the policy decides otherwise (another
    family, none, or ``uncast_if_mixed``). Ours replace native's only while a region of
    such a policy is open, so native autocast keeps its own kernel (and its weight cache)
    everywhere else.
    """

    added: frozenset[str]
    shadowed: frozenset[str]


class Kernels:
    """ampcert's kernels at one device type's Autocast key.

    Args:
        device_type: ``"cpu"``, ``"cuda"``, ...
        region_of: the innermost ampcert region of this thread for the device type that
            runs at the dispatcher, or None (then native's own autocast is on, or none).
        cast_arg: how a region casts a call's arguments (through its weight cache).
    """

    def __init__(self, device_type: str, region_of: Callable[[], Region | None], cast_arg: CastArgs) -> None:
        self.device_type = device_type
        self.key_name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        self.key = getattr(torch._C.DispatchKey, self.key_name)
        self._excluded = torch._C.DispatchKeySet(self.key)
        self._region_of = region_of
        self._cast_arg = cast_arg
        #: op -> {overload: native has a kernel here}, read before any kernel of ours for the op
        self._coverage: dict[str, dict[str, bool]] = {}
        #: native's family per op that has a native kernel here (the reference, as installed)
        self.native: dict[str, Family] = {
            op: Family(fam) for fam, ops in NATIVE_REFERENCE.get(device_type, {}).items() for op in ops
            if any(self.coverage(op).values())}
        #: Native's ops the shipped policy leaves out: those only native's C++ reaches (the
        #: 12-argument _convolution, nn.LSTM's mkldnn_rnn_layer on the CPU), which the
        #: Python engine cannot see. A policy that does not list one leaves it native's
        #: here; one that lists it decides it.
        self.native_only = frozenset(self.native) - frozenset(shipped_policy(device_type).ops)
        #: op name -> overloads that have our kernel for the process (Overrides.added)
        self.registered: dict[str, list[str]] = {}
        #: ops whose native kernel ours replaced, now or earlier (the dispatcher then shows only ours)
        self.shadowed: set[str] = set()
        self._fits: dict[str, Overrides | None] = {}  # policy digest -> its overrides, or None
        self._open: dict[frozenset[str], list[Any]] = {}  # shadowed ops -> [their library, regions open]
        self._native_regions: dict[torch.dtype, Region] = {}
        self._lock = threading.Lock()
        self._library: Any = None

    def coverage(self, op: str) -> dict[str, bool]:
        """Which functional overloads of ``op`` native has a kernel for at this key: read the
        first time the op is met, before any kernel of ours for it, and kept (once ours are
        registered, the dispatcher answers for them too)."""
        found = self._coverage.get(op)
        if found is None:
            found = {}
            for overload in _overloads(op):
                has = _has_native_kernel(overload, self.key_name)
                if has is not None:
                    found[overload._overloadname] = has
            self._coverage[op] = found
        return found

    # -- which policies, which ops ------------------------------------------------
    def overrides(self, policy: OpPolicy) -> Overrides | None:
        """Where ``policy`` differs from native on this device type, or None when a kernel
        cannot express it (then the Python engine decides the region)."""
        key = policy.effective_sha256
        if key not in self._fits:
            self._fits[key] = self._overrides(policy)
        return self._fits[key]

    def _overrides(self, policy: OpPolicy) -> Overrides | None:
        if self.device_type not in NATIVE_REFERENCE:
            return None
        ours = {op: Family(fam) for op, fam in policy.ops.items()}
        differ = {op for op in set(ours) | set(self.native) if ours.get(op) is not self.native.get(op)}
        differ |= set(policy.uncast_if_mixed) & set(ours)
        for op in differ:
            if op in ours and not self.coverage(op) and op_in_torch(op):
                return None  # a Python function, not an ATen op: only the Python engine sees it
            if any(self.coverage(op).values()) and op not in self.native:
                return None  # native has a kernel the reference gives no family: not emulated
        differ = {op for op in differ if self.coverage(op)} - (self.native_only - set(ours))
        return Overrides(added=frozenset(differ - set(self.native)), shadowed=frozenset(differ & set(self.native)))

    # -- registration ------------------------------------------------------------
    def _register(self, library: Any, op: str) -> list[str]:
        done = []
        with warnings.catch_warnings():
            # "Overriding a previously registered kernel": native's, by design (module doc).
            warnings.simplefilter("ignore", UserWarning)
            coverage = self.coverage(op)
            for overload in _overloads(op):
                native_kernel = coverage.get(overload._overloadname)
                if native_kernel is None:
                    continue
                if native_kernel:
                    self.shadowed.add(op)
                label = op if overload._overloadname == "default" else f"{op}.{overload._overloadname}"
                library.impl(label, self._kernel(op, overload, native_kernel), self.key_name, with_keyset=True)
                done.append(overload._overloadname)
        return done

    def ensure(self, ops: frozenset[str]) -> None:
        """Our kernel on every functional overload of each of ``ops`` that native has none
        for (Overrides.added), once per process."""
        if all(op in self.registered for op in ops):
            return
        with self._lock:
            if self._library is None:
                self._library = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (an IMPL on aten, by design)
            for op in ops:
                if op not in self.registered:
                    self.registered[op] = self._register(self._library, op)

    def open(self, ops: frozenset[str]) -> None:
        """Our kernels in place of native's for ``ops`` (Overrides.shadowed), until as many
        :meth:`close` calls: the first region of a policy that shadows them registers them."""
        with self._lock:
            held = self._open.get(ops)
            if held is None:
                library = torch.library.Library("aten", "IMPL")  # noqa: TOR901
                for op in ops:
                    self._register(library, op)
                held = self._open[ops] = [library, 0]
            held[1] += 1

    def close(self, ops: frozenset[str]) -> None:
        with self._lock:
            held = self._open.get(ops)
            if held is None:
                return
            held[1] -= 1
            if held[1] <= 0:
                held[0]._destroy()  # native's kernels are the dispatcher's again
                del self._open[ops]

    def _native_region(self, dtype: torch.dtype) -> Region:
        region = self._native_regions.get(dtype)
        if region is None:
            policy = OpPolicy(name="native", device_type=self.device_type,
                              ops=dict(self.native))
            region = self._native_regions[dtype] = Region(self.device_type, dtype, policy, True, False)
        return region

    def _kernel(self, name: str, op: torch._ops.OpOverload, native_kernel: bool) -> Callable[..., Any]:
        key, excluded, region_of, cast_arg = self.key, self._excluded, self._region_of, self._cast_arg
        native_family = self.native.get(name) if native_kernel else None
        dev = self.device_type
        call = op._op  # the C++ callable under OpOverload.__call__: one Python frame less per call
        slot = dtype_slot(op)

        def kernel(keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> Any:
            region = region_of()
            if region is not None and torch.get_autocast_dtype(dev) is not region.dtype:
                region = None  # a plain torch.autocast of another dtype inside the region: native's call
            if region is None:  # native torch.autocast (another thread, while ours are open): as native
                if native_family is None:
                    return op.redispatch(keyset.remove(key), *args, **kwargs)
                region = self._native_region(torch.get_autocast_dtype(dev))
                family: Family | None = native_family
            else:
                family = region.families.get(name)
                if family is None and name in self.native_only:  # left to native (see native_only)
                    family = native_family
                if family is None and not native_kernel:
                    # in neither list: what the dispatcher does without us (a composite decomposes)
                    return op.redispatch(keyset.remove(key), *args, **kwargs)
            with torch._C._ExcludeDispatchKeyGuard(excluded):
                if family is None:  # native lists it, the policy does not: untouched
                    return call(*args, **kwargs)
                to = fixed_target(region, family, name)
                if to is None:
                    to = HANDLERS[family](region, name, args, kwargs)
                if to is None:
                    return call(*args, **kwargs)
                if family is Family.FP32_WITH_DTYPE and slot is not None:
                    given, kw = _with_dtype(slot, to, args, kwargs)
                    return call(*given, **kw)
                cast, kw = cast_arg(to, region, args, kwargs)
                return call(*cast, **kw)

        kernel.__name__ = f"ampcert_{self.key_name}_{name}"
        return kernel


# ---------------------------------------------------------------------------
# the engine: which regions it decides, their entry and exit
# ---------------------------------------------------------------------------
#: device type -> its kernels, made on first use
KERNELS: dict[str, Kernels] = {}


def kernels_for(region: Region) -> tuple[Kernels, Overrides] | None:
    """The kernels that carry ``region`` at the dispatcher and where its policy differs from
    native, the added ones registered; None when the Python engine must decide it: native
    autocast is not available for its device type, or the policy names ops no ATen kernel
    sees (:meth:`Kernels.overrides`)."""
    found = region.kernel_ops
    if found is False:
        return None
    dev = region.device_type
    kernels = KERNELS.get(dev)
    if found is None:
        available = torch._C._is_autocast_available(dev) and (dev != "cuda" or torch.cuda.is_available())
        if available and kernels is None:
            kernels = KERNELS[dev] = Kernels(dev, functools.partial(_region_of, dev), kernel_cast_args)
        found = kernels.overrides(region.policy) if available and kernels is not None else None
        region.kernel_ops = False if found is None else found
        if found is None:
            return None
    assert kernels is not None and isinstance(found, Overrides)
    kernels.ensure(found.added)
    return kernels, found


def _region_of(dev: str) -> Region | None:
    return STATE.kernel_regions.get(dev)


#: serial -> region, for the regions the dispatcher engine decides (a graph holds the serial)
SERIALS: list[Region] = []
SERIAL_OF: dict[tuple, int] = {}


def serial_of(key: tuple, region: Region) -> int:
    """The serial of ``region`` (made for the setting ``key``) if the dispatcher engine
    decides it, its added kernels registered; else -1 (the Python engine)."""
    serial = SERIAL_OF.get(key)
    if serial is None:
        if kernels_for(region) is None:
            serial = -1
        else:
            serial = len(SERIALS)
            SERIALS.append(region)
        SERIAL_OF[key] = serial
    return serial


# The two below are the dispatcher engine's entry and exit. Both run eagerly as plain
# calls; under torch.compile they are nodes of the graph (allow_in_graph; side effects, so
# never dropped) that run while AOTAutograd traces it, so the kernels decide the traced
# ops with this region's policy, and the compiled graph holds their casts.
@torch.fx.node.has_side_effect
def open_region(serial: int) -> None:
    region = SERIALS[serial]
    overrides = region.kernel_ops
    assert isinstance(overrides, Overrides)
    st = STATE
    if is_compiling() and st.trace_base is None:
        # A trace may stop between this call and its close_region (a graph break inside
        # the with-block gives the frame back to eager, a failed compile): what it opens is
        # closed when the compile ends, whatever happened (_end_of_compile).
        st.trace_base = len(st.stack)
        _watch_compiles()
    if overrides.shadowed and region.enabled:
        KERNELS[region.device_type].open(overrides.shadowed)
    st.stack.append(region)
    st.engines.append(overrides)
    st.refresh()


def _pop_entry(st: Any) -> None:
    region = st.stack.pop()
    overrides = st.engines.pop()
    if isinstance(overrides, Overrides) and overrides.shadowed and region.enabled:
        KERNELS[region.device_type].close(overrides.shadowed)


@torch.fx.node.has_side_effect
def close_region(serial: int) -> None:
    st = STATE
    region = SERIALS[serial]
    mine = [i for i, (r, e) in enumerate(zip(st.stack, st.engines, strict=True))
            if r is region and isinstance(e, Overrides)]
    if mine:  # this region's entry and anything a stopped trace left above it
        while len(st.stack) > mine[-1]:
            _pop_entry(st)
        st.refresh()
    if not st.stack:
        st.cache.clear()
        st.pending = None


def _end_of_compile(_args: Any = None) -> None:
    """Close what a trace opened and did not close (open_region)."""
    st = STATE
    base = st.trace_base
    st.trace_base = None
    if base is None:
        return
    while len(st.stack) > base and isinstance(st.engines[-1], Overrides):
        _pop_entry(st)
    st.refresh()


def _watch_compiles() -> None:
    """_end_of_compile as one of Dynamo's end-of-compile callbacks (torch._dynamo.reset
    clears them, so this is checked at every traced entry)."""
    handler = getattr(getattr(torch._dynamo, "callback", None), "callback_handler", None)
    ends = getattr(handler, "end_callbacks", None)
    if handler is not None and ends is not None and _end_of_compile not in ends:
        handler.register_end_callback(_end_of_compile)


@when_dynamo_imported
def _into_graphs(dynamo: ModuleType) -> None:
    dynamo.allow_in_graph(open_region)
    dynamo.allow_in_graph(close_region)
