"""Rule packs: certification criteria as data.

A rule pack (``configs/rules/default.yaml``) lists rules; each names one check
from a fixed set, its threshold, the runs it applies to and whether it is
required (its FAIL fails the certificate) or advisory::

    - id: parity.final_metric
      check: accuracy_parity
      measures: final eval metric, low precision minus FP32, paired by seed
      margin: 0.02
      per_workload: {gpt: 0.05}     # the threshold for entries of this label/workload
      min_seeds: 3
      applies_to: {precisions: [bf16, fp16]}   # the default
      required: true                            # the default

Rules are declarative on purpose: MLPerf's compliance checker evaluates rule
strings as Python; here a rule can only pick a check and set its numbers, so
a rule file can never run code. Loading validates every field and reports
the first problem as one line (file, rule, field, what was expected).

A check's parameters are a :class:`RuleModel` subclass whose ``check`` is a
one-value ``Literal``, its id: defining the class is what adds the check to
the set a pack may name (:data:`CHECKS`, :data:`Rule`, in the order the
classes are written here). The function that judges it is registered beside
it with ``@judges(Model)`` in :mod:`ampcert.certify.checks`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ampcert.amp.precision import LOW_PRECISIONS, Precision, base_precision
from ampcert.errors import UserError
from ampcert.resources import (
    SHIPPED_PREFIX,
    config_path,
    from_label,
    require_shipped,
    shipped_label,
)

RULES_DIR = config_path("rules")



class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AppliesTo(_Strict):
    """Which (workload, backend, amp, precision) subjects a rule judges;
    ``"*"`` matches everything. Workloads match an entry's label or name."""

    workloads: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    precisions: list[Precision] = Field(default_factory=lambda: list(LOW_PRECISIONS), min_length=1)
    backends: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    amp: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    # `[cuda]`: a rule for GPUs only (a CPU's memory behaves otherwise, see memory_saving).
    devices: list[Literal["*", "cpu", "cuda"]] = Field(default=["*"], min_length=1)

    def matches(self, label: str, workload: str, backend: str, amp: str, precision: Precision,
                device: str | None = None) -> bool:
        def ok(values: list[str], *candidates: str) -> bool:
            return "*" in values or any(c in values for c in candidates)

        # a rule that names a recipe's base precision (bf16 for bf16-true) judges the recipe too
        return (ok(self.workloads, label, workload)
                and (precision in self.precisions or base_precision(precision) in self.precisions)
                and ok(self.backends, backend) and ok(self.amp, amp)
                and (device is None or ok(list(self.devices), device)))


#: every check, its id to its rule model, in the order the models are defined below
RULE_MODELS: dict[str, type[RuleModel]] = {}


class RuleModel(_Strict):
    """What every rule has; a subclass with a ``check: Literal["<id>"]`` field is one check."""

    if TYPE_CHECKING:
        check: str  # each check's own Literal (pydantic's discriminator), never declared here

    id: str = Field(pattern=r"^[a-z][a-z0-9_.-]*$", max_length=80)
    measures: str = Field(min_length=1)
    applies_to: AppliesTo = Field(default_factory=AppliesTo)
    required: bool = True
    per_workload: dict[str, float] = Field(default_factory=dict)

    #: the name of the rule's main threshold field (overridden per workload by ``per_workload``):
    #: a fact of the rule's class, never a field a rule pack could point at another attribute
    threshold_field: ClassVar[str] = ""
    #: the check's id, from its ``check`` Literal (set when the subclass is defined)
    check_id: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        field = cls.model_fields.get("check")
        if field is None:
            return  # an intermediate base, not a check
        values = get_args(field.annotation)
        if get_origin(field.annotation) is not Literal or len(values) != 1 or not isinstance(values[0], str):
            raise TypeError(f"{cls.__name__}.check: expected a one-value Literal naming the check, "
                            f"got {field.annotation!r}")
        if values[0] in RULE_MODELS:
            raise TypeError(f"{cls.__name__}: check {values[0]!r} is already {RULE_MODELS[values[0]].__name__}")
        cls.check_id = values[0]
        RULE_MODELS[values[0]] = cls

    def threshold(self, label: str, workload: str) -> float:
        for key in (label, workload):
            if key in self.per_workload:
                return self.per_workload[key]
        return getattr(self, self.threshold_field)


class AccuracyParity(RuleModel):
    check: Literal["accuracy_parity"]
    margin: float = Field(gt=0)
    alpha: float = Field(0.05, gt=0, lt=0.5)
    min_seeds: int = Field(3, ge=2)
    # The precision compared with: FP32 (the default), or BF16 (FP8 against
    # the precision it replaces); same entry, backend and amp, paired by seed.
    reference: Literal["fp32", "bf16"] = "fp32"
    threshold_field: ClassVar[str] = "margin"


class Convergence(RuleModel):
    check: Literal["convergence"]
    max_ratio: float = Field(ge=1.0)
    min_seeds: int = Field(1, ge=1)
    threshold_field: ClassVar[str] = "max_ratio"


class Determinism(RuleModel):
    check: Literal["determinism"]
    repeats: int = Field(1, ge=1, le=10)


class ResumeEquivalence(RuleModel):
    """A run of the first seed stopped after window ``after_window``, its training state
    saved to a file, its live state scrambled and restored from that file, trained on:
    held to the seed's uninterrupted run bit for bit, or, where ``max_metric_delta`` is
    declared (a framework whose kernels are not deterministic), its final metric within it."""

    check: Literal["resume_equivalence"]
    after_window: int = Field(1, ge=1)
    max_metric_delta: float = Field(0.0, ge=0)
    threshold_field: ClassVar[str] = "max_metric_delta"


class SeedSpread(RuleModel):
    check: Literal["seed_spread"]
    max_spread: float = Field(gt=0)
    min_seeds: int = Field(2, ge=2)
    threshold_field: ClassVar[str] = "max_spread"


class ScalerSkipRate(RuleModel):
    check: Literal["scaler_skip_rate"]
    warmup_steps: int = Field(0, ge=0)
    max_rate: float = Field(ge=0, le=1)
    threshold_field: ClassVar[str] = "max_rate"


class ScalerFloor(RuleModel):
    check: Literal["scaler_floor"]
    floor: float = Field(1.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    max_fraction: float = Field(0.0, ge=0, le=1)
    threshold_field: ClassVar[str] = "max_fraction"


class NonFiniteLoss(RuleModel):
    check: Literal["nonfinite_loss"]
    max_fraction: float = Field(0.0, ge=0, le=1)
    threshold_field: ClassVar[str] = "max_fraction"


class Speedup(RuleModel):
    check: Literal["speedup"]
    min_ratio: float = Field(gt=0)
    threshold_field: ClassVar[str] = "min_ratio"


class MemoryRatio(RuleModel):
    check: Literal["memory_ratio"]
    max_ratio: float = Field(gt=0)
    threshold_field: ClassVar[str] = "max_ratio"


class MemorySaving(RuleModel):
    """Memory per sample saved against FP32, from the suite's memory sweep (its fitted
    lines, ampcert/memory.py): PASS where the interval's lower end reaches ``min_saving``,
    FAIL where its upper end falls short, INCONCLUSIVE between; no verdict for a subject
    that was not swept."""

    check: Literal["memory_saving"]
    min_saving: float = Field(gt=-1, lt=1)
    threshold_field: ClassVar[str] = "min_saving"


class PrecisionDisclosure(RuleModel):
    """The suite's declared MLPerf precision disclosure (``submission.lowest_precision``)
    against what each run measured; no verdict where nothing is declared."""

    check: Literal["precision_disclosure"]


class CompileHealth(RuleModel):
    """compile: true runs: graph breaks and recompiles of the compiled step, and
    that it compiled at all; no verdict for runs that were not compiled.
    ``max_graph_breaks`` holds the forward and loss (``scope: forward``), where
    any break is the AMP engine's; a whole step (``scope: step``) breaks by
    design at its backward and around its optimizer step, so its breaks are held
    to ``max_step_graph_breaks`` where the pack sets it, else recorded only."""

    check: Literal["compile_health"]
    max_graph_breaks: int = Field(0, ge=0)
    max_recompiles: int = Field(1, ge=0)
    max_step_graph_breaks: int | None = Field(None, ge=0)
    threshold_field: ClassVar[str] = "max_graph_breaks"


class Fp8Health(RuleModel):
    """fp8/mxfp8 runs: FP8's overflow (steps where an FP8 operand held inf or
    NaN, so its amax and scale were not finite) and the converted layers the
    eligibility map calls unsafe; no verdict for runs without FP8 layers."""

    check: Literal["fp8_health"]
    max_nonfinite_steps: int = Field(0, ge=0)
    max_unsafe_layers: int = Field(0, ge=0)
    threshold_field: ClassVar[str] = "max_nonfinite_steps"


#: the ids a rule pack may name, in the order their models are defined
CHECKS: tuple[str, ...] = tuple(RULE_MODELS)
#: one rule of a pack: the model its ``check`` names
if TYPE_CHECKING:
    Rule = RuleModel
else:  # a Union over a tuple of classes, which `X | Y` cannot spell
    Rule = Annotated[Union[tuple(RULE_MODELS.values())], Field(discriminator="check")]  # noqa: UP007


class RulePack(_Strict):
    name: str = Field(min_length=1)
    version: Literal[1] = 1
    description: str = ""
    rules: list[Rule] = Field(min_length=1)
    # Where the pack was read from and the digest of its bytes: set by load_rules,
    # never by the file (a pack must not be able to claim another pack's digest).
    source: str = Field(default="", exclude=True)
    sha256: str = Field(default="", exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _not_from_the_file(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("source", "sha256"):
                if key in data:
                    raise ValueError(f"`{key}` is recorded by ampcert when it reads the pack; remove it from the file")
        return data

    @model_validator(mode="after")
    def _unique_ids(self) -> RulePack:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.id in seen:
                raise ValueError(f"rule id {rule.id!r} appears twice")
            seen.add(rule.id)
        return self

    def of(self, check: str) -> list[Any]:
        return [r for r in self.rules if r.check == check]

    def min_seeds(self) -> int:
        """Seeds the pack needs for its statistical checks to be able to pass."""
        return max([getattr(r, "min_seeds", 1) for r in self.rules] + [1])

    def repeats(self) -> int:
        return max([r.repeats for r in self.of("determinism")] + [0])

    def resumes(self) -> tuple[int, ...]:
        """The windows after which the pack's resume checks stop and resume a run."""
        return tuple(sorted({r.after_window for r in self.of("resume_equivalence")}))


def shipped_rule_names() -> list[str]:
    return sorted(p.stem for p in require_shipped(RULES_DIR).glob("*.yaml") if p.stem != "mllog")


def _not_found(text: str, candidates: list[Path], *, named: bool) -> str:
    """Why no rule pack was found, in the words the user wrote (never a path inside
    the installation): a mistyped shipped name gets the closest one and the list."""
    from difflib import get_close_matches

    names = shipped_rule_names()
    shipped = f"shipped: {', '.join(names)}"
    if named:
        close = get_close_matches(text, names, n=1)
        return (f"rules: no shipped rule pack is called {text!r}"
                + (f"; did you mean {close[0]!r}?" if close else "")
                + f" ({shipped}; or give the path of a rule file, such as my-rules.yaml)")
    if any(c.is_dir() for c in candidates):
        return f"{text}: rules: expected a rule file (YAML), found a folder"
    if text.startswith(SHIPPED_PREFIX):
        return f"{text}: rules: not a rule pack shipped with this ampcert ({shipped})"
    return f"{text}: rules: rule file not found (or give a shipped rule pack's name; {shipped})"


def load_rules(ref: str | Path | None = None, base_dir: Path | None = None) -> RulePack:
    """A rule pack from a path or a shipped name (``default``, ``procurement``);
    raises UserError with one line on any problem."""
    from ampcert.configio import read_yaml_file, validation_message

    text = str(ref or "default")
    candidates = []
    shipped = from_label(text)
    named = False
    if shipped is not None:  # a pack as results record it: ampcert:configs/rules/<name>.yaml
        candidates.append(shipped)
    elif "/" in text or text.endswith((".yaml", ".yml")):
        p = Path(text).expanduser()
        if not p.is_absolute() and base_dir is not None:
            candidates.append(base_dir / p)
        candidates.append(p)
    else:
        named = True
        candidates.append(RULES_DIR / f"{text}.yaml")
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        raise UserError(_not_found(text, candidates, named=named))
    data, raw = read_yaml_file(path, "rule file", mapping="name and rules")
    rules = data.get("rules")
    if isinstance(rules, list):
        for i, rule in enumerate(rules):
            if isinstance(rule, dict) and "check" in rule and rule["check"] not in CHECKS:
                raise UserError(f"{path}: rules[{i}].check: expected one of {list(CHECKS)}, "
                                f"got {rule['check']!r}")
    try:
        pack = RulePack.model_validate(data)
    except ValidationError as err:
        raise UserError(validation_message(str(path), err, data)) from None
    return pack.model_copy(update={"source": shipped_label(path), "sha256": hashlib.sha256(raw).hexdigest()})
