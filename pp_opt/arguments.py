"""Checks of the Python API's arguments: each error names the argument at fault.

The command line maps these names to its flags (:data:`pp_opt.cli.common.FLAGS`), so one
check serves both. Problem, card and schedule *files* are checked where they are parsed
(:mod:`pp_opt.problem_io`, :mod:`pp_opt.schedule_io`, :mod:`pp_opt.profiler.cards`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, SolverInfo

MAX_SEED = 2**31 - 1
"""Largest random seed (the solvers take 32-bit seeds)."""
MAX_THREADS = 1024
MAX_TIME_LIMIT = 7 * 24 * 3600.0
"""A week: every run is bounded."""


def of_type(name: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` when it is an instance of ``kind``; an error naming ``name`` if not."""
    if not isinstance(value, kind):
        raise ProblemError(name, f"got {type(value).__name__} {value!r:.60}; expected {what}")
    return value


def optional(name: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """``value`` when it is None or an instance of ``kind``; an error naming ``name`` if not."""
    return None if value is None else of_type(name, value, kind, f"{what} or None")


def flag(name: str, value: Any) -> bool:
    """A bool (not a number or a string that reads as one)."""
    found: bool = of_type(name, value, bool, "True or False")
    return found


def a_problem(value: Any, name: str = "problem") -> Problem:
    """``value`` when it is a :class:`~pp_opt.problem.Problem`."""
    found: Problem = of_type(name, value, Problem, "a pp_opt Problem (pp_opt.load_problem)")
    return found


def a_schedule(value: Any, name: str = "schedule") -> Schedule:
    """``value`` when it is a :class:`~pp_opt.schedule.Schedule`."""
    found: Schedule = of_type(name, value, Schedule, "a pp_opt Schedule (pp_opt.load_schedule)")
    return found


def a_solver_info(value: Any, name: str = "solver") -> SolverInfo | None:
    """``value`` when it is None or a :class:`~pp_opt.schedule.SolverInfo`."""
    found: SolverInfo | None = optional(name, value, SolverInfo, "a SolverInfo")
    return found


def integer(name: str, value: Any, *, low: int, high: int | None = None) -> int:
    """An ``int`` (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProblemError(name, f"got {value!r:.60}; expected an integer")
    if value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise ProblemError(name, f"got {value}; give an integer {span}")
    return value


def number(
    name: str, value: Any, *, low: float | None = None, high: float | None = None,
    above: float | None = None,
) -> float:  # fmt: skip
    """A finite real number (not a bool) within the given bounds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProblemError(name, f"got {value!r:.60}; expected a number")
    x = float(value)
    if not math.isfinite(x):
        raise ProblemError(name, f"got {x}; expected a finite number")
    if above is not None and not x > above:
        raise ProblemError(name, f"got {x:g}; it must be greater than {above:g}")
    if low is not None and x < low:
        raise ProblemError(name, f"got {x:g}; it must be at least {low:g}")
    if high is not None and x > high:
        raise ProblemError(name, f"got {x:g}; it must be at most {high:g}")
    return x


def choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ProblemError(name, f"unknown {value!r:.60}; use one of {', '.join(allowed)}")
    return value


def fractions(name: str, value: Any, *, empty: bool = False) -> tuple[float, ...]:
    """A sequence of numbers in (0, 1] (non-empty unless ``empty``)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ProblemError(name, f"got {value!r:.60}; give a list of fractions in (0, 1]")
    out = tuple(number(name, a) for a in value)
    if (not out and not empty) or any(not 0 < a <= 1 for a in out):
        raise ProblemError(name, f"got {out}; each must be in (0, 1]")
    return out


def callback(name: str, value: Any) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        raise ProblemError(name, f"got {type(value).__name__}; give a function or None")
    found: Callable[..., Any] | None = value
    return found


def check_solve(
    *, problem: Any, time_limit: Any, threads: Any, seed: Any, warm_start: Any, progress: Any,
    offload_fractions: Any,
) -> None:  # fmt: skip
    """The arguments of :func:`pp_opt.solvers.solve` that its own checks leave out."""
    a_problem(problem)
    number("time_limit", time_limit, above=0, high=MAX_TIME_LIMIT)
    integer("threads", threads, low=1, high=MAX_THREADS)
    integer("seed", seed, low=0, high=MAX_SEED)
    of_type("warm_start", warm_start, (bool, Schedule), "True, False or a Schedule")
    callback("progress", progress)
    fractions("offload_fractions", offload_fractions)


def check_problem_and_fractions(problem: Any, offload_fractions: Any = (1.0,)) -> None:
    """``problem`` is a :class:`~pp_opt.problem.Problem`; ``offload_fractions`` in (0, 1]."""
    a_problem(problem)
    fractions("offload_fractions", offload_fractions, empty=True)


def check_profile(*, measure: Any, layers: Any) -> None:
    """The arguments of :func:`pp_opt.profiler.profile_costs` its layout checks leave out."""
    flag("measure", measure)
    if layers is not None:
        if isinstance(layers, str | bytes) or not isinstance(layers, Iterable):
            raise ProblemError("layers", f"got {layers!r:.60}; give a list of layer counts or None")
        for count in layers:
            integer("layers", count, low=0)
