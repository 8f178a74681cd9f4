"""The regression gate: is a candidate's set of results worse than a baseline's?

    from ampcert import gate
    result = gate.compare(gate.load_source("baseline/"), gate.load_source("report.json"),
                          gate.load_gate())
    result.status                       # "PASS" or "FAIL"; exit code 0 / 1

A *source* is a results folder (``ampcert run --out DIR``) or a report.json
(its ``runs``, ``certificate`` and ``suite``). Both sides must come from the
same suite and share at least one subject, else :class:`UserError` (exit 2).

Per subject (workload entry, backend, AMP, precision) and metric, a regression
needs both an effect beyond the metric's threshold and statistical support
over the repeated samples, so that noise alone does not fail a build (a single
threshold does: see DESIGN.md, "Regression gating"). The samples are the
per-step times within runs where they were recorded (``step_times_ms``) and
the runs (seeds) themselves; the test that decided (bootstrap interval or
Mann-Whitney U) is named in every row. Independently of speed, a subject or
required rule that FAILs now but did not in the baseline, and runs that fail
now, are regressions. Thresholds, directions and tests are data
(``configs/gate.yaml``).
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ampcert.certify.checks import Certificate
from ampcert.errors import UserError
from ampcert.resources import config_path
from ampcert.results import ResultsDir, RunResult

GATE_FILE = config_path("gate.yaml")
MetricName = Literal["samples_per_s", "time_to_target_s", "final_metric", "peak_memory_bytes",
                     "energy_j_per_sample"]
RowStatus = Literal["REGRESSION", "INCONCLUSIVE", "IMPROVED", "OK", "N/A"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- gate config


class MetricGate(_Model):
    measures: str = ""
    direction: Literal["higher", "lower", "workload"]
    threshold: float = Field(gt=0, description="relative (fraction of the baseline) or absolute, per `kind`")
    kind: Literal["relative", "absolute"] = "relative"
    test: Literal["auto", "bootstrap", "mannwhitney"] = "auto"
    alpha: float | None = Field(default=None, gt=0, lt=0.5, description="default: the gate's alpha")
    per_workload: dict[str, float] = Field(default_factory=dict)
    enabled: bool = True

    def threshold_for(self, workload: str) -> float:
        return self.per_workload.get(workload, self.threshold)


class VerdictGate(_Model):
    new_fail: bool = True
    new_inconclusive: bool = False


class GateConfig(_Model):
    name: str
    version: int = 1
    description: str = ""
    alpha: float = Field(0.05, gt=0, lt=0.5)
    bootstrap_resamples: int = Field(4000, ge=200, le=100_000)
    mannwhitney_min_runs: int = Field(4, ge=2)
    min_runs: int = Field(3, ge=2, description="runs per side below which no change counts as significant")
    seed: int = 0
    verdicts: VerdictGate = Field(default_factory=VerdictGate)
    failed_runs: bool = True
    metrics: dict[MetricName, MetricGate]
    source: str = ""
    sha256: str = ""


def _read_yaml_mapping(path: Path) -> tuple[dict[str, Any], bytes]:
    import yaml

    from ampcert.configio import load_yaml, yaml_problem

    try:
        raw = path.read_bytes()
        data = load_yaml(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: expected a readable UTF-8 gate file, got {type(exc).__name__}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: YAML: expected well-formed YAML, got {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of gate settings at the top level, got {type(data).__name__}")
    return data, raw


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _overlay(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_gate(path: str | Path | None = None) -> GateConfig:
    """The shipped gate (configs/gate.yaml), with ``path`` laid over it if given."""
    from ampcert.configio import validation_message

    data, raw = _read_yaml_mapping(GATE_FILE)
    source, digest = str(GATE_FILE), hashlib.sha256(raw).hexdigest()
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
        source = f"{GATE_FILE} + {p}"
        digest = hashlib.sha256(raw + b"\n---\n" + user_raw).hexdigest()
        where = str(p)
    try:
        cfg = GateConfig.model_validate(data)
    except ValidationError as err:
        raise UserError(validation_message(where, err, data)) from None
    return cfg.model_copy(update={"source": source, "sha256": digest})


# --------------------------------------------------------------------------- sources


@dataclass
class Source:
    """What one side of a comparison holds: runs, certificate, suite identity."""

    path: Path
    kind: Literal["results folder", "report"]
    suite_name: str
    suite_sha256: str | None
    runs: list[RunResult]
    certificate: Certificate | None


def load_source(path: str | Path) -> Source:
    """A results folder or a report.json (``runs``, ``certificate``, ``suite``), as a Source."""
    from ampcert.configio import validation_message

    p = Path(path)
    if p.is_dir():
        from ampcert.results import load

        rd = ResultsDir(p)
        rs = load(p)  # one clear line if this is not a results folder
        plan = rd.read_plan()
        cert = None
        if rd.verdicts_file.exists():
            try:
                cert = Certificate.model_validate_json(rd.verdicts_file.read_bytes())
            except (OSError, ValueError) as exc:
                raise UserError(f"{rd.verdicts_file}: unreadable verdicts: {str(exc).splitlines()[0]}") from None
        return Source(p, "results folder", rs.suite_name, plan.get("suite_sha256"), rs.runs, cert)
    if not p.exists():
        raise UserError(f"{p}: no such report file or results folder")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: expected a readable report.json, got {type(exc).__name__}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{p}: expected a report.json or a results folder, got invalid JSON "
                        f"(line {exc.lineno}: {exc.msg})") from None
    if isinstance(data, dict) and "payloadType" in data and "payload" in data:
        raise UserError(f"{p}: a signed envelope (DSSE): compare the report.json it signs "
                        "(verify it first with `ampcert verify`)")
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or not isinstance(data.get("suite"), dict):
        raise UserError(f"{p}: not an ampcert report: expected a JSON object with `runs` (list) and `suite` (object)")
    suite = data["suite"]
    if not isinstance(suite.get("name"), str):
        raise UserError(f"{p}: suite.name: expected the suite's name (string)")
    runs = []
    for i, item in enumerate(data["runs"]):
        try:
            runs.append(RunResult.model_validate(item))
        except ValidationError as err:
            raise UserError(validation_message(f"{p}: runs[{i}]", err, item)) from None
    cert = None
    if data.get("certificate") is not None:
        try:
            cert = Certificate.model_validate(data["certificate"])
        except ValidationError as err:
            raise UserError(validation_message(f"{p}: certificate", err, data["certificate"])) from None
    return Source(p, "report", suite["name"], suite.get("sha256"), runs, cert)


# --------------------------------------------------------------------------- subjects


class SubjectKey(_Model):
    workload: str
    backend: str
    amp: str
    precision: str

    def __str__(self) -> str:
        return f"{self.workload}/{self.backend}/{self.amp}/{self.precision}"


def _key(r: RunResult) -> tuple[str, str, str, str]:
    return (r.spec.label, r.spec.backend, r.spec.amp, r.spec.precision)


def _primary(runs: list[RunResult]) -> list[RunResult]:
    """Seeds are the replicates: repeats of a seed (determinism checks) are left out."""
    return [r for r in runs if (r.spec.repeat or 0) == 0 and r.status != "skipped"]


def match_subjects(base: list[RunResult], cand: list[RunResult]
                   ) -> tuple[list[tuple[tuple, tuple]], list[tuple], list[tuple], list[str]]:
    """Pairs of (baseline key, candidate key), keys only in one side, notes.

    Subjects match on (workload, backend, amp, precision). Where a (workload,
    backend, precision) has exactly one unmatched AMP implementation on each
    side (a change from native to ampcert AMP, say), those are paired too,
    with a note: that change is exactly what a gate should judge."""
    bk = sorted({_key(r) for r in base})
    ck = sorted({_key(r) for r in cand})
    pairs = [(k, k) for k in bk if k in ck]
    only_b = [k for k in bk if k not in ck]
    only_c = [k for k in ck if k not in bk]
    notes = []

    def wbp(k):
        return (k[0], k[1], k[3])

    for k in list(only_b):
        ob = [x for x in only_b if wbp(x) == wbp(k)]
        oc = [x for x in only_c if wbp(x) == wbp(k)]
        if len(ob) == 1 and len(oc) == 1:
            pairs.append((ob[0], oc[0]))
            only_b.remove(ob[0])
            only_c.remove(oc[0])
            notes.append(f"{k[0]}/{k[1]}/{k[3]}: AMP implementation changed from {ob[0][2]} to {oc[0][2]}; compared")
    return sorted(pairs), only_b, only_c, notes


# --------------------------------------------------------------------------- samples


@dataclass
class _Samples:
    """One side's samples of one metric: a value per run, and per-step samples
    within runs where the metric has them."""

    per_run: list[float]
    groups: list[np.ndarray] | None = None  # per-step samples, one array per run
    missing: str | None = None  # why a run had no value
    note: str | None = None

    @property
    def pooled(self) -> np.ndarray:
        if self.groups:
            return np.concatenate(self.groups)
        return np.asarray(self.per_run, dtype=float)

    @property
    def n_samples(self) -> int:
        return int(sum(len(g) for g in self.groups)) if self.groups else len(self.per_run)


def _energy_reason(r: RunResult) -> str:
    energy = (r.telemetry or {}).get("energy") or {}
    return str(energy.get("reason") or "no energy measurement in the run's telemetry")


def _collect(metric: str, runs: list[RunResult]) -> _Samples:
    done = [r for r in runs if r.status == "completed"]
    if not done:
        return _Samples([], missing="no completed run")
    if metric == "samples_per_s":
        vals = [r.samples_per_s for r in done if r.samples_per_s]
        groups = []
        for r in done:
            if r.step_times_ms and r.steps:
                batch = r.train_samples / r.steps
                ms = np.asarray([t for t in r.step_times_ms if t > 0], dtype=float)
                if len(ms):
                    groups.append(batch * 1e3 / ms)
        use_steps = len(groups) == len(done)
        return _Samples(vals, groups if use_steps else None, None if vals else "samples/s not recorded",
                        None if use_steps else "per run (no per-step times recorded)")
    if metric == "time_to_target_s":
        vals, censored = [], 0
        for r in done:
            if r.target_reached and r.time_to_target_s is not None:
                vals.append(r.time_to_target_s)
            else:
                censored += 1
                ph = r.phases
                vals.append((ph.train_s + ph.eval_s) if ph is not None else (r.wall_s or math.inf))
        note = (f"target missed in {censored}/{len(done)} runs: counted at their whole training time"
                if censored else None)
        return _Samples(vals, note=note)
    if metric == "final_metric":
        vals = [r.final_metric for r in done if r.final_metric is not None]
        return _Samples(vals, missing=None if vals else "no final metric")
    if metric == "peak_memory_bytes":
        vals = [r.peak_memory.value for r in done if r.peak_memory and r.peak_memory.value is not None]
        return _Samples(vals, missing=None if vals else "peak memory not measured")
    if metric == "energy_j_per_sample":
        vals = [v for r in done if (v := ((r.telemetry or {}).get("energy") or {}).get("train_j_per_sample"))
                is not None]
        return _Samples(vals, missing=None if vals else f"energy not measured: {_energy_reason(done[0])}")
    raise ValueError(metric)  # pragma: no cover - MetricName admits only these


# --------------------------------------------------------------------------- statistics


def bootstrap_medians(groups: list[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``resamples`` hierarchical bootstrap samples: draw the runs
    with replacement, then within each drawn run as many steps as a run has
    (the median length) with replacement, and take the median of the pool.
    With one value per run it is the ordinary bootstrap over runs."""
    m = len(groups)
    lengths = np.array([len(g) for g in groups])
    draws = max(int(np.median(lengths)), 1)
    padded = np.zeros((m, lengths.max()))
    for j, g in enumerate(groups):
        padded[j, : len(g)] = g
    out = np.empty(resamples)
    chunk = max(1, 2_000_000 // (m * draws))
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        picked = rng.integers(0, m, size=(b, m))
        steps = (rng.random((b, m, draws)) * lengths[picked][..., None]).astype(np.int64)
        values = padded[picked[..., None], steps]
        out[start:start + b] = np.median(values.reshape(b, -1), axis=1)
    return out


def _change(b: np.ndarray | float, c: np.ndarray | float, kind: str):
    if kind == "absolute":
        return np.subtract(c, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(c, b) - 1.0


def _mannwhitney(c: np.ndarray, b: np.ndarray, alternative: str) -> float:
    from scipy.stats import mannwhitneyu

    if np.ptp(np.concatenate([b, c])) == 0:
        return 1.0  # every sample equal: no evidence of any shift
    return float(mannwhitneyu(c, b, alternative=alternative).pvalue)


class Side(_Model):
    value: float | None = Field(description="the median of the samples (the estimate compared)")
    runs: int
    samples: int
    per_run: list[float] = Field(default_factory=list, description="each run's own value (samples/s: the run's mean)")
    note: str | None = None


class MetricComparison(_Model):
    subject: SubjectKey
    candidate_subject: SubjectKey | None = Field(default=None, description="set where the AMP implementation changed")
    metric: MetricName
    unit: str
    direction: Literal["higher", "lower"]
    baseline: Side
    candidate: Side
    change: float | None = Field(description="candidate vs baseline: relative (c/b - 1) or absolute (c - b), per kind")
    kind: Literal["relative", "absolute"]
    threshold: float
    alpha: float
    test: str | None = Field(description="the test that decided whether the change is significant")
    p_value: float | None = Field(default=None, description="one-sided Mann-Whitney U p for 'the candidate is worse'")
    ci: list[float] | None = Field(default=None, description="bootstrap (1 - alpha) interval of the change")
    status: RowStatus
    summary: str


class VerdictChange(_Model):
    subject: SubjectKey
    rule: str | None = Field(description="a required rule's id; null for the subject's overall verdict")
    baseline: str | None
    candidate: str | None
    regression: bool
    summary: str


class RunFailures(_Model):
    subject: SubjectKey
    baseline_failed: int
    candidate_failed: int
    runs: int
    reasons: list[str]
    regression: bool


class SourceInfo(_Model):
    path: str
    kind: str
    suite: str
    suite_sha256: str | None
    runs: int
    devices: list[str]
    certificate: str | None = Field(description="the certificate's status, if the source has one")


class GateResult(_Model):
    status: Literal["PASS", "FAIL"]
    regressions: list[str] = Field(description="one line per regression")
    baseline: SourceInfo
    candidate: SourceInfo
    gate: dict[str, str] = Field(description="name, source and sha256 of the gate config")
    comparisons: list[MetricComparison]
    verdict_changes: list[VerdictChange]
    run_failures: list[RunFailures]
    notes: list[str]

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "FAIL" else 0


UNITS = {"samples_per_s": "samples/s", "time_to_target_s": "s", "peak_memory_bytes": "bytes",
         "energy_j_per_sample": "J/sample"}


def _compare_metric(metric: str, mg: MetricGate, cfg: GateConfig, subject: SubjectKey,
                    cand_subject: SubjectKey | None, base: list[RunResult], cand: list[RunResult],
                    rng: np.random.Generator) -> MetricComparison | None:
    if metric == "time_to_target_s" and not any(r.target is not None for r in base + cand):
        return None  # fixed step budgets: no target to reach
    known = [r for r in base + cand if r.higher_is_better is not None]
    unit = UNITS.get(metric) or next((r.metric for r in known if r.metric), "")
    if mg.direction == "workload":
        higher = known[0].higher_is_better if known else True
    else:
        higher = mg.direction == "higher"
    alpha = mg.alpha or cfg.alpha
    threshold = mg.threshold_for(subject.workload)
    bs, cs = _collect(metric, base), _collect(metric, cand)

    def side(s: _Samples) -> Side:
        return Side(value=float(np.median(s.pooled)) if s.per_run else None, runs=len(s.per_run),
                    samples=s.n_samples, per_run=[float(v) for v in s.per_run],
                    note=s.missing or s.note)

    row = dict(subject=subject, candidate_subject=cand_subject, metric=metric, unit=unit,
               direction="higher" if higher else "lower", baseline=side(bs), candidate=side(cs),
               kind=mg.kind, threshold=threshold, alpha=alpha)
    if not bs.per_run or not cs.per_run:
        if not bs.per_run and not cs.per_run and bs.missing == cs.missing:
            why = f"on neither side: {bs.missing}"
        else:
            why = "; ".join(f"{name}: {x.missing}" for name, x in (("baseline", bs), ("candidate", cs))
                            if not x.per_run)
        return MetricComparison(**row, change=None, test=None, status="N/A", summary=why)
    b_est, c_est = row["baseline"].value, row["candidate"].value
    if mg.kind == "relative" and b_est == 0:
        return MetricComparison(**row, change=None, test=None, status="N/A",
                                summary="baseline value is 0: no relative change")
    change = float(_change(b_est, c_est, mg.kind))
    # grouped (per-step) samples only where both sides have them
    grouped = bs.groups is not None and cs.groups is not None
    b_groups = bs.groups if grouped else [np.array([v]) for v in bs.per_run]
    c_groups = cs.groups if grouped else [np.array([v]) for v in cs.per_run]
    test = mg.test
    if test == "auto":
        enough = min(len(bs.per_run), len(cs.per_run)) >= cfg.mannwhitney_min_runs
        test = "bootstrap" if grouped or not enough else "mannwhitney"
    level = "runs x steps" if grouped else "runs"
    # bootstrap interval of the change (always reported; decides with test=bootstrap)
    boots = _change(bootstrap_medians(b_groups, cfg.bootstrap_resamples, rng),
                    bootstrap_medians(c_groups, cfg.bootstrap_resamples, rng), mg.kind)
    boots = boots[np.isfinite(boots)]
    ci = [float(np.percentile(boots, 100 * alpha / 2)), float(np.percentile(boots, 100 * (1 - alpha / 2)))] \
        if len(boots) else None
    b_flat = np.concatenate(b_groups)
    c_flat = np.concatenate(c_groups)
    p_worse = _mannwhitney(c_flat, b_flat, "less" if higher else "greater")
    p_better = _mannwhitney(c_flat, b_flat, "greater" if higher else "less")
    if test == "mannwhitney":
        label = f"Mann-Whitney U, one-sided, over {'steps' if grouped else 'runs'} (n={len(b_flat)} vs {len(c_flat)})"
        worse_sig, better_sig = p_worse < alpha, p_better < alpha
        evidence = f"p={p_worse:.3g}"
    else:
        label = (f"bootstrap {100 * (1 - alpha):.0f}% CI of the change in medians, over {level} "
                 f"({len(bs.per_run)} vs {len(cs.per_run)} runs, {cfg.bootstrap_resamples} resamples)")
        lo, hi = ci if ci else (-math.inf, math.inf)
        worse_sig = (hi < 0) if higher else (lo > 0)
        better_sig = (lo > 0) if higher else (hi < 0)
        evidence = f"CI [{_fmt_change(lo, mg.kind)}, {_fmt_change(hi, mg.kind)}]"
    few = min(len(bs.per_run), len(cs.per_run)) < cfg.min_runs
    if few:  # two runs cannot show how much runs vary: no interval over them is trustworthy
        worse_sig = better_sig = False
        label = (f"none: {len(bs.per_run)} vs {len(cs.per_run)} runs, support needs >= {cfg.min_runs} "
                 "per side (interval shown for information)")
        evidence += f", {len(bs.per_run)} vs {len(cs.per_run)} runs (support needs >= {cfg.min_runs} per side)"
    worse = change < 0 if higher else change > 0
    beyond = abs(change) > threshold
    if worse and beyond and worse_sig:
        status: RowStatus = "REGRESSION"
        verdict = "worse beyond the threshold, significant"
    elif worse and beyond:
        status = "INCONCLUSIVE"
        verdict = ("worse beyond the threshold, too few runs to tell it from noise" if few else
                   "worse beyond the threshold, but not significant (noise cannot be ruled out)")
    elif not worse and beyond and better_sig:
        status, verdict = "IMPROVED", "better beyond the threshold, significant"
    else:
        status = "OK"
        verdict = "within the threshold" if not beyond else "better, not significant"
    summary = (f"{_fmt_change(change, mg.kind)} (threshold {_fmt_threshold(threshold, mg.kind)}), "
               f"{evidence}: {verdict}")
    notes = [n for n in (bs.note, cs.note) if n]
    if notes:
        summary += f" [{'; '.join(dict.fromkeys(notes))}]"
    return MetricComparison(**row, change=change, test=label, p_value=p_worse, ci=ci, status=status,
                            summary=summary)


# --------------------------------------------------------------------------- verdicts and failures


def _compare_verdicts(base: Certificate | None, cand: Certificate | None, pairs, cfg: GateConfig,
                      notes: list[str]) -> list[VerdictChange]:
    if base is None and cand is None:
        return []
    if cand is None:
        notes.append("the baseline is certified but the candidate is not: verdicts not compared "
                      "(run `ampcert certify DIR` on the candidate)")
        return []
    if base is None:
        notes.append("the candidate is certified but the baseline is not: verdicts not compared")
        return []
    if base.rules.get("sha256") != cand.rules.get("sha256"):
        notes.append(f"rule packs differ: baseline {base.rules.get('name')} ({str(base.rules.get('sha256'))[:12]}), "
                     f"candidate {cand.rules.get('name')} ({str(cand.rules.get('sha256'))[:12]})")

    def regressed(b: str | None, c: str | None) -> bool:
        if c == "FAIL" and b != "FAIL":
            return cfg.verdicts.new_fail
        return c == "INCONCLUSIVE" and b == "PASS" and cfg.verdicts.new_inconclusive

    b_subj = {s.subject.key(): s for s in base.subjects}
    c_subj = {s.subject.key(): s for s in cand.subjects}
    b_rule = {(v.subject.key(), v.rule): v for v in base.verdicts}
    changes = []
    for bk, ck in pairs:
        if bk not in b_subj and ck not in c_subj:
            continue
        subject = SubjectKey(workload=bk[0], backend=bk[1], amp=bk[2], precision=bk[3])
        b = b_subj[bk].status if bk in b_subj else None
        c = c_subj[ck].status if ck in c_subj else None
        if b == c:
            continue
        reg = regressed(b, c)
        failed = ", ".join(c_subj[ck].failed) if ck in c_subj and c_subj[ck].failed else ""
        changes.append(VerdictChange(subject=subject, rule=None, baseline=b, candidate=c, regression=reg,
                                     summary=f"certificate {b} -> {c}" + (f" (failed: {failed})" if failed else "")))
        if c is not None and b == "PASS" and c == "INCONCLUSIVE" and not reg:
            notes.append(f"{subject}: verdict PASS -> INCONCLUSIVE ({', '.join(c_subj[ck].inconclusive)})")
        for v in cand.verdicts:
            if v.subject.key() != ck or not v.required:
                continue
            bv = b_rule.get((bk, v.rule))
            if bv is not None and bv.status == v.status:
                continue
            b_status = bv.status if bv is not None else None
            changes.append(VerdictChange(subject=subject, rule=v.rule, baseline=b_status, candidate=v.status,
                                         regression=regressed(b_status, v.status), summary=v.summary))
    return changes


def _compare_failures(base: list[RunResult], cand: list[RunResult], subject: SubjectKey,
                      cfg: GateConfig) -> RunFailures | None:
    bf = [r for r in base if r.status == "failed"]
    cf = [r for r in cand if r.status == "failed"]
    if not bf and not cf:
        return None
    return RunFailures(subject=subject, baseline_failed=len(bf), candidate_failed=len(cf), runs=len(cand),
                       reasons=[f"seed {r.spec.seed}: {r.reason}" for r in cf],
                       regression=cfg.failed_runs and len(cf) > len(bf))


# --------------------------------------------------------------------------- compare


def _group_na(comparisons: list[MetricComparison]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for c in comparisons:
        if c.status == "N/A":
            out[c.summary].append(f"{c.metric} of {c.subject}")
    return {why: (rows if len(rows) <= 2 else [c.split(" of ")[0] + f" ({len(rows)} subjects)" for c in rows[:1]])
            for why, rows in out.items()}


def _info(s: Source) -> SourceInfo:
    devices = sorted({str((r.environment or {}).get("device_name") or r.spec.device) for r in s.runs})
    return SourceInfo(path=str(s.path), kind=s.kind, suite=s.suite_name, suite_sha256=s.suite_sha256,
                      runs=len(s.runs), devices=devices,
                      certificate=s.certificate.status if s.certificate else None)


def compare(baseline: Source, candidate: Source, cfg: GateConfig | None = None) -> GateResult:
    """Gate ``candidate`` against ``baseline``; UserError where they cannot be compared."""
    cfg = cfg or load_gate()
    if not baseline.runs:
        raise UserError(f"{baseline.path}: no run results to compare (baseline)")
    if not candidate.runs:
        raise UserError(f"{candidate.path}: no run results to compare (candidate)")
    if baseline.suite_name != candidate.suite_name:
        raise UserError(f"suites differ: baseline {baseline.path} is suite {baseline.suite_name!r}, "
                        f"candidate {candidate.path} is suite {candidate.suite_name!r}; "
                        "compare results of the same suite")
    b_runs, c_runs = _primary(baseline.runs), _primary(candidate.runs)
    pairs, only_b, only_c, notes = match_subjects(b_runs, c_runs)
    if not pairs:
        def names(keys):
            return ", ".join(sorted({f"{k[0]}/{k[1]}/{k[3]}" for k in keys})) or "none"

        raise UserError(f"no common (workload, backend, precision) between baseline {baseline.path} "
                        f"({names(only_b)}) and candidate {candidate.path} ({names(only_c)})")
    if baseline.suite_sha256 and candidate.suite_sha256 and baseline.suite_sha256 != candidate.suite_sha256:
        notes.append(f"suite {baseline.suite_name!r} differs between the two (sha256 "
                     f"{baseline.suite_sha256[:12]} vs {candidate.suite_sha256[:12]}): common subjects compared")
    for k in only_b:
        notes.append(f"{'/'.join(k)}: only in the baseline (not compared)")
    for k in only_c:
        notes.append(f"{'/'.join(k)}: only in the candidate (not compared)")
    bi, ci = _info(baseline), _info(candidate)
    if bi.devices != ci.devices:
        notes.append(f"devices differ: baseline {', '.join(bi.devices)}; candidate {', '.join(ci.devices)}: "
                     "speed, memory and energy compare different hardware")

    by_b: dict[tuple, list[RunResult]] = defaultdict(list)
    by_c: dict[tuple, list[RunResult]] = defaultdict(list)
    # in seed order, so a report.json (runs sorted by id) and its folder give the same answer
    for r in sorted(b_runs, key=lambda r: (r.spec.seed, r.run_id)):
        by_b[_key(r)].append(r)
    for r in sorted(c_runs, key=lambda r: (r.spec.seed, r.run_id)):
        by_c[_key(r)].append(r)
    comparisons: list[MetricComparison] = []
    failures: list[RunFailures] = []
    for bk, ck in pairs:
        subject = SubjectKey(workload=bk[0], backend=bk[1], amp=bk[2], precision=bk[3])
        cand_subject = None if ck == bk else SubjectKey(workload=ck[0], backend=ck[1], amp=ck[2], precision=ck[3])
        for metric, mg in cfg.metrics.items():
            if not mg.enabled:
                continue
            # one random stream per (subject, metric): a row does not depend on which others exist
            rng = np.random.default_rng([cfg.seed, zlib.crc32(f"{subject}|{metric}".encode())])
            row = _compare_metric(metric, mg, cfg, subject, cand_subject, by_b[bk], by_c[ck], rng)
            if row is not None:
                comparisons.append(row)
        f = _compare_failures(by_b[bk], by_c[ck], subject, cfg)
        if f is not None:
            failures.append(f)
    for why, rows in _group_na(comparisons).items():
        notes.append(f"{', '.join(rows)}: not compared, {why}")
    verdicts = _compare_verdicts(baseline.certificate, candidate.certificate, pairs, cfg, notes)

    regressions = [f"{c.subject}: {c.metric} {c.summary}" for c in comparisons if c.status == "REGRESSION"]
    regressions += [f"{v.subject}: {'rule ' + v.rule if v.rule else 'verdict'} {v.baseline} -> {v.candidate}"
                    + (f": {v.summary}" if v.rule else "") for v in verdicts if v.regression]
    regressions += [f"{f.subject}: {f.candidate_failed}/{f.runs} run(s) failed (baseline {f.baseline_failed}): "
                    f"{'; '.join(f.reasons)}" for f in failures if f.regression]
    return GateResult(
        status="FAIL" if regressions else "PASS", regressions=regressions, baseline=bi, candidate=ci,
        gate={"name": cfg.name, "source": cfg.source, "sha256": cfg.sha256},
        comparisons=comparisons, verdict_changes=verdicts, run_failures=failures, notes=notes,
    )


# --------------------------------------------------------------------------- formatting


def _fmt_change(x: float | None, kind: str) -> str:
    if x is None or not math.isfinite(x):
        return "—" if x is None else ("+inf" if x > 0 else "-inf")
    return f"{100 * x:+.1f}%" if kind == "relative" else f"{x:+.4f}"


def _fmt_threshold(t: float, kind: str) -> str:
    return f"{100 * t:g}%" if kind == "relative" else f"{t:g}"


def fmt_value(metric: str, v: float | None) -> str:
    if v is None:
        return "—"
    if metric == "peak_memory_bytes":
        return f"{v / 2**20:,.1f} MiB"
    if metric == "samples_per_s":
        return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"
    if metric == "time_to_target_s":
        return f"{v:.3g} s"
    if metric == "energy_j_per_sample":
        return f"{v:.4g} J"
    return f"{v:.4f}"


def table_rows(result: GateResult) -> list[dict[str, str]]:
    """One row of strings per comparison (terminal table and Markdown)."""
    rows = []
    for c in result.comparisons:
        evidence = ""
        if c.test is not None:
            if c.test.startswith("none"):
                evidence = "too few runs"
            elif c.test.startswith("Mann"):
                evidence = f"MWU p={c.p_value:.3g}"
            elif c.ci is not None:
                evidence = f"CI [{_fmt_change(c.ci[0], c.kind)}, {_fmt_change(c.ci[1], c.kind)}]"
        elif c.status == "N/A":
            evidence = "not compared (see notes)"
        rows.append({
            "subject": str(c.subject) + (f" -> {c.candidate_subject.amp}" if c.candidate_subject else ""),
            "metric": c.metric,
            "baseline": fmt_value(c.metric, c.baseline.value),
            "candidate": fmt_value(c.metric, c.candidate.value),
            "n": f"{c.baseline.runs}x{c.baseline.samples // max(c.baseline.runs, 1)}"
                 f" / {c.candidate.runs}x{c.candidate.samples // max(c.candidate.runs, 1)}"
            if c.baseline.runs else "",
            "change": _fmt_change(c.change, c.kind),
            "threshold": ("+" if c.direction == "lower" else "-") + _fmt_threshold(c.threshold, c.kind),
            "evidence": evidence,
            "status": c.status,
        })
    return rows


COLUMNS = ["subject", "metric", "baseline", "candidate", "n", "change", "threshold", "evidence", "status"]
HEADERS = {"n": "runs x samples", "threshold": "worse by >"}


def tests_used(result: GateResult) -> list[str]:
    """The tests that decided, in words (each once)."""
    return list(dict.fromkeys(
        c.test.split(" (")[0] if c.test.startswith(("bootstrap", "none")) else c.test.split(" (n=")[0]
        for c in result.comparisons if c.test))


def to_markdown(result: GateResult) -> str:
    """A CI job summary ($GITHUB_STEP_SUMMARY)."""
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    head = ("### :x: ampcert gate: FAIL, " + f"{len(result.regressions)} regression(s)"
            if result.status == "FAIL" else "### :white_check_mark: ampcert gate: PASS, no regression")
    b, c = result.baseline, result.candidate
    lines = [head, "",
             f"- baseline: `{b.path}` ({b.kind}, suite `{b.suite}`, {b.runs} runs, {', '.join(b.devices)}"
             + (f", certificate {b.certificate}" if b.certificate else "") + ")",
             f"- candidate: `{c.path}` ({c.kind}, suite `{c.suite}`, {c.runs} runs, {', '.join(c.devices)}"
             + (f", certificate {c.certificate}" if c.certificate else "") + ")",
             f"- gate: `{result.gate['name']}` (sha256 {result.gate['sha256'][:12]}): a regression needs an "
             "effect beyond the threshold **and** statistical support", ""]
    if result.regressions:
        lines += ["**Regressions**", ""] + [f"- {esc(r)}" for r in result.regressions] + [""]
    lines.append("| " + " | ".join(HEADERS.get(k, k) for k in COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for row in table_rows(result):
        cells = [row[k] for k in COLUMNS]
        if row["status"] == "REGRESSION":
            cells[-1] = "**REGRESSION**"
        lines.append("| " + " | ".join(esc(x) for x in cells) + " |")
    if result.verdict_changes:
        lines += ["", "**Verdict changes**", ""]
        lines += [f"- {'**regression**: ' if v.regression else ''}`{v.subject}` "
                  f"{'rule ' + v.rule if v.rule else 'certificate'}: {v.baseline} -> {v.candidate}"
                  f"{': ' + esc(v.summary) if v.rule else ''}" for v in result.verdict_changes]
    if result.run_failures:
        lines += ["", "**Failed runs**", ""]
        lines += [f"- `{f.subject}`: {f.candidate_failed}/{f.runs} failed (baseline {f.baseline_failed})"
                  + (f": {esc('; '.join(f.reasons))}" if f.reasons else "") for f in result.run_failures]
    tests = tests_used(result)
    if tests:
        lines += ["", "Tests: " + "; ".join(tests) + "."]
    if result.notes:
        lines += ["", "Notes:", ""] + [f"- {esc(n)}" for n in result.notes]
    return "\n".join(lines) + "\n"


def write_outputs(result: GateResult, json_path: Path | None, markdown_path: Path | None,
                  write: Callable[[Path, str], None] | None = None) -> list[Path]:
    """Write the JSON result and/or the Markdown summary (atomically)."""
    from ampcert.results import atomic_write_text

    write = write or atomic_write_text
    written = []
    for path, text in ((json_path, result.model_dump_json(indent=1) + "\n"),
                       (markdown_path, to_markdown(result) if markdown_path else "")):
        if path is None:
            continue
        try:
            write(Path(path), text)
        except OSError as exc:
            raise UserError(f"{path}: cannot write ({type(exc).__name__}: {exc.strerror or exc})") from None
        written.append(Path(path))
    return written
