"""The stop token of one command-line run.

:func:`pp_opt.cli.main` makes a new one per run (:func:`new_run_token`) and its signal
handling requests it (the first SIGINT/SIGTERM); the commands pass it to the library
(``pp_opt.solve(..., stop=run_token())``) and read why the run was stopped from it. The
command line owns its process, so its token is the one piece of run state kept here.
"""

from __future__ import annotations

from pp_opt.solvers.process.stop import StopToken

_current = [StopToken()]


def new_run_token() -> StopToken:
    """A fresh token for a run that starts now (the previous run's requests are gone)."""
    _current[0] = StopToken()
    return _current[0]


def run_token() -> StopToken:
    """The token of the run going on."""
    return _current[0]


def stop_reason() -> str | None:
    """Why the run was asked to stop (a signal's name), or None."""
    return _current[0].requested
