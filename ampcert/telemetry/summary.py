"""What a run's telemetry recorded, and its summary: energy per phase, peaks, means, per source.

:class:`Recording` holds the samples and the phase edges the live sampler
(:mod:`ampcert.telemetry.sampler`) took; :func:`summarize` turns them into
the JSON-able summary a RunResult carries (``RunResult.telemetry``). Pure
functions over recorded data: tested on synthetic recordings, no thread, no
device.

Energy per phase comes from counter deltas between edges (NVML's total energy
counter, RAPL's package counters). Only where a source has no readable
counter is its sampled power integrated (:func:`integrate_trapezoid`, with
power interpolated linearly at the phase edges and held flat beyond the
first/last sample). Each source states the method it used. Joules per
training sample use the train phase only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from ampcert.telemetry.nvml import decode_throttle

PHASES = ("init", "train", "eval")
SUMMARY_VERSION = 1


# --------------------------------------------------------------------------- recorded data


@dataclass
class Edge:
    """A phase boundary: at ``t`` (seconds since start) ``phase`` begins
    (None: recording stopped); ``energy`` holds each source's cumulative
    counter in joules at that moment (None where unreadable)."""

    t: float
    phase: str | None
    energy: dict[str, float | None]


@dataclass
class SourceInfo:
    """What the summary needs to know about a source (plain data, so the
    summary can be computed, and tested, without live sources)."""

    name: str
    kind: str
    columns: tuple[str, ...]
    power_column: str | None = None
    power_is_interval_mean: bool = False
    describe: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    energy_reason: str | None = None
    energy_method: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, src: Any) -> SourceInfo:
        desc = src.describe()
        return cls(src.name, src.kind, tuple(src.columns), src.power_column, src.power_is_interval_mean,
                   desc, dict(src.reasons), src.energy_unavailable_reason(), desc.get("energy_method"),
                   src.extra_summary())


@dataclass
class Recording:
    """Everything a run's telemetry recorded. ``rows[i] = (t, phase, edge,
    {source: values aligned with that source's columns})``."""

    device: str
    rate_hz: float
    sources: list[SourceInfo]
    edges: list[Edge]
    rows: list[tuple[float, str, bool, dict[str, tuple[Any, ...]]]]
    notes: list[str] = field(default_factory=list)
    gpu_reason: str | None = None
    unresolved_gpus: list[dict[str, Any]] = field(default_factory=list)

    def column(self, source: str, col: str) -> tuple[np.ndarray, np.ndarray]:
        """(times, values) of one column, None as NaN, in time order."""
        info = next(s for s in self.sources if s.name == source)
        k = info.columns.index(col)
        ts = np.fromiter((r[0] for r in self.rows), float, len(self.rows))
        vs = np.fromiter((_num(r[3].get(source, ())[k] if source in r[3] else None) for r in self.rows),
                         float, len(self.rows))
        order = np.argsort(ts, kind="stable")
        return ts[order], vs[order]

    def segments(self) -> list[tuple[str, float, float]]:
        """(phase, start, end) for every stretch between two edges."""
        return [(a.phase, a.t, b.t) for a, b in pairwise(self.edges) if a.phase is not None]


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


# --------------------------------------------------------------------------- integration


def integrate_trapezoid(ts: Sequence[float] | np.ndarray, ps: Sequence[float] | np.ndarray,
                        a: float, b: float) -> float | None:
    """Integral of the sampled signal ``ps(ts)`` over ``[a, b]`` by the
    trapezoidal rule. Values at ``a`` and ``b`` are interpolated linearly
    between the neighbouring samples (held flat before the first and after
    the last one); NaN samples are dropped. None if there is no sample."""
    t = np.asarray(ts, dtype=float)
    p = np.asarray(ps, dtype=float)
    ok = np.isfinite(t) & np.isfinite(p)
    t, p = t[ok], p[ok]
    if t.size == 0 or b < a:
        return None
    order = np.argsort(t, kind="stable")
    t, p = t[order], p[order]
    inside = (t > a) & (t < b)
    tt = np.concatenate(([a], t[inside], [b]))
    pp = np.concatenate(([np.interp(a, t, p)], p[inside], [np.interp(b, t, p)]))
    return float(np.sum((tt[1:] - tt[:-1]) * (pp[1:] + pp[:-1]) / 2.0))


# --------------------------------------------------------------------------- summary


def _per_phase(values: dict[str, float | None], durations: dict[str, float]) -> dict[str, float | None]:
    out = {p: values.get(p) for p in durations if p != "total"}
    known = [v for v in out.values() if v is not None]
    out["total"] = sum(known) if known and len(known) == len(out) else None
    return out


def _source_energy(rec: Recording, info: SourceInfo, durations: dict[str, float]
                   ) -> tuple[dict[str, float | None] | None, str | None, str | None, float | None]:
    """(joules per phase, method, reason if None, integrated total for cross-checks)."""
    segs = rec.segments()
    counters = [e.energy.get(info.name) for e in rec.edges]
    have_counter = len(rec.edges) >= 2 and all(c is not None for c in counters)
    integrated_total = None
    ts = ps = None
    integrable = info.power_column is not None and not info.power_is_interval_mean
    if integrable:
        ts, ps = rec.column(info.name, info.power_column)
        if not np.isfinite(ps).any():
            integrable = False
    if integrable:
        parts = [integrate_trapezoid(ts, ps, a, b) for _, a, b in segs]
        if all(v is not None for v in parts):
            integrated_total = float(sum(parts))  # type: ignore[arg-type]
    if have_counter:
        by_phase: dict[str, float | None] = {p: 0.0 for p in durations if p != "total"}
        for a, b in pairwise(rec.edges):
            if a.phase is not None:
                delta = b.energy[info.name] - a.energy[info.name]  # type: ignore[operator]
                by_phase[a.phase] = (by_phase.get(a.phase) or 0.0) + delta
        return _per_phase(by_phase, durations), f"counter: {info.energy_method}", None, integrated_total
    missing = sum(c is None for c in counters)
    why = info.energy_reason or f"energy counter unreadable at {missing} of {len(counters)} phase edges"
    if integrable:
        by_phase = {p: 0.0 for p in durations if p != "total"}
        for phase, a, b in segs:
            by_phase[phase] = (by_phase.get(phase) or 0.0) + (integrate_trapezoid(ts, ps, a, b) or 0.0)
        method = (f"trapezoid: sampled power ({info.describe.get('power_method')}) integrated over "
                  f"each phase, because the energy counter is unavailable: {why}")
        return _per_phase(by_phase, durations), method, None, integrated_total
    reason = why
    if info.power_column and info.reasons.get(info.power_column):
        reason = info.reasons[info.power_column]
    return None, None, reason, None


def _in_segments(ts: np.ndarray, segs: Iterable[tuple[float, float]]) -> np.ndarray:
    mask = np.zeros(ts.shape, dtype=bool)
    for a, b in segs:
        mask |= (ts >= a) & (ts <= b)
    return mask


def _fmax(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else None


def _fmean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None


def _phase_segments(rec: Recording) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for phase, a, b in rec.segments():
        out.setdefault(phase, []).append((a, b))
    return out


def _source_summary(rec: Recording, info: SourceInfo, durations: dict[str, float],
                    train_samples: int | None) -> dict[str, Any]:
    by_phase = _phase_segments(rec)
    out: dict[str, Any] = {**info.describe}
    unavailable: dict[str, str] = {}
    energy, method, reason, integrated = _source_energy(rec, info, durations)
    out["energy_method"] = method
    out["energy_j"] = energy
    if energy is None:
        unavailable["energy_j"] = reason or "no energy source"
    # Average watts: energy over duration, per phase.
    out["avg_w"] = (None if energy is None else
                    {p: (energy[p] / durations[p] if energy.get(p) is not None and durations[p] > 0 else None)
                     for p in energy})
    train_j = energy.get("train") if energy else None
    if train_j is not None and train_samples:
        out["train_j_per_sample"] = train_j / train_samples
    else:
        out["train_j_per_sample"] = None
        unavailable.setdefault("train_j_per_sample", unavailable.get("energy_j") or
                               ("no training samples" if not train_samples else "no train-phase energy"))
    if integrated is not None and energy is not None and method and method.startswith("counter"):
        total = energy["total"]
        out["cross_check"] = {
            "integrated_total_j": integrated, "counter_total_j": total,
            "relative_difference": (integrated - total) / total if total else None,
            "method": "trapezoidal integration of the sampled power over the same phases, "
                      "against the counter (a check; the counter is the reported figure)",
        }
    # Peaks and means from the samples.
    stats: dict[str, Any] = {}
    for col in info.columns:
        ts, vs = rec.column(info.name, col)
        if not np.isfinite(vs).any():
            unavailable[col] = (info.reasons.get(col) or info.reasons.get("sample")
                                or "no sample could be read")
            continue
        if col == "throttle_reasons":
            continue
        in_train = _in_segments(ts, by_phase.get("train", []))
        stats[col] = {"train_mean": _fmean(vs[in_train]), "max": _fmax(vs)}
        if col == info.power_column:
            out["peak_w"] = {p: _fmax(vs[_in_segments(ts, by_phase.get(p, []))]) for p in by_phase}
            out["peak_w"]["total"] = _fmax(vs)
    if info.power_column and "peak_w" not in out:
        out["peak_w"] = None
    out["stats"] = stats
    if "throttle_reasons" in info.columns:
        ts, vs = rec.column(info.name, "throttle_reasons")
        train = vs[_in_segments(ts, by_phase.get("train", [])) & np.isfinite(vs)]
        if train.size:
            counts: dict[str, int] = {}
            for mask in train.astype(np.int64):
                for name in decode_throttle(int(mask)):
                    counts[name] = counts.get(name, 0) + 1
            out["throttle_train"] = {"samples": int(train.size),
                                     "fraction": {k: v / train.size for k, v in sorted(counts.items())}}
    out.update(info.extra)
    if "sample" in info.reasons:
        out["sample_error"] = info.reasons["sample"]
    out["unavailable"] = unavailable
    return out


def _memory_entry(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        entry = {"value": value.get("value"), "unit": value.get("unit", "bytes"),
                 "method": value.get("method", key)}
        if entry["value"] is None:
            entry["reason"] = value.get("reason") or "not reported"
        return entry
    if value is None:
        return {"value": None, "unit": "bytes", "method": key, "reason": "not reported"}
    return {"value": float(value), "unit": "bytes", "method": key}


def summarize(rec: Recording, train_samples: int | None = None,
              extra_memory: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run's telemetry summary (JSON-able), from a recording alone."""
    durations: dict[str, float] = {}
    for phase, a, b in rec.segments():
        durations[phase] = durations.get(phase, 0.0) + (b - a)
    for p in PHASES:
        durations.setdefault(p, 0.0)
    durations["total"] = (rec.edges[-1].t - rec.edges[0].t) if len(rec.edges) >= 2 else 0.0

    background = np.array([r[0] for r in rec.rows if not r[2]], dtype=float)
    background.sort()
    gaps = np.diff(background) * 1e3 if background.size > 1 else np.array([])
    sampling = {
        "requested_hz": rec.rate_hz,
        "achieved_hz": background.size / durations["total"] if durations["total"] > 0 else None,
        "samples": int(background.size),
        "edge_samples": sum(1 for r in rec.rows if r[2]),
        "interval_ms": ({"mean": float(gaps.mean()), "p50": float(np.percentile(gaps, 50)),
                         "p99": float(np.percentile(gaps, 99)), "max": float(gaps.max())}
                        if gaps.size else None),
        "method": "background thread on a time.perf_counter schedule (late ticks skipped, not bunched); "
                  "one extra sample at each phase edge",
    }

    sources = {info.name: _source_summary(rec, info, durations, train_samples) for info in rec.sources}

    # The headline: the run's device. GPU runs count the GPUs' board energy
    # (host beside it); CPU runs count the RAPL package energy.
    gpu_names = [s.name for s in rec.sources if s.kind == "nvml"]
    scope = gpu_names if rec.device == "cuda" else [s.name for s in rec.sources if s.kind == "host"]
    energy: dict[str, Any] = {"scope": ", ".join(scope) if scope else None}
    parts = [sources[n] for n in scope]
    if parts and all(p["energy_j"] is not None for p in parts):
        for phase in ("train", "eval", "init", "total"):
            vals = [p["energy_j"].get(phase) for p in parts]
            energy[f"{phase}_j"] = sum(vals) if all(v is not None for v in vals) else None  # type: ignore[arg-type]
        energy["train_j_per_sample"] = (energy["train_j"] / train_samples
                                        if energy["train_j"] is not None and train_samples else None)
        energy["method"] = "; ".join(f"{n}: {sources[n]['energy_method']}" for n in scope)
        energy["reason"] = None if energy["train_j_per_sample"] is not None else "no training samples"
    else:
        for k in ("train_j", "eval_j", "init_j", "total_j", "train_j_per_sample"):
            energy[k] = None
        energy["method"] = None
        if not parts:
            energy["reason"] = rec.gpu_reason if rec.device == "cuda" else "no host source"
        else:
            energy["reason"] = "; ".join(f"{n}: {sources[n]['unavailable'].get('energy_j')}"
                                         for n in scope if sources[n]["energy_j"] is None)

    peak_memory: dict[str, Any] = {}
    for info in rec.sources:
        for col in ("rss_bytes", "mem_used_bytes"):
            if col in info.columns:
                peak = sources[info.name]["stats"].get(col, {}).get("max")
                label = f"{info.name}.{col}"
                method = (f"max of this process's RSS sampled at {rec.rate_hz:g} Hz" if col == "rss_bytes"
                          else f"max of nvmlDeviceGetMemoryInfo.used samples at {rec.rate_hz:g} Hz "
                               "(device-wide: every process and the CUDA context)")
                peak_memory[label] = ({"value": peak, "unit": "bytes", "method": method} if peak is not None else
                                      {"value": None, "unit": "bytes", "method": method,
                                       "reason": sources[info.name]["unavailable"].get(col)})
    for key, value in (extra_memory or {}).items():
        peak_memory[key] = _memory_entry(key, value)

    gpu = {"available": bool(gpu_names), "devices": gpu_names,
           "statement": None if gpu_names else rec.gpu_reason}
    if rec.unresolved_gpus:
        gpu["unresolved"] = rec.unresolved_gpus
    host = next((s for s in rec.sources if s.kind == "host"), None)
    host_energy = {"available": bool(host and sources[host.name]["energy_j"] is not None),
                   "reason": sources[host.name]["unavailable"].get("energy_j") if host else "no host source"}

    return {
        "version": SUMMARY_VERSION,
        "device": rec.device,
        "sampling": sampling,
        "phases_s": durations,
        "train_samples": train_samples,
        "energy": energy,
        "gpu": gpu,
        "host_energy": host_energy,
        "peak_memory": peak_memory,
        "sources": sources,
        "notes": list(rec.notes),
    }
