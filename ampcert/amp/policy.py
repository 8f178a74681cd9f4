"""Op-cast policies for ampcert's autocast engine.

A policy says, for every op name the dispatcher in :mod:`ampcert.amp.torch.autocast`
knows (:mod:`ampcert.amp.torch.op_names` names them), which *family* it belongs to inside
an autocast region:

``lower_precision``
    cast eligible floating inputs to the autocast dtype (bf16/fp16).
``fp32``
    cast eligible inputs to float32.
``fp32_with_dtype``
    float32 unless the caller passes an explicit ``dtype=`` (softmax, sum, ...);
    torch calls get ``dtype=float32`` as native's ``fp32_set_opt_dtype`` makes
    them (the op computes in fp32 from its inputs as given).
``promote``
    run in the widest floating dtype among the eligible inputs.
``banned``
    raise a clear error inside an enabled region (CUDA: ``binary_cross_entropy``).

Ops in no family run untouched (in their input dtypes), exactly like native
``torch.autocast`` leaves them.

Policies are YAML files (see ``configs/policies``)::

    name: torch-cpu
    device_type: cpu
    description: ...
    families:
      lower_precision: [conv2d, linear, matmul]
      fp32: [mse_loss, ...]
      fp32_with_dtype: []
      promote: [cat, stack, index_copy]
      banned: []

A short user policy can derive from another one::

    name: my-policy
    extends: torch-cuda            # shipped name, or a path relative to this file
    overrides: {softmax: fp32, layer_norm: lower_precision, cumsum: none}

(``none`` removes an op from the policy: it then runs untouched).

``uncast_if_mixed: [tensordot, ...]`` lists policy ops that native autocast only
casts *inside* a composite which first checks that its floating inputs share one
dtype: ampcert leaves such a call uncast when the eligible inputs' dtypes differ,
so it raises exactly like native does.

This module is standalone: it imports only the standard library, PyYAML,
:mod:`.yamlio` and, lazily (for validation), the op names of the framework a
policy is for: :mod:`.torch.op_names` (torch) or :mod:`.jax.primitives` (JAX). Neither
imports this module, so imports run one way: the autocast engines import the
policy, never the reverse.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from .yamlio import load_yaml

__all__ = [
    "FAMILIES",
    "Family",
    "OpPolicy",
    "PolicyError",
    "POLICY_DIR",
    "load_policy",
    "shipped_policy",
    "shipped_policy_names",
]

class Family(enum.StrEnum):
    """An op family, valued by its name in policy files. A ``str``: a family compares,
    hashes, prints and serialises as that name, so digests, reports and YAML are as
    they were; code dispatches on the members."""

    LOWER_PRECISION = "lower_precision"
    FP32 = "fp32"
    FP32_WITH_DTYPE = "fp32_with_dtype"
    PROMOTE = "promote"
    BANNED = "banned"


#: The cast families, in the order they appear in YAML files and reports.
FAMILIES: tuple[Family, ...] = tuple(Family)

#: Directory holding the shipped policies (``torch-cpu.yaml``, ``torch-cuda.yaml``), read as
#: package data so that an installed wheel finds them wherever it runs. (Only the data of the
#: top-level package is named here; nothing of the harness is imported.)
POLICY_DIR = Path(str(files("ampcert").joinpath("configs", "policies")))

_TOP_KEYS = ("name", "framework", "device_type", "description", "extends", "families", "overrides",
             "uncast_if_mixed", "accumulate_fp32")
_FRAMEWORKS = ("torch", "jax")
_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu")
# A JAX program is traced once and compiled for whichever backend runs it, so a
# JAX policy names primitives, not devices.
_JAX_DEVICE_TYPE = "any"
_REMOVE = "none"


class PolicyError(ValueError):
    """A policy file is missing, malformed or names something unknown (one-line message)."""

    def __init__(self, message: object = "") -> None:
        text = str(message)  # names from the file (an op, a family) may hold line breaks: escaped
        if not text.isprintable():
            text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
        super().__init__(text)


@dataclass(frozen=True)
class OpPolicy:
    """An immutable, resolved op -> family mapping.

    ``sha256`` is the digest of the policy file's bytes (empty for policies built
    in code); ``effective_sha256`` digests the resolved mapping, so it also changes
    when a base policy named in ``extends`` changes.
    """

    name: str
    device_type: str
    ops: Mapping[str, Family]  # given as family names (str) or members; kept as members
    source: Path | None = None
    sha256: str = ""
    description: str = ""
    extends: str | None = None
    uncast_if_mixed: frozenset[str] = frozenset()
    #: Computed from the resolved mapping, never given (a given digest could vouch for
    #: ops that are not these).
    effective_sha256: str = field(default="", init=False, compare=False)
    #: ``torch`` (ops are torch callables) or ``jax`` (ops are jaxpr primitives).
    framework: str = "torch"
    #: lower-precision JAX primitives that accumulate in float32
    #: (``preferred_element_type``); torch policies leave this empty.
    accumulate_fp32: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        ops: dict[str, Family] = {}
        for op, fam in dict(self.ops).items():
            if fam not in FAMILIES:
                raise PolicyError(
                    f"{self.name}: ops.{op}: expected a family in {[f.value for f in FAMILIES]}, got {fam!r}"
                )
            ops[op] = Family(fam)
        object.__setattr__(self, "ops", MappingProxyType(dict(sorted(ops.items()))))
        object.__setattr__(self, "uncast_if_mixed", frozenset(o for o in self.uncast_if_mixed if o in ops))
        object.__setattr__(self, "accumulate_fp32", frozenset(o for o in self.accumulate_fp32 if o in ops))
        object.__setattr__(
            self, "effective_sha256",
            _digest_mapping(self.device_type, ops, self.uncast_if_mixed, self.framework, self.accumulate_fp32),
        )

    def __hash__(self) -> int:
        return hash((self.name, self.framework, self.device_type, self.effective_sha256))

    # -- queries ---------------------------------------------------------------
    def family(self, op: str) -> Family | None:
        """The family of ``op``, or None when the op runs untouched."""
        return self.ops.get(op)

    def ops_in(self, family: Family | str) -> tuple[str, ...]:
        if family not in FAMILIES:
            raise KeyError(f"unknown family {family!r}; expected one of {[f.value for f in FAMILIES]}")
        return tuple(op for op, fam in self.ops.items() if fam == family)

    @property
    def families(self) -> dict[Family, tuple[str, ...]]:
        """Family -> sorted op names (every family present, possibly empty)."""
        return {fam: self.ops_in(fam) for fam in FAMILIES}

    def family_sizes(self) -> dict[str, int]:
        return {fam: len(ops) for fam, ops in self.families.items()}

    def __contains__(self, op: object) -> bool:
        return op in self.ops

    def __len__(self) -> int:
        return len(self.ops)

    # -- derivation ------------------------------------------------------------
    def with_overrides(self, overrides: Mapping[str, str], name: str | None = None) -> OpPolicy:
        """A new policy with ``overrides`` (op -> family or ``"none"``) applied.

        Op names and families are validated like a YAML ``overrides`` block.
        """
        where = f"<{name or self.name + '+overrides'}>"
        ops = dict(self.ops)
        _apply_overrides(ops, overrides, where, "overrides", known=_known_ops(self.framework))
        return OpPolicy(
            name=name or f"{self.name}+overrides",
            device_type=self.device_type,
            ops=ops,
            source=None,
            sha256="",
            description=self.description,
            extends=self.name,
            uncast_if_mixed=self.uncast_if_mixed,
            framework=self.framework,
            accumulate_fp32=self.accumulate_fp32,
        )

    def to_dict(self) -> dict[str, Any]:
        """A plain, YAML-dumpable form of the resolved policy."""
        return {
            "name": self.name,
            "framework": self.framework,
            "device_type": self.device_type,
            "description": self.description,
            "families": {fam: list(ops) for fam, ops in self.families.items()},
            "uncast_if_mixed": sorted(self.uncast_if_mixed),
            "accumulate_fp32": sorted(self.accumulate_fp32),
        }


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------
def shipped_policy_names() -> tuple[str, ...]:
    """Names of the policies shipped in ``configs/policies`` (top level only)."""
    if not POLICY_DIR.is_dir():  # say so, rather than "expected one of []"
        raise PolicyError(f"{POLICY_DIR}: the shipped policies are missing from this installation of "
                          "ampcert (a wheel built without its package data?): reinstall ampcert")
    return tuple(sorted(p.stem for p in POLICY_DIR.glob("*.yaml")))


def shipped_policy(device_type: str, framework: str = "torch") -> OpPolicy:
    """The shipped policy for ``device_type`` (``torch-cpu`` or ``torch-cuda``);
    with ``framework="jax"``, the one JAX policy (``jax``) for every device."""
    if framework == "jax":
        return _load_cached(str(POLICY_DIR / "jax.yaml"))
    dev = str(device_type).split(":", 1)[0]
    path = POLICY_DIR / f"torch-{dev}.yaml"
    if not path.is_file():
        raise PolicyError(
            f"{path}: device_type: expected one of "
            f"{[n.removeprefix('torch-') for n in shipped_policy_names() if n.startswith('torch-')]}"
            f" (a shipped policy), got {device_type!r}"
        )
    return _load_cached(str(path))


def load_policy(path_or_name: OpPolicy | str | Path) -> OpPolicy:
    """Load a policy from a YAML path or a shipped policy name (``torch-cpu``)."""
    if isinstance(path_or_name, OpPolicy):  # convenience: already loaded
        return path_or_name
    path = _resolve_ref(path_or_name, base_dir=None)
    if path.parent == POLICY_DIR:
        return _load_cached(str(path))
    return _load_file(path, chain=())


_CACHE: dict[str, tuple[int, int, OpPolicy]] = {}  # shipped policies only


def _load_cached(path: str) -> OpPolicy:
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise PolicyError(f"{p}: file: expected a readable policy file, got {type(exc).__name__}") from None
    hit = _CACHE.get(path)
    if hit is not None and hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
        return hit[2]
    pol = _load_file(p, chain=())
    _CACHE[path] = (st.st_mtime_ns, st.st_size, pol)
    return pol


def _resolve_ref(ref: str | Path, base_dir: Path | None) -> Path:
    text = str(ref)
    candidates: list[Path] = []
    looks_like_path = isinstance(ref, Path) or "/" in text or "\\" in text or text.endswith((".yaml", ".yml"))
    if looks_like_path:
        p = Path(text).expanduser()
        if not p.is_absolute() and base_dir is not None:
            candidates.append(base_dir / p)
        candidates.append(p)
    else:
        candidates.append(POLICY_DIR / f"{text}.yaml")
        if base_dir is not None:
            candidates.append(base_dir / f"{text}.yaml")
    for c in candidates:
        if c.is_file():
            return c.resolve()
    # In the words the user wrote, never a path inside the installation: a mistyped
    # shipped name gets the closest one and the list of them.
    names = shipped_policy_names()
    shipped = f"shipped: {', '.join(names)}"
    if looks_like_path:
        found = ", found a folder" if any(c.is_dir() for c in candidates) else ", not found"
        raise PolicyError(f"{text}: expected an existing policy file{found} (or a shipped policy's name; {shipped})")
    from difflib import get_close_matches

    close = get_close_matches(text, names, n=1)
    raise PolicyError(f"no shipped policy is called {text!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                      + f" ({shipped}; or give the path of a policy file, such as my-policy.yaml)")


def _load_file(path: Path, chain: tuple[Path, ...]) -> OpPolicy:
    where = str(path)
    if path in chain:
        cycle = " -> ".join(str(p.name) for p in (*chain, path))
        raise PolicyError(f"{where}: extends: expected no cycles, got {cycle}")
    try:
        raw_bytes = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"{where}: file: expected a readable file, got {type(exc).__name__}") from None
    try:
        doc = load_yaml(raw_bytes.decode("utf-8"))
    except UnicodeDecodeError:
        raise PolicyError(f"{where}: file: expected UTF-8 text, got undecodable bytes") from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"{where}: YAML: expected well-formed YAML, got {_yaml_problem(exc)}") from None

    if not isinstance(doc, dict):
        raise PolicyError(f"{where}: top level: expected a mapping, got {_tname(doc)}")
    unknown = [k for k in doc if k not in _TOP_KEYS]
    if unknown:
        raise PolicyError(f"{where}: {unknown[0]}: expected one of the keys {list(_TOP_KEYS)}, got unknown key")

    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        raise PolicyError(f"{where}: name: expected a non-empty string, got {_tname(name)}")
    name = name.strip()
    if not name.isprintable():  # it is printed in tables and written to MLLOG lines
        raise PolicyError(f"{where}: name: expected one line of printable text, got {name!r}")
    description = doc.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise PolicyError(f"{where}: description: expected a string, got {_tname(description)}")
    description = " ".join(description.split())
    if not description.isprintable():
        raise PolicyError(f"{where}: description: expected printable text, got {description!r}")

    extends = doc.get("extends")
    base: OpPolicy | None = None
    if extends is not None:
        if not isinstance(extends, str) or not extends.strip():
            raise PolicyError(f"{where}: extends: expected a policy name or path (string), got {_tname(extends)}")
        try:
            base_path = _resolve_ref(extends, base_dir=path.parent)
        except PolicyError:
            raise PolicyError(
                f"{where}: extends: expected a shipped policy name {list(shipped_policy_names())} "
                f"or an existing file (relative to this one), got {extends!r}"
            ) from None
        base = _load_file(base_path, chain=(*chain, path))

    framework = doc.get("framework", base.framework if base else "torch")
    if framework not in _FRAMEWORKS:
        raise PolicyError(f"{where}: framework: expected one of {list(_FRAMEWORKS)}, got {framework!r}")
    if base is not None and framework != base.framework:
        raise PolicyError(
            f"{where}: framework: expected {base.framework!r} (the framework of {extends!r}), got {framework!r}"
        )
    device_types = (_JAX_DEVICE_TYPE,) if framework == "jax" else _DEVICE_TYPES
    device_type = doc.get("device_type", base.device_type if base else (_JAX_DEVICE_TYPE if framework == "jax" else None))
    if not isinstance(device_type, str) or device_type not in device_types:
        raise PolicyError(f"{where}: device_type: expected one of {list(device_types)}, got {device_type!r}")
    if base is not None and device_type != base.device_type:
        raise PolicyError(
            f"{where}: device_type: expected {base.device_type!r} (the device_type of {extends!r}), got {device_type!r}"
        )

    ops: dict[str, Family] = dict(base.ops) if base else {}

    families = doc.get("families")
    if families is None:
        if base is None:
            raise PolicyError(f"{where}: families: expected a mapping of family -> op list, got nothing")
        families = {}
    if not isinstance(families, dict):
        raise PolicyError(f"{where}: families: expected a mapping of family -> op list, got {_tname(families)}")
    seen: dict[str, str] = {}
    known = _known_ops(framework)
    for fam, op_list in families.items():
        if fam not in FAMILIES:
            raise PolicyError(f"{where}: families.{fam}: expected a family in {[f.value for f in FAMILIES]}, got unknown family {fam!r}")
        if op_list is None:
            op_list = []
        if not isinstance(op_list, list):
            raise PolicyError(f"{where}: families.{fam}: expected a list of op names, got {_tname(op_list)}")
        for i, op in enumerate(op_list):
            field_name = f"families.{fam}[{i}]"
            _check_op(op, where, field_name, known)
            if op in seen:
                if seen[op] == fam:
                    raise PolicyError(f"{where}: {field_name}: expected each op once, got {op!r} listed twice in {fam!r}")
                raise PolicyError(
                    f"{where}: {field_name}: expected each op in exactly one family, "
                    f"got {op!r} in both {seen[op]!r} and {fam!r}"
                )
            seen[op] = fam
    for op, fam in seen.items():
        ops[op] = Family(fam)

    overrides = doc.get("overrides")
    if overrides is not None:
        if not isinstance(overrides, dict):
            raise PolicyError(f"{where}: overrides: expected a mapping of op -> family, got {_tname(overrides)}")
        _apply_overrides(ops, overrides, where, "overrides", known=known)

    mixed = set(base.uncast_if_mixed) if base else set()
    mixed_list = doc.get("uncast_if_mixed")
    if mixed_list is not None:
        if not isinstance(mixed_list, list):
            raise PolicyError(f"{where}: uncast_if_mixed: expected a list of op names, got {_tname(mixed_list)}")
        for i, op in enumerate(mixed_list):
            field_name = f"uncast_if_mixed[{i}]"
            _check_op(op, where, field_name, known)
            if op not in ops:
                raise PolicyError(f"{where}: {field_name}: expected an op that is in a family, got {op!r}")
            mixed.add(op)

    accumulate = set(base.accumulate_fp32) if base else set()
    acc_list = doc.get("accumulate_fp32")
    if acc_list is not None:
        if framework != "jax":
            raise PolicyError(f"{where}: accumulate_fp32: expected only in `framework: jax` policies "
                              "(torch picks its own accumulation), got a torch policy")
        if not isinstance(acc_list, list):
            raise PolicyError(f"{where}: accumulate_fp32: expected a list of primitive names, got {_tname(acc_list)}")
        for i, op in enumerate(acc_list):
            field_name = f"accumulate_fp32[{i}]"
            _check_op(op, where, field_name, known)
            if ops.get(op) != "lower_precision":
                raise PolicyError(f"{where}: {field_name}: expected a lower_precision primitive, got {op!r}")
            accumulate.add(op)

    policy = OpPolicy(
        name=name,
        device_type=device_type,
        ops=ops,
        source=path,
        sha256=hashlib.sha256(raw_bytes).hexdigest(),
        description=description,
        extends=extends,
        uncast_if_mixed=frozenset(mixed),
        framework=framework,
        accumulate_fp32=frozenset(accumulate),
    )
    _check_name(policy, path, where)
    return policy


def _shipped_stems() -> set[str]:
    return {p.stem for p in POLICY_DIR.glob("*.yaml")} if POLICY_DIR.is_dir() else set()


def _check_name(policy: OpPolicy, path: Path, where: str) -> None:
    """A policy's name is how results, reports and MLLOG logs (``amp_policy``) credit
    it, so a name is an identity the file must live up to: a shipped policy is named
    by its file, and another file may take a shipped policy's name only while it is
    that policy (a verbatim copy, ``ampcert show policy torch-cpu > mine.yaml``); once
    its ops differ, it needs a name of its own."""
    name = policy.name
    try:
        shipped_file = path.resolve().parent == POLICY_DIR.resolve()
    except OSError:  # pragma: no cover - an unreadable directory: not the shipped one
        shipped_file = False
    if shipped_file:
        if name != path.stem:
            raise PolicyError(f"{where}: name: expected {path.stem!r} (a shipped policy is named by its file), "
                              f"got {name!r}")
        return
    if name not in _shipped_stems():
        return
    shipped = POLICY_DIR / f"{name}.yaml"
    if _load_cached(str(shipped)).effective_sha256 != policy.effective_sha256:
        raise PolicyError(f"{where}: name: expected a name of its own for a policy that differs from the "
                          f"shipped {name!r} ({shipped}), got {name!r}: results and logs name a policy by "
                          f"its name (to start from it, write `extends: {name}` and a name of your own)")


def _apply_overrides(
    ops: dict[str, Family], overrides: Mapping[str, Any], where: str, field_root: str,
    known: frozenset[str] | None = None,
) -> None:
    known = known if known is not None else _known_ops()
    for op, fam in overrides.items():
        field_name = f"{field_root}.{op}"
        _check_op(op, where, field_name, known)
        if fam is None:
            fam = _REMOVE
        if not isinstance(fam, str) or (fam not in FAMILIES and fam != _REMOVE):
            raise PolicyError(
                f"{where}: {field_name}: expected a family in {[*(f.value for f in FAMILIES), _REMOVE]}, got {fam!r}"
            )
        if fam == _REMOVE:
            ops.pop(op, None)
        else:
            ops[op] = Family(fam)


def _check_op(op: Any, where: str, field_name: str, known: frozenset[str]) -> None:
    if not isinstance(op, str):
        raise PolicyError(f"{where}: {field_name}: expected an op name (string), got {_tname(op)}")
    if op.endswith("_") and not op.startswith("__"):
        raise PolicyError(
            f"{where}: {field_name}: expected an out-of-place op (in-place ops are never cast), got {op!r}"
        )
    if op not in known:
        raise PolicyError(
            f"{where}: {field_name}: expected an op name the dispatcher maps to a torch callable, got unknown op {op!r}"
        )


def _known_ops(framework: str = "torch") -> frozenset[str]:
    # Op names are checked against the framework itself, so a policy for a framework that is
    # not installed cannot be validated: say which one, in the one-line form of every policy error.
    try:
        if framework == "jax":
            from .jax.primitives import known_primitive_names  # lazy: imports jax

            return known_primitive_names()
        from .torch.op_names import known_op_names  # lazy: imports torch
    except ImportError as exc:
        missing = "JAX" if framework == "jax" else "PyTorch"
        raise PolicyError(f"a {framework} policy needs {missing}, which is not installed ({exc}): "
                          f"pip install 'ampcert[{framework}]'") from None
    return known_op_names()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    text = " ".join(str(problem).split())
    if mark is not None:
        text += f" at line {mark.line + 1}, column {mark.column + 1}"
    return text


def _tname(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _digest_mapping(device_type: str, ops: Mapping[str, str], mixed: Iterable[str] = (),
                    framework: str = "torch", accumulate: Iterable[str] = ()) -> str:
    doc: dict[str, Any] = {"device_type": device_type, "ops": dict(sorted(ops.items())),
                           "uncast_if_mixed": sorted(mixed)}
    if framework != "torch":  # torch digests stay what they were before JAX existed
        doc |= {"framework": framework, "accumulate_fp32": sorted(accumulate)}
    blob = json.dumps(doc, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()
