"""The ``pp-opt`` command line. Each command group lives in its own module and registers here."""

from __future__ import annotations

import importlib
import sys

import typer

from pp_opt.cli.common import flag
from pp_opt.errors import PPOptError

app = typer.Typer(
    name="pp-opt",
    help="Pipeline-parallel schedule optimizer: profile, solve, compare, validate, export.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules that define ``register(app)``; each adds its commands.
_COMMAND_MODULES = (
    "pp_opt.cli.core",
    "pp_opt.cli.solve",
    "pp_opt.cli.profile",
    "pp_opt.cli.export",
)

for _name in _COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point: errors pp_opt raises on purpose become one line and a non-zero exit.

    Library errors name Python arguments; here they name the flags
    (:data:`pp_opt.cli.common.FLAGS`).
    Usage errors are typer's own (exit 2); anything else is a bug and keeps its traceback.
    """
    try:
        app(args=argv, prog_name="pp-opt")
    except PPOptError as err:
        typer.echo(f"error: {err.describe(flag)}", err=True)
        sys.exit(err.exit_code)
