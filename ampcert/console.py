"""Output that reads right anywhere: a terminal, a CI log, a pipe, a program.

Every ``ampcert`` command prints its tables through :func:`print_table`:

- **on a terminal**: a borderless rich table, bold headers, coloured statuses,
  as wide as the terminal.
- **anywhere else** (a pipe, a file, a CI log): plain aligned text, no box
  characters and no colour, as wide as ``COLUMNS`` (or the terminal the pipe
  ends in, else 80).
- **with --json**: the command's data as JSON on stdout (:func:`print_json`),
  every message on stderr, so ``ampcert report DIR --json | jq`` works;
  ``--json-out FILE`` writes the same JSON to FILE.

Terminal and plain tables are laid out alike (:func:`fit_layout`). Columns
start at their natural width; a table too wide leaves out its ``spare``
columns, then the widest columns give way first and their cells wrap onto more
lines (at spaces, else after a ``/``, ``_``, ``-`` or ``.``; never cut, never
"…"). A header is never broken, nor a ``whole`` column (an id: what grep looks
for). Only when even that cannot fit is every row printed as a block of
``key: value`` lines instead, so a log keeps a table wherever one can be read.
A command with a plain layout of its own (the certificate's text, the audit's
tables) prints that in a log instead of a wrapped table, and where nothing fits.

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
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, TextIO

from rich.console import Console

__all__ = ["Col", "Output", "fit_layout", "fit_widths", "json_text", "make_console", "plain_lines", "print_json",
           "print_pairs", "print_table", "vertical_lines", "wrap_cell"]

#: Spaces between two columns, in both layouts.
GAP = 2
#: A column is not wrapped narrower than this (unless its header is): below it, rows become blocks.
MIN_FOLD = 6
#: A row wrapped onto more lines than this reads badly: the spare columns go first, if that helps.
FEW_LINES = 3


@dataclass(frozen=True)
class Col:
    """A column: its (short) header and how its cells line up.

    ``spare``: the column repeats what another cell of the row already says
    (e.g. the workload inside a run id), or what the lines after the table
    say: it is left out, before anything is wrapped or laid out as blocks,
    when the table does not fit.

    ``whole``: the cells are never wrapped (a run id, a subject: what a reader
    greps the log for); the other columns give way, or the rows become blocks."""

    header: str
    justify: Literal["left", "right"] = "left"  # right: numbers
    spare: bool = False
    whole: bool = False


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


# Where a long word may break besides spaces: after a path's or a name's separator
# ("digits/torch/", "samples_", "entry-", "blocks.", a range's "5,000–"), never inside
# a number ("-30.0%", "0.055", "1.5e-05", "2026-10-01").
_SOFT_BREAK = re.compile(r"(?<=[/_])|(?<=[^\W\d]{2}-)(?=\w)|(?<=\w–)(?=\w)|(?<=[^\W\d]\.)(?=\w)|(?<=\.)(?=[^\W\d])")


def wrap_cell(text: str, width: int) -> list[str]:
    """``text`` as lines of at most ``width`` characters: broken at spaces (dropped
    there) or soft breaks, a word longer than a line folded; every other character
    kept, in order. A line break in ``text`` stays one."""
    out: list[str] = []
    for paragraph in text.split("\n"):
        if len(paragraph) <= width:
            out.append(paragraph)
            continue
        line = ""
        for i, token in enumerate(re.findall(r"\s+|\S+", paragraph)):
            if token.isspace():
                if i == 0:
                    line = token  # an indent stays (a rule under its subject)
                elif line.strip():
                    line += token  # dropped again if the next piece starts a new line
                continue
            for piece in _SOFT_BREAK.split(token):
                if len(line) + len(piece) > width and line.strip():
                    out.append(line.rstrip())
                    line = ""
                line += piece
                while len(line) > width:  # a word longer than a line: folded
                    out.append(line[:width])
                    line = line[width:]
        out.append(line.rstrip())
    return out


def _longest_word(text: str) -> int:
    """The longest piece of ``text`` that :func:`wrap_cell` keeps on one line unless it folds it."""
    return max((len(piece) for word in text.split() for piece in _SOFT_BREAK.split(word)), default=0)


def fit_widths(columns: Sequence[Col], rows: Sequence[Sequence[Cell]], width: int,
               min_fold: int | None = MIN_FOLD) -> list[int] | None:
    """Column widths that fit ``width`` (gaps included), the widest columns
    giving way first; None when the headers and ``whole`` columns, with the
    others no narrower than ``min_fold`` (None: than their longest word, so
    that no word is folded), cannot fit."""
    natural = natural_widths(columns, rows)

    def narrowest(i: int) -> int:
        if columns[i].whole:
            return natural[i]
        words = max((_longest_word(_text(r[i])) for r in rows), default=0) if min_fold is None else min_fold
        return max(len(columns[i].header), min(natural[i], words))

    floor = [narrowest(i) for i in range(len(columns))]
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
    tightened: set[int] = set()
    for _ in columns:  # settles in a round or two; bounded all the same
        # A capped column wraps at spaces and separators, so its lines may need less than the
        # cap ("underflow/torch/" of a cap of 18): it takes only that, and what it leaves...
        for i in range(len(columns)):
            if widths[i] < natural[i]:
                used = max(floor[i], *(len(line) for row in rows for line in wrap_cell(_text(row[i]), widths[i])))
                if used < widths[i]:
                    widths[i] = used
                    tightened.add(i)
        # ...and what the cap left over go to the capped columns, widest first; a tightened
        # column only where it can then be whole (a little more would wrap it no better).
        spare = room - sum(widths)
        before = list(widths)
        for i in sorted(range(len(widths)), key=lambda i: -natural[i]):
            need = natural[i] - widths[i]
            if spare <= 0 or need <= 0 or (i in tightened and need > spare):
                continue
            give = min(spare, need)
            widths[i] += give
            spare -= give
        if widths == before:
            break
    return widths


Layout = tuple[list[Col], list[list[Cell]], list[int]]


def fit_layout(columns: Sequence[Col], rows: Sequence[Sequence[Cell]], width: int,
               wrap: bool = True) -> Layout | None:
    """The columns, rows and column widths to print within ``width``: the table
    at its natural widths, else (``wrap``) its cells wrapped between words, else
    its words folded too (:func:`fit_widths`). At each step, all its columns where
    no row then takes more than :data:`FEW_LINES` lines; else, with or without its
    spare columns, whichever takes fewer lines. None when nothing fits: the caller
    prints blocks."""
    cols, cells = list(columns), [list(r) for r in rows]
    tables = [(cols, cells)]
    if any(c.spare for c in cols):
        keep = [i for i, c in enumerate(cols) if not c.spare]
        tables.append(([cols[i] for i in keep], [[r[i] for i in keep] for r in cells]))
    fits = [natural_widths] + ([partial(fit_widths, width=width, min_fold=None), partial(fit_widths, width=width)]
                               if wrap else [])
    for fit in fits:
        fitting = [(c, r, widths) for c, r in tables
                   if (widths := fit(c, r)) is not None and sum(widths) + GAP * (len(widths) - 1) <= width]
        if fitting:
            readable = [layout for layout in fitting if max(_row_heights(layout), default=0) <= FEW_LINES]
            return readable[0] if readable else min(fitting, key=lambda layout: sum(_row_heights(layout)))
    return None


def _row_heights(layout: Layout) -> list[int]:
    """The lines each row of ``layout`` takes."""
    _, rows, widths = layout
    return [max((len(wrap_cell(_text(c), w)) for c, w in zip(row, widths, strict=True)), default=1) for row in rows]


def plain_lines(columns: Sequence[Col], rows: Sequence[Sequence[Cell]],
                widths: Sequence[int] | None = None) -> list[str]:
    """An aligned plain-text table (header, dashes, rows) at ``widths`` (default:
    the natural ones); a cell wider than its column wraps onto the row's next lines."""
    widths = list(widths) if widths is not None else natural_widths(columns, rows)

    def lines(cells: Sequence[str]) -> list[str]:
        wrapped = [wrap_cell(c, w) for c, w in zip(cells, widths, strict=True)]
        out = []
        for n in range(max((len(w) for w in wrapped), default=1)):
            parts = [(w[n] if n < len(w) else "") for w in wrapped]
            out.append((" " * GAP).join(p.rjust(w) if col.justify == "right" else p.ljust(w)
                                        for p, w, col in zip(parts, widths, columns, strict=True)).rstrip())
        return out

    out = lines([c.header for c in columns]) + lines(["-" * w for w in widths])
    for row in rows:
        out += lines([_text(c) for c in row])
    return out


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

    ``footnotes``: lines after the table, wrapped to its width. ``hide_blank``:
    leave out columns whose every cell is empty. ``fallback``:
    the command's own layout of whole lines (e.g. the certificate's text), never
    truncated: printed instead of ``key: value`` blocks where the table cannot
    fit, and in a log instead of wrapping the table's cells (grep finds a whole
    finding on its line)."""
    cols = [c if isinstance(c, Col) else Col(c) for c in columns]
    rows = [list(r) for r in rows]
    for r in rows:
        if len(r) != len(cols):
            raise ValueError(f"row has {len(r)} cells, table has {len(cols)} columns")
    if hide_blank and rows:
        keep = [i for i in range(len(cols)) if any(_text(r[i]).strip() for r in rows)]
        cols, rows = [cols[i] for i in keep], [[r[i] for i in keep] for r in rows]
    # The footnotes explain the table, so they keep to its width (a hanging indent after the first line).
    notes = [("  " if n else "") + line for text in footnotes for n, line in enumerate(wrap_cell(text, con.width - 2))]
    layout = fit_layout(cols, rows, con.width, wrap=con.is_terminal or fallback is None)
    if layout is not None and con.is_terminal:
        _print_rich(con, *layout, title)
        _print_lines(con, notes)
        return
    if layout is not None:
        lines = plain_lines(*layout)
    else:
        lines = list(fallback) if fallback is not None else vertical_lines(cols, rows)
    _print_lines(con, ([title] if title else []) + lines + notes)


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
        # Wrapped here as in the plain layout (at the same places), so rich has nothing left to fold.
        table.add_row(*[Text("\n".join(wrap_cell(_text(c), w)), style=c[1] if isinstance(c, tuple) else "")
                        for c, w in zip(row, widths, strict=True)])
    con.print(table, soft_wrap=False, crop=False)
