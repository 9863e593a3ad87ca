"""Solvers: :func:`solve` (:mod:`.entry`) runs an exact backend (CP-SAT or MILP) behind
one interface.

The backends live in :mod:`.cpsat` and :mod:`.milp`, each with the same parts
(``variables``, ``constraints``, ``objective``, ``model``, ``solution``) and one entry
(``solve_cpsat``, ``solve_milp``); they are imported only when they run. Warm starts
come from :mod:`pp_opt.orders`. Process handling (the child process of each solve, stop
requests: :class:`StopToken`) is in :mod:`.process`.
"""

from pp_opt.schedule import Status
from pp_opt.solvers.base import Progress, SolveOptions
from pp_opt.solvers.entry import SOLVERS, solve
from pp_opt.solvers.process.stop import StopToken
from pp_opt.solvers.result import SolveResult, WarmStart

__all__ = [
    "SOLVERS",
    "Progress",
    "SolveOptions",
    "SolveResult",
    "Status",
    "StopToken",
    "WarmStart",
    "solve",
]
