"""Output that reads right anywhere: a terminal, a CI log, a pipe, a program.

Every ``ampcert`` command prints its tables through :func:`print_table`:

- **on a terminal**: a borderless rich table, bold headers, coloured statuses,
  as wide as the terminal. Columns start at their natural width; when the
  table is too wide, the widest columns give way first and their cells fold
  onto more lines (never cut, never "…"). A header is never broken. When even
  the headers cannot fit, every row is printed as a block of ``key: value``
  lines instead.
- **anywhere else** (a pipe, a file, a CI log): plain aligned text, no box
  characters and no colour; when it is wider than the width (``COLUMNS``, or
  the terminal the pipe ends in, else 80), the same ``key: value`` blocks.
  Nothing is ever truncated.
- **with --json**: the command's data as JSON on stdout (:func:`print_json`),
  every message on stderr, so ``ampcert report DIR --json | jq`` works;
  ``--json-out FILE`` writes the same JSON to FILE.

One :class:`Output` per invocation holds the two consoles and the JSON
options; the CLI hands it to the views, the progress display and the error
lines.

``NO_COLOR`` (any non-empty value, https://no-color.org) wins over
``FORCE_COLOR``: no ANSI escape is written, and a forced terminal is not
pretended where there is none.

This module imports rich's table machinery only when a terminal table is
drawn, so commands stay quick to start.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console

__all__ = ["Col", "Output", "fit_widths", "json_text", "make_console", "plain_lines", "print_json", "print_pairs",
           "print_table", "vertical_lines"]

#: Spaces between two columns, in both layouts.
GAP = 2
#: On a terminal, a column is not folded narrower than this (unless its header is): below it, rows become blocks.
MIN_FOLD = 6


@dataclass(frozen=True)
class Col:
    """A column: its (short) header and how its cells line up.

    ``spare``: the column repeats what another cell of the row already says
    (e.g. the workload inside a run id): it is left out, before anything is
    folded or laid out as blocks, when the table does not fit."""

    header: str
    justify: str = "left"  # "left" or "right" (numbers)
    spare: bool = False


#: A cell: its text, or (text, rich style) for a coloured cell on a terminal.
Cell = str | tuple[str, str]


def no_color() -> bool:
    return os.environ.get("NO_COLOR", "") != ""


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def make_console(stderr: bool = False) -> Console:
    """The console for stdout (or stderr), set up for where it writes now.

    Not a terminal: messages are not wrapped (a CI log or a file keeps whole
    lines). ``NO_COLOR``: no styles at all, and ``FORCE_COLOR`` does not turn
    a pipe into a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    kwargs: dict[str, Any] = {}
    if no_color():
        kwargs["color_system"] = None
        kwargs["force_terminal"] = _isatty(stream)
    con = Console(stderr=stderr, **kwargs)
    if not con.is_terminal:
        con.soft_wrap = True
    return con


def json_text(data: Any) -> str:
    """``data`` as the JSON text ``--json`` prints (pydantic models as their JSON), newline-terminated."""
    if hasattr(data, "model_dump"):
        data = data.model_dump(mode="json")
    return json.dumps(data, indent=1, default=str, ensure_ascii=False) + "\n"


def print_json(data: Any, stream: TextIO | None = None) -> None:
    """``data`` as JSON on stdout: nothing else, never coloured (pydantic models as their JSON)."""
    out = stream if stream is not None else sys.stdout
    out.write(json_text(data))
    out.flush()


@dataclass
class Output:
    """Where one invocation of a command prints; made once per invocation
    (:meth:`make`), for the streams and environment (NO_COLOR, COLUMNS) of that
    invocation, and handed to the views, the progress display and the error lines.

    ``stdout``, ``stderr``: the two consoles. ``as_json`` (``--json``): the
    command's data goes to stdout as JSON and every message to stderr.
    ``json_out`` (``--json-out FILE``): the same JSON is written to FILE.
    ``command``: the command line's command (``history show``), for error lines
    that name its options."""

    stdout: Console
    stderr: Console
    as_json: bool = False
    json_out: Path | None = None
    command: str = ""

    @classmethod
    def make(cls) -> Output:
        return cls(make_console(), make_console(stderr=True))

    @property
    def console(self) -> Console:
        """Tables and messages: stdout, or stderr where stdout carries the JSON (--json)."""
        return self.stderr if self.as_json else self.stdout

    def data(self, data: Any, table: Callable[[Console], object] | None = None, *, write: bool = True) -> None:
        """The command's data: as JSON on stdout with --json, else ``table(console)``
        (None: nothing). With --json-out FILE (and ``write``; False where the session
        writes FILE itself), the same JSON is written to FILE and ``wrote FILE`` said."""
        if self.as_json:
            print_json(data)
        elif table is not None:
            table(self.console)
        if write and self.json_out is not None:
            from ampcert.atomic import atomic_write_text  # WriteFailed: one line, exit 2

            atomic_write_text(self.json_out, json_text(data))
            self.line(f"wrote {self.json_out}")

    def line(self, text: str) -> None:
        """One plain message line (stderr with --json): no markup, never cut."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def warning(self, text: str) -> None:
        self.stderr.print(f"ampcert: warning: {text}", markup=False, highlight=False, soft_wrap=True)

    def error(self, text: str) -> None:
        """``ampcert: error: <text>`` on stderr (the caller exits)."""
        self.stderr.print(f"ampcert: error: {text}", markup=False, highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------- layout (pure)


def _text(cell: Cell) -> str:
    return cell[0] if isinstance(cell, tuple) else cell


def _width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def natural_widths(columns: Sequence[Col], rows: Sequence[Sequence[Cell]]) -> list[int]:
    return [max([len(c.header)] + [_width(_text(r[i])) for r in rows]) for i, c in enumerate(columns)]


def fit_widths(columns: Sequence[Col], rows: Sequence[Sequence[Cell]], width: int,
               min_fold: int = MIN_FOLD) -> list[int] | None:
    """Column widths that fit ``width`` (gaps included), the widest columns
    giving way first; None when the headers alone (or columns no narrower
    than ``min_fold``) cannot fit."""
    natural = natural_widths(columns, rows)
    floor = [max(len(c.header), min(n, min_fold)) for c, n in zip(columns, natural, strict=True)]
    room = width - GAP * (len(columns) - 1)
    if sum(natural) <= room:
        return natural
    if sum(floor) > room:
        return None
    # The largest cap C with sum(max(floor, min(natural, C))) <= room.
    lo, hi = 0, max(natural)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(max(f, min(n, mid)) for f, n in zip(floor, natural, strict=True)) <= room:
            lo = mid
        else:
            hi = mid - 1
    widths = [max(f, min(n, lo)) for f, n in zip(floor, natural, strict=True)]
    # Hand what is left over to the capped columns, widest first.
    spare = room - sum(widths)
    for i in sorted(range(len(widths)), key=lambda i: -natural[i]):
        if spare <= 0:
            break
        give = min(spare, natural[i] - widths[i])
        widths[i] += give
        spare -= give
    return widths


def plain_lines(columns: Sequence[Col], rows: Sequence[Sequence[Cell]], width: int | None = None) -> list[str] | None:
    """An aligned plain-text table (header, dashes, rows); None if wider than ``width``."""
    widths = natural_widths(columns, rows)
    if width is not None and sum(widths) + GAP * (len(widths) - 1) > width:
        return None
    if any("\n" in _text(cell) for row in rows for cell in row):
        return None  # a cell of several lines does not align: the caller falls back to blocks

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if col.justify == "right" else c.ljust(w)
               for c, w, col in zip(cells, widths, columns, strict=True)]
        return (" " * GAP).join(out).rstrip()

    return [line([c.header for c in columns]), line(["-" * w for w in widths])] + [
        line([_text(c) for c in row]) for row in rows]


def vertical_lines(columns: Sequence[Col], rows: Sequence[Sequence[Cell]]) -> list[str]:
    """Every row as a block of ``key: value`` lines, blocks separated by a blank line."""
    key_width = max((len(c.header) for c in columns), default=0) + 1
    out: list[str] = []
    for n, row in enumerate(rows):
        if n:
            out.append("")
        for col, cell in zip(columns, row, strict=True):
            if not _text(cell).strip():
                continue  # an empty cell says nothing: no "key:" line for it
            value = _text(cell).replace("\n", "\n" + " " * (key_width + 1))
            out.append(f"{col.header + ':':<{key_width}} {value}".rstrip())
    return out


# --------------------------------------------------------------------------- printing


def print_table(con: Console, columns: Sequence[Col | str], rows: Sequence[Sequence[Cell]], *,
                title: str | None = None, footnotes: Sequence[str] = (), hide_blank: bool = False,
                fallback: Sequence[str] | None = None) -> None:
    """Print a table the way ``con`` can show it (see the module's docstring).

    ``hide_blank``: leave out columns whose every cell is empty. ``fallback``:
    plain lines to print instead of ``key: value`` blocks when the table
    cannot fit (a layout of the command's own, never truncated)."""
    cols = [c if isinstance(c, Col) else Col(c) for c in columns]
    rows = [list(r) for r in rows]
    for r in rows:
        if len(r) != len(cols):
            raise ValueError(f"row has {len(r)} cells, table has {len(cols)} columns")
    if hide_blank and rows:
        keep = [i for i in range(len(cols)) if any(_text(r[i]).strip() for r in rows)]
        cols, rows = [cols[i] for i in keep], [[r[i] for i in keep] for r in rows]
    width = con.width
    # The whole table first; then without its spare columns.
    layouts = [(cols, rows)]
    if any(c.spare for c in cols):
        keep = [i for i, c in enumerate(cols) if not c.spare]
        layouts.append(([cols[i] for i in keep], [[r[i] for i in keep] for r in rows]))
    lines: list[str] | None = None
    if con.is_terminal:
        for min_fold in (None, MIN_FOLD):  # natural widths, then folding the widest columns
            for c, r in layouts:
                widths = natural_widths(c, r) if min_fold is None else fit_widths(c, r, width, min_fold)
                if widths is not None and sum(widths) + GAP * (len(widths) - 1) <= width:
                    _print_rich(con, c, r, widths, title)
                    _print_lines(con, list(footnotes))
                    return
    else:
        for c, r in layouts:
            lines = plain_lines(c, r, width)
            if lines is not None:
                break
    if lines is None:
        lines = list(fallback) if fallback is not None else vertical_lines(cols, rows)
    _print_lines(con, ([title] if title else []) + lines + list(footnotes))


def print_pairs(con: Console, pairs: Sequence[tuple[str, str]]) -> None:
    """``key  value`` lines, keys aligned; values never cut (a terminal wraps them)."""
    width = max((len(k) for k, _ in pairs), default=0)
    _print_lines(con, [f"{k:<{width}}  {v}".rstrip() for k, v in pairs])


def _print_lines(con: Console, lines: list[str]) -> None:
    for line in lines:
        con.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)


def _print_rich(con: Console, cols: list[Col], rows: list[list[Cell]], widths: list[int], title: str | None) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True,
                  title=Text(title) if title else None, title_justify="left", header_style="bold")
    for col, w in zip(cols, widths, strict=True):
        table.add_column(Text(col.header), width=w, justify=col.justify, overflow="fold", no_wrap=False)
    for row in rows:
        table.add_row(*[Text(c[0], style=c[1]) if isinstance(c, tuple) else Text(c) for c in row])
    con.print(table, soft_wrap=False, crop=False)
