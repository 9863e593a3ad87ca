"""Printing that survives a closed standard output (``pp-opt solve ... | head -c 10``).

Once stdout is closed, :func:`say` stops printing and the command carries on: the solve
goes on, the output file is written, the exit code says how it went.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys

import typer

_closed = [False]


def say(text: str = "", *, err: bool = False) -> None:
    """``typer.echo``, except that a closed stdout (EPIPE) silences it instead of failing."""
    if _closed[0] and not err:
        return
    try:
        typer.echo(text, err=err)
    except BrokenPipeError:
        _silence_stdout()
    except OSError as error:
        if error.errno != errno.EPIPE:
            raise
        _silence_stdout()


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that later writes and the final flush do not fail."""
    _closed[0] = True
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def reset() -> None:
    """Forget a closed stdout (each in-process run starts afresh)."""
    _closed[0] = False
