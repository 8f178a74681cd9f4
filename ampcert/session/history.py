"""The nightly history: nights recorded in a store, and the gate of a new night against their series.

``gate_history`` judges NEW against the history store's series of earlier
nights (change points; accuracy by paired TOST); the gate against one
baseline is :mod:`.compare`'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ampcert.errors import BadArgument, UserError
from ampcert.runner.signals import interruptible
from ampcert.session.compare import write_files

if TYPE_CHECKING:
    from ampcert.history.gate import HistoryGate
    from ampcert.history.store import NightRow


def history_add(folders: Sequence[str | Path], *, store: str | None = None,
                machine: str | None = None) -> list[tuple[Path, bool]]:
    """Record each results folder as a night in the history store (default:
    ``$AMPCERT_HISTORY`` or ``./ampcert-history.sqlite``); (folder, added) per
    folder, added False where it was there already. Every folder is read and
    checked before the first is written."""
    from ampcert.history.records import read_night
    from ampcert.history.store import open_store

    with interruptible():
        nights = [read_night(folder, machine) for folder in folders]
        opened = open_store(store)
        return [(Path(folder), opened.add(night)) for folder, night in zip(folders, nights, strict=True)]


def history_show(*, store: str | None = None, suite: str | None = None) -> list[NightRow]:
    """The nights in the store (oldest first), of one suite if given."""
    from ampcert.history.store import open_store

    with interruptible():
        return open_store(store, create=False).nights(suite=suite)


def gate_history(new: str | Path, *, store: str | None = None, machine: str | None = None,
                 window: int | None = None, min_effect: float | None = None) -> HistoryGate:
    """The history gate: NEW's metrics against their series in the store (change
    points; accuracy by paired TOST). ``.status`` is PASS or FAIL (exit 0 / 1)."""
    from ampcert.gate.settings import load_gate
    from ampcert.history import changepoints
    from ampcert.history.gate import gate_night
    from ampcert.history.records import read_night
    from ampcert.history.store import open_store

    with interruptible():
        night = read_night(new, machine)
        final = load_gate().metrics["final_metric"]
        margins = {"*": final.threshold, **final.per_workload}
        return gate_night(open_store(store, create=False), night, window=window or changepoints.DEFAULT_WINDOW,
                          min_effect=changepoints.DEFAULT_MIN_EFFECT if min_effect is None else min_effect,
                          accuracy_margins=margins)


def write_history_gate_outputs(result: HistoryGate, json_path: str | Path | None,
                               markdown: str | Path | None, html: str | Path | None = None) -> list[Path]:
    """The history gate's JSON, Markdown and HTML files (atomically); the paths written."""
    from ampcert.history.gate import to_html, to_markdown

    return write_files([(json_path, json.dumps(result.to_json(), indent=1) + "\n"),
                        (markdown, to_markdown(result) if markdown is not None else ""),
                        (html, to_html(result) if html is not None else "")])


def history_plot(out: str | Path, *, store: str | None = None, suite: str | None = None,
                 machine: str | None = None, metric: str = "samples_per_s") -> Path:
    """One metric's series of every subject of a suite on a machine, with their change
    points, as an SVG file. Suite and machine may be left out where the store holds one."""
    from ampcert.history.records import METRICS

    if metric not in METRICS:
        raise BadArgument("metric", f"expected one of {', '.join(METRICS)}", metric)
    with interruptible():
        return _plot(out, store, suite, machine, metric)


def _plot(out: str | Path, store: str | None, suite: str | None, machine: str | None, metric: str) -> Path:
    from ampcert.history.changepoints import change_points
    from ampcert.history.store import open_store
    from ampcert.report.plots import history_series
    from ampcert.results import atomic_write_text

    opened = open_store(store, create=False)
    nights = opened.nights(suite=suite, machine=machine)
    for what, values in (("suite", {n.suite for n in nights}), ("machine", {n.machine for n in nights})):
        if len(values) > 1:
            raise BadArgument(what, f"the store holds several: give one of {', '.join(sorted(values))}")
    if not nights:
        raise UserError(f"{opened.url}: no nights{' of suite ' + repr(suite) if suite else ''} to plot")
    suite_name, machine_name = nights[0].suite, nights[0].machine
    dates = [n.created_at for n in nights]
    series, cps = {}, {}
    for subject, m in opened.subjects(suite_name, machine_name):
        if m != metric:
            continue
        points = opened.series(suite_name, machine_name, subject, metric)
        name = "/".join(subject)
        series[name] = [p.value for p in points]
        cps[name] = change_points(series[name])
    svg = history_series(f"{suite_name}: {metric}", dates, series, cps, metric, f"history-{metric}")
    if svg is None:
        raise UserError(f"{opened.url}: suite {suite_name!r} has no {metric} values to plot")
    atomic_write_text(out, svg)
    return Path(out)
