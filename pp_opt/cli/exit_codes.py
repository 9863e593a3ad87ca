"""The exit codes of ``pp-opt``, one per outcome (listed in ``--help`` and the README)."""

from __future__ import annotations

OK = 0
"""Success."""
BAD_INPUT = 1
"""A file, flag or value is wrong (one line names it and the fix), including usage errors
(unknown command or flag, missing argument) and an invalid schedule given to ``validate``,
``show`` or ``export``."""
INFEASIBLE = 2
"""The memory cap admits no schedule; the smallest cap that works is printed (rounded up,
with its unit). ``predict``: the configuration does not fit; the memory it needs is printed."""
TIME_LIMIT = 3
"""The time limit passed before any schedule was found; nothing was written."""
OUTPUT = 4
"""An output file cannot be written (checked before long work); no file is damaged."""
BACKEND_FAILED = 5
"""A solver backend or the search died in native code (an abort, a segfault, killed for
memory); the best schedule found before (the warm start at least) is written and valid."""
INTERRUPTED = 130
"""Ctrl-C or SIGTERM: the best schedule found so far is written when there is one."""

TABLE = (
    (OK, "ok"),
    (BAD_INPUT, "bad input or usage"),
    (INFEASIBLE, "infeasible cap or configuration (prints the memory that works)"),
    (TIME_LIMIT, "time limit without any schedule"),
    (OUTPUT, "output not writable"),
    (BACKEND_FAILED, "a solver backend crashed (best schedule so far saved)"),
    (INTERRUPTED, "interrupted (best schedule so far saved)"),
)

EPILOG = "Exit codes: " + ", ".join(f"{code} {meaning}" for code, meaning in TABLE) + "."
"""The line ``pp-opt --help`` ends with."""
