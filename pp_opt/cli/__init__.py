"""The ``pp-opt`` command line. Each command group lives in its own module and registers here."""

from __future__ import annotations

import errno
import gc
import importlib
import sys

import typer

from pp_opt.cli import exit_codes
from pp_opt.cli.common import flag
from pp_opt.cli.output import flush_stdout, reset, say, silence_stdout, stdout_failure
from pp_opt.errors import PPOptError

app = typer.Typer(
    name="pp-opt",
    help="Pipeline-parallel schedule optimizer: profile, solve, compare, validate, export.",
    epilog=exit_codes.EPILOG,
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
    "pp_opt.cli.plan",
    "pp_opt.cli.predict",
)

for _name in _COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def _click_exceptions() -> tuple[type[Exception], type[Exception] | None]:
    """``(ClickException, NoArgsIsHelpError)`` of the click typer runs on: its own copy
    (typer >= 0.23) or the click package. Usage errors are click exceptions too."""
    try:
        from typer._click import exceptions as found
    except ImportError:  # older typer, on click itself
        import click.exceptions as found  # type: ignore[no-redef]
    return found.ClickException, getattr(found, "NoArgsIsHelpError", None)


def relax_garbage_collection() -> None:
    """Run the cyclic garbage collector far less often in this process (one bounded run).

    A large schedule is hundreds of thousands of long-lived objects; at the default
    thresholds the collector walks them all again and again, a fifth of the CPU time of a
    120,000-op solve. Nothing of ours leaks cycles, and it still collects."""
    gc.set_threshold(10_000, 10, 10)


_FULL = (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG)
"""Errors of a stream that cannot take more output (a full disk, a failing device)."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: every outcome becomes one line and its exit code (:mod:`.exit_codes`).

    Library errors name Python arguments; here they name the flags
    (:data:`pp_opt.cli.common.FLAGS`). Usage errors (unknown flag, missing argument) exit
    1 like any bad input, not click's 2 (that is "infeasible" here). SIGINT and SIGTERM
    stop a running search, which keeps and saves its best schedule (exit 130); a second
    one aborts. Anything else is a bug and keeps its traceback.
    """
    from pp_opt.cli.stopping import new_run_token
    from pp_opt.solvers.process.stop import stop_on_signals

    click_error, no_args = _click_exceptions()
    reset()
    relax_garbage_collection()
    try:
        # The run's stop token (pp_opt.cli.stopping): the signal handler requests it, the
        # commands pass it to the library.
        with stop_on_signals(new_run_token()):
            code = app(args=argv, prog_name="pp-opt", standalone_mode=False)
    except PPOptError as err:
        say(f"error: {err.describe(flag)}", err=True)
        sys.exit(err.exit_code)
    except click_error as err:
        if no_args is not None and isinstance(err, no_args):  # bare ``pp-opt``: the help
            ctx = getattr(err, "ctx", None)
            say(ctx.get_help() if ctx is not None else "")
            sys.exit(exit_codes.OK)
        err.show()  # type: ignore[attr-defined]
        sys.exit(exit_codes.BAD_INPUT)
    except (typer.Abort, KeyboardInterrupt):
        say("interrupted", err=True)
        sys.exit(exit_codes.INTERRUPTED)
    except BrokenPipeError:
        sys.exit(exit_codes.OK)
    except OSError as err:  # a write to stdout outside say() (the help text) failed
        if err.errno not in _FULL:
            raise
        silence_stdout()
        say(f"error: standard output: {err.strerror or err}", err=True)
        sys.exit(exit_codes.OUTPUT)
    code = code if isinstance(code, int) else exit_codes.OK
    flush_stdout()
    failed = stdout_failure()
    if failed is not None:  # the files were written; only what was printed is lost
        say(f"error: standard output: {failed.strerror or failed}; files written are kept",
            err=True)  # fmt: skip
        code = code or exit_codes.OUTPUT
    sys.exit(code)
