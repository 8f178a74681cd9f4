"""``ampcert history add``, ``show`` and ``plot``: the nightly history store (the gate
against it, ``ampcert gate``, is in :mod:`ampcert.cli`). Parse, call one session
function, print (see :mod:`ampcert.cli`)."""

from __future__ import annotations

from pathlib import Path

import typer

from ampcert import session
from ampcert.cli import views
from ampcert.cli.options import JSON_HELP, Typer, json_out_option, output_of

history_app = Typer(no_args_is_help=True, help="The nightly history store: add results folders, list them.")
STORE_HELP = "the history store: a file, sqlite:///PATH or postgresql://... (default $AMPCERT_HISTORY, " \
             "else ./ampcert-history.sqlite)"


@history_app.command("add")
def history_add(
    ctx: typer.Context,
    dirs: list[Path] = typer.Argument(..., help="results folders (`ampcert run --out DIR`), one night each"),
    store: str | None = typer.Option(None, "--store", help=STORE_HELP),
    machine: str | None = typer.Option(None, "--machine", help="the series' machine name (default: host, CPU, "
                                       "GPUs from the folder's fingerprint; name CI runners here)"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    json_out: Path | None = json_out_option(),
) -> None:
    """Record results folders in the history store (a folder already there is skipped)."""
    output = output_of(ctx, as_json, json_out)
    done = session.history_add(dirs, store=store, machine=machine)
    output.data([{"folder": str(folder), "added": added} for folder, added in done],
                lambda console: views.print_history_added(console, done))


@history_app.command("show")
def history_show(
    ctx: typer.Context,
    store: str | None = typer.Option(None, "--store", help=STORE_HELP),
    suite: str | None = typer.Option(None, "--suite", help="only this suite's nights"),
    as_json: bool = typer.Option(False, "--json", help="print the nights as JSON"),
    json_out: Path | None = json_out_option(),
) -> None:
    """List the nights in the history store, oldest first."""
    output = output_of(ctx, as_json, json_out)
    nights = session.history_show(store=store, suite=suite)
    output.data([vars(n) for n in nights], lambda console: views.print_nights(console, nights))


@history_app.command("plot")
def history_plot(
    ctx: typer.Context,
    out: Path = typer.Argument(..., help="the SVG file to write"),
    store: str | None = typer.Option(None, "--store", help=STORE_HELP),
    suite: str | None = typer.Option(None, "--suite", help="the suite (needed where the store holds several)"),
    machine: str | None = typer.Option(None, "--machine", help="the machine (needed where it holds several)"),
    metric: str = typer.Option("samples_per_s", "--metric", help="samples_per_s, time_to_target_s, final_metric, "
                               "peak_memory_bytes, energy_j_per_sample, scaler_skips or failed_runs"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    json_out: Path | None = json_out_option(),
) -> None:
    """Plot one metric's nightly series (every subject of the suite) with their change points, as SVG."""
    output = output_of(ctx, as_json, json_out)
    written = session.history_plot(out, store=store, suite=suite, machine=machine, metric=metric)
    output.data({"svg": str(written), "metric": metric},
                lambda console: console.print(f"wrote {written}", markup=False, soft_wrap=True))
