"""Solvers: :func:`solve` runs a backend (CP-SAT or MILP) behind one interface."""

from pp_opt.solvers.api import SOLVERS, SolveResult, WarmStart, solve
from pp_opt.solvers.base import Progress, SolveOptions
from pp_opt.solvers.min_cap import min_feasible_cap

__all__ = [
    "SOLVERS",
    "Progress",
    "SolveOptions",
    "SolveResult",
    "WarmStart",
    "min_feasible_cap",
    "solve",
]
