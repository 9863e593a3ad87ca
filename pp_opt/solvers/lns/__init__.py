"""Large-neighbourhood search with CP-SAT: improve a valid schedule window by window."""

from pp_opt.solvers.lns.search import SearchStats, improve

__all__ = ["SearchStats", "improve"]
