"""Printing that survives a closed or failing standard output (``pp-opt solve ... | head
-c 10``, ``pp-opt solve ... >/dev/full``).

Once stdout is closed or fails, :func:`say` stops printing and the command carries on: the
solve goes on, the output file is written, the exit code says how it went (a closed pipe
is no error; a failed write, a full disk, is: :func:`stdout_failure`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

import typer

from pp_opt.atomic import write_text

_closed = [False]
_failed: list[OSError] = []
"""The error of a failed write to stdout other than a closed pipe (a full disk)."""


def say(text: str = "", *, err: bool = False) -> None:
    """``typer.echo``, except that a stdout that fails (closed pipe, full disk) is silenced
    instead of failing the command; a full disk is remembered (:func:`stdout_failure`).
    A failing stderr is ignored: there is nowhere left to say anything."""
    if _closed[0] and not err:
        return
    try:
        typer.echo(text, err=err)
    except OSError as error:
        if err:
            return
        if error.errno != errno.EPIPE:
            _failed.append(error)
        silence_stdout()


def show_and_write(table: str, data: dict[str, Any], output: Path | None) -> None:
    """Write ``data`` to ``output`` as its JSON file (when given), show ``table``, then say
    where the file went (the file first: a closed stdout does not lose it)."""
    if output is not None:
        write_text(output, json.dumps(data, indent=1) + "\n")
    say(table)
    if output is not None:
        say(f"wrote {output}")


def flush_stdout() -> None:
    """Flush stdout now (at exit a failing flush would print a traceback-like warning)."""
    if _closed[0]:
        return
    try:
        sys.stdout.flush()
    except OSError as error:
        if error.errno != errno.EPIPE:
            _failed.append(error)
        silence_stdout()


def stdout_failure() -> OSError | None:
    """The first failed write to stdout that was not a closed pipe, or None."""
    return _failed[0] if _failed else None


def silence_stdout() -> None:
    """Point stdout at /dev/null so that later writes and the final flush do not fail."""
    _closed[0] = True
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def reset() -> None:
    """Forget a closed or failed stdout (each in-process run starts afresh)."""
    _closed[0] = False
    _failed.clear()
