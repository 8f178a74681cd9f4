"""Read MLPerf MLLOG logs, strictly: what a training log says, or why it cannot be read.

The format
----------
mlcommons' ``mlperf_logging.mllog`` (and ampcert's own :mod:`ampcert.mllog`)
writes one event per line::

    :::MLLOG {"namespace": "", "time_ms": 1700000000123, "event_type": "POINT_IN_TIME",
              "key": "eval_accuracy", "value": 0.751, "metadata": {"epoch_num": 3, "samples_count": 3840}}

(one line in the file). ``event_type`` is ``INTERVAL_START``,
``INTERVAL_END`` or ``POINT_IN_TIME``; ``time_ms`` is milliseconds since the
epoch; ``value`` is any JSON; ``metadata`` is an object: mllog puts its
caller's ``file`` and ``lineno`` there, and the rules add what each key needs
(``eval_accuracy``: ``epoch_num`` and/or ``samples_count``; ``run_stop``:
``status``, ``"success"`` or ``"aborted"``; ``block_stop``/``epoch_stop``:
``samples_count`` or ``epoch_num``). A training log has one ``run_start``
and one ``run_stop``; the time to train is the time between them.

What is skipped
---------------
A job's output is more than its events, and a launcher adds to each line.
Every line that does not hold the marker ``:::MLLOG `` is noise (framework
output, warnings, progress bars) and is skipped. Where a line holds it, the
text before it is a prefix (``0: ``, ``[1,0]<stdout>:``, a timestamp, the
remains of a progress bar) and is dropped: the event is everything from the
marker onward, as MLPerf's compliance checker strips it (a line with two
markers, two ranks' output run together, is no one event: it is refused). Line numbers
are counted as ``grep -n`` and ``sed -n 12p`` count them: ``\\n`` ends a line.

What is strict, and why
-----------------------
A certification tool must not guess from a broken log: a number read from
half a line, or a run "finished" that never logged its end, would certify
what did not happen. So a line that holds the marker must be a whole event,
and a log must say what a training log says; anything else is a
:class:`LogError`, one line that names the file and the line::

    run.mllog line 12: eval_accuracy value 'abc' is not a number

:func:`parse` (one event per line) refuses: JSON that does not parse (a last
line cut short by a crash says so), an event that is not an object, a missing
``time_ms``, ``key`` or ``event_type``, a ``time_ms`` that is not a finite
number, an unknown ``event_type``, a ``metadata`` that is not an object, and
a ``time_ms`` below the previous event's (the clock went backwards, or two
logs were spliced: either way the durations would be wrong; published MLPerf
logs, whose ranks interleave, are read with ``in_order=False``).

:func:`summarize` (what the events say) refuses: no ``run_start``; no
``run_stop`` (the job never logged its end: a crash, a kill, a truncated
log); a ``run_stop`` before its ``run_start``; a second ``run_start``,
``run_stop`` or ``init_stop`` (two runs in one log); a ``run_stop`` without
a ``status`` of ``success`` or ``aborted``; an ``eval_accuracy`` whose value
is not a real number (a bool is not one) or that lies outside the run; a ``samples_count`` or
``epoch_num`` that is not a number; and a seed, batch size, sample count,
submission field or lowest precision logged twice with different values.
What it does not judge is the log's compliance with a benchmark's rules:
that is MLPerf's checker's work (``ampcert check --mlperf``).

Non-finite values: JSON has no NaN, but Python's ``json`` writes (and reads)
``NaN`` and ``Infinity``, and ampcert's writer spells them ``"nan"``,
``"inf"``, ``"-inf"``; an ``eval_accuracy`` of either kind reads as the float
(a run that diverged evaluated to NaN: that is what happened, and NaN reaches
no target).

Use
---
>>> from ampcert.mllog import reader as mllog_reader
>>> log = mllog_reader.read_training_log("run.mllog")  # doctest: +SKIP
>>> log.status, log.duration_s, log.samples, log.seed  # doctest: +SKIP
('success', 412.7, 3932160, 1234)
>>> hit = log.first_reaching(0.759, higher_is_better=True)  # doctest: +SKIP
>>> hit and (hit.samples_count, log.seconds_at(hit))  # doctest: +SKIP

:func:`read` (or :func:`parse` over lines, :func:`read_text` over a text) gives
the events, :func:`summarize` what they say; :func:`read_training_log` is both,
streamed: a file is read in one pass, in pieces of at most :data:`MAX_LINE`
bytes, and only what the summary reports is kept (its evaluations, the
first :data:`MAX_POINT_KEYS` point keys), so a log of any size is read in
bounded memory (``benchmarks/log_memory.py``: a 200 MB log in ~20 MB).
:func:`scan` is the same pass with the file's sha256 and size, for callers
that keep a log and its digest (the MLPerf import). Files are opened as
untrusted input: regular files only, never through a link
(:mod:`ampcert.regular_files`).

This module reads only; it imports nothing but the standard library,
:mod:`ampcert.errors` and the key names of :mod:`ampcert.mllog`.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ampcert import mllog
from ampcert.errors import UserError
from ampcert.regular_files import HashedLines, open_regular

__all__ = [
    "MARKER", "EVENT_TYPES", "RUN_STATUSES", "LogEvent", "LogError", "Eval", "TrainingLog",
    "parse", "iter_events", "read_text", "read", "summarize", "read_training_log", "scan", "Scanned", "lines_of",
]

#: What starts an event in a line; the text before it is a prefix.
MARKER = mllog.PREFIX
EVENT_TYPES = (mllog.INTERVAL_START, mllog.INTERVAL_END, mllog.POINT_IN_TIME)
RUN_STATUSES = ("success", "aborted")

#: The three parts of MLPerf's lowest-precision disclosure, by key.
LOWEST_PRECISION_KEYS = {mllog.LOWEST_PRECISION_LINEAR: "linear", mllog.LOWEST_PRECISION_ATTN: "attn",
                         mllog.LOWEST_PRECISION_COMM: "comm"}
#: MLPerf's submission fields, by key.
SUBMISSION_KEYS = {mllog.SUBMISSION_BENCHMARK: "benchmark", mllog.SUBMISSION_ORG: "org",
                   mllog.SUBMISSION_PLATFORM: "platform", mllog.SUBMISSION_DIVISION: "division",
                   mllog.SUBMISSION_STATUS: "status"}
# Where mllog notes its caller (not anything about the run): left out of the
# lowest-precision detail, as ampcert's writer leaves them out of its lines.
_CALLER_FIELDS = ("file", "lineno")


class LogError(UserError):
    """A log that cannot be read as it stands: one line, ``SOURCE line N: what``
    (``SOURCE: what`` where no one line is at fault). ``source``, ``line``
    (or None) and ``detail`` are kept for callers that word it their own way."""

    def __init__(self, source: str, line: int | None, detail: str) -> None:
        self.source, self.line, self.detail = source, line, detail
        where = source if line is None else f"{source} line {line}"
        super().__init__(f"{where}: {detail}")

    def __reduce__(self) -> tuple[Any, ...]:  # pickles whole (a worker's error crosses processes)
        return (type(self), (self.source, self.line, self.detail))


@dataclass(frozen=True)
class LogEvent:
    """One ``:::MLLOG`` event. ``line`` is its 1-based line in the file;
    ``metadata`` is ``{}`` where the event has none (do not mutate it)."""

    line: int
    time_ms: float
    event_type: str
    key: str
    value: Any
    metadata: dict[str, Any]
    namespace: str = ""


class Eval(NamedTuple):
    """One ``eval_accuracy`` event: a tuple ``(time_ms, value, samples_count,
    epoch_num, line, metric)``. ``metric`` is the metadata's ``metric`` name
    (ampcert logs one for metrics other than accuracy), else None."""

    time_ms: float
    value: float
    samples_count: int | None
    epoch_num: float | None
    line: int
    metric: str | None = None


@dataclass(frozen=True)
class TrainingLog:
    """What a training log says. Times are the log's ``time_ms``. Fields a log
    does not hold are None (or empty); ``points`` holds the last value of
    every other ``POINT_IN_TIME`` key (the first :data:`MAX_POINT_KEYS` keys),
    ``eval_intervals`` each ``eval_start``/``eval_stop`` pair inside the run.
    The events themselves are not kept: a log of any size is read in bounded
    memory (:func:`parse` gives them, for a log small enough to hold)."""

    source: str
    run_start_ms: float
    run_stop_ms: float
    status: str                         # "success" or "aborted"
    run_start_line: int
    run_stop_line: int
    run_stop_metadata: dict[str, Any]   # status, and e.g. ampcert's "reason" for an aborted run
    init_start_ms: float | None = None  # the first init_start (MLPerf allows several)
    init_stop_ms: float | None = None
    evals: tuple[Eval, ...] = ()
    samples: int | None = None          # the largest samples_count logged within the run
    seed: int | None = None
    global_batch_size: int | None = None
    train_samples: int | None = None
    eval_samples: int | None = None
    lowest_precision: dict[str, str] = field(default_factory=dict)      # "linear"|"attn"|"comm" -> "bfloat16"
    lowest_precision_detail: dict[str, dict[str, Any]] = field(default_factory=dict)  # their metadata
    submission: dict[str, str] = field(default_factory=dict)            # "benchmark"|"org"|... -> value
    points: dict[str, Any] = field(default_factory=dict)
    eval_intervals: tuple[tuple[float, float], ...] = ()  # (eval_start, eval_stop) time_ms, inside the run
    event_count: int = 0

    @property
    def duration_s(self) -> float:
        """run_stop - run_start, in seconds: MLPerf's time to train (for a run
        that succeeded)."""
        return (self.run_stop_ms - self.run_start_ms) / 1000.0

    @property
    def succeeded(self) -> bool:
        return self.status == "success"

    @property
    def metrics(self) -> tuple[str | None, ...]:
        """The metrics the evaluations name in their metadata, in the order they first
        appear (None: an evaluation naming none)."""
        return tuple(dict.fromkeys(ev.metric for ev in self.evals))

    @property
    def metric(self) -> str | None:
        """The metric every evaluation names (or None where none names one, or where they
        name several: see :attr:`metrics` and :meth:`of`)."""
        return self.metrics[0] if len(self.metrics) == 1 else None

    def of(self, metric: str | None) -> tuple[Eval, ...]:
        """The evaluations of one metric (of every one, where the log names a single metric
        or none: a log that names none is read as the suite's)."""
        if len(self.metrics) <= 1:
            return self.evals
        return tuple(ev for ev in self.evals if ev.metric == metric)

    def first_reaching(self, target: float, higher_is_better: bool, metric: str | None = None) -> Eval | None:
        """The first evaluation (in log order) at or past ``target``: value >=
        target where higher is better, <= where lower is; None if none is.
        A non-finite evaluation (NaN, an infinity) reaches nothing: a diverged
        run's Infinity is no accuracy. Where the log names several metrics, ``metric``'s
        evaluations alone (:meth:`of`)."""
        for ev in self.of(metric):
            if not math.isfinite(ev.value):
                continue
            if (ev.value >= target) if higher_is_better else (ev.value <= target):
                return ev
        return None

    def seconds_at(self, ev: Eval) -> float:
        """Seconds from run_start to ``ev``."""
        return (ev.time_ms - self.run_start_ms) / 1000.0


# --------------------------------------------------------------------------- reading lines


def parse(lines: Iterable[str], source: str, *, in_order: bool = True) -> list[LogEvent]:
    """The events in ``lines`` (one line per item, with or without its line
    end), in order. Lines without :data:`MARKER` are skipped; a prefix before
    it is dropped. Raises :class:`LogError` naming ``source`` and the line for
    an event that is not whole, or (``in_order``) whose time goes backwards.

    ``in_order=False`` is for logs published by others: a multi-rank job's log
    holds its ranks' lines as the launcher collected them, and 318 of the 1,679
    logs of MLPerf Training v5.1 go backwards (by 30 ms in the median, by up to
    4.7 minutes where a rank's output was buffered). MLPerf's tools do not ask
    for order, and a run's time (run_start to run_stop) does not depend on it."""
    if isinstance(lines, str):
        raise TypeError("parse() takes lines; pass a whole text to read_text()")
    return list(iter_events(lines, source, in_order=in_order))


def iter_events(lines: Iterable[str], source: str, *, in_order: bool = True,
                on_bad: Callable[[LogError], None] | None = None, power_log: bool = False) -> Iterator[LogEvent]:
    """:func:`parse`, one event at a time: what :func:`summarize` reads a file through,
    so no more than one event is held.

    Strict by default: the first line that is not a whole event (or goes back in time)
    raises. With ``on_bad``, the tolerant mode, that line's :class:`LogError` is handed to
    it and the line skipped: for a checker that reports every bad line (``ampcert check``)
    and for the tail of a log still being written (an own job's progress).

    ``power_log``: an MLPerf power log, read as MLPerf's result summarizer reads one (its
    events need a key and a numeric time; any event_type, SMC's own included; a metadata
    that is not an object, such as SMC v4.0's ``""``, is none; the namespace is not read)."""
    previous: LogEvent | None = None
    for number, raw in enumerate(lines, start=1):
        at = raw.find(MARKER)
        if at < 0:
            continue
        try:
            event = _event(raw, at + len(MARKER), number, source, power_log)
            if in_order and previous is not None and event.time_ms < previous.time_ms:
                raise LogError(source, number, f"time_ms {_ms(event.time_ms)} is before the previous event's "
                               f"{_ms(previous.time_ms)} (line {previous.line}): timestamps go backwards")
        except LogError as exc:
            if on_bad is None:
                raise
            on_bad(exc)
            continue
        yield event
        previous = event


def read_text(text: str, source: str, *, in_order: bool = True) -> list[LogEvent]:
    """:func:`parse` over ``text``, split at ``\\n`` (a ``\\r`` before it is dropped)."""
    return parse(text.split("\n"), source, in_order=in_order)


def read(path: str | Path, *, in_order: bool = True) -> list[LogEvent]:
    """The events of the file at ``path`` (:func:`parse`), its bytes decoded as
    UTF-8 (a bad byte, in noise, reads as U+FFFD). The file must be a regular
    file, reached without a symbolic link (:mod:`ampcert.regular_files`); one
    that cannot be read is a :class:`LogError` ``cannot read PATH: REASON``."""
    with _opened(path) as pieces:
        return parse(file_lines(pieces, str(path)), str(path), in_order=in_order)


def read_bytes(data: bytes, source: str, *, in_order: bool = True) -> list[LogEvent]:
    """:func:`read_text` over a file's bytes already read, decoded as :func:`read` decodes them."""
    return read_text(data.decode("utf-8", errors="replace"), source, in_order=in_order)


def read_training_log(path: str | Path, *, in_order: bool = True, source: str | None = None) -> TrainingLog:
    """:func:`summarize` of :func:`read`, streamed: the training log at ``path``, read in
    memory bounded by what it says (its evaluations), not by its size. ``source``
    names it in errors (default: the path)."""
    return scan(path, in_order=in_order, source=source).log_or_raise()


@dataclass(frozen=True)
class Scanned:
    """One pass over a log file: what it says (or why it cannot be read) and the
    sha256 and size of the bytes read, so a log's digest and its reading come from
    the same bytes. ``error`` is None where ``log`` is not."""

    log: TrainingLog | None
    error: LogError | None
    sha256: str
    size: int

    def log_or_raise(self) -> TrainingLog:
        if self.log is None:
            assert self.error is not None
            raise self.error
        return self.log


def scan(path: str | Path, *, in_order: bool = True, source: str | None = None) -> Scanned:
    """The log at ``path`` read once, in bounded memory (:class:`Scanned`). A file that
    cannot be opened (missing, a link, not a regular file) raises :class:`LogError`."""
    source = str(path) if source is None else source
    with _opened(path, source) as pieces:
        try:
            log, error = summarize(iter_events(file_lines(pieces, source), source, in_order=in_order), source), None
        except LogError as exc:
            log, error = None, exc
        pieces.drain()  # the digest covers the whole file, where reading stopped early
        return Scanned(log=log, error=error, sha256=pieces.sha256, size=pieces.size)


#: The longest MLLOG event line read, in bytes. MLPerf's events are a few hundred
#: bytes; a longer line that holds the marker is refused, a longer line of noise skipped,
#: so that no one line can make the reader hold the file.
MAX_LINE = 1 << 20


@contextlib.contextmanager
def lines_of(path: str | Path, source: str | None = None) -> Iterator[Iterator[str]]:
    """The decoded lines of the file at ``path`` (:func:`file_lines`), opened as :func:`read`
    opens it: a regular file, no link, a :class:`LogError` where it cannot be read."""
    with _opened(path, source) as pieces:
        yield file_lines(pieces, source or str(path))


@contextlib.contextmanager
def _opened(path: str | Path, source: str | None = None) -> Iterator[HashedLines]:
    try:
        fh = open_regular(path)
    except OSError as exc:
        raise LogError(f"cannot read {source or path}", None, exc.strerror or str(exc)) from None
    with fh:
        yield HashedLines(fh, MAX_LINE)


def file_lines(pieces: Iterable[bytes], source: str) -> Iterator[str]:
    """Decoded lines from pieces of at most :data:`MAX_LINE` bytes (:class:`HashedLines`):
    a line longer than that is ``""`` (its number kept) if it holds no :data:`MARKER`,
    and a :class:`LogError` if it does."""
    marker = MARKER.encode()
    number, long_line, tail = 0, False, b""
    for piece in pieces:
        ends = piece.endswith(b"\n")
        if not long_line and ends:
            number += 1
            yield piece.decode("utf-8", errors="replace")
            continue
        if not long_line and len(piece) < MAX_LINE:  # the last line, without a line end
            number += 1
            yield piece.decode("utf-8", errors="replace")
            continue
        if marker in tail + piece:  # a marker may straddle two pieces
            raise LogError(source, number + 1, f"a line of over {MAX_LINE:,} bytes holds an MLLOG event: "
                           "no event is that long (a log written without line ends?)")
        long_line, tail = not ends, b"" if ends else piece[-len(marker):]
        if ends:
            number += 1
            yield ""
    if long_line:
        yield ""


def _event(raw: str, start: int, number: int, source: str, power_log: bool = False) -> LogEvent:
    def fail(detail: str) -> LogError:
        return LogError(source, number, detail)

    text = raw[start:].rstrip()
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        cut = exc.pos >= len(text) or exc.msg.startswith("Unterminated string")
        hint = " (the line is cut short: a truncated log?)" if cut else ""
        raise fail(f"MLLOG event is not valid JSON{hint}: {exc.msg} (column {start + exc.pos + 1})") from None
    except (ValueError, RecursionError) as exc:  # an integer too long, nesting too deep
        raise fail(f"MLLOG event cannot be read: {type(exc).__name__}: {exc}") from None
    if not isinstance(record, dict):
        raise fail(f"MLLOG event is a JSON {type(record).__name__}, not an object")
    if power_log:
        return _power_event(record, number, fail)
    for name in ("time_ms", "key", "event_type"):
        if name not in record:
            raise fail(f"MLLOG event has no {name}")
    key, event_type, time_ms = record["key"], record["event_type"], record["time_ms"]
    if not isinstance(key, str) or not key:
        raise fail(f"MLLOG event key {_show(key)} is not a name")
    if event_type not in EVENT_TYPES:
        raise fail(f"{key}: unknown event_type {_show(event_type)} (expected {', '.join(EVENT_TYPES)})")
    if not _is_number(time_ms) or not math.isfinite(time_ms):
        raise fail(f"{key}: time_ms {_show(time_ms)} is not a finite number")
    metadata = record.get("metadata")
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict):
        raise fail(f"{key}: metadata {_show(metadata)} is not an object")
    namespace = record.get("namespace")
    if namespace is None:
        namespace = ""
    elif not isinstance(namespace, str):
        raise fail(f"{key}: namespace {_show(namespace)} is not a string")
    return LogEvent(line=number, time_ms=float(time_ms), event_type=event_type, key=key,
                    value=record.get("value"), metadata=metadata, namespace=namespace)


def _power_event(record: dict[str, Any], number: int, fail: Callable[[str], LogError]) -> LogEvent:
    """A power log's event, as the summarizer takes it (see :func:`iter_events`)."""
    key, time_ms, metadata = record.get("key"), record.get("time_ms"), record.get("metadata")
    if not isinstance(key, str) or not key or not isinstance(time_ms, int | float) or isinstance(time_ms, bool) \
            or not math.isfinite(time_ms):
        raise fail("an MLLOG event without a key and a numeric time_ms")
    return LogEvent(line=number, time_ms=float(time_ms), event_type=str(record.get("event_type")), key=key,
                    value=record.get("value"), metadata=metadata if isinstance(metadata, dict) else {})


# --------------------------------------------------------------------------- what the events say


def summarize(events: Iterable[LogEvent], source: str) -> TrainingLog:
    """What a training log says (:class:`TrainingLog`), from :func:`parse`'s
    events, in one pass that keeps only what it reports (events may be
    :func:`iter_events`' stream). Raises :class:`LogError` naming the offending
    event's line for a log that does not say it unambiguously (see the
    module's doc): first a log that holds no one whole run (which is found only
    at its end), then the first event that says something wrong, in line order."""
    start: LogEvent | None = None
    stop: LogEvent | None = None
    init_stop: LogEvent | None = None
    init_start_ms: float | None = None
    last: LogEvent | None = None
    count = 0
    # The first event that says something wrong, raised once the run's shape is known
    # (an eval before run_start names run_start's line, which comes later).
    wrong: Callable[[LogEvent, LogEvent], LogError] | None = None
    evals: list[Eval] = []
    samples: int | None = None
    single: dict[str, LogEvent] = {}  # key -> the event that set a once-only field
    points: dict[str, Any] = {}
    marks: list[tuple[str, float]] = []  # eval_start / eval_stop, in order
    for event in events:
        count, last = count + 1, event
        if event.key == mllog.RUN_START:
            if start is not None:
                raise LogError(source, event.line, f"a second run_start (the first is at line {start.line}): "
                               "two runs in one log?")
            start = event
        elif event.key == mllog.RUN_STOP:
            if stop is not None:
                raise LogError(source, event.line, f"a second run_stop (the first is at line {stop.line})")
            if start is None:
                raise LogError(source, event.line, "run_stop before any run_start")
            stop = event
        elif event.key == mllog.INIT_STOP:
            if init_stop is not None:
                raise LogError(source, event.line, f"a second init_stop (the first is at line {init_stop.line})")
            init_stop = event
        elif event.key == mllog.INIT_START and init_start_ms is None:
            init_start_ms = event.time_ms
        if wrong is not None:
            continue  # the log is refused; only a wrong shape, found above, comes before it
        try:
            samples = _take(event, start, stop, source, evals, single, points, marks, samples)
        except _Wrong as exc:
            wrong = exc.error
    if start is None:
        if last is None:
            raise LogError(source, None, f"no {MARKER.strip()} events: not an MLLOG log, or an empty one")
        raise LogError(source, None, "no run_start: this log holds no training run")
    if stop is None:
        assert last is not None
        raise LogError(source, None, "no run_stop: the job never logged its end (truncated log?); "
                       f"the last event is {last.key} at line {last.line}")
    if stop.time_ms < start.time_ms:
        raise LogError(source, stop.line, f"run_stop at time_ms {_ms(stop.time_ms)} is before run_start's "
                       f"{_ms(start.time_ms)} (line {start.line})")
    status = stop.metadata.get("status")
    if status is None:
        raise LogError(source, stop.line, f"run_stop has no status in its metadata (expected {' or '.join(RUN_STATUSES)})")
    if status not in RUN_STATUSES:
        raise LogError(source, stop.line, f"run_stop status {_show(status)} is not {' or '.join(RUN_STATUSES)}")
    if wrong is not None:
        raise wrong(start, stop)

    def whole(key: str, least: int | None) -> int | None:
        event = single.get(key)
        return None if event is None else _whole(event.value, key, event, source, least)

    lowest: dict[str, str] = {}
    detail: dict[str, dict[str, Any]] = {}
    for key, part in LOWEST_PRECISION_KEYS.items():
        if key in single:
            lowest[part] = _text(single[key], source)
            detail[part] = {k: v for k, v in single[key].metadata.items() if k not in _CALLER_FIELDS}
    submission = {name: _text(single[key], source) for key, name in SUBMISSION_KEYS.items() if key in single}
    return TrainingLog(
        source=source, run_start_ms=start.time_ms, run_stop_ms=stop.time_ms, status=status,
        run_start_line=start.line, run_stop_line=stop.line, run_stop_metadata=stop.metadata,
        init_start_ms=init_start_ms, init_stop_ms=None if init_stop is None else init_stop.time_ms,
        evals=tuple(evals), samples=samples, seed=whole(mllog.SEED, None),
        global_batch_size=whole(mllog.GLOBAL_BATCH_SIZE, 1), train_samples=whole(mllog.TRAIN_SAMPLES, 0),
        eval_samples=whole(mllog.EVAL_SAMPLES, 0), lowest_precision=lowest, lowest_precision_detail=detail,
        submission=submission, points=points, eval_intervals=_intervals(marks, start.time_ms, stop.time_ms),
        event_count=count,
    )


class _Wrong(Exception):
    """An event that says something wrong: ``error(run_start, run_stop)`` makes its LogError
    once the run's events are known."""

    def __init__(self, error: Callable[[LogEvent, LogEvent], LogError]):
        self.error = error


def _take(event: LogEvent, start: LogEvent | None, stop: LogEvent | None, source: str, evals: list[Eval],
          single: dict[str, LogEvent], points: dict[str, Any], marks: list[tuple[str, float]],
          samples: int | None) -> int | None:
    """Note what one event says (the largest samples_count inside the run is returned);
    :class:`_Wrong` for an event that says something wrong."""
    # Inside the run: from run_start to run_stop, both included.
    within = start is not None and (stop is None or stop is event)
    try:
        if within and event.metadata.get("samples_count") is not None:
            count = _whole(event.metadata["samples_count"], f"{event.key} samples_count", event, source)
            samples = count if samples is None else max(samples, count)
        if event.key == mllog.EVAL_ACCURACY:
            if not within:
                before = start is None

                def outside(run_start: LogEvent, run_stop: LogEvent) -> LogError:
                    where = "before run_start" if before else "after run_stop"
                    return LogError(source, event.line, f"eval_accuracy {where} (line "
                                    f"{(run_start if before else run_stop).line}): an evaluation outside the run")
                raise _Wrong(outside)
            # Several metrics may be evaluated together (stable_diffusion logs CLIP and FID at each
            # evaluation, and MLPerf scores it): each eval names its own (``metrics``, ``of``).
            evals.append(_eval(event, source))
        elif event.key in _SINGLE_FIELDS:
            seen = single.get(event.key)
            if seen is not None and seen.value != event.value:
                raise LogError(source, event.line, f"{event.key} {_show(event.value)} differs from "
                               f"{_show(seen.value)} logged at line {seen.line}")
            single.setdefault(event.key, event)
        elif event.key in (mllog.EVAL_START, mllog.EVAL_STOP):
            marks.append((event.key, event.time_ms))
        elif event.event_type == mllog.POINT_IN_TIME and (event.key in points or len(points) < MAX_POINT_KEYS):
            points[event.key] = event.value
    except LogError as exc:
        error = exc
        raise _Wrong(lambda _start, _stop: error) from None
    return samples


def _intervals(marks: list[tuple[str, float]], start_ms: float, stop_ms: float) -> tuple[tuple[float, float], ...]:
    """(start, stop) in ms of each eval_start/eval_stop pair inside the run."""
    out, opened = [], None
    for key, time_ms in marks:
        if not start_ms <= time_ms <= stop_ms:
            continue
        if key == mllog.EVAL_START:
            opened = time_ms
        elif opened is not None:
            out.append((opened, time_ms))
            opened = None
    return tuple(out)


# Keys a TrainingLog gives a field of their own: logged once (or again with the same value).
_SINGLE_FIELDS = frozenset({mllog.SEED, mllog.GLOBAL_BATCH_SIZE, mllog.TRAIN_SAMPLES, mllog.EVAL_SAMPLES,
                            *LOWEST_PRECISION_KEYS, *SUBMISSION_KEYS})
#: The POINT_IN_TIME keys :attr:`TrainingLog.points` keeps (the first ones seen): a log is
#: read in bounded memory, however many keys it invents.
MAX_POINT_KEYS = 1000
# ampcert's writer spells non-finite floats out (JSON has none); Python's json reads NaN, Infinity.
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _eval(event: LogEvent, source: str) -> Eval:
    value = event.value
    if isinstance(value, str) and value in _NON_FINITE:
        value = _NON_FINITE[value]
    if not _is_number(value):
        raise LogError(source, event.line, f"eval_accuracy value {_show(event.value)} is not a number")
    meta = event.metadata
    samples = _whole(meta["samples_count"], "eval_accuracy samples_count", event, source) \
        if meta.get("samples_count") is not None else None
    epoch = meta.get("epoch_num")
    if epoch is not None and (not _is_number(epoch) or not math.isfinite(epoch)):
        raise LogError(source, event.line, f"eval_accuracy epoch_num {_show(epoch)} is not a number")
    metric = meta.get("metric")
    if metric is not None and not isinstance(metric, str):
        raise LogError(source, event.line, f"eval_accuracy metric {_show(metric)} is not a name")
    return Eval(time_ms=event.time_ms, value=float(value), samples_count=samples,
                epoch_num=None if epoch is None else float(epoch), line=event.line, metric=metric)


def _whole(value: Any, what: str, event: LogEvent, source: str, least: int | None = 0) -> int:
    """``value`` as an int: a JSON integer, or a float with nothing after the
    point (1024.0); at least ``least`` where that is given."""
    if _is_number(value) and math.isfinite(value) and float(value).is_integer():
        number = int(value)
        if least is None or number >= least:
            return number
        raise LogError(source, event.line, f"{what} {_show(value)} is below {least}")
    raise LogError(source, event.line, f"{what} {_show(value)} is not a whole number")


def _text(event: LogEvent, source: str) -> str:
    if not isinstance(event.value, str):
        raise LogError(source, event.line, f"{event.key} {_show(event.value)} is not a string")
    return event.value


def _is_number(value: Any) -> bool:
    # bool is an int to Python, not a number to a log: `true` is no accuracy.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _ms(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
