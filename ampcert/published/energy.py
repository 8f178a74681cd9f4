"""Energy to train of one benchmark of one published system: MLPerf's figure, and what it leaves out.

Beside ``result_N.txt``, a benchmark folder with power results holds ``power/result_N/``:
``node_K.txt`` per node and ``sw_K.txt`` per network switch, MLLOG logs. A node log has a
measurement window (``power_measurement_start`` .. ``_stop``), a ``conversion_eff`` (with the
``measurement_type``, AC or DC, in its metadata; some submitters log neither) and
``power_reading`` events in watts, meant at 1 Hz (Lenovo's v5.0 logs miss one second in 20;
SMC's v4.0 ones read every ~2 s). A switch log holds an ``interconnect_power_est`` (a
constant draw, watts), or ``power_reading`` events as a node log does, or both.

MLPerf's figure (``mlperf_logging.result_summarizer``, 4.1.68), in joules:

1. a node: each reading in the window times the time since the one before it (the first:
   since the start), summed (W x ms), over the window (stop - start): the window's mean
   power; times the run's time to train (``run_stop - run_start`` of ``result_N.txt``, ms)
   and ``conversion_eff``, over 1000. Without a stop the window ends at the last reading;
2. a switch: ``conversion_eff`` x its first ``interconnect_power_est`` x the time to train /
   1000; its ``power_reading`` events are not read (a measured switch without an estimate adds 0);
3. a run: its nodes, then its switches, summed (a run whose time does not count has none);
4. the benchmark: the olympic mean of the runs' energies, the runs left out being the fastest
   and slowest by *time*, not by energy (a dropped run stands in for a slowest one), times
   the ``scaling.json`` factor: the time-to-train score's rule (:mod:`.scores`).

Mean power x time to train, not the readings between run_start and run_stop: the meter's
clock (a BMC's) is not the training host's, and the mean needs no agreement. ``conversion_eff``
is applied whatever the measurement type: Lenovo's v5.0 logs say AC with 0.94, so their figure
is 94% of the energy the meter saw.

ampcert's figures, and how they differ:

- ``nodes_joules``: MLPerf's node arithmetic, operation for operation; where a run has no
  switch logs it is MLPerf's figure to the last digit (tests/published/test_energy.py runs
  the summarizer beside it). Node logs are summed in their numbers' order, the summarizer's
  in directory order: with several nodes the two may differ in the last bits.
- ``nodes_and_switches_joules``: the nodes and every switch, measured (its readings, as a
  node's) where its log has readings, else its estimate. MLPerf reads only the estimates.
- a power log with no figure refuses its run, with one reason and no number: a window of
  zero duration (the summarizer stops on a ZeroDivisionError), no reading in the window (it
  counts 0 J), no node log (it stops on an assertion), a reading that is not a number, a
  marked line that is not a whole event (it skips the line). A counted run without a figure
  leaves the benchmark without one; a switch log with neither readings nor an estimate leaves
  only ``nodes_and_switches_joules`` unknown (MLPerf counts it 0 J).

A folder without ``power/`` gives a :class:`BenchmarkEnergy` with ``power_logs`` False, no
runs and ``no_figure`` saying so. 1 kWh is 3.6 MJ.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from statistics import median
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ampcert.errors import UserError
from ampcert.mllog.reader import LogError, LogEvent, TrainingLog, iter_events
from ampcert.published import scores


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunEnergy(_Model):
    file: str
    minutes: float | None = Field(description="time to train as MLPerf times it; None: the run does not count")
    nodes: int = 0
    switches_measured: int = Field(default=0, description="switch logs with power_reading events")
    switches_estimated: int = Field(default=0, description="switch logs with only interconnect_power_est")
    nodes_joules: float | None = None
    nodes_and_switches_joules: float | None = None
    mlperf_joules: float | None = Field(default=None, description="the result summarizer's figure")
    difference_pct: float | None = Field(
        default=None, description="(nodes_and_switches - mlperf) / mlperf x 100: what MLPerf's figure leaves out")
    conversion_eff: list[float] = Field(default_factory=list, description="each node log's, as MLPerf applies it")
    measurement_type: str | None = Field(default=None, description="AC or DC as the node logs state it; None: unstated")
    sampling_interval_s: float | None = Field(default=None, description="median time between readings")
    sampling_rate_hz: float | None = None
    longest_gap_s: float | None = None
    refused: str | None = Field(default=None, description="why this run has no energy figure")
    switches_unknown: str | None = Field(default=None, description="why nodes_and_switches_joules is unknown")
    sources: list[str] = Field(default_factory=list,
                               description="the power logs its figures come from (power/<run>/<log>.txt)")
    outside_run: list[str] = Field(
        default_factory=list, description="power logs whose events all lie outside the run's run_start..run_stop "
        "(counted as MLPerf counts them, which does not look at the times)")


class BenchmarkEnergy(_Model):
    benchmark: str
    power_logs: bool
    runs: list[RunEnergy]
    scaling_factor: float
    nodes_joules: float | None = None
    nodes_and_switches_joules: float | None = None
    mlperf_joules: float | None = Field(default=None, description="MLPerf's: olympic mean by time x scaling factor")
    difference_pct: float | None = None
    no_figure: str = ""
    switches_unknown: str = ""
    measurement_types: list[str] = Field(default_factory=list)
    sampling_interval_s: float | None = Field(default=None, description="median of the runs' median intervals")


    def per_run(self) -> tuple[float | None, str | None]:
        """The energy of one training run (J) as ampcert states it, and what it counts: nodes and
        switches where switch logs exist and every one is known, else the nodes; (None, None)
        where there is no figure."""
        if self.nodes_and_switches_joules is not None and any(self.switch_logs()):
            return self.nodes_and_switches_joules, "nodes and switches"
        if self.nodes_joules is not None:
            return self.nodes_joules, "nodes"
        return None, None

    def switch_logs(self) -> tuple[int, int]:
        """The switch logs of the counted runs: (measured with power_reading, estimated only), the
        most any run has (a submission logs the same switches for every run)."""
        counted = [run for run in self.runs if run.minutes is not None and run.refused is None]
        return (max((run.switches_measured for run in counted), default=0),
                max((run.switches_estimated for run in counted), default=0))

    def against_mlperf(self) -> str:
        """Why ampcert's nodes-and-switches figure differs from MLPerf's, or that it does not."""
        return against_mlperf(*self.switch_logs(), self.switches_unknown)


def against_mlperf(measured: int, estimated: int, unknown: str | None) -> str:
    """One sentence: what MLPerf's energy figure counts of the switches, beside what ampcert counts."""
    if unknown:
        return f"switches not counted ({unknown})"
    if measured:
        return (f"MLPerf counts a switch only by its interconnect_power_est, so it leaves out the "
                f"{measured} switch log(s) measured with power_reading, which ampcert counts as it counts a node"
                + (f"; {estimated} estimated switch(es) counted as MLPerf counts them" if estimated else ""))
    if estimated:
        return f"{estimated} switch(es) counted by their interconnect_power_est, as MLPerf counts them"
    return "no switch logs were published: the nodes alone, as in MLPerf's figure"


class _Refused(Exception):
    """A power log with no figure: the one reason the run records."""


def energy_benchmark(folder: str | Path, benchmark: str | None = None,
                     timed: scores.Timed | None = None,
                     power_logs: Mapping[str, bytes] | None = None) -> BenchmarkEnergy:
    """The energy to train of the benchmark folder ``folder`` (its name is the benchmark unless given),
    from its result files' ``timed`` runs (:func:`.scores.timed_runs`, read here unless given: the
    runs the time-to-train score counts, and no others, have an energy figure); ``power_logs``: the
    power logs' bytes by their path in ``folder`` (``power/result_0/node_0.txt``), where the
    caller has read them already (the figures then come from the bytes it digested)."""
    folder = Path(folder)
    benchmark = benchmark or folder.name
    files = scores.result_files(folder)
    if not files:
        raise UserError(f"{folder}: no result_*.txt logs: not an MLPerf benchmark folder")
    factor = scores.scaling_factor(folder)
    if not (folder / "power").is_dir():
        return BenchmarkEnergy(benchmark=benchmark, power_logs=False, runs=[], scaling_factor=factor,
                               no_figure="no power/ folder: these results were submitted without power logs")
    timed = scores.timed_runs(files) if timed is None else timed
    runs = [run_energy(folder, path, one, power_logs) for path, one in zip(files, timed, strict=True)]
    counted = [run for run in runs if run.minutes is not None]
    dropped = len(runs) - len(counted)
    result = BenchmarkEnergy(
        benchmark=benchmark, power_logs=True, runs=runs, scaling_factor=factor,
        measurement_types=sorted({run.measurement_type for run in runs if run.measurement_type}),
        sampling_interval_s=median(intervals) if (intervals := [r.sampling_interval_s for r in runs
                                                                 if r.sampling_interval_s]) else None)
    minutes = [run.minutes for run in counted if run.minutes is not None]
    result.no_figure = scores.olympic_score(minutes, dropped, benchmark)[1] or next(
        (f"{run.file} has no energy figure ({run.refused})" for run in counted if run.refused), "")
    if result.no_figure:
        return result
    result.nodes_joules = olympic_by_time(minutes, [r.nodes_joules for r in counted], dropped, benchmark, factor)
    result.mlperf_joules = olympic_by_time(minutes, [r.mlperf_joules for r in counted], dropped, benchmark, factor)
    result.switches_unknown = next((f"{r.file}: {r.switches_unknown}" for r in counted if r.switches_unknown), "")
    if not result.switches_unknown:
        result.nodes_and_switches_joules = olympic_by_time(
            minutes, [r.nodes_and_switches_joules for r in counted], dropped, benchmark, factor)
        result.difference_pct = _pct(result.nodes_and_switches_joules, result.mlperf_joules)
    return result


def olympic_by_time(minutes: list[float], energies: list[float | None], dropped: int, benchmark: str,
                    factor: float = 1.0) -> float | None:
    """MLPerf's benchmark energy (``_index_olympic_average``): ``energies`` ordered by their runs'
    ``minutes``, the fastest and slowest left out as for time, the rest's mean x ``factor``."""
    max_dropped = scores.MAX_DROPPED.get(benchmark, 1)
    values = [value for value in energies if value is not None]
    if len(values) != len(minutes) or dropped > max_dropped:
        return None
    index = [i[0] for i in sorted(enumerate(minutes), key=lambda x: x[1])]
    countable = [values[i] for i in index][max_dropped:len(values) - (max_dropped - dropped)]
    if not countable:
        return None
    return sum(countable) * 1.0 / len(countable) * factor


def run_energy(folder: Path, result: Path, known: tuple[scores.RunTime, TrainingLog | None] | None = None,
               power_logs: Mapping[str, bytes] | None = None) -> RunEnergy:
    """One run's energy figures (``folder/power/<result's name>/``), or the one reason it has none;
    ``known``: the result's :func:`.scores.run_time` where the caller has it; ``power_logs``: as
    :func:`energy_benchmark` takes them."""
    timed, log = scores.run_time(result) if known is None else known
    run = RunEnergy(file=result.name, minutes=timed.minutes, refused=f"no time to train: {timed.dropped}")
    if timed.minutes is None or log is None:
        return run
    run.refused = None
    time_to_train = float(log.run_stop_ms) - float(log.run_start_ms)  # ms, as the summarizer takes it
    power = folder / "power" / result.name.split(".")[0]
    nodes, switches = _numbered(power, "node"), _numbered(power, "sw")
    run.nodes = len(nodes)
    try:
        if not nodes:
            raise _Refused(f"no power/{power.name}/node_*.txt")
        node_logs = {path: _events(path, folder, power_logs) for path in nodes}
        read_nodes = [_node(node_logs[path], time_to_train, _name(path, folder)) for path in nodes]
        logs = {path: _events(path, folder, power_logs) for path in switches}
        run.sources = [_name(path, folder) for path in (*nodes, *switches)]
        run.outside_run = [note for path, events in (*node_logs.items(), *logs.items())
                           if (note := _outside(events, log, _name(path, folder))) is not None]
        estimates = [_switch_estimate(logs[path], time_to_train, _name(path, folder)) for path in switches]
    except _Refused as exc:
        run.refused = str(exc)
        return run
    total: float = 0  # the summarizer's running sum: the nodes, then the switches
    gaps: list[float] = []
    types: set[str] = set()
    for joules, eff, kind, node_gaps in read_nodes:
        total += joules
        run.conversion_eff.append(eff)
        types.update([kind] if kind else [])
        gaps.extend(node_gaps)
    run.nodes_joules = measured = total
    for (path, events), estimate in zip(logs.items(), estimates, strict=True):
        total += estimate if estimate is not None else 0
        if any(event.key == "power_reading" for event in events):
            try:
                measured += _node(events, time_to_train, _name(path, folder))[0]
                run.switches_measured += 1
            except _Refused as exc:
                run.switches_unknown = run.switches_unknown or str(exc)
        elif estimate is not None:
            measured += estimate
            run.switches_estimated += 1
        else:
            run.switches_unknown = run.switches_unknown or \
                f"{_name(path, folder)}: neither power_reading nor interconnect_power_est"
    run.mlperf_joules = total
    run.nodes_and_switches_joules = None if run.switches_unknown else measured
    run.difference_pct = _pct(run.nodes_and_switches_joules, total)
    run.measurement_type = ", ".join(sorted(types)) or None
    if gaps:
        run.sampling_interval_s, run.longest_gap_s = median(gaps) / 1000, max(gaps) / 1000
        run.sampling_rate_hz = 1 / run.sampling_interval_s if run.sampling_interval_s else None
    return run


def _outside(events: list[LogEvent], log: TrainingLog, name: str) -> str | None:
    """Where every timed event of a power log lies outside the run (a log from another run or
    a clock hours off), that, in one phrase; None where the two overlap."""
    times = [event.time_ms for event in events if math.isfinite(event.time_ms)]
    if not times:
        return None
    first, last = min(times), max(times)
    start, stop = float(log.run_start_ms), float(log.run_stop_ms)
    if last >= start and first <= stop:
        return None
    hours = (start - last) / 3.6e6 if last < start else (first - stop) / 3.6e6
    return (f"{name}: its events end {hours:.2g} h before run_start" if last < start
            else f"{name}: its events start {hours:.2g} h after run_stop")


def _node(events: list[LogEvent], time_to_train: float, name: str) -> tuple[float, float, str | None, list[float]]:
    """MLPerf's ``_compute_power_node`` (joules), with the conversion_eff, the measurement type
    and the gaps (ms) between readings; :class:`_Refused` where it gives no figure."""
    prev_timestamp = last_timestamp = power_start = power_stop = 0.0
    agg_power: float = 0
    conversion_eff: float = 1.0
    kind: str | None = None
    start_found = stop_found = False
    times: list[float] = []
    for event in sorted(events, key=lambda event: event.time_ms):  # the summarizer's (stable) sort
        if event.key == "power_measurement_start":
            power_start = prev_timestamp = event.time_ms
            start_found = True
        if event.key == "power_reading" and not stop_found and start_found:
            agg_power += _number(event, name) * (event.time_ms - prev_timestamp)
            prev_timestamp = event.time_ms
            last_timestamp = max(last_timestamp, event.time_ms)
            times.append(event.time_ms)
        if event.key == "power_measurement_stop":
            power_stop = event.time_ms
            stop_found = True
        if event.key == "conversion_eff":
            conversion_eff = _number(event, name)
            stated = event.metadata.get("measurement_type")
            kind = stated if isinstance(stated, str) else None
    if not start_found:
        raise _Refused(f"{name}: no power_measurement_start")
    # A window that ends where it starts is refused first, whatever readings follow it: MLPerf
    # divides by its length, so it stops there even where no reading falls inside (0 / 0).
    if not (stop_found and power_stop <= power_start) and not times:
        raise _Refused(f"{name}: no power_reading inside its measurement window (MLPerf would count 0 J)")
    if not stop_found:
        power_stop = last_timestamp
    if power_stop <= power_start:
        raise _Refused(f"{name}: the power measurement lasts {power_stop - power_start:g} ms (stop at "
                       f"{power_stop:.0f}, start at {power_start:.0f}): no mean power; MLPerf's summarizer "
                       "stops on a ZeroDivisionError here")
    joules = conversion_eff * agg_power * time_to_train / (power_stop - power_start) / 1000
    return joules, conversion_eff, kind, [b - a for a, b in zip(times, times[1:], strict=False)]


def _switch_estimate(events: list[LogEvent], time_to_train: float, name: str) -> float | None:
    """MLPerf's ``_compute_power_sw`` (joules, in the log's order); None without an estimate."""
    agg_power: float = 0
    conversion_eff: float = 1.0
    found = False
    for event in events:
        if event.key == "conversion_eff":
            conversion_eff = _number(event, name)
        if event.key == "interconnect_power_est":
            agg_power, found = _number(event, name), True
            break
    return conversion_eff * agg_power * time_to_train / 1000 if found else None


def _events(path: Path, folder: Path, power_logs: Mapping[str, bytes] | None = None) -> list[LogEvent]:
    """A power log's events, in the file's order, read by the one MLLOG reader as the
    summarizer reads them (``power_log``), not as a training log is read: a ``metadata`` that
    is not an object is none (SMC's v4.0 logs write ``""``). A marked line that is not a whole
    event with a key and a numeric time is refused (the summarizer skips it)."""
    name = _name(path, folder)
    try:
        data = power_logs[name] if power_logs is not None and name in power_logs else path.read_bytes()
        text = data.decode("utf-8", errors="replace")
    except OSError as exc:
        raise _Refused(f"{name}: cannot read it: {exc.strerror or exc}") from None
    try:
        return list(iter_events(text.split("\n"), name, in_order=False, power_log=True))
    except LogError as exc:
        raise _Refused(str(exc)) from None


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _number(event: LogEvent, name: str) -> Any:
    value = event.value
    if not _is_number(value):
        raise _Refused(f"{name} line {event.line}: {event.key} {value!r} is not a number")
    return value


def _numbered(power: Path, stem: str) -> list[Path]:
    """``stem_*.txt`` in ``power``, in their numbers' order."""
    return sorted(power.glob(f"{stem}_*.txt"),
                  key=lambda path: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name)])


def _name(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()


def _pct(ours: float | None, mlperf: float | None) -> float | None:
    return None if ours is None or not mlperf else (ours - mlperf) / mlperf * 100
