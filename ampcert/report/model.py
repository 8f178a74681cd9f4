"""report.json: the versioned, schema'd record of one results folder.

Everything in it is derived from the stored files (plan.json, suite.yaml, the
run results, verdicts.json, telemetry series), never from the clock or the
machine that renders it, so rendering the same folder twice gives the same
bytes: the file is signed, and a signature over a moving target is useless.
``schemas/report.v1.schema.json`` is generated from :class:`Report` (a test
keeps it in step) for readers in other languages.

Nor from where things are installed: an installed file recorded in the results
(a shipped policy or rule pack, scikit-learn's digits, the stdlib corpus) is
named in the report by package and path inside it (:func:`portable`), so two
installs of the same version sign the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from ampcert.aggregate import Aggregate, aggregate, is_repeat, steady
from ampcert.capacity_planning import CapacityPlan, capacity_plan
from ampcert.certify.checks import Certificate
from ampcert.envinfo import CPU_FLAGS_OF_INTEREST
from ampcert.memory import MemoryFit, folder_fits, stored_sweep
from ampcert.report.speed_probe import EXPLANATION as SPEED_PROBE_EXPLANATION
from ampcert.report.speed_probe import SpeedProbeRow, speed_probe_rows
from ampcert.report.training_state import TrainingStateRow, training_state_rows
from ampcert.resources import schema_path
from ampcert.results import ResultsDir, ResultSet, RunResult
from ampcert.steady_state import SteadyState
from ampcert.version import __version__
from ampcert.vocabulary import Status

REPORT_SCHEMA_VERSION = 1
PLAN_SAMPLES = 1_000_000  # the report's capacity section: per million training samples
SCHEMA_FILE = schema_path(f"report.v{REPORT_SCHEMA_VERSION}.schema.json")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SuiteInfo(_Model):
    name: str
    description: str = ""
    sha256: str = Field(description="sha256 of suite.yaml as given to `ampcert run`")
    text: str = Field(description="suite.yaml as given")


class PolicyInfo(_Model):
    name: str
    sha256: str | None = None
    effective_sha256: str | None = None
    source: str | None = None
    engine: str | None = Field(default=None, description="which engine of ampcert's torch autocast decided these "
                               "runs' casts: dispatcher (native's kernels, ampcert's where the policy differs) or "
                               "python; null where the runs did not record one (native AMP, JAX, older runs)")
    ampcert_kernels: list[str] = Field(default_factory=list, description="on the dispatcher engine, the ops "
                                       "ampcert's own kernels decided (the policy differs from native there)")
    runs: int


class PrecisionRow(Aggregate):
    """One (workload, backend, amp, precision) across its seeds (repeats excluded):
    the aggregate table's row, with the certificate's verdict on its subject."""

    verdict: Status | None = None


class NotMeasured(_Model):
    what: str
    why: str


class EnvFact(NamedTuple):
    """One line of the report's environment section: a label and a readable value."""

    name: str
    value: str


class Report(_Model):
    schema_version: Literal[1] = REPORT_SCHEMA_VERSION
    tool: str = Field(description="the ampcert version that rendered the report")
    suite: SuiteInfo
    device: str
    planned_at: str | None = Field(default=None, description="when the suite was planned (from plan.json)")
    capabilities: dict[str, Any] = Field(description="per precision: accelerated or not, measured ratio, peak FLOP/s")
    environment: dict[str, Any] = Field(description="fingerprint taken at planning: Python, frameworks, CPU, GPUs")
    policies: list[PolicyInfo]
    rules: dict[str, str] | None = None
    certificate: Certificate | None = None
    table: list[PrecisionRow]
    runs: list[RunResult]
    missing_runs: list[str] = Field(default_factory=list, description="planned runs with no result")
    steady_state: dict[str, SteadyState] = Field(
        default_factory=dict, description="per run id: its steady-state throughput (warm-up found in its step "
        "times, the median after it, a bootstrap interval over step windows, the CV); runs without step times absent")
    methods: dict[str, list[str]] = Field(description="how each figure was obtained, as recorded by the runs")
    not_measured: list[NotMeasured]
    capacity: CapacityPlan | None = Field(
        default=None, description=f"capacity plan for {PLAN_SAMPLES:,} training samples on one device "
                                  "(`ampcert plan` for other figures)")
    # Written only when the suite swept memory, so a report without a sweep keeps the bytes it had.
    memory: list[MemoryFit] = Field(
        default_factory=list, exclude_if=lambda v: not v,
        description="the suite's memory sweep: per subject, peak memory against batch size fitted with a line, "
                    "the largest batch per budget and the saving per sample against fp32 (ampcert/memory.py)")
    memory_missing_runs: list[str] = Field(
        default_factory=list, exclude_if=lambda v: not v, description="planned memory-sweep runs with no result")
    # Written only where runs read it (torch runs since precision recipes), so older reports keep their bytes.
    training_state: list[TrainingStateRow] = Field(
        default_factory=list, exclude_if=lambda v: not v,
        description="per subject: bytes per parameter of the weights, gradients and optimizer state, the total "
                    "against fp32's, and the memory sweep's activation bytes per sample (precision recipes)")
    # Written only where a speed probe ran, so reports without one keep their bytes.
    speed_probe: list[SpeedProbeRow] = Field(
        default_factory=list, exclude_if=lambda v: not v, description=SPEED_PROBE_EXPLANATION)
    speed_probe_missing_runs: list[str] = Field(
        default_factory=list, exclude_if=lambda v: not v, description="speed-probe processes with no result")

    def environment_facts(self) -> list[EnvFact]:
        """The fingerprint as a reader wants it (report.html's environment table)."""
        return environment_facts(self.environment)

    def fp8_maps(self) -> list[dict[str, Any]]:
        """report.html's eligibility maps: per (entry, amp, precision) of fp8/mxfp8
        runs, each layer's worst figures over the group's seeds."""
        return fp8_maps(self.runs)


_VERDICT_ORDER = ("safe", "unmeasured", "review", "unsafe")


def fp8_maps(runs: list[RunResult]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[RunResult]] = {}
    for r in runs:
        if r.fp8 is not None:
            groups.setdefault((r.spec.label, r.spec.amp, r.spec.precision), []).append(r)
    maps = []
    for (label, amp, precision), members in sorted(groups.items()):
        layers: dict[str, dict[str, Any]] = {}
        for r in members:
            assert r.fp8 is not None
            for layer in r.fp8.layers:
                row = layers.setdefault(layer.name, {"name": layer.name, "dims": f"{layer.in_features}x{layer.out_features}",
                                                     "converted": layer.converted, "reason": layer.reason,
                                                     "verdict": "safe", "why": layer.why, "rel_error": None,
                                                     "underflow": {}, "amax": {}, "nonfinite": 0})
                if _VERDICT_ORDER.index(layer.verdict) >= _VERDICT_ORDER.index(row["verdict"]):
                    row["verdict"], row["why"] = layer.verdict, layer.why
                row["rel_error"] = _max(row["rel_error"], layer.rel_error_vs_bf16)
                for role, value in layer.underflow.items():
                    row["underflow"][role] = _max(row["underflow"].get(role), value)
                for role, history in layer.amax.items():
                    row["amax"][role] = _max(row["amax"].get(role), max(history) if history else None)
                row["nonfinite"] += layer.nonfinite_steps or 0
        first = members[0].fp8
        assert first is not None
        maps.append({"label": label, "amp": amp, "precision": precision, "recipe": first.recipe,
                     "implementation": first.implementation, "matmuls": first.matmuls, "runs": len(members),
                     "layers": list(layers.values())})
    return maps


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


# --------------------------------------------------------------------------- install paths

# An absolute path inside a longer text: after the start or a space, quote, bracket or "=",
# up to the next such character. ":" ends it too ("in /x/pricing.yaml: pass ..."), so a
# Windows drive is only taken at the start of a path.
_ABSOLUTE = re.compile(r"(?:^|(?<=[\s'\"(\[=]))(?:[A-Za-z]:)?[/\\][^\s'\"()\[\]<>:;,]+")
_PYTHON_LIB = re.compile(r"python3\.\d+")


def _portable_path(path: str) -> str:
    parts = [p for p in re.split(r"[/\\]", path) if p]
    for i in range(len(parts) - 1, -1, -1):  # the innermost install folder names the package
        if parts[i] in ("site-packages", "dist-packages") and i + 1 < len(parts):
            return f"{parts[i + 1]}:{'/'.join(parts[i + 2:])}"
    for i in range(len(parts) - 2, -1, -1):  # an editable install (a checkout): its shipped data
        if parts[i] == "ampcert" and parts[i + 1] in ("configs", "schemas"):
            return f"ampcert:{'/'.join(parts[i + 1:])}"
    for i in range(len(parts) - 1):  # the interpreter's own library (the stdlib corpus)
        if parts[i].lower() == "lib" and _PYTHON_LIB.fullmatch(parts[i + 1]):
            return f"stdlib:{'/'.join(parts[i + 2:])}"
    return path


def portable(text: str) -> str:
    """``text`` with every installed file's absolute path as ``package:path/inside``:
    ``.../site-packages/ampcert/configs/pricing.yaml`` (or a checkout's
    ``.../ampcert/configs/pricing.yaml``) becomes ``ampcert:configs/pricing.yaml``,
    ``.../site-packages/sklearn/datasets/...`` ``sklearn:datasets/...``,
    ``/usr/lib/python3.11/json/x.py`` ``stdlib:json/x.py``. Any other path (a suite,
    data or rule file the user gave) is left as written.

    Purely textual, so the same results render to the same report on any machine,
    whatever this one's install paths are; the sha256 recorded next to each such file
    (policy, rule pack, price table, data) says which bytes it was."""
    return _ABSOLUTE.sub(lambda m: _portable_path(m.group(0)), text)


def portable_tree(value: Any) -> Any:
    """:func:`portable` applied to every string in a JSON-shaped value (keys left alone)."""
    if isinstance(value, str):
        return portable(value)
    if isinstance(value, dict):
        return {k: portable_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_tree(v) for v in value]
    return value


# --------------------------------------------------------------------------- environment

# The CPU features shown first: those that decide whether bf16/fp16 have fast paths
# (AMX, AVX-512 BF16/FP16), then the fp32 baseline's (AVX-512F, AVX2, FMA) and F16C
# (fp16 <-> fp32 conversion). envinfo records these and a few more.
MIXED_PRECISION_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "amx_fp16", "avx512_fp16", "avx512_vnni",
                         "avx512f", "avx2", "f16c", "fma")


def _gib(n: Any) -> str | None:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, (int, float)) and n > 0 else None


def _version(packages: dict[str, Any], name: str) -> str:
    return str(packages.get(name) or "not installed") if name in packages else "not recorded"


def environment_facts(env: dict[str, Any]) -> list[EnvFact]:
    """Readable facts from an :func:`ampcert.envinfo.fingerprint` (as plan.json stores it):
    CPU and its mixed-precision features, GPUs, driver, CUDA, frameworks, Python, OS.
    Tolerant of fingerprints from older versions and of missing parts (``[]`` for none)."""
    if not isinstance(env, dict) or not env:
        return []
    facts: list[EnvFact] = []
    cpu = env.get("cpu") if isinstance(env.get("cpu"), dict) else {}
    if cpu:
        cores = [f"{cpu['usable_cores']} usable of {cpu.get('logical_cores', '?')} logical cores"
                 if cpu.get("usable_cores") else None,
                 f"{cpu['physical_cores']} physical" if cpu.get("physical_cores") else None,
                 _gib(cpu.get("memory_bytes")) and f"{_gib(cpu.get('memory_bytes'))} memory"]
        facts.append(EnvFact("CPU", " · ".join([str(cpu.get("model") or "unknown model")]
                                                + [c for c in cores if c])))
        flags = cpu.get("flags")
        if isinstance(flags, dict):
            order = list(MIXED_PRECISION_FLAGS) + [f for f in CPU_FLAGS_OF_INTEREST if f not in MIXED_PRECISION_FLAGS]
            order += sorted(f for f in flags if f not in order)
            has = [f for f in order if flags.get(f) is True]
            lacks = [f for f in order if flags.get(f) is False]
            facts.append(EnvFact("CPU features (mixed precision)",
                                 "; ".join(x for x in (has and "has " + ", ".join(has),
                                                       lacks and "lacks " + ", ".join(lacks)) if x) or "none recorded"))
        elif flags is not None:
            facts.append(EnvFact("CPU features (mixed precision)", "unknown: the CPU's flags could not be read"))
    gpu = env.get("gpu") if isinstance(env.get("gpu"), dict) else None
    if gpu is not None:
        devices = gpu.get("devices") or []
        for d in devices:
            extra = [f"compute capability {d['capability']}" if d.get("capability") else None,
                     _gib(d.get("memory_bytes"))]
            facts.append(EnvFact(f"GPU {d.get('index', '?')}",
                                 " · ".join([str(d.get("name") or "unknown")] + [x for x in extra if x])))
        if not devices:
            why = (f"torch: {gpu['torch_error']}" if gpu.get("torch_error")
                   else "CUDA not available to torch" if gpu.get("cuda_available") is False else "none recorded")
            facts.append(EnvFact("GPU", f"none ({why})"))
        if gpu.get("cuda_visible_devices") is not None:
            facts.append(EnvFact("CUDA_VISIBLE_DEVICES", str(gpu["cuda_visible_devices"])))
        facts.append(EnvFact("NVIDIA driver", str(gpu.get("driver") or gpu.get("nvml") or "not recorded")))
        cuda = (f"torch built for CUDA {gpu['torch_cuda']}" if gpu.get("torch_cuda")
                else "torch built without CUDA" if "torch_cuda" in gpu else "not recorded")
        if gpu.get("cudnn"):
            cuda += f" · cuDNN {gpu['cudnn']}"
        facts.append(EnvFact("CUDA", cuda))
    packages = env.get("packages") if isinstance(env.get("packages"), dict) else None
    if packages is not None:
        facts.append(EnvFact("PyTorch", _version(packages, "torch")))
        jax = _version(packages, "jax")
        if packages.get("jax") and packages.get("jaxlib"):
            jax += f" (jaxlib {packages['jaxlib']})"
        facts.append(EnvFact("JAX", jax))
        others = [f"{k} {v}" for k, v in sorted(packages.items()) if v and k not in ("torch", "jax", "jaxlib")]
        if others:
            facts.append(EnvFact("Other packages", ", ".join(others)))
    for key, label in (("python", "Python"), ("platform", "OS"), ("hostname", "Host")):
        if env.get(key):
            facts.append(EnvFact(label, str(env[key])))
    return facts


# --------------------------------------------------------------------------- building


def _table(runs: list[RunResult], cert: Certificate | None) -> list[PrecisionRow]:
    """The aggregation every view shares (:mod:`ampcert.aggregate`), with each subject's verdict."""
    verdicts = {s.subject: s.status for s in (cert.subjects if cert else [])}
    return [PrecisionRow(**row.model_dump(), verdict=verdicts.get(row.key)) for row in aggregate(runs)]


def _methods(runs: list[RunResult]) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {k: set() for k in ("step_time", "peak_memory", "peak_flops", "energy", "flops")}
    for r in runs:
        if r.step_time:
            found["step_time"].add(r.step_time.method)
        if r.peak_memory:
            found["peak_memory"].add(r.peak_memory.method)
        if r.peak_flops:
            found["peak_flops"].add(r.peak_flops.method)
        energy = (r.telemetry or {}).get("energy") or {}
        if energy.get("method"):
            found["energy"].add(f"{energy.get('scope')}: {energy['method']}")
        if r.flops_per_step:
            found["flops"].add("jax: XLA cost analysis of the compiled step" if r.spec.backend == "jax"
                               else "torch.utils.flop_counter (forward + backward, one batch)")
    return {k: sorted(v) for k, v in found.items()}


def _not_measured(runs: list[RunResult], capabilities: dict[str, Any]) -> list[NotMeasured]:
    out: dict[str, str] = {}
    for r in runs:
        tel = r.telemetry or {}
        energy = tel.get("energy") or {}
        if tel and energy.get("train_j") is None and energy.get("reason"):
            out.setdefault("energy per sample", energy["reason"])
        gpu = tel.get("gpu") or {}
        if tel and not gpu.get("available") and gpu.get("statement"):
            out.setdefault("GPU power, energy and utilisation", gpu["statement"])
        if r.status == "completed" and r.flops_per_step is None:
            out.setdefault("FLOPs and MFU", f"{r.run_id}: the FLOP counter could not count this model")
        if r.status == "completed" and not tel:
            out.setdefault("telemetry", f"{r.run_id}: no telemetry summary recorded")
    for precision, cap in sorted(capabilities.items()):
        if not cap.get("accelerated", True):
            out.setdefault(f"{precision} speed-up", f"{cap.get('note', '')}: speed and memory gains are advisory")
    return [NotMeasured(what=k, why=v) for k, v in out.items()]


def build_report(rs: ResultSet) -> Report:
    rd = ResultsDir(rs.root)
    plan = rd.read_plan()
    suite_text = rd.suite_file.read_text(encoding="utf-8") if rd.suite_file.exists() else ""
    doc = stored_suite_doc(suite_text)
    description = str(doc.get("description", ""))
    cert = None
    if rd.verdicts_file.exists():
        from pydantic import ValidationError

        from ampcert.errors import UserError

        try:
            cert = Certificate.model_validate_json(rd.verdicts_file.read_bytes())
        except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            lines = str(exc).splitlines()
            first = (lines[1] if isinstance(exc, ValidationError) and len(lines) > 1 else lines[0]).strip()
            raise UserError(f"{rd.verdicts_file}: not trusted, not the verdicts ampcert wrote ({first}); "
                            f"re-create it with `ampcert certify {rs.root}`") from None
    runs = sorted(rs.runs, key=lambda r: r.run_id)
    policies: dict[tuple, int] = {}
    for r in runs:
        pol = r.amp_policy or {}
        source = pol.get("source")  # by package name: one row for one shipped policy, however many installs ran it
        key = (pol.get("name") or "none", pol.get("sha256"), pol.get("effective_sha256"),
               portable(source) if isinstance(source, str) else source,
               pol.get("engine"), tuple(pol.get("ampcert_kernels") or ()))
        policies[key] = policies.get(key, 0) + 1
    fits = folder_fits(rs, plan, stored_sweep(rd) if rs.memory_runs else None)
    report = Report(
        tool=f"ampcert {__version__}",
        suite=SuiteInfo(name=rs.suite_name, description=description,
                        sha256=plan.suite_sha256 or hashlib.sha256(suite_text.encode()).hexdigest(),
                        text=suite_text),
        device=plan.device or "", planned_at=plan.created_at,
        capabilities=plan.capabilities or {}, environment=plan.environment or {},
        policies=[PolicyInfo(name=k[0], sha256=k[1], effective_sha256=k[2], source=k[3], engine=k[4],
                             ampcert_kernels=list(k[5]), runs=n)
                  for k, n in sorted(policies.items(), key=lambda kv: str(kv[0]))],
        rules=cert.rules if cert else None, certificate=cert, table=_table(runs, cert), runs=runs,
        missing_runs=sorted(rs.missing), methods=_methods(runs),
        steady_state={r.run_id: found for r in runs if r.status == "completed" and (found := steady(r))},
        not_measured=_not_measured(runs, plan.capabilities or {}),
        capacity=_capacity(runs),
        memory=fits,
        memory_missing_runs=sorted(rs.memory_missing),
        training_state=training_state_rows(runs, fits),
        speed_probe=speed_probe_rows(rs.probe_runs),
        speed_probe_missing_runs=sorted(rs.probe_missing),
    )
    # Install paths, wherever the stored results carry one (policy and rule sources, data
    # provenance, messages); the suite's text stays as given, its sha256 is over those bytes.
    data = report.model_dump(mode="json", exclude={"suite"})
    return Report.model_validate({**portable_tree(data), "suite": report.suite})


def stored_suite_doc(suite_text: str) -> dict[str, Any]:
    """The stored suite.yaml as a mapping ({} where it is absent or unreadable), for what the
    report only shows (its description); the sweep's settings are read typed
    (:func:`ampcert.memory.stored_sweep`)."""
    try:
        import yaml

        doc = yaml.safe_load(suite_text)
    except Exception:  # noqa: BLE001 - the stored suite was valid when run; a reader must not fail on it
        return {}
    return doc if isinstance(doc, dict) else {}


def memory_fits(rs: ResultSet) -> list[MemoryFit]:
    """The memory sweep's fits for a results folder (report.json's ``memory``), for the summary."""
    rd = ResultsDir(rs.root)
    if not rs.memory_runs:
        return []
    return folder_fits(rs, rd.read_plan(), stored_sweep(rd))


def _capacity(runs: list[RunResult]) -> CapacityPlan | None:
    try:
        cp = capacity_plan([r for r in runs if not is_repeat(r)], PLAN_SAMPLES, gpus=1)
    except Exception:  # noqa: BLE001 - a report must render even where a plan cannot be made
        return None
    return cp if cp.rows else None


def report_json(report: Report) -> str:
    """The canonical text of report.json (sorted keys, fixed indentation)."""
    return json.dumps(report.model_dump(mode="json"), sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def json_schema() -> str:
    return json.dumps(Report.model_json_schema(), sort_keys=True, indent=1) + "\n"


def load_report(path: str | Path) -> Report:
    """A report.json read back (validated against the model)."""
    from ampcert.errors import UserError

    p = Path(path)
    try:
        return Report.model_validate_json(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: expected a readable report.json, got {type(exc).__name__}") from None
    except ValueError as exc:
        first = str(exc).splitlines()[0]
        raise UserError(f"{p}: not an ampcert report (schema v{REPORT_SCHEMA_VERSION}): {first}") from None


def runs_frame(path: str | Path):
    """One pandas row per run of a report.json (or a results folder): for dashboards."""
    p = Path(path)
    if p.is_dir():
        from ampcert.results import load

        return load(p).frame()
    report = load_report(p)
    rs = ResultSet(p.parent, report.suite.name, [r.spec for r in report.runs], report.runs, report.missing_runs)
    return rs.frame()
