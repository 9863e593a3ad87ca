"""Options shared by several commands, and applying them to a problem."""

from __future__ import annotations

from pathlib import Path

import typer

from pp_opt.problem import Device, Problem
from pp_opt.problem_io import load_problem, resplit

CapOption = typer.Option(None, "--cap", help="Memory cap of every device (problem's unit).")
PlacementOption = typer.Option(
    None, "--placement", help="Re-split each device into chunks: loop or v."
)
ChunksOption = typer.Option(None, "--chunks", help="Chunks per device for --placement (v = 2).")
ObjectiveOption = typer.Option(None, "--objective", help="makespan or span.")
QuietOption = typer.Option(False, "--quiet", "-q", help="No progress output.")


def problem_with_overrides(
    path: Path,
    *,
    cap: float | None = None,
    placement: str | None = None,
    chunks: int | None = None,
    objective: str | None = None,
    offload: bool | None = None,
    recompute: bool | None = None,
) -> Problem:
    """Load a problem file and apply the command-line overrides to it (each one checked)."""
    problem = load_problem(path)
    if placement is not None or chunks is not None:
        target = placement or ("loop" if problem.placement == "explicit" else problem.placement)
        v = chunks if chunks is not None else (2 if target == "v" else problem.v)
        problem = resplit(problem, target, v)
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
    changes: dict[str, object] = {}
    if cap is not None:
        changes["devices"] = tuple(Device(cap=cap, static=d.static) for d in problem.devices)
    for name, value in (("objective", objective), ("offload", offload), ("recompute", recompute)):
        if value is not None:
            changes[name] = value
    return problem.replace(**changes) if changes else problem
