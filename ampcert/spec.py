"""Suite files: what to run.

A suite (YAML) names workloads, precisions, seeds, a training budget and a
device; :func:`load_suite` validates it (a file, or a suite ampcert ships,
by name: :func:`resolve_suite`) into a :class:`Suite`, and
:func:`expand` turns it into the run matrix, one :class:`RunSpec` per
(workload, precision, seed). A RunSpec is plain, frozen data: it crosses the
process boundary to the worker, and its content (not its position in the
file) gives its run id, so the same suite always names its runs the same way.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    NonNegativeInt,
    PositiveInt,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue

from ampcert.amp.precision import (  # noqa: F401 - PRECISIONS re-exported for suite readers
    AUTOCAST_PRECISIONS,
    FP8_PRECISIONS,
    PRECISIONS,
    Precision,
)
from ampcert.amp.recipes import RECIPES
from ampcert.configio import canonical_json, read_yaml, validation_message
from ampcert.errors import UserError
from ampcert.frameworks import installed_release, require_backend
from ampcert.own_job.entry import OwnJob, check_templates

AmpImpl = Literal["native", "ampcert"]
Device = Literal["auto", "cpu", "cuda"]
Backend = Literal["torch", "jax"]
# What to do with a low precision that the device does not accelerate
# (fp16 on most CPUs): run it anyway, cap its steps, or skip it. Every choice
# is recorded in the run result; none is silent.
Unaccelerated = Literal["run", "cap", "skip"]
# How a run's worker starts: one process (forked from ampcert's
# forkserver), or data-parallel ranks through torch.distributed.run.
Launcher = Literal["process", "torchrun"]

# Suite names, workload labels and run ids become file names (the results
# folder, ``runs/<run_id>/``), and a results folder is input that may come
# from elsewhere: one pattern for all of them, letters, digits, ``_``, ``.``
# and ``-``, starting with a letter or digit, so that none can be ``..``,
# hidden, absolute or hold a ``/``.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_ID_RE = re.compile(ID_PATTERN)
# A label or suite name leaves room for what a run id (or the default folder
# name) adds to it: precision, amp, seed, repeat and digest, about 35 characters.
MAX_ID_LEN = 200
# The longest file name that common file systems allow (NAME_MAX): a run id
# names a folder, so none may be longer. Planning also checks the limits of
# the file system the results go to (ampcert.results.check_path_limits).
MAX_NAME_LEN = 255


def id_problem(value: str, max_len: int = MAX_ID_LEN) -> str | None:
    """Why ``value`` cannot name a file (a label, run id or suite name), or None."""
    if len(value) > max_len:
        return f"is {len(value)} characters, more than {max_len}"
    if not _ID_RE.fullmatch(value):  # fullmatch: `$` alone would let a trailing newline through
        return "may hold only letters, digits, `_`, `.` and `-`, and must start with a letter or digit"
    return None


def shown(value: str, limit: int = 60) -> str:
    """``value`` as repr, shortened for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 25]}...{text[-20:]} ({len(value)} characters)"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrainBudget(_Strict):
    """How long a run trains: a fixed number of steps, or until the eval
    metric reaches ``target`` with ``max_steps`` as the cap (MLPerf's
    time-to-quality)."""

    steps: PositiveInt | None = None
    target: float | None = None
    max_steps: PositiveInt | None = None
    eval_every: PositiveInt = 50

    @model_validator(mode="after")
    def _one_budget(self) -> TrainBudget:
        if self.target is None:
            if self.steps is None:
                raise ValueError("give `steps`, or `target` with `max_steps`")
            if self.max_steps is not None:
                raise ValueError("`max_steps` caps a `target`; with a fixed budget use `steps`")
        else:
            if self.steps is not None:
                raise ValueError("give either `steps` or `target`, not both")
            if self.max_steps is None:
                raise ValueError("a `target` needs a `max_steps` cap")
        return self

    @property
    def step_limit(self) -> int:
        return self.steps if self.steps is not None else self.max_steps  # type: ignore[return-value]


class TelemetryConfig(_Strict):
    """How the telemetry sampler runs. Not part of a run's identity: the
    sampling rate changes how a run is observed, not what it computes."""

    rate_hz: float = Field(default=10.0, gt=0, le=1000)


class Torchrun(_Strict):
    """Settings for ``launcher: torchrun``. Only the world size (``nnodes`` x
    ``nproc_per_node``) changes what a run computes; the rendezvous settings
    say where the ranks meet and pass through to torchrun unchanged. Anything
    left out here may come from torchrun's own ``PET_*`` environment variables
    on each node (``PET_NODE_RANK``, ``PET_RDZV_ENDPOINT``, ...)."""

    nproc_per_node: PositiveInt
    nnodes: PositiveInt = 1  # a fixed count: an elastic range would change the world size mid-suite
    rdzv_backend: str | None = Field(default=None, min_length=1)
    rdzv_endpoint: str | None = Field(default=None, min_length=1)
    rdzv_id: str | None = Field(default=None, min_length=1)
    node_rank: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _rank_in_range(self) -> Torchrun:
        if self.node_rank is not None and self.node_rank >= self.nnodes:
            raise ValueError(f"`node_rank` {self.node_rank} is not below `nnodes` {self.nnodes}")
        return self


# What MLPerf's status field means by these: `available` hardware and
# software anyone can buy or download, `preview` soon to be, `research`
# (MLPerf's "Research, Development, or Internal") anything else. A
# benchmarking run of one's own machine is the last, hence the default.
SubmissionStatus = Literal["available", "preview", "research"]
# The values MLPerf training 6.1's common rules allow for lowest_numerical_precision_in_*.
MlperfPrecision = Literal["fp64", "fp32", "tf32", "fp16", "bfloat16", "fp8", "mxfp6", "nvfp4", "mxfp4",
                          "int8", "uint8", "int4", "uint4"]


class DeclaredPrecision(_Strict):
    """What a submitter claims its runs of one precision computed in (MLPerf's
    lowest_numerical_precision_in_linear/attn/comm). ampcert logs what it
    measures, whatever is declared; the ``precision_disclosure`` rule fails a
    run whose measurement differs from a declared value."""

    linear: MlperfPrecision | None = None
    attn: MlperfPrecision | None = None
    comm: MlperfPrecision | None = None


class Submission(_Strict):
    """The MLPerf submission fields every run's run.mllog carries
    (``submission_org``, ``submission_platform``, ``submission_division``,
    ``submission_status``): MLPerf's common rules require the first three.

    ``org`` defaults to ``ampcert-user``: ampcert cannot know who runs it, and
    a placeholder that says so is more honest than a guessed name; set it for
    anything you publish. ``platform`` left out is filled at planning from the
    environment fingerprint (the first GPU's name on cuda, the CPU model on
    cpu). ``division`` is MLPerf's `closed` or `open`; ampcert's workloads are
    not MLPerf benchmarks, so its runs are `open` unless a suite says
    otherwise."""

    org: str = Field(default="ampcert-user", min_length=1)
    platform: str | None = Field(default=None, min_length=1)
    division: Literal["closed", "open"] = "open"
    status: SubmissionStatus = "research"
    # Per ampcert precision (fp32, bf16, fp16): the disclosure the submitter declares.
    lowest_precision: dict[Precision, DeclaredPrecision] = Field(default_factory=dict)


class TorchCompile(_Strict):
    """How ``compile: true`` runs compile the training step (torch backend):
    with ``scope: forward`` the model's forward and the loss go through
    ``torch.compile`` (AOTAutograd compiles their backward); with ``scope:
    step`` the step as a user compiles it, from the autocast region to the
    loss scaler's ``update()`` (the scaled backward and the scaler's step, the
    optimizer's inside it, included). The first step runs eagerly (the
    precision probe watches it), the second compiles. ``fallback: eager`` lets
    a run whose compilation fails go on eagerly, its result saying so and why;
    by default (``fail``) such a run fails with the reason."""

    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    fallback: Literal["fail", "eager"] = "fail"
    scope: Literal["forward", "step"] = "forward"

    @model_validator(mode="after")
    def _check(self) -> TorchCompile:
        if self.scope == "step" and self.fallback == "eager":
            # Dynamo compiles a step with graph breaks piece by piece, running each piece
            # as it goes: one that fails part-way may have applied part of the step.
            raise ValueError("`fallback: eager` needs `scope: forward`; a whole step "
                             "that fails to compile part-way may have run part of itself, so it "
                             "cannot be run again eagerly")
        return self


COMPILED_SUFFIX = "-compiled"


class Fp8(_Strict):
    """Which Linear layers of a torch model multiply in FP8 for the ``fp8`` and
    ``mxfp8`` precisions, and how (``amp/torch/fp8.py``; docs/policies.md).

    By default a Linear layer converts when both its dimensions divide by 16
    (32 for mxfp8's blocks), except the model's first and last Linear layers;
    ``include`` and ``exclude`` name modules by pattern (fnmatch on the
    module's name in ``model.named_modules()``, e.g. ``blocks.*.mlp.*``). A
    layer that ``include`` names and the recipe cannot take is an error."""

    # fp8's scaling recipe (torchao's names); mxfp8 always scales blocks of 32.
    recipe: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] = "tensorwise"
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    # The first and last Linear layers stay in bf16 unless this is true.
    first_last: bool = False
    # The eligibility map's statistics are taken at step 1 and every this many
    # steps (each taking costs one extra bf16 and FP8 matmul per Linear layer).
    record_every: PositiveInt = 10


class MemorySweep(_Strict):
    """The suite's memory sweep (``memory:``): for each workload entry and
    precision, short runs at each of ``batch_sizes`` (the first of the suite's
    seeds, ``steps`` training steps, the first of them left out of the peak
    where the device can leave it out: on CUDA) whose peak memory
    is fitted against the batch: fixed bytes plus bytes per sample. The fit
    gives the largest batch that fits each of ``budgets`` (``24GiB``,
    ``80GB``, ``512MiB``; none: the device's own memory). Sweep runs never
    enter the speed tables or other rules than memory_saving (ampcert/memory.py)."""

    batch_sizes: list[PositiveInt] = Field(min_length=3)
    budgets: list[ByteSize] = Field(default_factory=list)
    steps: int = Field(default=4, ge=2, le=1000)
    # After the sweep, one run per entry and precision at the fitted largest batch of the smallest
    # budget the device at hand holds (ampcert/memory.py: confirming_runs); false: the fit alone.
    confirm: bool = True
    # On CUDA: each sweep run sees only this much of the GPU, as a smaller card would
    # (torch.cuda.set_per_process_memory_fraction); the default budget when `budgets` is empty.
    device_memory: ByteSize | None = None

    @model_validator(mode="after")
    def _check(self) -> MemorySweep:
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError(f"`memory.batch_sizes` lists a size twice: {self.batch_sizes}")
        if any(b <= 0 for b in self.budgets):
            raise ValueError("`memory.budgets`: a budget must be more than 0 bytes")
        return self


class SpeedProbe(_Strict):
    """The speed probe (``speed_probe:``; docs/gate.md, "The speed probe"): after the
    certified runs, for each entry and low precision that trains beside FP32, one process
    holds both models of the first seed and times short windows of steps of each in turn,
    with a fixed calibration kernel between them, for a budget of seconds. Its steps are
    not the certified runs' steps: it measures speed only, and no verdict reads it.

    The budget is ``share`` of the time the pair's certified runs took (all their seeds),
    at most ``max_seconds``, split over ``processes`` probe processes: a process has a
    speed of its own (where its memory landed, which cores its threads got), which more
    processes average out, as pyperf's do. On a CPU a probe trains with ``cpu_threads``
    intra-op threads (None: as the runs do); one thread keeps a shared VM's second core,
    whose speed comes and goes, out of the ratio."""

    enabled: bool = True
    share: float = Field(default=0.10, gt=0, le=1)
    max_seconds: float = Field(default=5.0, gt=0, le=3600)
    processes: PositiveInt = Field(default=2, le=16)
    window_steps: PositiveInt = Field(default=2, le=1000)
    cpu_threads: PositiveInt | None = 1


class SlurmOptions(_Strict):
    """Where ``ampcert run --executor slurm`` submits the suite's job arrays
    (command-line options win over these). Not part of any run's identity:
    they say where runs train, not what they compute (docs/fleet.md)."""

    partition: str | None = Field(default=None, min_length=1)
    account: str | None = Field(default=None, min_length=1)
    # Each array task's time limit; default: the longest run timeout of the array plus 5 minutes.
    time_min: PositiveInt | None = None
    # At most this many tasks of an array run at once (sbatch --array=...%N).
    array_parallelism: PositiveInt | None = None
    # Further sbatch options by name, without the dashes (qos, constraint, ...).
    additional: dict[str, str | int] = Field(default_factory=dict)


class WorkloadEntry(_Strict):
    # A built-in or plugin workload by name, or a team's own job as a command
    # (ampcert/command.py): exactly one of the two.
    workload: str | None = Field(default=None, min_length=1)
    command: list[str] | None = Field(default=None, min_length=1)
    # A command's metric (the eval_accuracy its MLLOG reports), its direction and target,
    # its working folder (beside the suite file unless absolute) and extra environment.
    metric: str | None = Field(default=None, min_length=1)
    higher_is_better: bool | None = None
    target: float | None = None
    cwd: str | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    # The variables of ampcert's own environment an own job inherits (unset: all of them).
    inherit_env: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] | None = None
    # Where an own job runs on this machine (`cwd` resolved beside the suite file): set by
    # parse_suite, which knows the file; not a suite field.
    _workdir: str | None = PrivateAttr(default=None)
    id: str | None = Field(default=None, pattern=ID_PATTERN, max_length=MAX_ID_LEN)
    params: dict[str, Any] = Field(default_factory=dict)
    train: TrainBudget | None = None
    precisions: list[Precision] | None = None
    # The precision recipes this entry trains (None: the suite's; [] none).
    recipes: list[Precision] | None = None
    seeds: list[int] | None = None
    timeout_s: PositiveInt | None = None
    # fp16 trains with dynamic loss scaling; `false` turns it off (numerics
    # suites show what it prevents). bf16 and fp32 never scale.
    loss_scaling: bool = True
    # Override the suite's launcher (and its torchrun settings) for this entry.
    launcher: Launcher | None = None
    torchrun: Torchrun | None = None
    # Override the suite's compile axis for this entry.
    compile: list[bool] | None = Field(default=None, min_length=1)
    # Override the suite's FP8 layer policy for this entry.
    fp8: Fp8 | None = None

    @model_validator(mode="after")
    def _label_names_a_file(self) -> WorkloadEntry:
        if (self.workload is None) == (self.command is None):
            raise ValueError("give either `workload` (a workload's name) or `command` (your own job's argv)")
        if self.command is not None:
            self._check_command()
        else:
            given = [k for k in ("metric", "higher_is_better", "target", "cwd") if getattr(self, k) is not None]
            if self.inherit_env is not None:
                given.append("inherit_env")
            if given or self.env:
                raise ValueError(f"`{(given or ['env'])[0]}` belongs to a `command` entry; a workload's "
                                 "metric and target come from the workload (and `train:`)")
        # A label taken from the workload's name (an import path such as
        # `mod:/abs/path`, an entry-point name) is not checked by the `id`
        # field's pattern, and it becomes part of each run's folder name.
        problem = id_problem(self.label)
        if problem is not None:
            raise ValueError(f"the run label {shown(self.label, 200)} taken from the workload's name {problem}; "
                             "give the entry an `id`")
        return self

    def _check_command(self) -> None:
        if self.id is None:
            raise ValueError("a `command` entry needs an `id`: it names the entry's runs and folders")
        refused = [k for k in ("params", "train", "launcher", "torchrun", "fp8") if k in self.model_fields_set]
        if refused:
            raise ValueError(f"`{refused[0]}` configures ampcert's own training; a `command` job trains itself "
                             "(pass settings in its argv or `env`)")
        if self.compile not in (None, [False]):
            raise ValueError("`compile` compiles ampcert's own training step; a `command` job compiles itself")
        if self.target is not None and self.target != self.target:
            raise ValueError("`target` is not a number")
        check_templates(self.command or [], self.env)

    @property
    def label(self) -> str:
        if self.id is not None or self.workload is None:
            return self.id or "command"
        return self.workload.replace(":", ".").split(".")[-1]


class Suite(_Strict):
    name: str = Field(min_length=1, pattern=ID_PATTERN, max_length=MAX_ID_LEN)
    description: str = ""
    backend: Backend = "torch"
    amp: AmpImpl = "native"
    policy: str | None = None
    device: Device = "auto"
    precisions: list[Precision] = Field(default_factory=lambda: list(AUTOCAST_PRECISIONS), min_length=1)
    # Precision recipes (amp/recipes.py: bf16-true, bf16-state, ...), each run and certified
    # beside the precisions as a precision is: every entry trains them too.
    recipes: list[Precision] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    # None: each workload's declared budget (its target quality and step cap).
    train: TrainBudget | None = None
    timeout_s: PositiveInt = 900
    unaccelerated: Unaccelerated = "run"
    unaccelerated_max_steps: PositiveInt | None = None
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    # A rule pack (shipped name or path): the runner schedules what its checks
    # need (enough seeds, repeated seeds) and writes verdicts.json.
    certify: str | None = None
    # `torchrun`: every run trains data-parallel (DistributedDataParallel) on
    # `torchrun.nproc_per_node` x `torchrun.nnodes` ranks; entries may override.
    launcher: Launcher = "process"
    torchrun: Torchrun | None = None
    # MLPerf submission fields for each run's log (see Submission).
    submission: Submission = Field(default_factory=Submission)
    # `[false, true]`: every entry also runs with its training step compiled
    # (torch.compile), as the entry `<label>-compiled`; see TorchCompile.
    compile: list[bool] = Field(default_factory=lambda: [False], min_length=1)
    torch_compile: TorchCompile = Field(default_factory=TorchCompile)
    # Which Linear layers the fp8 and mxfp8 precisions convert (see Fp8).
    fp8: Fp8 = Field(default_factory=Fp8)
    # Where `--executor slurm` submits (partition, account, time limit).
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)
    # Fault injection, to test a gate on real runs: each step of a precision's runs (or of
    # `all` runs: the path they share) is held for this fraction of its own time longer
    # (0.05: 5% slower). Part of each run's identity; reports say so (docs/suites.md).
    inject_slowdown: dict[Literal[Precision, "all"], Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict)
    # A memory sweep: peak memory against batch size per entry and precision (MemorySweep).
    memory: MemorySweep | None = None
    # The in-process interleaved speed probe after the certified runs (SpeedProbe); not part of
    # any certified run's identity: turning it off or on changes no run id.
    speed_probe: SpeedProbe = Field(default_factory=SpeedProbe)
    workloads: list[WorkloadEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Suite:
        seen: set[str] = set()
        for entry in self.workloads:
            for label in self.labels_of(entry):
                if label in seen:
                    raise ValueError(
                        f"duplicate workload entry {label!r}: give each entry a distinct `id`"
                    )
                seen.add(label)
            if True in self.compile_of(entry) and self.backend != "torch":
                raise ValueError(f"workload {entry.label!r}: `compile: true` compiles the torch backend's "
                                 "training step (torch.compile); the JAX backend always jit-compiles its step")
            if len(set(self.compile_of(entry))) != len(self.compile_of(entry)):
                raise ValueError(f"workload {entry.label!r}: `compile` lists a value twice")
            fp8 = [p for p in self.precisions_of(entry) if p in FP8_PRECISIONS]
            if fp8 and self.backend != "torch":
                raise ValueError(f"workload {entry.label!r}: precision {fp8[0]} is not supported by the JAX backend "
                                 "(ampcert's FP8 scales Linear layers of torch models; see docs/policies.md, "
                                 "\"FP8 and MXFP8\"): train it with `backend: torch`")
        listed: list[tuple[str, list[Any]]] = [("precisions", list(self.precisions)), ("recipes", list(self.recipes)),
                                               ("seeds", list(self.seeds))]
        for where, values in listed:
            if len(set(values)) != len(values):
                raise ValueError(f"`{where}` lists a value twice: {values}")
        if self.unaccelerated == "cap" and self.unaccelerated_max_steps is None:
            raise ValueError("`unaccelerated: cap` needs `unaccelerated_max_steps`")
        self._check_injection()
        jobs = [e.label for e in self.workloads if e.command is not None]
        if self.memory is not None and jobs:
            raise ValueError(f"`memory` sweeps the batch of ampcert's own workloads; the command entry {jobs[0]!r} "
                             "sets its own batch")
        if self.backend == "jax" and self.amp == "native":
            raise ValueError("`backend: jax` needs `amp: ampcert`: JAX has no native autocast to compare with")
        for entry in self.workloads:
            if self.launcher_of(entry) != "torchrun":
                continue
            if self.backend != "torch":
                raise ValueError(f"workload {entry.label!r}: `launcher: torchrun` trains the torch backend "
                                 "(DistributedDataParallel); the JAX backend runs one process per run")
            if self.torchrun_of(entry) is None:
                raise ValueError(f"workload {entry.label!r}: `launcher: torchrun` needs "
                                 "`torchrun: {nproc_per_node: N}` (in the suite or the entry)")
        self._check_recipes()  # after the launcher's checks: a recipe's needs read the launch they made sure of
        return self

    def _check_recipes(self) -> None:
        plain = [name for name in [*self.recipes, *(r for e in self.workloads for r in e.recipes or [])]
                 if name not in RECIPES]
        if plain:
            raise ValueError(f"`recipes` names {plain[0]}, a precision: list it under `precisions` "
                             f"(the recipes: {', '.join(RECIPES)})")
        for entry in self.workloads:  # a recipe listed under `precisions` trains as one under `recipes`
            for name in (p for p in self.precisions_of(entry) if p in RECIPES):
                recipe = RECIPES[name]
                if self.backend not in recipe.frameworks:
                    raise ValueError(f"recipe {name} trains with {' or '.join(recipe.frameworks)}; "
                                     f"this suite's backend is {self.backend}")
                if entry.command is not None:  # it trains itself, told the recipe's name (AMPCERT_PRECISION)
                    continue
                if recipe.needs_ranks and _launch(self, entry).world_size < 2:
                    raise ValueError(f"recipe {name} reduces gradients across ranks in {recipe.reduce}: workload "
                                     f"{entry.label!r} needs `launcher: torchrun` with two or more ranks")

    def precisions_of(self, entry: WorkloadEntry) -> list[Precision]:
        """What the entry trains in: its precisions (or the suite's), then its recipes (or the suite's)."""
        own = list(entry.precisions or self.precisions)
        recipes = entry.recipes if entry.recipes is not None else self.recipes
        return own + [r for r in recipes if r not in own]

    def _check_injection(self) -> None:
        if not self.inject_slowdown:
            return
        jobs = [e.label for e in self.workloads if e.command is not None]
        if jobs:
            raise ValueError(f"`inject_slowdown` holds ampcert's own training steps; the command entry {jobs[0]!r} "
                             "trains itself (slow it in its own code)")
        if "all" in self.inject_slowdown and len(self.inject_slowdown) > 1:
            raise ValueError("`inject_slowdown` gives `all` and a precision: give one or the other")
        trained = {p for e in self.workloads for p in self.precisions_of(e)}
        unknown = [p for p in self.inject_slowdown if p != "all" and p not in trained]
        if unknown:
            raise ValueError(f"`inject_slowdown` names {unknown[0]}, which no entry trains "
                             f"(the suite trains {', '.join(sorted(trained))})")

    def slowdown_of(self, precision: Precision) -> float:
        """The fraction a run of ``precision`` is slowed by on purpose (0: not at all)."""
        return self.inject_slowdown.get(precision, self.inject_slowdown.get("all", 0.0))

    def launcher_of(self, entry: WorkloadEntry) -> str:
        return entry.launcher or self.launcher

    def compile_of(self, entry: WorkloadEntry) -> list[bool]:
        return entry.compile if entry.compile is not None else self.compile

    def labels_of(self, entry: WorkloadEntry) -> list[str]:
        """The entry's labels: its own, and ``<label>-compiled`` for its compiled runs,
        which make their own table rows and certificate subjects (with their own FP32)."""
        return [entry.label + (COMPILED_SUFFIX if c else "") for c in self.compile_of(entry)]

    def torchrun_of(self, entry: WorkloadEntry) -> Torchrun | None:
        return entry.torchrun or self.torchrun

    def fp8_of(self, entry: WorkloadEntry) -> Fp8:
        return entry.fp8 or self.fp8


class Launch(Torchrun):
    """How a run's processes start: one process, or torchrun's data-parallel ranks with
    the suite's :class:`Torchrun` settings. A process launch keeps those settings'
    defaults: one rank on one node, no rendezvous. Only the world size enters a run's
    identity; the rendezvous settings say where the ranks meet."""

    launcher: Launcher = "process"
    nproc_per_node: PositiveInt = 1

    @model_serializer(mode="wrap")
    def _launcher_first(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Torchrun's fields come first in a subclass; stored, the launcher leads (schema v1's order).
        data = handler(self)
        return {"launcher": data.pop("launcher"), **data}

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node if self.launcher == "torchrun" else 1


class SweepPoint(_Strict):
    """Where a run sits in the suite's memory sweep (``memory:``, ampcert/memory.py):
    the batch it trains at instead of the workload's, so that its peak memory is its
    result. Every field None: a certified run, not a sweep point. (Each is written only
    when set: results from before the sweep keep their bytes.)"""

    batch_size: PositiveInt | None = Field(default=None, exclude_if=lambda v: v is None)
    # The GPU memory the run may use (MemorySweep.device_memory): a smaller card, emulated.
    device_memory_limit: PositiveInt | None = Field(default=None, exclude_if=lambda v: v is None)
    # A confirming run (memory.confirming_runs): the budget, in bytes, whose fitted largest
    # batch it trains at; planned after the sweep, never in plan.json.
    confirms_budget: PositiveInt | None = Field(default=None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _a_point_has_a_batch(self) -> SweepPoint:
        if self.batch_size is None and (self.device_memory_limit is not None or self.confirms_budget is not None):
            raise ValueError("a memory-sweep point's emulated card or confirmed budget needs its `batch_size`")
        return self


class ResumePoint(_Strict):
    """A run that checkpoints itself and resumes from the checkpoint mid-training (the rule
    ``resume_equivalence``): after window ``resume_after_window`` (``eval_every`` steps
    each) it saves what training needs, scrambles its live state, restores it from the
    file and trains on; the check holds it to the seed's run that never stopped. None: a
    run that does not. (Written only when set.)"""

    resume_after_window: PositiveInt | None = Field(default=None, exclude_if=lambda v: v is None)


class ProbePoint(_Strict):
    """A speed probe's process (:class:`SpeedProbe`): the run's spec is the low precision's,
    of the first seed; the FP32 model it alternates with is :meth:`RunSpec.probe_reference`.
    Every field None: not a probe. (Each is written only when set.)"""

    probe_process: NonNegativeInt | None = Field(default=None, exclude_if=lambda v: v is None)
    probe_window_steps: PositiveInt | None = Field(default=None, exclude_if=lambda v: v is None)
    probe_cpu_threads: PositiveInt | None = Field(default=None, exclude_if=lambda v: v is None)
    # The FP32 reference's own injected slowdown (a suite's `inject_slowdown: {all: ...}`).
    probe_reference_slowdown: float = Field(default=0.0, ge=0, le=1, exclude_if=lambda v: not v)
    # Seconds of alternating windows, resolved from the pair's certified runs just before the
    # probe runs (runner/speed_probes.py); how long it measures, not what: not in the run id.
    probe_seconds: float | None = Field(default=None, gt=0, exclude_if=lambda v: v is None)


class FaultInjection(_Strict):
    """What is done to a run on purpose, to test what judges it (the suite's
    ``inject_slowdown``): each training step held this fraction of its own time longer.
    (Written only when set.)"""

    injected_slowdown: float = Field(default=0.0, ge=0, le=1, exclude_if=lambda v: not v)


class RunSpec(_Strict):
    """One run of the matrix: everything a worker needs, nothing it must look up."""

    suite: str
    label: str
    workload: str
    params: dict[str, Any]
    backend: Backend
    amp: AmpImpl
    policy: str | None
    precision: Precision
    seed: int
    device: Literal["cpu", "cuda"]
    # ampcert's own training budget; None for an own job, which trains itself.
    train: TrainBudget | None
    timeout_s: int
    # Digest of the resolved op policy (amp: ampcert); the id hashes this, not
    # the path, so moving a policy file keeps ids and editing it changes them.
    policy_sha256: str | None = None
    # Filled from the device's precision capability when the suite is planned.
    accelerated: bool = True
    capability_note: str = ""
    skip_reason: str | None = None
    peak_flops: float | None = None
    peak_source: str = ""
    # Observation only, so left out of identity() like the timeout.
    telemetry_rate_hz: float = Field(default=10.0, gt=0, le=1000)
    loss_scaling: bool = True
    # 0 for a seed's run; 1, 2, ... for repeats of it (determinism checks).
    repeat: int = Field(default=0, ge=0)
    # How its processes start (one process, or torchrun's ranks); stored flat (launcher, nproc_per_node, ...).
    launch: Launch = Field(default_factory=Launch)
    # What the run's MLLOG discloses about the submission (platform filled at
    # planning) and the suite file's name (MLPerf's config_filename). Left out
    # of identity(): they describe who ran it where, not what it computes.
    submission: Submission = Field(default_factory=Submission)
    config_filename: str = ""
    # The training step compiled with torch.compile (these settings); None: eager.
    torch_compile: TorchCompile | None = None
    # The FP8 layer policy of an fp8 or mxfp8 run; None for every other precision.
    fp8: Fp8 | None = None
    # A team's own job (a suite entry's `command:`); None for ampcert's workloads, whose job
    # is `train`: a run has exactly one of the two (_one_job).
    # (Written only when set: results of ampcert's own workloads keep their bytes.)
    command: OwnJob | None = Field(default=None, exclude_if=lambda v: v is None)
    # What is done to the run on purpose (the suite's `inject_slowdown`); stored flat.
    fault: FaultInjection = Field(default_factory=FaultInjection)
    # Where it sits in the suite's memory sweep (none for a certified run); stored flat.
    sweep: SweepPoint = Field(default_factory=SweepPoint)
    # Where it stops and resumes from its own checkpoint (none for every other run); stored flat.
    resume: ResumePoint = Field(default_factory=ResumePoint)
    # A speed probe's process (none for every other run); stored flat.
    probe: ProbePoint = Field(default_factory=ProbePoint)

    @model_validator(mode="before")
    @classmethod
    def _grouped(cls, data: Any) -> Any:
        """A stored RunSpec (plan.json, result.json, report.json: schema v1) is flat; its
        groups' fields are gathered into them here, so every stored folder reads as before."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for group, model in _GROUPS.items():
            flat = {name: data.pop(name) for name in model.model_fields if name in data}
            if flat and group in data:
                raise ValueError(f"give `{group}` or its fields ({', '.join(flat)}), not both")
            if flat:
                data[group] = flat
        return data

    @model_serializer(mode="wrap")
    def _stored_flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Written flat, each group's fields where the group stands: the bytes of schema v1."""
        out: dict[str, Any] = {}
        for name, value in handler(self).items():
            if name in _GROUPS:
                out.update(value)
            else:
                out[name] = value
        return out

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        # The schema describes what is stored: the groups' fields in place of the groups.
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        properties: dict[str, Any] = {}
        for name, prop in target["properties"].items():
            if name in _GROUPS:
                properties.update(handler.resolve_ref_schema(prop)["properties"])
            else:
                properties[name] = prop
        target["properties"] = properties
        return schema

    @model_validator(mode="after")
    def _one_job(self) -> RunSpec:
        if (self.train is None) == (self.command is None):
            raise ValueError("a run trains one job: ampcert's workload (`train`) or an own job (`command`)")
        if self.command is not None and (self.fault.injected_slowdown or self.sweep.batch_size is not None
                                         or self.resume.resume_after_window is not None
                                         or self.probe.probe_process is not None):
            raise ValueError("an own job trains itself: it is neither slowed on purpose, nor a memory-sweep point, "
                             "nor resumed nor probed by ampcert")
        return self

    @model_validator(mode="after")
    def _names_are_file_names(self) -> RunSpec:
        # A plan.json is read back from a results folder that may come from
        # elsewhere: its labels name folders, so they are checked here, where
        # every RunSpec is built or parsed, not only where suites are read.
        problem = id_problem(self.label)
        if problem is not None:
            raise ValueError(f"label {shown(self.label)} {problem}")
        run_id = self.run_id
        if len(run_id) > MAX_NAME_LEN:
            raise ValueError(f"run id {shown(run_id)} is longer than the {MAX_NAME_LEN} characters "
                             "a file name may have")
        return self

    @property
    def step_limit(self) -> int | None:
        """ampcert's step cap for this run; None for an own job (its steps are its own)."""
        return self.train.step_limit if self.train is not None else None

    @property
    def target(self) -> float | None:
        """The quality the run trains to, where it has one."""
        if self.command is not None:
            return self.command.target
        return self.train.target if self.train is not None else None

    def budget_key(self) -> str:
        """What runs must share to be compared as trained alike: ampcert's budget, or the job's."""
        return canonical_json(self.train.model_dump() if self.train is not None else {"command": self.label})

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    def identity(self) -> dict[str, Any]:
        """The fields that decide what a run computes; its id hashes these.

        The suite name, timeout and capability findings are left out: renaming
        a suite or re-measuring a device does not make a different run.
        """
        ident = self.model_dump(
            include={"label", "workload", "params", "backend", "amp", "policy_sha256",
                     "precision", "seed", "device", "train"}
        )
        # Hashed only where they differ from the default, so ids of runs that
        # existed before these fields stay what they were.
        if not self.loss_scaling:
            ident["loss_scaling"] = False
        if self.repeat:
            ident["repeat"] = self.repeat
        if self.launch.launcher == "torchrun":
            ident["launcher"] = "torchrun"
            ident["world_size"] = self.world_size
        if self.torch_compile is not None:  # the fallback is what to do on failure, not what runs
            ident["torch_compile"] = self.torch_compile.model_dump(include={"mode", "backend"})
            if self.torch_compile.scope != "forward":  # ids of forward-compiled runs stay what they were
                ident["torch_compile"]["scope"] = self.torch_compile.scope
        if self.fp8 is not None:  # when the map is recorded does not change what is trained
            ident["fp8"] = self.fp8.model_dump(exclude={"record_every"})
        if self.command is not None:
            ident["command"] = self.command.identity()
        # A slowed run is another run: it never resumes or merges as the real one. A sweep
        # point's batch, emulated card and confirmed budget make it another run too.
        ident.update(self.fault.model_dump())
        ident.update(self.sweep.model_dump())
        ident.update(self.resume.model_dump())  # a resumed run is another run of the seed
        ident.update(self.probe.model_dump(exclude={"probe_seconds"}))  # a probe is no certified run
        return ident

    @property
    def run_id(self) -> str:
        digest = hashlib.sha256(canonical_json(self.identity()).encode()).hexdigest()[:8]
        rep = f"-r{self.repeat}" if self.repeat else ""
        point = self.sweep
        batch = f"-b{point.batch_size}{'c' if point.confirms_budget else ''}" if point.batch_size is not None else ""
        window = self.resume.resume_after_window
        resumed = f"-k{window}" if window is not None else ""
        process = self.probe.probe_process
        probe = f"-p{process}" if process is not None else ""
        return f"{self.label}-{self.precision}-{self.amp}-s{self.seed}{rep}{resumed}{batch}{probe}-{digest}"

    @property
    def is_rerun(self) -> bool:
        """A second run of a seed already in its group: a determinism repeat or a resumed run.
        Neither is one of the group's samples; their checks read them."""
        return bool(self.repeat) or self.resume.resume_after_window is not None

    @property
    def is_memory_sweep(self) -> bool:
        """A run of the suite's memory sweep (or its confirming run): its peak memory is its result,
        not its speed or accuracy."""
        return self.sweep.batch_size is not None

    @property
    def is_speed_probe(self) -> bool:
        """A process of the speed probe (:class:`SpeedProbe`): its speed ratio is its result,
        and it is none of its subject's certified runs."""
        return self.probe.probe_process is not None

    def probe_reference(self) -> RunSpec:
        """The FP32 run a speed probe alternates with: this run's entry and seed in FP32, with
        FP32's own injected slowdown, accelerated (FP32 always is)."""
        return self.model_copy(update={
            "precision": "fp32", "fp8": None, "accelerated": True, "capability_note": "", "skip_reason": None,
            "fault": FaultInjection(injected_slowdown=self.probe.probe_reference_slowdown),
            "probe": ProbePoint()})


def speed_probes(settings: SpeedProbe | None, runs: list[RunSpec]) -> list[RunSpec]:
    """The speed probe's processes of a planned matrix (:class:`SpeedProbe`; none where
    ``settings`` is None or turned off): for each entry label and precision other than FP32
    whose first seed also trains in FP32, ``settings.processes`` probes of that seed, their
    budget unresolved. Own jobs, torchrun's ranks, memory-sweep points and reruns have none.
    Derived from the plan alone, the same on every call: `--resume` finds them done."""
    if settings is None or not settings.enabled:
        return []
    firsts: dict[tuple[str, str], RunSpec] = {}
    for run in runs:
        if (run.command is None and run.world_size == 1 and not run.is_memory_sweep and not run.is_rerun
                and not run.is_speed_probe):
            firsts.setdefault((run.label, run.precision), run)  # the first seed's run, in matrix order
    probes = []
    for (label, precision), run in firsts.items():
        reference = firsts.get((label, "fp32"))
        if precision == "fp32" or reference is None or reference.seed != run.seed:
            continue
        probes += [run.model_copy(update={"probe": ProbePoint(
            probe_process=process, probe_window_steps=settings.window_steps, probe_cpu_threads=settings.cpu_threads,
            probe_reference_slowdown=reference.fault.injected_slowdown)}) for process in range(settings.processes)]
    return probes


# RunSpec's groups, by field: each is stored as its own fields, flat (schema v1).
_GROUPS: dict[str, type[_Strict]] = {"launch": Launch, "sweep": SweepPoint, "fault": FaultInjection,
                                     "resume": ResumePoint, "probe": ProbePoint}


def _check_compile_scope(suite: Suite, source: str) -> None:
    """A whole step compiled (``torch_compile: {scope: step}``) enters ampcert's autocast
    region inside the compiled function, which the torch installed may not trace
    (amp/torch/support.py): one line now, not a failed or eager run later."""
    if suite.backend != "torch" or suite.amp != "ampcert" or suite.torch_compile.scope != "step":
        return
    if not any(True in (entry.compile or suite.compile) for entry in suite.workloads if entry.command is None):
        return
    from ampcert.amp.torch.support import REGION_IN_TRACE_MIN, release_name

    have = installed_release("torch")
    if have is not None and have < REGION_IN_TRACE_MIN:
        need = release_name(REGION_IN_TRACE_MIN)
        raise UserError(f"{source}: torch_compile: scope step compiles ampcert's autocast region inside the step, "
                        f"which needs torch {need} or newer (this is torch {release_name(have)}): use scope "
                        f"forward (the region around the compiled forward), or upgrade torch to {need}+")


def parse_suite(data: Any, source: str = "<suite>") -> Suite:
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of suite fields at the top level")
    try:
        suite = Suite.model_validate(data)
    except ValidationError as err:
        raise UserError(validation_message(source, err, data)) from None
    # Before the workloads: a plugin workload that imports the missing framework
    # would otherwise fail with a less useful "does not import".
    if any(entry.command is None for entry in suite.workloads):  # an own job brings its own
        require_backend(suite.backend, source)
        _check_compile_scope(suite, source)
    from ampcert.workloads import registry

    for i, entry in enumerate(suite.workloads):
        where = f"{source}: workloads[{i}]({entry.label})"
        if entry.command is not None:
            _check_workdir(entry, source, where)
            continue
        registry.validate_entry(entry, where)
        if suite.backend == "jax" and not hasattr(registry.get_for(entry, where), "build_jax"):
            raise UserError(f"{where}: backend jax: workload {entry.workload!r} has no JAX version (build_jax)")
    if suite.policy is not None:
        if suite.amp != "ampcert":
            raise UserError(f"{source}: policy: an op policy applies to `amp: ampcert`, not `amp: {suite.amp}`")
        suite = suite.model_copy(update={"policy": str(_policy_path(suite.policy, source))})
        load_op_policy(suite.policy, f"{source}: policy", framework=suite.backend)
    if suite.certify is not None:
        # The rule pack itself is read by the planner (it sits above this
        # layer); here only its path is fixed, as the suite's folder sees it.
        suite = suite.model_copy(update={"certify": _rules_ref(suite.certify, source)})
    return suite


def command_workdir(entry: WorkloadEntry, source: str) -> Path:
    """Where a command entry's job runs: its ``cwd`` beside the suite file (unless
    absolute), or the suite file's folder."""
    base = Path(source).parent
    return (base / Path(entry.cwd).expanduser()).resolve() if entry.cwd else base.resolve()


def _check_workdir(entry: WorkloadEntry, source: str, where: str) -> None:
    workdir = command_workdir(entry, source)
    if not workdir.is_dir():
        raise UserError(f"{where}: cwd: {workdir} is not a folder")
    entry._workdir = str(workdir)


def _rules_ref(ref: str, source: str) -> str:
    """A relative rule-pack path is looked up beside the suite file, then from
    the working folder; a bare name (``default``) is a shipped rule pack."""
    if "/" not in ref and not ref.endswith((".yaml", ".yml")):
        return ref
    p = Path(ref).expanduser()
    beside = Path(source).parent / p
    return str(beside) if not p.is_absolute() and beside.is_file() else str(p)


def _policy_path(ref: str, source: str) -> str | Path:
    """A relative policy path is looked up beside the suite file, then from the
    working folder; a bare name (``torch-cpu``) is a shipped policy."""
    beside = Path(source).parent / ref
    return beside.resolve() if beside.is_file() else ref


def load_op_policy(ref: str | None, where: str, device: str = "cpu", framework: str = "torch"):
    """The OpPolicy for a suite's `policy:` (or the shipped one for ``device``
    and ``framework``); a policy written for the other framework is refused."""
    from ampcert.amp.policy import PolicyError, load_policy, shipped_policy

    try:
        policy = load_policy(ref) if ref else shipped_policy(device, framework=framework)
    except PolicyError as exc:
        raise UserError(f"{where}: {exc}") from None
    if policy.framework != framework:
        raise UserError(f"{where}: {policy.source or policy.name}: framework: expected a {framework} policy "
                        f"(the suite's backend), got a {policy.framework} policy")
    return policy


def resolve_suite(ref: str | Path) -> Path:
    """The suite file ``ref`` names: a file where one exists at that path (from the
    working folder), else, for a bare name (no ``/``, no ``.yaml``: ``vision``), the
    suite ampcert ships under that name (``ampcert list`` names them). A shipped suite
    is read where it is installed, so its relative references resolve beside it."""
    path = Path(ref)
    text = str(ref)
    if path.is_file() or "/" in text or "\\" in text or text.endswith((".yaml", ".yml")) or text in ("", ".", ".."):
        return path  # a path (read_yaml says what is wrong with one that is not a file)
    from ampcert.resources import shipped_names, shipped_path

    names = shipped_names("suite")
    if text not in names:
        raise UserError(f"{text}: suite file not found, and ampcert ships no suite of that name "
                        f"(shipped: {', '.join(names)})")
    return shipped_path("suite", text)


def load_suite(path: str | Path) -> Suite:
    """The suite a file (or a shipped suite's name: :func:`resolve_suite`) holds, validated."""
    path = resolve_suite(path)
    return parse_suite(read_yaml(path, "suite file"), str(path))


def expand(suite: Suite, device: Literal["cpu", "cuda"], *, min_seeds: int = 1, repeats: int = 0,
           resumes: tuple[int, ...] = ()) -> list[RunSpec]:
    """The run matrix, in a stable order: workload entry, then seed, then precision.

    A seed's precisions run one after the other (fp32 s0, bf16 s0, fp32 s1, ...),
    never all of FP32 and then all of bf16: two runs of a seed then share the
    machine's state (its load, its clocks, its caches), and a low precision's
    speed-up over FP32, paired by seed, cancels what the machine does to both
    (``aggregate.paired_speedups``, what the nightly history gates the gain on).

    ``min_seeds``, ``repeats`` and ``resumes`` are what the suite's rule pack needs
    (its statistical checks need that many seeds; its determinism check reruns the
    first seed ``repeats`` times; its resume check runs the first seed once more per
    window in ``resumes``, stopped after that window and resumed from its checkpoint;
    not an own job, which trains itself): the planner reads the pack and passes them."""
    from ampcert.workloads import registry

    policy_sha256 = None
    if suite.amp == "ampcert":
        policy_sha256 = load_op_policy(suite.policy, "policy", device, suite.backend).effective_sha256
    runs: list[RunSpec] = []
    for entry in suite.workloads:
        launch = _launch(suite, entry)
        job: OwnJob | None = None
        budget: TrainBudget | None = None
        if entry.command is not None:
            params: dict[str, Any] = {}
            job = OwnJob(argv=entry.command, env=entry.env, inherit_env=entry.inherit_env, cwd=entry.cwd,
                             workdir=entry._workdir, metric=entry.metric or "accuracy",
                             higher_is_better=True if entry.higher_is_better is None else entry.higher_is_better,
                             target=entry.target)
        else:
            params, declared = registry.resolve(entry)
            budget = entry.train or suite.train or TrainBudget(
                target=declared.target, max_steps=declared.max_steps, eval_every=declared.eval_every)
        seeds = with_min_seeds(entry.seeds or suite.seeds, min_seeds)
        matrix = [(compiled, label, precision, seed, repeat)
                  for compiled, label in zip(suite.compile_of(entry), suite.labels_of(entry), strict=True)
                  # repeat 0 of every seed, then `repeats` reruns of the first seed
                  for seed, repeat in [(s, 0) for s in seeds] + [(seeds[0], r) for r in range(1, repeats + 1)]
                  for precision in suite.precisions_of(entry)]
        for compiled, label, precision, seed, repeat in matrix:
            runs.append(
                _run_spec(
                    entry,
                    suite=suite.name,
                    label=label,
                    workload=entry.workload or "command",
                    params=params,
                    backend=suite.backend,
                    amp=suite.amp,
                    policy=suite.policy,
                    precision=precision,
                    seed=seed,
                    device=device,
                    train=budget,
                    timeout_s=entry.timeout_s or suite.timeout_s,
                    policy_sha256=policy_sha256,
                    telemetry_rate_hz=suite.telemetry.rate_hz,
                    loss_scaling=entry.loss_scaling,
                    repeat=repeat,
                    submission=suite.submission,
                    torch_compile=suite.torch_compile if compiled else None,
                    fp8=suite.fp8_of(entry) if precision in FP8_PRECISIONS and job is None else None,
                    command=job,
                    fault=FaultInjection(injected_slowdown=suite.slowdown_of(precision)),
                    launch=launch,
                )
            )
        if job is None:
            firsts = [r for r in runs[-len(matrix):] if r.seed == seeds[0] and not r.repeat]
            runs.extend(r.model_copy(update={"resume": ResumePoint(resume_after_window=window)})
                        for window in resumes for r in firsts)
        if suite.memory is not None and job is None:
            runs.extend(_memory_runs(suite, entry, suite.memory, runs[-1], seeds[0]))
    return runs


def _memory_runs(suite: Suite, entry: WorkloadEntry, sweep: MemorySweep, like: RunSpec, seed: int) -> list[RunSpec]:
    """The entry's memory-sweep runs: each label and precision at each of the sweep's batch
    sizes, ``sweep.steps`` steps of the first seed, evaluated once at the end (the peak is
    read before that evaluation)."""
    budget = TrainBudget(steps=sweep.steps, eval_every=sweep.steps)
    if sweep.device_memory is not None and like.backend == "jax":
        raise UserError("`memory.device_memory` emulates a smaller card through torch's caching allocator "
                        "(torch.cuda.set_per_process_memory_fraction); JAX has no such per-process limit: "
                        "leave it out of a JAX suite, whose sweep measures on the card itself")
    if sweep.device_memory is not None and like.device != "cuda":
        raise UserError(f"`memory.device_memory` shrinks a CUDA device (torch.cuda.set_per_process_memory_fraction); "
                        f"this suite runs on {like.device}: leave it out, or run on cuda")
    return [like.model_copy(update={
                "label": label, "precision": precision, "seed": seed, "repeat": 0, "train": budget,
                "fault": FaultInjection(), "resume": ResumePoint(),
                "sweep": SweepPoint(batch_size=batch, device_memory_limit=int(sweep.device_memory)
                                    if sweep.device_memory is not None else None),
                "torch_compile": suite.torch_compile if compiled else None,
                "fp8": suite.fp8_of(entry) if precision in FP8_PRECISIONS else None})
            for compiled, label in zip(suite.compile_of(entry), suite.labels_of(entry), strict=True)
            for precision in suite.precisions_of(entry)
            for batch in sweep.batch_sizes]


def _run_spec(entry: WorkloadEntry, **fields: Any) -> RunSpec:
    """A RunSpec, or the one-line UserError for one whose run id cannot name
    a folder (a long label with a many-digit seed): refused while planning,
    not when the run's folder is made."""
    try:
        return RunSpec(**fields)
    except ValidationError as err:
        msg = err.errors()[0]["msg"].removeprefix("Value error, ")
        raise UserError(f"workload {shown(entry.label)}, precision {fields['precision']}, seed {shown(str(fields['seed']), 40)}: "
                        f"{msg}; give the entry a shorter `id`") from None


def _launch(suite: Suite, entry: WorkloadEntry) -> Launch:
    if suite.launcher_of(entry) != "torchrun":
        return Launch()
    tr = suite.torchrun_of(entry)
    assert tr is not None  # Suite._check
    return Launch(launcher="torchrun", **tr.model_dump())


def with_min_seeds(seeds: list[int], minimum: int) -> list[int]:
    """``seeds``, extended with the next unused integers up to ``minimum``
    (a rule pack's statistical checks cannot pass on fewer)."""
    out = list(seeds)
    candidate = max(out) + 1 if out else 0
    while len(out) < minimum:
        if candidate not in out:
            out.append(candidate)
        candidate += 1
    return out


def apply_capabilities(
    suite: Suite, runs: list[RunSpec], capabilities: dict[str, dict[str, Any]]
) -> list[RunSpec]:
    """Mark runs whose precision the device does not accelerate, and apply
    the suite's declared policy for them (run, cap the steps, or skip)."""
    out: list[RunSpec] = []
    for run in runs:
        cap = capabilities.get(run.precision, {"accelerated": True, "note": ""})
        update: dict[str, Any] = {"accelerated": cap["accelerated"], "capability_note": cap["note"],
                                  "peak_flops": cap.get("peak_flops"), "peak_source": cap.get("peak_source", "")}
        if not cap["accelerated"]:
            if suite.unaccelerated == "skip":
                update["skip_reason"] = (
                    f"{run.precision} not accelerated on {run.device}; skipped by "
                    "the suite's `unaccelerated: skip`"
                )
            elif suite.unaccelerated == "cap" and run.is_memory_sweep:  # a few steps already; fewer measure nothing
                update["capability_note"] += "; a memory-sweep run is not capped (its peak needs its steps)"
            elif suite.unaccelerated == "cap":
                limit = suite.unaccelerated_max_steps
                assert limit is not None
                budget = run.train
                if budget is None:  # an own job: its steps are its own
                    update["capability_note"] += (
                        "; the suite's `unaccelerated: cap` does not apply to an own job, which sets its own steps"
                    )
                elif budget.step_limit > limit:
                    fields = {"max_steps": limit} if budget.target is not None else {"steps": limit}
                    update["train"] = budget.model_copy(update=fields)
                    update["capability_note"] += (
                        f"; steps capped at {limit} by the suite's `unaccelerated: cap`"
                    )
        # A capped run computes something else, so its id (which hashes the
        # budget) differs; the plan is stored, so --resume never re-decides.
        out.append(run.model_copy(update=update))
    return out
