"""A loaded problem with a caller's overrides: re-split chunks, one cap, the switches.

The command line's ``--cap``, ``--placement``/``--v``, ``--objective``, ``--offload`` and
``--recompute`` are these arguments; a Python caller gets the same checks.
"""

from __future__ import annotations

from pathlib import Path

from pp_opt.arguments import a_problem, choice, flag, integer, number, of_type, optional
from pp_opt.bounds import check_static_caps
from pp_opt.problem import Device, Problem
from pp_opt.problem_io import load_problem, resplit


def problem_with_overrides(
    path: str | Path,
    *,
    cap: float | None = None,
    placement: str | None = None,
    v: int | None = None,
    objective: str | None = None,
    offload: bool | None = None,
    recompute: bool | None = None,
) -> Problem:
    """Load a problem file and apply the command-line overrides to it (each one checked)."""
    of_type("path", path, (str, Path), "a problem file's path")
    optional("placement", placement, str, '"loop" or "v"')
    if placement is not None:
        choice("placement", placement, ("loop", "v"))
    if v is not None:
        integer("v", v, low=1)
    _check_switches(cap=cap, objective=objective, offload=offload, recompute=recompute)
    problem = load_problem(path)
    if placement is not None or v is not None:
        target = placement or ("loop" if problem.placement == "explicit" else problem.placement)
        chunks = v if v is not None else (2 if target == "v" else problem.v)
        problem = resplit(problem, target, chunks)
    return apply_overrides(
        problem, cap=cap, objective=objective, offload=offload, recompute=recompute
    )


def apply_overrides(
    problem: Problem,
    *,
    cap: float | None = None,
    objective: str | None = None,
    offload: bool | None = None,
    recompute: bool | None = None,
) -> Problem:
    """The problem with the cap of every device and the switches the user gave replaced."""
    a_problem(problem)
    _check_switches(cap=cap, objective=objective, offload=offload, recompute=recompute)
    changes: dict[str, object] = {}
    if cap is not None:
        check_static_caps(problem, [cap] * problem.p)  # a cap below static memory: exit 2
        changes["devices"] = tuple(Device(cap=cap, static=d.static) for d in problem.devices)
    for name, value in (("objective", objective), ("offload", offload), ("recompute", recompute)):
        if value is not None:
            changes[name] = value
    return problem.replace(**changes) if changes else problem


def _check_switches(*, cap: object, objective: object, offload: object, recompute: object) -> None:
    if cap is not None:
        number("cap", cap, low=0.0)
    if objective is not None:
        choice("objective", objective, ("makespan", "span"))
    for name, value in (("offload", offload), ("recompute", recompute)):
        if value is not None:
            flag(name, value)
