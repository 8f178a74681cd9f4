"""Run results on disk: the model, the folder layout, atomic writes, loading.

One invocation of ``ampcert run`` owns one folder::

    OUT/
      suite.yaml          the suite file exactly as given (its bytes are hashed)
      plan.json           the run matrix as planned, with device capabilities
      runs/<run_id>/
        result.json       RunResult, written atomically once the run ends
        run.mllog         MLPerf-style event log, appended while the run trains
        telemetry.csv     power/memory/utilisation samples (ampcert.telemetry)
      summary.json        per-run table, re-derivable from the results
      summary.html

A run is finished exactly when its result.json exists and parses; every
file is written to a temporary name and renamed, so a crash never leaves a
half-written result that a resume would trust.

A folder read back (resume, merge, report) may come from elsewhere, so it is
input like a suite file: its labels and run ids must be names (RunSpec's
validator, :meth:`ResultsDir.run_dir`), ``runs`` and ``runs/<run_id>`` must
be real folders inside it (:meth:`ResultsDir.check_run_dirs`), and result
and plan files are read without following links (:func:`read_regular_file`).
Path lengths are checked against the file system's own limits before
anything is written (:func:`check_path_limits`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ampcert.atomic import (
    atomic_write_text,  # re-exported: the writers of results import it from here
)
from ampcert.errors import UserError
from ampcert.regular_files import link_target, read_regular_file  # noqa: F401 (read_regular_file: re-exported)
from ampcert.spec import MAX_NAME_LEN, RunSpec, id_problem, shown, speed_probes
from ampcert.stored_plan import StoredPlan

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1
Status = Literal["completed", "failed", "skipped"]


class FailureKind(str, Enum):
    """Why a run failed, as data: checks and the gate read this, never the message.

    A non-finite loss or metric is a finding about the precision (fp16
    without loss scaling is expected to produce one); the others say the run
    could not produce evidence at all."""

    NON_FINITE = "non_finite"      # the loss or the eval metric became inf/nan
    BAD_INPUT = "bad_input"        # the run's own configuration was refused (UserError)
    UNSUPPORTED = "unsupported"    # the workload or backend cannot run this combination
    ERROR = "error"                # an exception in the training code
    TIMEOUT = "timeout"            # the run exceeded its time limit and was stopped
    WORKER_LOST = "worker_lost"    # the worker process died without writing a result
    OUT_OF_MEMORY = "out_of_memory"  # the device's memory could not hold the run at its batch


class _Model(BaseModel):
    # NaN and the infinities are written as the strings "NaN", "Infinity" and "-Infinity"
    # and read back as floats: pydantic's default writes them as null, which a float field
    # then refuses, so a diverged run's result would read back as no result at all.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class EvalPoint(_Model):
    step: int
    samples: int
    train_time_s: float
    value: float


class StepTimes(_Model):
    n: int
    mean_ms: float
    std_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float
    method: str


class Measured(_Model):
    """A number and how it was obtained; ``value`` is None with a reason when
    it could not be measured (never a made-up zero)."""

    value: float | None
    unit: str
    method: str


class Phases(_Model):
    """Where the worker's wall time went, in seconds."""

    startup_s: float = Field(description="process start to the worker's first line (imports included)")
    build_s: float = Field(description="data loading, model construction, moving to the device")
    train_s: float = Field(description="training steps, excluding evaluation")
    eval_s: float
    other_s: float = Field(description="seeding, digests, logging and writing results")


class LowestPrecision(_Model):
    """MLPerf's precision disclosure, measured during the run's first training
    step (ampcert.backends.torch_precision), in MLPerf's spelling (fp32, tf32,
    bfloat16, fp16, ...)."""

    linear: str = Field(description="lowest dtype matmul/convolution ops computed in")
    attn: str = Field(description="lowest dtype attention ops computed in (see detail.attn.observed)")
    comm: str = Field(description="lowest dtype of the gradient collective's payload (fp32 for one process)")
    detail: dict[str, Any] = Field(default_factory=dict, description="per category: observed, ops seen, or the reason none were")


class CompileStats(_Model):
    """What torch.compile did with a ``compile: true`` run's training step (its forward and
    loss, their backward through AOTAutograd; or the whole step), from torch._dynamo's counters."""

    mode: str
    backend: str
    scope: Literal["forward", "step"] = Field("forward", description="the forward and loss, or the whole step")
    compiled: bool = Field(description="whether the steps after the first ran compiled; false: "
                           "compilation failed and the suite's `fallback: eager` let it go on eagerly")
    fallback_reason: str | None = Field(default=None, description="why compilation failed, one line")
    compile_s: float | None = Field(default=None, description="the first compiled step's time "
                                    "(tracing and compiling included) less the median step")
    graph_breaks: int | None = None
    break_reasons: list[str] = Field(default_factory=list, description="the first line of each distinct break reason")
    graphs: int | None = Field(default=None, description="graphs Dynamo compiled")
    recompiles: int | None = Field(default=None, description="frames Dynamo compiled after the first compiled step")


class Fp8Layer(_Model):
    """One Linear layer of an fp8/mxfp8 run: the policy's decision and what
    FP8 did to it on the recorded steps (docs/policies.md, "the eligibility map")."""

    name: str
    in_features: int
    out_features: int
    converted: bool = Field(description="whether the layer trained in FP8 (else bf16; its figures are a what-if)")
    reason: str = Field(description="why the policy converted the layer or kept it")
    recorded_steps: list[int] = Field(default_factory=list)
    amax: dict[str, list[float]] = Field(default_factory=dict,
                                         description="max |x| per operand (input, weight, grad_output) per recorded step")
    underflow: dict[str, float | None] = Field(default_factory=dict,
                                               description="largest fraction of non-zero values the cast flushed to zero")
    saturation: dict[str, float | None] = Field(default_factory=dict,
                                                description="largest fraction of values clamped to the format's maximum")
    rel_error_vs_bf16: float | None = Field(default=None, description="largest ||y_fp8 - y_bf16|| / ||y_bf16|| "
                                            "of the layer's output over the recorded steps")
    rel_error_history: list[float] = Field(default_factory=list)
    nonfinite_steps: int | None = Field(default=None, description="steps an operand held inf/NaN (converted layers)")
    verdict: Literal["safe", "review", "unsafe", "unmeasured"]
    why: str


class Fp8Stats(_Model):
    """How an fp8/mxfp8 run computed its Linear layers, and the per-layer map."""

    recipe: str
    implementation: str = Field(description="whose FP8 Linear trained: ampcert's or torchao's")
    matmuls: Literal["real FP8", "emulated"] = Field(
        description="emulated: FP8 casts with the matmul in fp32 (no FP8 units); speed figures not meaningful")
    note: str = ""
    converted_layers: int
    linear_layers: int
    nonfinite_amax_steps: int = Field(description="layer-steps whose FP8 operand held inf/NaN (FP8's overflow)")
    layers: list[Fp8Layer]


class TrainingState(_Model):
    """What training holds for its parameters, in bytes, read from the run's own tensors
    after its first window (the optimizer's state exists by then): the weights, their
    gradients and the optimizer's state (a tensor subclass, such as torchao's 8-bit
    state, counted by the plain tensors it is made of). Per rank under torchrun. What a
    precision recipe saves is here; the activations' bytes per sample are the memory
    sweep's (ampcert/memory.py)."""

    parameters: int = Field(description="trainable parameters (elements)")
    weights_dtype: str
    optimizer: str = Field(description="the optimizer's class, as the run trained with it")
    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_state_bytes


class SpeedProbeResult(_Model):
    """One speed-probe process (RunSpec.is_speed_probe; ampcert/backends/speed_probe.py): the
    low precision's model and the FP32 model of the same entry and seed, built in one process
    from the same state, trained on the same batches in alternating windows of
    ``window_steps`` steps, with the calibration kernel timed between them. Its steps are
    not the certified runs' steps: speed only. Per round (in the order measured) each path's
    mean step time over its window and the kernel's time; ``aggregate.probe_summaries``
    combines a subject's processes."""

    reference: str = Field(description="the precision the speed-up is over (fp32)")
    precision: str
    window_steps: int
    seconds: float = Field(description="the budget of alternating windows, after the warm-up")
    threads: str = Field(description="the intra-op threads the probe trained with")
    kernel: str = Field(description="the calibration kernel")
    reference_step_ms: list[float] = Field(description="per round: the FP32 model's mean step time over its window")
    step_ms: list[float] = Field(description="per round: the low precision's mean step time over its window")
    kernel_ms: list[float] = Field(description="per round: the calibration kernel's time")
    reference_first: list[bool] = Field(description="per round: whether FP32's window came first (alternating)")
    counters: dict[str, dict[str, float]] | None = Field(
        default=None, description="per precision, hardware counters per step (median over windows), where counted")
    counters_note: str = Field(description="which counters were read, or why none were")

    @property
    def rounds(self) -> int:
        return len(self.step_ms)


class TrainedFields(_Model):
    """The fields of a :class:`RunResult` that training fills in, declared once:
    what the run trained and measured, how it was set up (policy, determinism,
    environment) and whether the device accelerates its precision.

    RunResult inherits them, so result.json stays flat; what a backend hands
    the worker, :class:`~ampcert.backends.contract.TrainOutcome`, is these
    fields plus its phase times and telemetry samples. A failed or skipped run
    keeps the defaults but for ``accelerated`` and ``capability_note``, which
    come from its spec. The declaration order is result.json's key order."""

    steps: int = 0
    train_samples: int = 0
    metric: str | None = None
    higher_is_better: bool | None = None
    final_metric: float | None = None
    target: float | None = None
    target_reached: bool | None = None
    steps_to_target: int | None = None
    samples_to_target: int | None = None
    time_to_target_s: float | None = Field(
        default=None, description="run_start to the eval that first met the target, evals included (MLPerf's time-to-train)")
    samples_per_s: float | None = Field(default=None, description="training samples / training time (evals excluded)")
    flops_per_step: float | None = Field(default=None, description="forward+backward FLOPs of one step (torch.utils.flop_counter)")
    achieved_flops: float | None = Field(default=None, description="flops_per_step x steps / training time, FLOP/s")
    mfu: float | None = Field(default=None, description="achieved_flops / the device's peak for this precision")
    peak_flops: Measured | None = None
    data_time_s: float | None = Field(default=None, description="time spent indexing and augmenting batches inside training")
    data_share: float | None = Field(default=None, description="data_time_s / training time")
    data_info: dict[str, Any] | None = None
    loss: list[float | None] = Field(default_factory=list, description="training loss per step; null where non-finite")
    evals: list[EvalPoint] = Field(default_factory=list)
    step_time: StepTimes | None = None
    step_times_ms: list[float] | None = Field(
        default=None, description="each timed training step in ms (0.001 ms resolution), in order; the samples behind step_time and the regression gate")
    peak_memory: Measured | None = None
    telemetry: dict[str, Any] | None = Field(
        default=None, description="ampcert.telemetry summary: energy per phase and per training sample, "
        "power, peak memory per source, sampling rate, method per device; null values carry reasons")
    loss_scale: list[float] | None = Field(default=None, description="scale after each step's update (fp16)")
    skipped_steps: list[int] | None = Field(default=None, description="steps whose optimizer update was skipped")
    # Written only when set, like `failure`: results from before the field keep their bytes.
    lowest_precision: LowestPrecision | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="the precision the run measurably computed in (MLPerf's lowest_numerical_precision_in_*)")
    compile_stats: CompileStats | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="torch.compile's graph breaks, graphs, recompiles and compile time (compile: true runs)")
    fp8: Fp8Stats | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="the FP8 recipe, whose Linear trained, and the per-layer eligibility map (fp8/mxfp8 runs)")
    training_state: TrainingState | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="bytes of the weights, gradients and optimizer state (torch runs; precision recipes' memory)")
    speed_probe: SpeedProbeResult | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="a speed probe's rounds (speed-probe runs only; not a certified run)")
    accelerated: bool = True
    capability_note: str = ""
    amp_policy: dict[str, Any] | None = Field(default=None, description="the autocast policy: name and sha256 (and, for ampcert's torch autocast, the engine that decided the casts)")
    determinism: dict[str, Any] = Field(default_factory=dict)
    weights_sha256: str | None = None
    environment: dict[str, Any] = Field(default_factory=dict)

    def trained_fields(self) -> dict[str, Any]:
        """These fields' values by name (not dumped: nested models stay models),
        as ``RunResult(run_id=..., **outcome.trained_fields())`` takes them."""
        return {name: getattr(self, name) for name in TrainedFields.model_fields}


class _RunRecord(_Model):
    # The fields of a RunResult that say which run it is, how it ended and when:
    # set by whoever records the run: the worker, or the runner for a run no worker finished.
    schema_version: int = SCHEMA_VERSION
    run_id: str
    spec: RunSpec
    status: Status
    reason: str | None = None
    # Written only when set, so results recorded before the field existed
    # render to the same report bytes; read it through ``failure_kind``.
    failure: FailureKind | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="why a failed run failed (absent in results written before ampcert 0.2)")
    started_at: str | None = None
    finished_at: str | None = None
    wall_s: float | None = None
    phases: Phases | None = None


# No docstring: report.json's schema (schemas/report.v1.schema.json) holds
# RunResult's, and it has none. Pydantic orders the fields of a model with
# several bases from the last base to the first: _RunRecord's, then
# TrainedFields', the key order of every result.json written so far.
class RunResult(TrainedFields, _RunRecord):
    @property
    def failure_kind(self) -> FailureKind | None:
        """Why this run failed (None unless it did)."""
        if self.status != "failed":
            return None
        return self.failure if self.failure is not None else _legacy_failure_kind(self.reason or "")


def _legacy_failure_kind(reason: str) -> FailureKind:
    """The kind of a failure recorded before results carried one: read once
    from the message those versions wrote (their exact wording, nothing looser)."""
    if "non-finite" in reason or " is nan at step " in reason or " is inf at step " in reason:
        return FailureKind.NON_FINITE
    if reason.startswith("timeout: "):
        return FailureKind.TIMEOUT
    return FailureKind.ERROR


# --------------------------------------------------------------------------- writes


def atomic_write_json(path: Path, obj: Any) -> None:
    if isinstance(obj, BaseModel):
        text = obj.model_dump_json(indent=1)
    else:
        text = json.dumps(obj, indent=1, sort_keys=True, default=str)
    atomic_write_text(path, text + "\n")


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class ResultsDir:
    root: Path

    @property
    def suite_file(self) -> Path:
        return self.root / "suite.yaml"

    @property
    def rules_file(self) -> Path:
        """The suite's own rule pack, copied at planning (a shipped pack is named, not copied)."""
        return self.root / "rules.yaml"

    @property
    def plan_file(self) -> Path:
        return self.root / "plan.json"

    @property
    def summary_json(self) -> Path:
        return self.root / "summary.json"

    @property
    def summary_html(self) -> Path:
        return self.root / "summary.html"

    def run_dir(self, run_id: str) -> Path:
        # Every path of a run is made here, from an id that may have been read
        # from a results folder: what is not a run id never becomes a path.
        problem = id_problem(run_id, MAX_NAME_LEN)
        if problem is not None:
            raise UserError(f"{self.root}: run id {shown(run_id)} {problem}")
        return self.root / "runs" / run_id

    def check_run_dirs(self, run_ids: Iterable[str]) -> None:
        """Refuse, with one line naming it, a ``runs`` or ``runs/<id>`` that is
        not a real folder inside the results folder: through a symbolic link, a
        resume would delete and write run files wherever the link points."""
        for path in (self.root / "runs", *(self.run_dir(i) for i in run_ids)):
            try:
                mode = os.lstat(path).st_mode
            except (FileNotFoundError, NotADirectoryError):
                continue  # not made yet: the run makes it, inside the folder
            except OSError as exc:
                raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None
            if stat.S_ISLNK(mode):
                raise UserError(f"{path}: is a symbolic link{link_target(path)}; run folders must be real "
                                f"folders inside {self.root}, and ampcert does not follow links out of it")
            if not stat.S_ISDIR(mode):
                raise UserError(f"{path}: is not a folder; remove it (a run folder holds a run's files)")

    def result_file(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "result.json"

    def mllog_file(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "run.mllog"

    def telemetry_file(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "telemetry.csv"

    @property
    def verdicts_file(self) -> Path:
        return self.root / "verdicts.json"

    def read_plan(self) -> StoredPlan:
        """plan.json, checked as input from elsewhere: every label and run id
        can name a folder (RunSpec's validator), a shard's run ids are run ids,
        and the run folders are real folders."""
        path = self.plan_file
        try:
            raw = read_regular_file(path)
        except FileNotFoundError:
            raise UserError(f"{self.root}: not an ampcert results folder (no plan.json)") from None
        except OSError as exc:
            raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
        try:
            plan = json.loads(raw)
            runs = plan["runs"]
            if not isinstance(runs, list):
                raise TypeError("`runs` is not a list")
            plan["runs"] = [_plan_run(path, i, r) for i, r in enumerate(runs)]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:  # ValueError: JSON, 5000-digit ints
            raise UserError(f"{path}: unreadable plan: {str(exc).splitlines()[0]}") from None
        shard = plan.get("shard")
        if shard:
            ids = shard.get("run_ids") if isinstance(shard, dict) else None
            if not isinstance(shard, dict) or not (ids is None or isinstance(ids, list) and all(
                    isinstance(i, str) and id_problem(i, MAX_NAME_LEN) is None for i in ids)):
                raise UserError(f"{path}: shard.run_ids: expected a list of run ids")
        try:
            stored = StoredPlan.model_validate(plan)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "(top level)"
            raise UserError(f"{path}: unreadable plan: {where}: {first['msg']}") from None
        self.check_run_dirs(r.run_id for r in stored.runs)
        return stored

    def read_result(self, run_id: str) -> RunResult | None:
        """The stored result, or None if the run has none that can be trusted
        (missing, truncated, not JSON, not a RunResult, or for another run)."""
        return self.check_result(run_id)[0]

    def check_result(self, run_id: str) -> tuple[RunResult | None, str | None]:
        """(the trusted result, None); (None, None) when there is no result
        file; (None, why) when there is one that cannot be trusted."""
        path = self.result_file(run_id)
        try:
            data = read_regular_file(path)
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"unreadable ({exc.strerror or type(exc).__name__})"
        try:
            result = RunResult.model_validate_json(data)
        except ValidationError as err:
            first = err.errors()[0]
            if first["type"] == "json_invalid":
                return None, f"not valid JSON, truncated or corrupted ({first['msg']})"
            where = ".".join(str(x) for x in first["loc"]) or "(top level)"
            return None, f"not an ampcert run result ({where}: {first['msg']})"
        if result.run_id != run_id:
            return None, f"holds the result of another run ({result.run_id})"
        if result.spec.run_id != run_id:
            return None, "its spec is not the spec of this run (edited or copied from elsewhere)"
        return result, None


def _plan_run(path: Path, index: int, data: Any) -> RunSpec:
    try:
        return RunSpec.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = "".join(f".{x}" for x in first["loc"])
        raise UserError(f"{path}: runs[{index}]{where}: {first['msg'].removeprefix('Value error, ')}") from None


# --------------------------------------------------------------------------- file system limits

# The files a run writes into its folder (runner/torchrun.py adds
# launcher.log), and the temp names of their atomic writes, ``.NAME.XXXXXXXX.tmp``
# (mkstemp): the longest of these makes the longest path under a results folder.
RUN_FILES = ("result.json", "run.mllog", "telemetry.csv", "error.txt", "launcher.log")
LONGEST_RUN_FILE = max(len(f".{name}.XXXXXXXX.tmp") for name in RUN_FILES)
# POSIX-typical limits, for a system that cannot say (no pathconf, Windows).
NAME_MAX_FALLBACK = 255
PATH_MAX_FALLBACK = 4096


def fs_limits(path: Path) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) of the file system that holds ``path``, or would hold
    it once made: asked of its nearest existing ancestor (a folder that does not
    exist yet is made on its parent's file system)."""
    for candidate in (path, *path.parents):
        try:
            name_max = os.pathconf(candidate, "PC_NAME_MAX")
            path_max = os.pathconf(candidate, "PC_PATH_MAX")
        except (OSError, ValueError, AttributeError):  # missing, a name too long, no pathconf here
            continue
        return (name_max if name_max > 0 else NAME_MAX_FALLBACK,  # -1: no limit the system will name
                path_max if path_max > 0 else PATH_MAX_FALLBACK)
    return NAME_MAX_FALLBACK, PATH_MAX_FALLBACK


def _shown_path(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 100 else f"{text[:45]}...{text[-45:]} ({len(text)} characters)"


def check_path_limits(root: Path, run_ids: Iterable[str] | None, what: str) -> None:
    """Refuse, with one line and before anything is written, a results folder
    whose files the file system could not hold: a name in ``root``'s path or a
    run id longer than its NAME_MAX, or ``root/runs/<id>/`` plus the longest file
    a run writes longer than its PATH_MAX. Without ``run_ids`` (not planned
    yet), run ids are taken to be as long as a name may be."""
    absolute = Path(os.path.abspath(root))  # what any later command, from any folder, will use
    name_max, path_max = fs_limits(absolute)
    for part in absolute.parts[1:]:
        size = len(os.fsencode(part))
        if size > name_max:
            head = repr(part) if len(part) <= 40 else f"{part[:30]!r}..."
            raise UserError(f"{what} {_shown_path(root)}: the name {head} is {size} bytes, more than "
                            f"the {name_max} this file system allows for a file or folder name")
    if run_ids is None:
        longest_id = min(name_max, MAX_NAME_LEN)
    else:
        ids = list(run_ids)
        for run_id in ids:
            if len(os.fsencode(run_id)) > name_max:
                raise UserError(f"{what} {_shown_path(root)}: run id {shown(run_id)} is longer than the "
                                f"{name_max} characters this file system allows for a folder name; "
                                "give its workload entry a shorter `id`")
        longest_id = max((len(os.fsencode(i)) for i in ids), default=0)
    longest = len(os.fsencode(str(absolute))) + len("/runs/") + longest_id + len("/") + LONGEST_RUN_FILE
    if longest > path_max - 1:  # PATH_MAX counts the terminating NUL
        raise UserError(f"{what} {_shown_path(root)}: a run's files would have paths of {longest} bytes, more "
                        f"than the {path_max - 1} this file system allows; choose a folder with a shorter path")


# --------------------------------------------------------------------------- loading


@dataclass
class ResultSet:
    """Everything one results folder holds, loaded."""

    root: Path
    suite_name: str
    plan: list[RunSpec]  # the certified matrix: what every view of speed, accuracy and verdicts reads
    runs: list[RunResult]
    missing: list[str]
    # The memory sweep's runs (RunSpec.is_memory_sweep) apart: their peak is their result (memory.py).
    memory_runs: list[RunResult] = field(default_factory=list)
    memory_missing: list[str] = field(default_factory=list)
    # The speed probe's processes (spec.speed_probes), apart: a speed ratio is their result.
    probe_runs: list[RunResult] = field(default_factory=list)
    probe_missing: list[str] = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        """One row per run with the headline numbers, for tables and dashboards."""
        import pandas as pd

        rows = []
        for r in self.runs:
            rows.append(
                {
                    "run_id": r.run_id,
                    "workload": r.spec.label,
                    "backend": r.spec.backend,
                    "amp": r.spec.amp,
                    "precision": r.spec.precision,
                    "seed": r.spec.seed,
                    "device": r.spec.device,
                    "status": r.status,
                    "reason": r.reason,
                    "steps": r.steps,
                    "metric": r.metric,
                    "final_metric": r.final_metric,
                    "target_reached": r.target_reached,
                    "steps_to_target": r.steps_to_target,
                    "time_to_target_s": r.time_to_target_s,
                    "samples_per_s": r.samples_per_s,
                    "flops_per_step": r.flops_per_step,
                    "mfu": r.mfu,
                    "data_share": r.data_share,
                    "step_ms_p50": r.step_time.p50_ms if r.step_time else None,
                    "peak_memory_bytes": r.peak_memory.value if r.peak_memory else None,
                    "energy_train_j": _energy(r, "train_j"),
                    "energy_j_per_sample": _energy(r, "train_j_per_sample"),
                    "skipped_steps": len(r.skipped_steps) if r.skipped_steps is not None else None,
                    "accelerated": r.accelerated,
                    "wall_s": r.wall_s,
                }
            )
        return pd.DataFrame(rows)


def _energy(r: RunResult, key: str) -> float | None:
    energy = (r.telemetry or {}).get("energy") or {}
    return energy.get(key)


def load(root: str | Path) -> ResultSet:
    """Load a results folder written by ``ampcert run``."""
    rd = ResultsDir(Path(root))
    if not rd.root.is_dir():
        raise UserError(f"{rd.root}: results folder not found")
    plan = rd.read_plan()
    specs = plan.my_runs()  # a shard's folder answers for its own runs only
    # A shard's folder has no probes: they run where the folder is whole (merged, resumed).
    probes = speed_probes(plan.speed_probe, plan.runs) if not plan.shard else []
    # Each run's result (or its id, missing) by kind: certified, a memory-sweep point, a probe.
    found: dict[str, tuple[list[RunResult], list[str]]] = {kind: ([], []) for kind in ("run", "sweep", "probe")}
    for spec in specs + probes:
        result = rd.read_result(spec.run_id)
        runs, missing = found["probe" if spec.is_speed_probe else "sweep" if spec.is_memory_sweep else "run"]
        if result is None:
            missing.append(spec.run_id)
        else:
            runs.append(result)
    return ResultSet(rd.root, plan.suite, [s for s in specs if not s.is_memory_sweep], *found["run"],
                     memory_runs=found["sweep"][0], memory_missing=found["sweep"][1],
                     probe_runs=found["probe"][0], probe_missing=found["probe"][1])
