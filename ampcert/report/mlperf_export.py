"""A results folder laid out as an MLPerf training submission.

MLPerf's tools read a submission as one folder per organisation::

    <org>/systems/<system>.json                       the system description
    <org>/results/<system>/<benchmark>/result_N.txt   one MLLOG per run

A *system* there is hardware plus the software stack that ran a benchmark,
and the ``result_N.txt`` of one benchmark folder are repeats of the same
configuration with different seeds (MLPerf scores their olympic average).
ampcert's folders hold several configurations per workload (backend, AMP
engine, precision), so each configuration is its own system:
``<platform>_<backend>_<amp>_<precision>`` (plus ``_<nodes>x<gpus>`` for a
torchrun world larger than one), and each workload label is a benchmark.
The runs of a group are its seeds, determinism repeats and skipped runs left
out (:func:`ampcert.aggregate.group_runs`); failed runs are kept, as MLPerf
keeps non-converged runs (its scoring drops them).

The system description is built from what the results folder recorded: the
environment fingerprint of plan.json (CPU, memory, GPUs, OS, packages) and
each run's own environment (the device it trained on, the framework
version). Fields the fingerprint does not record (clock frequencies, caches,
storage, networking, cooling) are left empty and named in ``hw_notes``
rather than guessed. MLPerf's own checkers then judge the result:
:mod:`ampcert.certify.mlperf`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampcert import mllog
from ampcert.aggregate import group_runs
from ampcert.errors import UserError
from ampcert.results import ResultSet, RunResult, atomic_write_text, read_regular_file

# spec.Submission.status in MLPerf's availability wording (system_desc_checker's list).
AVAILABILITY = {
    "available": "Available on-premise",
    "preview": "Preview",
    "research": "Research, Development, or Internal (RDI)",
}
NOT_RECORDED = (
    "host_processor_frequency", "host_processor_caches", "host_processor_interconnect", "host_storage_type",
    "host_storage_capacity", "host_networking", "host_networking_topology", "host_memory_configuration",
    "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
    "accelerator_memory_configuration", "accelerator_interconnect", "accelerator_interconnect_topology", "cooling",
)
FRAMEWORKS = {"torch": ("PyTorch", "torch"), "jax": ("JAX", "jax")}


def slug(text: str) -> str:
    """A folder-safe lower-case name: runs of other characters become one ``_``."""
    return re.sub(r"[^a-z0-9.-]+", "_", text.lower()).strip("._-") or "unnamed"


def org_folder_name(org: str) -> str:
    """The organisation's folder: its name where that is a safe folder name, else its slug."""
    return org if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", org) else slug(org)


def system_id(r: RunResult) -> str:
    spec = r.spec
    parts = [spec.submission.platform or spec.device, spec.backend, spec.amp, spec.precision]
    if spec.world_size > 1:
        parts.append(f"{spec.launch.nnodes}x{spec.launch.nproc_per_node}")
    return "_".join(slug(p) for p in parts)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _gib(n: Any) -> str:
    return f"{float(n) / 2**30:.0f} GB" if isinstance(n, (int, float)) and n > 0 else ""


def system_description(r: RunResult, environment: dict[str, Any], tool: str) -> dict[str, str]:
    """MLPerf's system description for the system that ran ``r``, from the
    run's own environment and the folder's fingerprint (plan.json). Every
    value is a string: MLPerf's tools join and int() them as text."""
    spec = r.spec
    # plan.json comes from wherever the folder came from: a field of the wrong type counts as not recorded.
    cpu, gpu, packages = (_mapping(environment.get(k)) for k in ("cpu", "gpu", "packages"))
    run_env = r.environment or {}
    on_gpu = spec.device == "cuda"
    gpus_per_node = (spec.launch.nproc_per_node if spec.launch.launcher == "torchrun" else 1) if on_gpu else 0
    devices = [d for d in gpu.get("devices") or [] if isinstance(d, dict)] if isinstance(gpu.get("devices"), list) else []
    accelerator = str(run_env.get("device_name") or (devices[0].get("name") if devices else "") or "") if on_gpu else "N/A"
    name, package = FRAMEWORKS.get(spec.backend, (spec.backend, spec.backend))
    version = run_env.get(package) or packages.get(package) or "unknown version"
    sockets = cpu.get("sockets")
    hw_notes = [f"ampcert's environment fingerprint records none of: {', '.join(NOT_RECORDED)}"]
    if not sockets:
        hw_notes.append("host_processors_per_node taken as 1: the fingerprint did not count sockets")
    other = [tool, f"Python {environment.get('python', 'unknown')}"]
    other += [f"{k} {v}" for k, v in sorted(packages.items()) if v and k != package]
    if on_gpu:
        other += [f"CUDA {gpu.get('torch_cuda')}" if gpu.get("torch_cuda") else "",
                  f"driver {gpu.get('driver')}" if gpu.get("driver") else ""]
    return {
        "submitter": spec.submission.org,
        "division": spec.submission.division,
        "status": AVAILABILITY[spec.submission.status],
        "system_name": f"{spec.submission.platform or spec.device} ({spec.backend}, {spec.amp} AMP, "
                       f"{spec.precision})",
        "number_of_nodes": str(spec.launch.nnodes if spec.launch.launcher == "torchrun" else 1),
        "host_processors_per_node": str(sockets or 1),
        "host_processor_model_name": str(cpu.get("model") or ""),
        "host_processor_core_count": str(cpu.get("physical_cores") or ""),
        "host_processor_vcpu_count": str(cpu.get("logical_cores") or ""),
        "host_memory_capacity": _gib(cpu.get("memory_bytes")),
        "accelerators_per_node": str(gpus_per_node),
        "accelerator_model_name": accelerator,
        "accelerator_memory_capacity": (_gib(devices[0].get("memory_bytes")) if on_gpu and devices else
                                        "" if on_gpu else "N/A"),
        **{k: "" if on_gpu or not k.startswith("accelerator") else "N/A"
           for k in NOT_RECORDED},
        "hw_notes": "; ".join(hw_notes),
        "framework": f"{name} {version}",
        "other_software_stack": ", ".join(s for s in other if s),
        "operating_system": str(environment.get("platform") or ""),
        "sw_notes": f"{spec.amp} AMP in {spec.precision}"
                    + (f" (policy {Path(spec.policy).name})" if spec.amp == "ampcert" and spec.policy else "")
                    + f"; exported by {tool}; each result's lowest_numerical_precision_in_* keys give "
                    "the precision measured in that run",
    }


@dataclass
class Exported:
    """What an export wrote, and what MLPerf's checkers said of it."""

    out: Path
    orgs: list[str] = field(default_factory=list)
    systems: dict[str, list[str]] = field(default_factory=dict)  # system file -> checker's reasons (none: pass)
    benchmarks: list[tuple[str, str, str, int]] = field(default_factory=list)  # org, system, benchmark, results
    log_problems: dict[str, list[str]] = field(default_factory=dict)  # result file -> common-rule violations
    scores: list[dict[str, Any]] = field(default_factory=list)  # MLPerf's summarizer rows
    # result file -> why its run has no time-to-train (no target, or not reached: logged
    # `aborted`); a benchmark with one such run gets no score
    unscored: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.systems.values()) and not self.log_problems

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out), "ok": self.ok, "orgs": self.orgs, "systems": self.systems,
                "benchmarks": [{"org": o, "system": s, "benchmark": b, "results": n}
                               for o, s, b, n in self.benchmarks],
                "log_problems": self.log_problems, "scores": self.scores, "unscored": self.unscored}


def _no_time_to_train(r: RunResult) -> str | None:
    """Why MLPerf would give ``r`` no time-to-train (its log's run_stop says ``aborted``),
    or None for a run that reached its target."""
    if r.status != "completed":
        return f"the run {r.status}"
    return mllog.run_stop_metadata(r.target, bool(r.target_reached), r.steps).get("reason")


def _plan(rs: ResultSet, environment: dict[str, Any], tool: str
          ) -> tuple[dict[Path, tuple[bytes, str]], dict[Path, str]]:
    """Every file the export writes (relative path -> bytes, and where they come from), and
    the result files whose runs have no time-to-train (-> why)."""
    files: dict[Path, tuple[bytes, str]] = {}
    unscored: dict[Path, str] = {}
    for runs in group_runs(rs.runs, skipped=False).values():
        # Seeds in order: result_0 is the lowest seed.
        runs = sorted(runs, key=lambda r: r.spec.seed)
        for n, r in enumerate(runs):
            org, system = org_folder_name(r.spec.submission.org), system_id(r)
            source = rs.root / "runs" / r.run_id / "run.mllog"
            try:
                log = read_regular_file(source)
            except FileNotFoundError:
                raise UserError(f"{rs.root}: run {r.run_id} has a result but no run.mllog; "
                                "export needs every run's log") from None
            result = Path(org, "results", system, r.spec.label, f"result_{n}.txt")
            files[result] = (log, str(source))
            why = _no_time_to_train(r)
            if why is not None:
                unscored[result] = f"{r.run_id}: {why}"
            # The first run of a system describes it: its runs share plan.json's fingerprint,
            # and the system id names what else they share (platform, backend, amp, precision).
            sys_file = Path(org, "systems", f"{system}.json")
            if sys_file not in files:
                desc = json.dumps(system_description(r, environment, tool), indent=2) + "\n"
                files[sys_file] = (desc.encode(), "environment fingerprint")
    return files, unscored


def export(rs: ResultSet, out: Path, environment: dict[str, Any], tool: str) -> Exported:
    """Write ``rs`` under ``out`` in MLPerf's layout and judge it with MLPerf's
    checkers (common rules per result file, the system description checker,
    the result summarizer's scores).

    ``out`` may hold other organisations or systems (several results folders
    exported side by side make one package), but a file this export would
    write must not exist with other bytes: nothing already there is replaced."""
    from ampcert.certify import mlperf

    if not rs.runs:
        raise UserError(f"{rs.root}: no run results to export")
    files, unscored = _plan(rs, environment, tool)
    clashes = [p for p, (data, _) in files.items() if (out / p).exists() and (out / p).read_bytes() != data]
    if clashes:
        raise UserError(f"{out / clashes[0]} already exists with other content; export into an empty folder "
                        f"or remove it ({len(clashes)} file(s) clash)")
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder")
    for path, (data, _) in sorted(files.items()):
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, data.decode("utf-8"))
    done = Exported(out)
    done.orgs = sorted({p.parts[0] for p in files})
    for path in sorted(p for p in files if p.parts[1] == "systems"):
        done.systems[str(out / path)] = mlperf.check_system_description(out / path)
    counts: dict[tuple[str, str, str], int] = {}
    for path in sorted(p for p in files if p.parts[1] == "results"):
        key = (path.parts[0], path.parts[2], path.parts[3])
        counts[key] = counts.get(key, 0) + 1
        violations = mlperf.check_common(out / path).violations()
        if violations:
            done.log_problems[str(out / path)] = [f"line {line}: {msg}" if line else msg for line, msg in violations]
    done.benchmarks = [(*k, n) for k, n in sorted(counts.items())]
    for org in done.orgs:
        benchmarks = sorted({b for o, _, b, _ in done.benchmarks if o == org})
        done.scores += mlperf.summarize(out / org, benchmarks)
    # MLPerf's summarizer times run_start to run_stop whatever the status says; a time-to-train
    # exists only where every run reached the quality target, so the others' scores go.
    done.unscored = {str(out / p): why for p, why in sorted(unscored.items())}
    no_score = {(p.parts[2], p.parts[3]) for p in unscored}
    for row in done.scores:
        for system, benchmark in no_score:
            if row.get("system_id") == system and benchmark in row:
                row[benchmark] = None
    return done
