"""Options shared by several commands and the flag of each library argument (the overrides
are :mod:`pp_opt.problem_overrides`)."""

from __future__ import annotations

import typer

from pp_opt.errors import ProblemError
from pp_opt.job import FIELDS
from pp_opt.schedule import Schedule

FLAGS = {
    "torchtitan": "--torchtitan",
    "torchtitan_activation_checkpoint": "--activation-checkpoint",
    "torchtitan_base": "--torchtitan-base",
    "torchtitan_config": "--torchtitan-config",
    "fused_backward": "--fused-backward",
    "cap": "--cap",
    "drop_offload": "--drop-offload",
    "force": "--force",
    "format": "--format",
    "global_batch": "--global-batch",
    "gpus": "--gpus",
    "hardware": "--hardware",
    "measure": "--measure",
    "model": "--model",
    "name": "NAME",
    "objective": "--objective",
    "offload": "--offload",
    "output": "--output",
    "path": "--output",
    "plot": "--plot",
    "ray": "--ray",
    "recompute": "--recompute",
    "repeats": "--repeats",
    "schedule": "--schedule",
    "seed": "--seed",
    "solver": "--solver",
    "threads": "--threads",
    "time_limit": "--time-limit",
    "width": "--width",
    "workers": "--workers",
}
"""The flag (or argument) of each library argument that is not a Job field, for one-line
errors; a Job field's flag is its own (:meth:`pp_opt.job.JobOption.flag`)."""


def flag(name: str) -> str:
    """The command-line spelling of a library argument (the name itself when it has none)."""
    if name in FLAGS:
        return FLAGS[name]
    return FIELDS[name].flag(name) if name in FIELDS else name


CapOption = typer.Option(None, "--cap", help="Memory cap of every device (problem's unit).")
PlacementOption = typer.Option(
    None, "--placement", help="Re-split each device into chunks: loop or v."
)
VOption = typer.Option(None, "--v", help="Chunks per device (with --placement; v placement: 2).")
ChunksAlias = typer.Option(None, "--chunks", hidden=True, help="Former name of --v.")
VppAlias = typer.Option(None, "--vpp", hidden=True, help="Former name of --v.")
ObjectiveOption = typer.Option(None, "--objective", help="makespan or span.")
QuietOption = typer.Option(False, "--quiet", "-q", help="No progress output.")
LayersOption = typer.Option(None, "--layers", help="Layers per stage, e.g. 2,3,3,2.")
ForceOption = typer.Option(
    False, "--force", help="Write or show the schedule even if it is invalid (loudly)."
)


def checked_for_output(schedule: Schedule, *, force: bool, action: str) -> None:
    """Refuse an invalid schedule (exit 1, first violation named) unless ``--force``, which
    prints a loud warning instead."""
    from pp_opt.cli.output import say
    from pp_opt.validator import require_valid

    violations = require_valid(schedule, force=force, action=action)
    if violations:
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        say(
            f"WARNING: {action} of an INVALID schedule forced by --force: {violations[0]}{more}",
            err=True,
        )


def layers_per_stage(text: str | None) -> list[int] | None:
    """``2,3,3,2`` as a list of integers (None when not given)."""
    if not text:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",")]
    except ValueError:
        raise ProblemError("layers", f"got {text!r}; give comma-separated integers") from None


def chunks_per_device(v: int | None, **former: int | None) -> int | None:
    """``--v``, or a value given under a former flag name (with a one-line warning)."""
    for name, value in former.items():
        if value is not None:
            typer.echo(f"warning: --{name} is deprecated; use --v", err=True)
            if v is None:
                v = value
    return v
