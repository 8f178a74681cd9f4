"""``ampcert export mlperf`` and ``ampcert import mlperf``: MLPerf Training's submission layout,
written from a results folder and read from published results; ``ampcert compare-systems``:
imported and measured systems side by side. Parse, call one session function, print (see
:mod:`ampcert.cli`)."""

from __future__ import annotations

from pathlib import Path

import typer

from ampcert import session
from ampcert.cli import views
from ampcert.cli.options import JSON_HELP, json_out_option, output_of

export_app = typer.Typer(no_args_is_help=True, help="Write a results folder in another tool's layout.")
import_app = typer.Typer(no_args_is_help=True, help="Read results published in another tool's layout.")


@export_app.command("mlperf")
def export_mlperf(
    ctx: typer.Context,
    folder: Path = typer.Argument(..., help="results folder"),
    out: Path = typer.Argument(..., help="where to write the submission layout (created; may hold other exports)"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    json_out: Path | None = json_out_option(),
) -> None:
    """Lay a results folder out as an MLPerf training submission (<org>/results/<system>/<benchmark>/result_N.txt,
    <org>/systems/<system>.json) and check it with MLPerf's own tools (common rules, system description checker,
    result summarizer).

    Exit 0 when MLPerf's checkers pass everything written, 1 when they reject a file (it is still written), 2 on bad
    input."""
    output = output_of(ctx, as_json, json_out)
    done = session.export_mlperf(folder, out)
    output.data(done.to_json(), lambda console: views.print_exported(console, done))
    if not done.ok:
        raise typer.Exit(1)


@import_app.command("mlperf")
def import_mlperf(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(..., help="a round's results (training_results_v5.1), a submitter's folder, "
                                                 "or <submitter>/results/<system>/<benchmark>"),
    out: Path = typer.Option(..., "--out", help="where to write one folder per system and benchmark (created)"),
    round_: str | None = typer.Option(None, "--round", help="the MLPerf Training round, e.g. 5.1 (default: from "
                                      "the training_results_vX.Y folder the paths are in)"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    json_out: Path | None = json_out_option(),
) -> None:
    """Import published MLPerf Training results: per system and benchmark, the original logs and their
    digests, the system description as the fingerprint, MLPerf's score reproduced (with the spread, a
    bootstrap interval and accelerator-hours) and energy to train where power logs exist. Plan from them with
    `ampcert plan OUT --training-runs N`.

    Each folder is re-verified with MLPerf's own tools for the round's ruleset (compliance, system description,
    RCP, summarizer, package checker), on copies, and ampcert recomputes the RCP scaling factor against
    scaling.json (its own finding, beside MLPerf's RCP verdict). Exit 0 when imported, scored and none of
    them failed (a round they have no ruleset for is "not run", with the reason), 1 when one rejects a folder or
    a folder gets no score (it is still imported, with the verdicts and the reason), 2 on bad input (nothing
    written)."""
    output = output_of(ctx, as_json, json_out)
    done = session.import_mlperf(paths, out, round=round_)
    output.data(done.to_json(), lambda console: views.print_imported(console, done))
    if not done.ok:
        raise typer.Exit(1)


def compare_systems(
    ctx: typer.Context,
    folders: list[Path] = typer.Argument(..., help="imported MLPerf results (`ampcert import mlperf`'s --out or one "
                                                   "of its folders) and ampcert results folders"),
    out: Path = typer.Option(..., "--out", help="where to write comparison.json, .md and .html (created)"),
    benchmark: str | None = typer.Option(None, help="the benchmark to compare (default: the one the folders share)"),
    pricing: Path | None = typer.Option(None, "--pricing", help="price table (default configs/pricing.yaml)"),
    price_per_gpu_hour: float | None = typer.Option(None, "--price-per-gpu-hour", help="one price for every "
                                                    "accelerator-hour (overrides the table)"),
    sign_key: Path | None = typer.Option(None, "--sign-key", help="Ed25519 private key: also write "
                                         "comparison.dsse.json (`ampcert verify` checks it)"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    json_out: Path | None = json_out_option(),
) -> None:
    """Compare systems for one benchmark: time to train with intervals, accelerator-hours, energy and cost per
    training run, precision as disclosed, and MLPerf's checkers' verdicts, for published systems and ampcert's
    own measured runs alike. Writes JSON, Markdown and self-contained HTML with plots, signed with --sign-key.

    Exit 0 when written, 2 on bad input (nothing written)."""
    output = output_of(ctx, as_json, json_out)
    done = session.compare_systems(folders, out, benchmark=benchmark, pricing=pricing,
                                   price_per_gpu_hour=price_per_gpu_hour, sign_key=sign_key)
    output.data(done.to_json(), lambda console: views.print_systems(console, done))
