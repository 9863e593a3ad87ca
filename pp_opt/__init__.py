"""pp_opt: optimal pipeline-parallel schedules under per-GPU memory caps.

The pieces, each a plain function over plain data::

    problem = load_problem("examples/small.toml")       # or Problem(...), profile_problem(...)
    result = solve(problem, solver="cpsat", time_limit=10)
    save_schedule(result.schedule, "s.json")
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Problem": "pp_opt.problem",
    "Stage": "pp_opt.problem",
    "Device": "pp_opt.problem",
    "uniform_problem": "pp_opt.problem",
    "load_problem": "pp_opt.problem_io",
    "resplit": "pp_opt.problem_io",
    "build_dag": "pp_opt.dag",
    "simulate": "pp_opt.simulator",
    "Schedule": "pp_opt.schedule",
    "load_schedule": "pp_opt.schedule_io",
    "save_schedule": "pp_opt.schedule_io",
    "validate": "pp_opt.validator",
    "check_schedule": "pp_opt.validator",
    "make_baseline": "pp_opt.baselines",
    "run_baseline": "pp_opt.api",
    "solve": "pp_opt.solvers",
    "lower_bound": "pp_opt.bounds",
    "profile_problem": "pp_opt.profiler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import on first use, so ``import pp_opt`` stays light (no solver or torch load)."""
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pp_opt' has no attribute {name!r}")
