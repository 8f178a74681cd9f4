"""The command line's options as the commands share them.

- the invocation's :class:`~ampcert.console.Output`, set to a command's
  ``--json`` and ``--json-out FILE`` (:func:`output_of`);
- the app and its commands (:class:`Typer`), whose help shows each option's
  choices and no value after a flag;
- the choices the parser checks and the help lists (``--device``, ``--dtype``,
  ``--executor``, ``--backend``, screen's ``--precision`` and ``--recipe``);
- errors in the command line's words: click's usage errors (:func:`usage_line`)
  and a session's :class:`~ampcert.errors.BadArgument`, named as the option
  or argument that fed the parameter (:func:`bad_argument_line`).
"""

from __future__ import annotations

import importlib
from enum import Enum
from pathlib import Path
from typing import Any

import typer
import typer.core

from ampcert.console import Output
from ampcert.errors import BadArgument

# The click that typer runs on (its own copy, typer._click, in typer 0.2x; the click
# package before): a bad command line raises that module's exceptions.
click_errors: Any = importlib.import_module(typer.BadParameter.__module__)
# `ampcert` alone (click 8.2 on; before, the help ends in an exit 0 that raises nothing).
NoArgsIsHelpError = getattr(click_errors, "NoArgsIsHelpError", ())

JSON_HELP = "print the data as JSON on stdout instead of the table (messages go to stderr)"
JSON_OUT_HELP = "also write the JSON that --json prints to FILE"


def json_out_option(text: str = JSON_OUT_HELP) -> Any:
    return typer.Option(None, "--json-out", metavar="FILE", help=text)


# --------------------------------------------------------------------------- the app and its help


def _no_value_after_flags(params: list[Any]) -> None:
    """typer's rich help (0.2x) writes a value's type after every option, flags too (``--dry-run
    <bool>``, ``--help <bool>``), as if a flag took one. A flag takes none: an empty metavar shows
    none (a flag's metavar is read nowhere else: its errors name the flag itself)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""


class Command(typer.core.TyperCommand):
    """An ampcert command: its help shows no value after a flag."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _no_value_after_flags(self.get_params(ctx))
        super().format_help(ctx, formatter)


class Group(typer.core.TyperGroup):
    """``ampcert`` and ``ampcert history``: their help shows no value after a flag (``--version``)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _no_value_after_flags(self.get_params(ctx))
        super().format_help(ctx, formatter)


class Typer(typer.Typer):
    """typer's app, its groups and commands made with :class:`Group` and :class:`Command`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=Group, **kwargs)

    def command(self, *args: Any, cls: type[typer.core.TyperCommand] | None = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or Command, **kwargs)


# --------------------------------------------------------------------------- choices
# A closed set of values is an Enum: the parser refuses anything else (a usage error, exit 2)
# and the help lists the choices (`--executor <local|ray|slurm>`).


class Device(str, Enum):
    """--device."""

    cpu = "cpu"
    cuda = "cuda"


class LowDtype(str, Enum):
    """--dtype: autocast's low precision."""

    bf16 = "bf16"
    fp16 = "fp16"


class Executor(str, Enum):
    """run --executor: ampcert.runner.fleet.EXECUTORS (tests/cli/test_cli_output.py holds them equal)."""

    local = "local"
    ray = "ray"
    slurm = "slurm"


class Framework(str, Enum):
    """audit --backend."""

    torch = "torch"
    jax = "jax"


class Fp8Precision(str, Enum):
    """screen --precision."""

    fp8 = "fp8"
    mxfp8 = "mxfp8"


class Fp8Recipe(str, Enum):
    """screen --recipe: fp8's recipes in ampcert.amp.fp8_recipes.RECIPES (the test holds them equal)."""

    tensorwise = "tensorwise"
    rowwise = "rowwise"
    rowwise_with_gw_hp = "rowwise_with_gw_hp"


def output_of(ctx: typer.Context, as_json: bool = False, json_out: Path | None = None) -> Output:
    """This invocation's output object (made by :func:`ampcert.cli.main`, or here where the app is
    invoked directly, as typer's CliRunner does), set to the command's JSON options.
    ``--json-out -`` is ``--json``: stdout, not a file named '-'."""
    root = ctx.find_root()
    if not isinstance(root.obj, Output):
        root.obj = Output.make()
    out: Output = root.obj
    if json_out is not None and str(json_out) == "-":
        as_json, json_out = True, None
    out.as_json, out.json_out = as_json, json_out
    out.command = ctx.command_path.removeprefix(root.info_name or "").strip()
    return out


# --------------------------------------------------------------------------- errors

# The option (or argument) of each command that fed a session function's parameter,
# where its spelling is not `--` + the parameter's name with dashes (BadArgument.as_option).
FLAGS: dict[str, dict[str, str]] = {
    "run": {"suite": "SUITE", "folder": "--resume"},
    "merge": {"out": "OUT", "folders": "DIRS"},
    "certify": {"folder": "RESULTS_DIR"},
    "check": {"paths": "LOGS"},
    "export mlperf": {"folder": "FOLDER", "out": "OUT"},
    "import mlperf": {"paths": "PATHS"},
    "compare-systems": {"folders": "FOLDERS"},
    "show": {"kind": "KIND", "name": "NAME"},
    "report": {"folder": "RESULTS"},
    "keygen": {"key": "KEY"},
    "sign": {"folder": "RESULTS"},
    "verify": {"envelope": "ENVELOPE"},
    "screen": {"workload": "WORKLOAD"},
    "compare": {"baseline": "BASELINE", "new": "NEW", "json_path": "--json-out"},
    "history add": {"folders": "DIRS"},
    "history plot": {"out": "OUT"},
    "gate": {"new": "NEW", "json_path": "--json-out"},
    "plan": {"source": "REPORT", "json_path": "--json-out"},
}


def bad_argument_line(command: str, exc: BadArgument) -> str:
    """A session's BadArgument in the command line's words: ``--flag: detail``."""
    return exc.as_option(FLAGS.get(command, {}).get(exc.param))


def usage_line(exc: Any) -> str:
    """click's (typer's) error about the command line, as ampcert's one line: the
    subcommand, click's message, where to read the usage."""
    ctx = getattr(exc, "ctx", None)
    sub = ctx.command_path.removeprefix(ctx.find_root().info_name or "").strip() if ctx else ""
    where = f"{sub}: " if sub else ""
    hint = f" (see {ctx.command_path} --help)" if ctx else ""
    return f"{where}{exc.format_message()}{hint}"
