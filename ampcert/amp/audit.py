"""Audit ampcert's autocast against native ``torch.autocast``, op by op.

For every op of a policy the audit builds small real inputs (``SAMPLES``: one or
more builders per op, each calling a *public* entry point such as ``F.pad(...,
mode="reflect")`` for ``reflection_pad2d``; data, read from
``ampcert/amp/data/torch_audit_samples.yaml`` by :mod:`.audit_samples`), then runs
each builder under ``ampcert.amp.autocast`` and under ``torch.autocast`` in three
input scenarios:

``f32``  every floating input is float32;
``low``  every floating input is the autocast dtype (bf16/fp16);
``mix``  the first floating input is float32, the others low precision
         (only for builders with two or more floating inputs).

A row agrees when, for every builder and scenario, both runs give the same
output dtypes (or both raise the same exception type) *and* the same values,
bit for bit. Ops without a builder are reported with ``agree=False`` and the
note ``"no sample inputs"``: they are never dropped.

What native autocast lists (:data:`NATIVE_REFERENCE`) and where no policy can
mirror it exactly (:data:`KNOWN_DIVERGENCES`) are data too, read from
``ampcert/amp/data/torch_autocast_reference.yaml``.

Torch versions: the shipped policies and :data:`NATIVE_REFERENCE` cover the whole
supported range (torch 2.11 to 2.14). An op that the installed torch lacks
(:data:`~ampcert.amp.torch.op_names.OP_TORCH_VERSIONS`: ``cholesky`` and ``qr`` are
gone in 2.14, ``linalg_matrix_sqrth`` is new there) agrees when neither engine can
run it (its builder fails, or both raise in every scenario), with a note naming
the release; one that runs anyway is a disagreement, as the table is then wrong.

:func:`probe_native` is the helper used to derive ``configs/policies/torch-cpu.yaml``:
it classifies what native autocast does to an op by comparing a native
autocast run with a run without autocast.

Standalone: imports torch, the standard library and sibling modules only.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from .audit_samples import (
    DATA_DIR,
    SAMPLES_FILE,
    Builder,
    Inputs,
    load_samples,
    read_data,
)
from .policy import FAMILIES, Family, OpPolicy, load_policy, shipped_policy
from .torch.autocast import autocast
from .torch.kernels import KNOWN_DIVERGENCES, NATIVE_REFERENCE
from .torch.op_names import OP_TORCH_VERSIONS, op_in_torch, torch_version

__all__ = [
    "KNOWN_DIVERGENCES",
    "NATIVE_REFERENCE",
    "AuditRow",
    "SAMPLES",
    "audit_torch",
    "coverage",
    "format_coverage",
    "format_table",
    "probe_native",
    "sample_ops",
]

_SHORT = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.complex64: "c64", torch.complex128: "c128", torch.complex32: "c32", torch.int64: "i64",
    torch.int32: "i32", torch.bool: "bool", torch.uint8: "u8",
}


@dataclass(frozen=True)
class AuditRow:
    op: str
    family: str
    ampcert_dtype: str
    native_dtype: str
    agree: bool
    note: str = ""


# ---------------------------------------------------------------------------
# the data: sample inputs and what native autocast does
# ---------------------------------------------------------------------------
#: op -> builders. Each builder takes an :class:`Inputs` and returns a thunk that
#: calls a public torch entry point (inputs are created before any region opens).
#: Read from ``ampcert/amp/data/torch_audit_samples.yaml``.
SAMPLES: dict[str, tuple[Builder, ...]] = load_samples(read_data(SAMPLES_FILE), str(DATA_DIR / SAMPLES_FILE))

# NATIVE_REFERENCE: the native op lists per device type and family
# (``aten/src/ATen/autocast_mode.cpp``), spelled with the dispatcher's names: what
# :func:`coverage` measures a policy against. The union over the supported torch range:
# ops that only some releases have are in OP_TORCH_VERSIONS. tests/amp/test_audit.py
# checks the op sets (not the families) against the AutocastCPU/AutocastCUDA kernels of
# the installed torch's dispatcher. KNOWN_DIVERGENCES: ops whose native behaviour no
# policy family reproduces exactly on the Python engine (native casts *inside* a
# composite with mixed decisions), per device type: op -> why; reported by the
# ``unlisted`` audit. Both read from ``ampcert/amp/data/torch_autocast_reference.yaml``
# by :mod:`.torch.kernels`, whose kernels stand in for native's with them.


def sample_ops() -> tuple[str, ...]:
    """Every op that has a sample-input builder."""
    return tuple(sorted(SAMPLES))


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------
def _short(dtype: torch.dtype) -> str:
    return _SHORT.get(dtype, str(dtype).removeprefix("torch."))


def _flat(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        res: list[torch.Tensor] = []
        for o in out:
            res.extend(_flat(o))
        return res
    return []


def _run(thunk: Callable[[], object], ctx) -> tuple[str, list[torch.Tensor] | None]:
    torch.manual_seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with ctx:
                out = thunk()
    except Exception as exc:  # noqa: BLE001 - the exception type is the observation
        return f"err({type(exc).__name__})", None
    tensors = _flat(out)
    return "/".join(_short(t.dtype) for t in tensors) or "-", tensors


def _same_values(a: list[torch.Tensor], b: list[torch.Tensor], exact: bool = True) -> bool:
    """Bitwise equality (NaN == NaN); with ``exact=False``, closeness for the dtype."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.is_complex():
            x, y = torch.view_as_real(x.resolve_conj()), torch.view_as_real(y.resolve_conj())
        if x.is_floating_point():
            if exact:
                same = (x == y) | (torch.isnan(x) & torch.isnan(y))
            else:
                tol = 1e-4 if x.dtype in (torch.float32, torch.float64) else 2e-2
                same = torch.isclose(x, y, rtol=tol, atol=tol, equal_nan=True)
            if not bool(same.all()):
                return False
        elif not torch.equal(x, y):
            return False
    return True


_SCENARIOS = ("f32", "low", "mix")
_VALUE_RETRIES = 3


def _scenarios_for(builder: Builder, low: torch.dtype, device: str,
                   inputs_of: type[Inputs] = Inputs) -> list[tuple[str, Callable[[], object]]]:
    """(scenario, thunk) for each scenario the builder's inputs allow; ``inputs_of`` makes
    the tensors (tests/amp/torch/test_torch_autocast_cuda_decisions.py makes fake CUDA ones)."""
    out = []
    for sc in _SCENARIOS:
        inputs = inputs_of(sc, low, device)
        thunk = builder(inputs)
        if sc == "mix" and inputs.n_float < 2:
            continue
        out.append((sc, thunk))
    return out


def _native_ctx(device_type: str, dtype: torch.dtype):
    return torch.autocast(device_type, dtype=dtype)


class _NoCtx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _resolve(device_type: str, policy: OpPolicy | str | None,
             dtype: torch.dtype | None) -> tuple[OpPolicy, torch.dtype]:
    if policy is None:
        policy = shipped_policy(device_type)
    elif not isinstance(policy, OpPolicy):
        policy = load_policy(policy)
    if dtype is None:
        dtype = torch.bfloat16 if device_type == "cpu" else torch.float16
    return policy, dtype


def _release(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def _absent_note(op: str) -> str:
    first, gone = OP_TORCH_VERSIONS[op]
    if gone is not None and torch_version() >= gone:
        when = f"removed in torch {_release(gone)}"
    else:
        when = f"added in torch {_release(first)}" if first is not None else "not in this release"
    return f"not in torch {torch.__version__} ({when}): uncallable natively and under ampcert"


def _audit_absent(op: str, family: str, device_type: str, policy: OpPolicy, dtype: torch.dtype) -> AuditRow:
    """An op the installed torch lacks: agrees when neither engine can run it."""
    amp_parts: list[str] = []
    nat_parts: list[str] = []
    for bi, builder in enumerate(SAMPLES[op]):
        tag = "" if len(SAMPLES[op]) == 1 else f"{bi}:"
        try:
            scenarios = _scenarios_for(builder, dtype, device_type)
        except Exception as exc:  # noqa: BLE001 - the callable is not there: nothing to run
            amp_parts.append(f"{tag}build>err({type(exc).__name__})")
            nat_parts.append(f"{tag}build>err({type(exc).__name__})")
            continue
        for sc, thunk in scenarios:
            amp_parts.append(f"{tag}{sc}>" + _run(thunk, autocast(device_type, dtype=dtype, policy=policy))[0])
            nat_parts.append(f"{tag}{sc}>" + _run(thunk, _native_ctx(device_type, dtype))[0])
    ran = [p for p in amp_parts + nat_parts if not p.split(">", 1)[1].startswith("err")]
    note = _absent_note(op) if not ran else (
        f"OP_TORCH_VERSIONS says {op} is not in torch {torch.__version__}, but it ran: update the table")
    return AuditRow(op, family, " ".join(amp_parts), " ".join(nat_parts), not ran, note)


def audit_op(op: str, family: str, device_type: str, policy: OpPolicy, dtype: torch.dtype) -> AuditRow:
    builders = SAMPLES.get(op)
    if not builders:
        return AuditRow(op, family, "-", "-", False, "no sample inputs")
    if not op_in_torch(op):
        return _audit_absent(op, family, device_type, policy, dtype)
    amp_parts: list[str] = []
    nat_parts: list[str] = []
    problems: list[str] = []
    infos: list[str] = []
    for bi, builder in enumerate(builders):
        try:
            scenarios = _scenarios_for(builder, dtype, device_type)
        except Exception as exc:  # noqa: BLE001
            return AuditRow(op, family, "-", "-", False, f"sample builder {bi} failed: {type(exc).__name__}: {exc}")
        for sc, thunk in scenarios:
            amp_sig, amp_out = _run(thunk, autocast(device_type, dtype=dtype, policy=policy))
            nat_sig, nat_out = _run(thunk, _native_ctx(device_type, dtype))
            tag = f"{sc}>" if len(builders) == 1 else f"{bi}:{sc}>"
            amp_parts.append(tag + amp_sig)
            nat_parts.append(tag + nat_sig)
            if amp_sig != nat_sig:
                problems.append(f"{tag} dtype {amp_sig} vs native {nat_sig}")
            elif amp_out is not None and nat_out is not None and not _same_values(amp_out, nat_out):
                # Some kernels (e.g. LAPACK gelsy behind linalg.lstsq, multithreaded) are
                # not bitwise reproducible run to run, and one repeat may happen to agree
                # with itself. Repeat both sides: an exact match in any pair agrees; if
                # native disagrees with itself, compare with a dtype tolerance instead.
                amp_runs: list[list[torch.Tensor] | None] = [amp_out]
                nat_runs: list[list[torch.Tensor] | None] = [nat_out]
                for _ in range(_VALUE_RETRIES):
                    amp_runs.append(_run(thunk, autocast(device_type, dtype=dtype, policy=policy))[1])
                    nat_runs.append(_run(thunk, _native_ctx(device_type, dtype))[1])
                pairs = [(a, n) for a in amp_runs for n in nat_runs if a is not None and n is not None]
                native_varies = any(n is not None and not _same_values(nat_out, n) for n in nat_runs[1:])
                if any(_same_values(a, n) for a, n in pairs):
                    if native_varies and "nondeterministic" not in " ".join(infos):
                        infos.append("nondeterministic natively: matched on a repeat")
                elif native_varies and _same_values(amp_out, nat_out, exact=False):
                    if "nondeterministic" not in " ".join(infos):
                        infos.append("nondeterministic natively: values compared with tolerance")
                elif native_varies:
                    problems.append(f"{tag} values differ beyond tolerance (nondeterministic op)")
                else:
                    problems.append(f"{tag} values differ")
    if family != Family.BANNED and all(p.split(">", 1)[1].startswith("err") for p in nat_parts):
        if family == "none" and not problems:
            infos.append("raises natively in every scenario on this device")
        else:
            problems.append("native raises in every scenario: sample inputs unusable on this device")
    elif family == Family.BANNED and not all(p.split(">", 1)[1].startswith("err") for p in amp_parts):
        problems.append("banned op did not raise under ampcert")
    return AuditRow(op, family, " ".join(amp_parts), " ".join(nat_parts), not problems,
                    "; ".join(problems or infos))


def audit_torch(
    device_type: str = "cpu",
    policy: OpPolicy | str | None = None,
    dtype: torch.dtype | None = None,
    ops: Iterable[str] | None = None,
    unlisted: bool = False,
) -> list[AuditRow]:
    """Compare ampcert's autocast with ``torch.autocast`` for every op of ``policy``.

    ``ops`` restricts the audit to a subset. With ``unlisted=True`` every op that
    has sample inputs but is *not* in the policy is audited too (family ``none``):
    both engines must then leave it alone.
    """
    pol, low = _resolve(device_type, policy, dtype)
    names = list(pol.ops) if ops is None else list(ops)
    if unlisted:
        names += [op for op in sample_ops() if op not in pol.ops and op not in names]
    return [audit_op(op, pol.family(op) or "none", device_type, pol, low) for op in names]


# Modules that reach autocast as one builtin whose ATen composite native autocast
# decides op by op; ampcert re-runs them op by op on the CPU (torch.rnn).
_COMPOSITE_MODULES: dict[str, Callable[[], torch.nn.Module]] = {
    "nn.RNN": lambda: torch.nn.RNN(6, 8, num_layers=2, bidirectional=True),
    "nn.RNN(relu)": lambda: torch.nn.RNN(6, 8, nonlinearity="relu", batch_first=True),
    "nn.GRU": lambda: torch.nn.GRU(6, 8, num_layers=2, bidirectional=True),
}


class _AtenOps(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[str, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func.overloadpacket.__name__,
                         tuple(_short(t.dtype) for t in _flat(list(args)) + _flat(out))))
        return out


def audit_modules(device_type: str = "cpu", dtype: torch.dtype | None = None) -> list[AuditRow]:
    """nn.RNN and nn.GRU (CPU) under both engines: the same ATen ops in order, with
    the same dtypes in and out, and the same outputs, forward and backward."""
    if device_type != "cpu":
        return []  # on CUDA they run cuDNN's fused kernels: not mirrored (docs/policies.md)
    low = dtype or torch.bfloat16
    rows = []
    for name, build in _COMPOSITE_MODULES.items():
        torch.manual_seed(0)
        module = build().train()
        x = torch.randn(3, 5, 6)
        seen = {}
        for engine, ctx in (("ampcert", autocast(device_type, dtype=low)), ("native", _native_ctx(device_type, low))):
            module.zero_grad(set_to_none=True)
            torch.manual_seed(1)
            with _AtenOps() as recorder, ctx:
                out, h = module(x)
            (out.float().sum() + h.float().sum()).backward()
            grads = [p.grad for p in module.parameters()]
            seen[engine] = (recorder.ops, [out, h], grads)
        ours, theirs = seen["ampcert"], seen["native"]
        same_ops = ours[0] == theirs[0]
        same_values = all(torch.equal(a, b) for a, b in zip(ours[1] + ours[2], theirs[1] + theirs[2], strict=True))
        note = f"{len(ours[0])} ATen ops" + ("" if same_ops else ", op sequences differ") + \
            ("" if same_values else ", values differ")
        rows.append(AuditRow(name, "composite", "/".join(_short(t.dtype) for t in ours[1]),
                             "/".join(_short(t.dtype) for t in theirs[1]), same_ops and same_values, note))
    return rows


def format_table(rows: Sequence[AuditRow]) -> str:
    """A plain-text table of audit rows plus a one-line summary."""
    headers = ("op", "family", "agree", "ampcert", "native", "note")
    body = [(r.op, r.family, "yes" if r.agree else "NO", r.ampcert_dtype, r.native_dtype, r.note) for r in rows]
    widths = [max(len(h), *(len(str(b[i])) for b in body)) if body else len(h) for i, h in enumerate(headers)]
    widths[3] = min(widths[3], 60)
    widths[4] = min(widths[4], 60)

    def line(cells) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False)).rstrip()

    out = [line(headers), line("-" * w for w in widths)]
    out += [line(b) for b in body]
    agree = sum(r.agree for r in rows)
    out.append(f"{agree}/{len(rows)} ops agree with native torch.autocast")
    return "\n".join(out)


def coverage(
    rows: Sequence[AuditRow], device_type: str | None = None, policy: OpPolicy | None = None
) -> dict[str, dict]:
    """Per family: how much of it the audit covered and how much of native's list the policy has.

    Keys per family: ``ops`` (policy ops in the rows), ``audited`` (with sample
    inputs), ``agree``; with ``device_type``: ``native`` (size of the native list
    in :data:`NATIVE_REFERENCE`), ``covered`` (native ops the policy puts in the
    same family), ``missing`` and ``extra`` (sorted op lists).
    """
    cov: dict[str, dict] = {fam: {"ops": 0, "audited": 0, "agree": 0} for fam in FAMILIES}
    for r in rows:
        if r.family not in cov:
            continue
        c = cov[r.family]
        c["ops"] += 1
        if r.note != "no sample inputs":
            c["audited"] += 1
        if r.agree:
            c["agree"] += 1
    if device_type is not None:
        ref = NATIVE_REFERENCE.get(device_type, {})
        pol_fams: dict[str, set[str]] = {fam: set() for fam in FAMILIES}
        if policy is not None:
            for op, fam in policy.ops.items():
                pol_fams[fam].add(op)
        else:
            for r in rows:
                if r.family in pol_fams:
                    pol_fams[r.family].add(r.op)
        for fam in FAMILIES:
            native = set(ref.get(fam, ()))
            cov[fam]["native"] = len(native)
            cov[fam]["covered"] = len(native & pol_fams[fam])
            cov[fam]["missing"] = sorted(native - pol_fams[fam])
            cov[fam]["extra"] = sorted(pol_fams[fam] - native)
    return cov


def format_coverage(rows: Sequence[AuditRow], device_type: str | None = None,
                    policy: OpPolicy | None = None) -> str:
    cov = coverage(rows, device_type, policy)
    head = "family            ops  audited  agree"
    if device_type is not None:
        head += "  native  covered"
    lines = [head]
    for fam, c in cov.items():
        line = f"{fam:<16} {c['ops']:>4} {c['audited']:>8} {c['agree']:>6}"
        if device_type is not None:
            line += f"  {c['native']:>6} {c['covered']:>8}"
            if c["missing"]:
                line += f"  missing: {', '.join(c['missing'])}"
        lines.append(line)
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# probing native autocast (used to derive the shipped CPU policy)
# ---------------------------------------------------------------------------
def probe_native(
    ops: Iterable[str] | None = None, device_type: str = "cpu", dtype: torch.dtype | None = None
) -> dict[str, str]:
    """Infer native autocast's family for each op with a sample builder.

    Compares ``torch.autocast`` runs with plain runs, scenario by scenario:
    ``lower_precision`` when fp32 inputs come out low precision, ``fp32`` when
    low-precision inputs come out fp32 (``fp32_with_dtype`` and ``fp32`` look the
    same here), ``promote`` when mixed inputs change, ``none`` when autocast
    changes nothing observable, ``raises`` when native raises and plain does not, and
    ``unavailable`` when no builder can run the op even without autocast (its callable
    is missing or raises on fp32 inputs: an op this torch release lacks).
    """
    dtype = dtype or (torch.bfloat16 if device_type == "cpu" else torch.float16)
    result: dict[str, str] = {}
    for op in (ops if ops is not None else sample_ops()):
        verdict = "none"
        usable = False
        for builder in SAMPLES.get(op, ()):
            try:
                scen = dict(_scenarios_for(builder, dtype, device_type))
            except Exception:  # noqa: BLE001 - the callable is not in this torch
                continue
            sigs = {}
            for sc, thunk in scen.items():
                nat, _ = _run(thunk, _native_ctx(device_type, dtype))
                plain, _ = _run(thunk, _NoCtx())
                sigs[sc] = (nat, plain)
            low = _short(dtype)
            nat_f32, plain_f32 = sigs["f32"]
            nat_low, plain_low = sigs["low"]
            usable = usable or not plain_f32.startswith("err")
            if nat_f32.startswith("err") and not plain_f32.startswith("err"):
                verdict = "raises"
            elif nat_f32 != plain_f32 and low in nat_f32.split("/"):
                verdict = "lower_precision"
            elif nat_low != plain_low:
                verdict = "fp32"
            elif "mix" in sigs and sigs["mix"][0] != sigs["mix"][1]:
                verdict = "promote"
            if verdict != "none":
                break
        result[op] = verdict if usable or op not in SAMPLES else "unavailable"
    return result
