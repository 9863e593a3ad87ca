"""The CP-SAT backend (OR-Tools): variables, constraints, objective, model."""

from pp_opt.solvers.cpsat.model import solve_cpsat

__all__ = ["solve_cpsat"]
