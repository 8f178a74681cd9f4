"""The telemetry sampler: a background thread, phase tags; the summary is :mod:`.summary`'s.

Usage (a backend, around one run)::

    tel = Telemetry.start(device="cuda", rate_hz=10.0, gpus=[uuid_or_ordinal],
                          framework_memory=torch_cuda_memory)   # phase "init"
    tel.phase("train"); ...; tel.phase("eval"); ...; tel.phase("train"); ...
    summary = tel.stop(train_samples=n)      # JSON-able dict (RunResult.telemetry)
    tel.write_series(path)                   # CSV, one row per sample

How it measures:

- A daemon thread samples every source at ``rate_hz`` on a fixed
  ``time.perf_counter`` schedule; when it falls behind it skips ticks rather
  than bursting. ``phase()`` (called by the backend on the training thread,
  after it has synchronised the device) records an *edge*: the time, the
  energy counters of every source, and one extra sample, so every phase
  starts and ends with a reading.
- Energy per phase comes from counter deltas between edges (NVML's total
  energy counter, RAPL's package counters). Only where a source has no
  readable counter is its sampled power integrated (trapezoidal rule, with
  power interpolated linearly at the phase edges and held flat beyond the
  first/last sample). Each source states the method it used.
- Joules per training sample use the train phase only: evaluation and
  initialisation are reported beside it, not folded in.
- A value that cannot be read is ``None`` with a reason, never zero.

A source (``host.HostSource``, ``nvml.NvmlGpu``, or your own) has ``name``,
``kind``, ``columns`` (the series it fills), ``power_column`` (or None),
``power_is_interval_mean`` (True when its power is a mean since the last
sample, which is not integrated point by point), ``reasons`` (metric ->
why unreadable), and ``sample(t) -> tuple`` (one value or None per column),
``energy_j(t) -> float | None`` (a cumulative counter), ``describe()``,
``energy_unavailable_reason()``, ``extra_summary()`` and ``close()``.
``Telemetry(device, rate_hz, sources).begin()`` samples any such list.
"""

from __future__ import annotations

import csv
import io
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampcert.atomic import atomic_write_text
from ampcert.telemetry.host import POWERCAP_ROOT, HostSource, peak_rss_bytes
from ampcert.telemetry.nvml import NvmlSession
from ampcert.telemetry.nvml import probe as nvml_probe
from ampcert.telemetry.summary import Edge, Recording, SourceInfo, summarize

DEFAULT_RATE_HZ = 10.0
MAX_RATE_HZ = 1000.0

FrameworkMemory = Callable[[], Mapping[str, Any]] | Mapping[str, Any] | None


# --------------------------------------------------------------------------- the live sampler


class Telemetry:
    """Samples the host (and the GPUs in use) while a run trains. See the
    module docstring; create it with :meth:`start`."""

    def __init__(self, device: str, rate_hz: float, sources: list[Any], *,
                 gpu_reason: str | None = None, notes: Sequence[str] = (),
                 unresolved_gpus: Sequence[dict[str, Any]] = (), nvml_session: Any = None,
                 framework_memory: FrameworkMemory = None):
        if not (0 < rate_hz <= MAX_RATE_HZ) or not math.isfinite(rate_hz):
            raise ValueError(f"rate_hz must be in (0, {MAX_RATE_HZ:g}], got {rate_hz!r}")
        self.device = device
        self.rate_hz = float(rate_hz)
        self.sources = sources
        self._framework_memory = framework_memory
        self._nvml_session = nvml_session
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._phase: str | None = None
        self._summary: dict[str, Any] | None = None
        self._closed = False
        self.recording = Recording(device, self.rate_hz, [], [], [], list(notes), gpu_reason,
                                   list(unresolved_gpus))

    # -- lifecycle -------------------------------------------------------------

    @classmethod
    def start(cls, device: str = "cpu", rate_hz: float = DEFAULT_RATE_HZ, *,
              gpus: Sequence[int | str] | None = None, framework_memory: FrameworkMemory = None,
              phase: str = "init", nvml: Any = None,
              powercap_root: str | Path = POWERCAP_ROOT,
              env: Mapping[str, str] | None = None, host: HostSource | None = None) -> Telemetry:
        """Open the sources and start sampling in ``phase``.

        ``device``: "cpu" or "cuda". ``gpus``: the GPUs the run uses, as CUDA
        ordinals (int, read through CUDA_VISIBLE_DEVICES) or UUIDs (str, as the
        framework reports them); default ``[0]``. ``framework_memory``: a
        callable returning (or a mapping of) ``{name: bytes | {value, unit,
        method[, reason]}}``, read at :meth:`stop`, e.g.
        :func:`ampcert.telemetry.torch_cuda_memory`. ``nvml``, ``powercap_root``
        and ``env`` replace the real pynvml module, /sys/class/powercap and
        os.environ (for tests). ``host``: the host source, where it is not this
        process (a job's process tree: ``HostSource(tree=TreeStats(pid))``)."""
        sources: list[Any] = [host or HostSource(powercap_root=powercap_root)]
        notes: list[str] = []
        session = None
        unresolved: list[dict[str, Any]] = []
        if device == "cuda":
            session = NvmlSession.open(list(gpus) if gpus is not None else [0], nvml, env)
            sources.extend(session.gpus)
            unresolved = session.unresolved
            gpu_reason = None if session.gpus else f"GPU telemetry unavailable: {session.reason}"
            if session.gpus and session.unresolved:
                notes.append("some requested GPUs could not be found in NVML: "
                             + "; ".join(u["reason"] for u in session.unresolved))
        else:
            gpu_reason = (f"GPU telemetry unavailable: the run uses the CPU (device={device}), "
                          f"so no GPU is sampled ({nvml_probe(nvml)})")
        tel = cls(device, rate_hz, sources, gpu_reason=gpu_reason, notes=notes, unresolved_gpus=unresolved,
                  nvml_session=session, framework_memory=framework_memory)
        return tel.begin(phase)

    def begin(self, phase: str = "init") -> Telemetry:
        """Start sampling this instance's sources in ``phase`` (:meth:`start`
        calls it; call it yourself on an instance built with your own sources)."""
        if self._thread is not None:
            raise RuntimeError("telemetry already started")
        self._t0 = time.perf_counter()
        self._edge(phase)
        self._thread = threading.Thread(target=self._run, name="ampcert-telemetry", daemon=True)
        self._thread.start()
        return self

    def phase(self, name: str) -> None:
        """Start phase ``name`` now (e.g. "train", "eval"). Call it after the
        device has finished the previous phase's work (a synchronise), so
        the edge falls where the work changes. Repeating the current phase
        is a no-op."""
        if self._closed:
            raise RuntimeError("telemetry already stopped")
        if name != self._phase:
            self._edge(name)

    @property
    def current_phase(self) -> str | None:
        return self._phase

    def stop(self, train_samples: int | None = None, *,
             framework_memory: FrameworkMemory = None) -> dict[str, Any]:
        """Stop sampling and return the summary (computed once; later calls
        return the same dict). ``train_samples``: samples trained in the
        train phase, for joules per sample."""
        if self._summary is not None:
            return self._summary
        self.close()
        tree = getattr(self.sources[0], "tree", None) if self.sources else None
        extra: dict[str, Any] = {"host.ru_maxrss": {
            "value": float(peak_rss_bytes()), "unit": "bytes",
            "method": "getrusage ru_maxrss: the process's lifetime peak RSS (includes the framework)"}}
        if tree is not None:  # a job's tree: ampcert's own peak would say nothing about it
            extra = {"host.tree_peak_rss": {
                "value": float(tree.peak_rss), "unit": "bytes",
                "method": "the largest sampled sum of RSS over the job's process tree"}}
        for fm in (self._framework_memory, framework_memory):
            if fm is None:
                continue
            try:
                extra.update(fm() if callable(fm) else fm)
            except Exception as exc:  # noqa: BLE001 - a framework's stats must not fail the run
                self.recording.notes.append(f"framework memory unreadable: {type(exc).__name__}: {exc}")
        self._summary = summarize(self.recording, train_samples, extra)
        return self._summary

    def close(self) -> None:
        """Stop the thread and release NVML without computing a summary
        (idempotent; use on a failure path)."""
        if self._closed:
            return
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._edge(None)
        self._closed = True
        self.recording.sources = [SourceInfo.of(s) for s in self.sources]
        for src in self.sources:
            src.close()
        if self._nvml_session is not None:
            self._nvml_session.close()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- sampling --------------------------------------------------------------

    def _edge(self, phase: str | None) -> None:
        with self._lock:
            t = time.perf_counter() - self._t0
            energy: dict[str, float | None] = {}
            for src in self.sources:
                try:
                    energy[src.name] = src.energy_j(t)
                except Exception as exc:  # noqa: BLE001 - a source's bug must not stop the run
                    energy[src.name] = None
                    src.reasons.setdefault("energy", f"{type(exc).__name__}: {exc}")
            self.recording.edges.append(Edge(t, phase, energy))
            # The edge sample belongs to the phase that starts (the last one, at stop).
            self._sample_locked(t, True, phase if phase is not None else self._phase)
            self._phase = phase

    def _sample_locked(self, t: float, edge: bool, phase: str | None) -> None:
        values: dict[str, tuple[Any, ...]] = {}
        for src in self.sources:
            try:
                values[src.name] = tuple(src.sample(t))
            except Exception as exc:  # noqa: BLE001
                values[src.name] = (None,) * len(src.columns)
                src.reasons.setdefault("sample", f"{type(exc).__name__}: {exc}")
        self.recording.rows.append((t, phase or "", edge, values))

    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        next_t = time.perf_counter() + period
        while True:
            delay = next_t - time.perf_counter()
            if self._halt.wait(delay if delay > 0 else 0):
                return
            with self._lock:
                if self._halt.is_set():
                    return
                self._sample_locked(time.perf_counter() - self._t0, False, self._phase)
            now = time.perf_counter()
            next_t += period
            if next_t <= now:  # fell behind (a stall): skip the missed ticks
                next_t = now + period

    # -- output ------------------------------------------------------------------

    def series_columns(self) -> list[str]:
        cols = ["t_s", "phase", "edge"]
        for src in self.sources:
            cols.extend(f"{src.name}.{c}" for c in src.columns)
        return cols

    def series(self) -> Series:
        """The samples so far as a :class:`Series`: plain data, detached from
        this sampler (what a backend hands over once the run has stopped)."""
        names = [s.name for s in self.sources]
        widths = {s.name: len(s.columns) for s in self.sources}
        with self._lock:
            rows = list(self.recording.rows)
        lines: list[tuple[str, ...]] = []
        for t, phase, edge, values in sorted(rows, key=lambda r: r[0]):
            line: list[str] = [f"{t:.4f}", phase, str(int(edge))]
            for n in names:
                line.extend(_cell(v) for v in values.get(n, (None,) * widths[n]))
            lines.append(tuple(line))
        return Series(tuple(self.series_columns()), tuple(lines))

    def series_csv(self) -> str:
        """The series as CSV text (see :meth:`Series.csv`)."""
        return self.series().csv()

    def write_series(self, path: str | Path) -> Path:
        """Write :meth:`series_csv` to ``path`` atomically (see :meth:`Series.write`)."""
        return self.series().write(path)


@dataclass(frozen=True)
class Series:
    """A run's telemetry samples, one row per sample, as the cells of
    ``telemetry.csv``: ``t_s`` (seconds since start), ``phase``, ``edge`` (1
    for the samples taken at phase edges), then one column per source and
    metric (``host.package_w``, ``gpu0.power_w``, ...); empty cells are values
    that could not be read."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.columns)
        w.writerows(self.rows)
        return buf.getvalue()

    def write(self, path: str | Path) -> Path:
        """Write :meth:`csv` to ``path`` atomically (temp file + rename);
        ``pandas.read_csv(path)`` reads it back. A write that fails (a full
        disk) removes its temp file and raises :class:`~ampcert.errors.WriteFailed`
        naming ``path`` and the errno."""
        path = Path(path)
        atomic_write_text(path, self.csv())
        return path


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.6g}"
    return str(v)
