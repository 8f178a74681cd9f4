"""The gate settings: the YAML model behind ``--gate FILE`` and how it is loaded.

``configs/gate.yaml`` ships the defaults (thresholds, directions, tests,
significance level); a file given with ``--gate`` is laid over them, key by
key, so it names only what it changes. Everything a gate file can say is a
field of :class:`GateConfig` and is validated here, so that a bad file is one
``ampcert: error:`` line (exit 2) and never reaches the comparison. What the
loader computes, the gate's provenance (which files, their digest), is no
field: a file cannot set it.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from ampcert.configio import parse_model, read_yaml_file
from ampcert.errors import UserError
from ampcert.resources import config_path, shipped_label

GATE_FILE = config_path("gate.yaml")
MetricName = Literal["samples_per_s", "step_samples_per_s", "time_to_target_s", "final_metric", "peak_memory_bytes",
                     "energy_j_per_sample"]
#: The one metric whose better direction the workload itself declares (accuracy
#: higher, bits per byte lower); speed, time, memory and energy have a fixed one.
WORKLOAD_DIRECTED: MetricName = "final_metric"


def _finite(value: float) -> float:
    if math.isinf(value):
        raise ValueError("expected a finite threshold (to switch a metric off, set `enabled: false`)")
    return value


#: A threshold: worse by more than this is a regression (if significant). NaN fails `gt`.
Threshold = Annotated[float, Field(gt=0), AfterValidator(_finite)]


class GateModel(BaseModel):
    """The gate's models (its settings and its result) reject unknown fields."""

    model_config = ConfigDict(extra="forbid")


class MetricGate(GateModel):
    measures: str = ""
    direction: Literal["higher", "lower", "workload"]
    threshold: Threshold = Field(description="relative (fraction of the baseline) or absolute, per `kind`")
    kind: Literal["relative", "absolute"] = "relative"
    test: Literal["auto", "bootstrap", "mannwhitney"] = "auto"
    alpha: float | None = Field(default=None, gt=0, lt=0.5, description="default: the gate's alpha")
    per_workload: dict[str, Threshold] = Field(default_factory=dict)
    enabled: bool = True

    def threshold_for(self, workload: str) -> float:
        return self.per_workload.get(workload, self.threshold)


class VerdictGate(GateModel):
    new_fail: bool = True
    new_inconclusive: bool = False


class GateConfig(GateModel):
    name: str
    version: Literal[1] = 1
    description: str = ""
    alpha: float = Field(0.05, gt=0, lt=0.5)
    bootstrap_resamples: int = Field(4000, ge=200, le=100_000)
    mannwhitney_min_runs: int = Field(4, ge=2)
    min_runs: int = Field(3, ge=2, description="runs per side below which no change counts as significant")
    seed: int = Field(0, ge=0, description="the bootstrap's random seed (numpy takes no negative seed)")
    verdicts: VerdictGate = Field(default_factory=VerdictGate)
    failed_runs: bool = True
    metrics: dict[MetricName, MetricGate]
    # Set by load_gate, not by a file: which files the settings came from, and their digest.
    _source: str = PrivateAttr("")
    _sha256: str = PrivateAttr("")

    @field_validator("metrics")
    @classmethod
    def _workload_direction(cls, metrics: dict[str, MetricGate]) -> dict[str, MetricGate]:
        for name, mg in metrics.items():
            if mg.direction == "workload" and name != WORKLOAD_DIRECTED:
                raise ValueError(f"{name}.direction: got 'workload', expected 'higher' or 'lower' (only "
                                 f"{WORKLOAD_DIRECTED} takes its direction from the workload's metric)")
        return metrics

    @property
    def source(self) -> str:
        """The file(s) the settings came from: the shipped defaults, `+ FILE` where one was laid over them."""
        return self._source

    @property
    def sha256(self) -> str:
        """The digest of those files' bytes."""
        return self._sha256


def _read_yaml_mapping(path: Path) -> tuple[dict[str, Any], bytes]:
    return read_yaml_file(path, "gate file", mapping="gate settings")


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _overlay(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_gate(path: str | Path | None = None) -> GateConfig:
    """The shipped gate (configs/gate.yaml), with ``path`` laid over it if given."""
    data, raw = _read_yaml_mapping(GATE_FILE)
    source, digest = shipped_label(GATE_FILE), hashlib.sha256(raw).hexdigest()
    where = str(GATE_FILE)
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"{p}: --gate: expected an existing gate file (YAML)")
        user, user_raw = _read_yaml_mapping(p)
        metrics = user.get("metrics")
        if metrics is not None and not isinstance(metrics, dict):
            raise UserError(f"{p}: metrics: expected a mapping of metric name to settings")
        for name in metrics or {}:
            if name not in data["metrics"]:
                raise UserError(f"{p}: metrics.{name}: expected one of {list(data['metrics'])}")
        data = _overlay(data, user)
        data.setdefault("name", "default")
        if "name" not in user:
            data["name"] = f"default + {p.name}"
        source = f"{shipped_label(GATE_FILE)} + {p}"
        digest = hashlib.sha256(raw + b"\n---\n" + user_raw).hexdigest()
        where = str(p)
    cfg = parse_model(GateConfig, data, where)
    cfg._source, cfg._sha256 = source, digest
    return cfg
