"""Commands ``solve`` (best schedule under the caps) and ``compare`` (classic vs solver)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from pp_opt.atomic import check_writable
from pp_opt.cli import exit_codes
from pp_opt.cli.common import (
    CapOption,
    ChunksAlias,
    LayersOption,
    ObjectiveOption,
    PlacementOption,
    QuietOption,
    VOption,
    VppAlias,
    chunks_per_device,
    layers_per_stage,
)
from pp_opt.cli.job_options import JOB_FIELDS, with_job_options
from pp_opt.cli.output import say
from pp_opt.cli.stopping import run_token, stop_reason
from pp_opt.errors import Interrupted, OutputError, PPOptError, ProblemError, TimeLimitError
from pp_opt.problem import Problem
from pp_opt.problem_overrides import apply_overrides, problem_with_overrides
from pp_opt.schedule import Schedule, Status
from pp_opt.solvers.base import Progress
from pp_opt.solvers.result import SolveResult

SolverOption = typer.Option("cpsat", "--solver", help="cpsat, milp (CBC) or milp-highs.")
TimeLimitOption = typer.Option(60.0, "--time-limit", help="Seconds the solver may use.")
ThreadsOption = typer.Option(2, "--threads", help="Solver threads.")
SeedOption = typer.Option(0, "--seed", help="Random seed (same seed, same schedule).")
OffloadOption = typer.Option(None, "--offload/--no-offload", help="Allow activation offload.")
RecomputeOption = typer.Option(None, "--recompute/--no-recompute", help="Allow recompute.")


def _progress_printer(quiet: bool) -> Callable[[Progress], None] | None:
    if quiet:
        return None

    def show(update: Progress) -> None:
        gap = "-"
        if update.objective and update.bound is not None:
            gap = f"{max(0.0, (update.objective - update.bound) / update.objective):.2%}"
        bound = "-" if update.bound is None else f"{update.bound:.6g}"
        incumbent = "-" if update.objective is None else f"{update.objective:.6g}"
        say(f"{update.seconds:8.2f} s  incumbent {incumbent}  bound {bound}  gap {gap}")

    return show


def _load(
    problem_path: Path | None,
    *,
    profile: dict[str, Any],
    cap: float | None,
    placement: str | None,
    v: int | None,
    objective: str | None,
    offload: bool | None,
    recompute: bool | None,
) -> Problem:
    """The problem from a file, or profiled from model and hardware cards, with overrides."""
    if problem_path is not None:
        if profile["model"] is not None or profile["hardware"] is not None:
            raise ProblemError("PROBLEM", "give a problem file or --model/--hardware, not both")
        if profile[JOB_FIELDS]:
            name = next(iter(profile[JOB_FIELDS]))
            raise ProblemError(name, f"--{name.replace('_', '-')} describes a job: give it "
                               "with --model/--hardware, not with a problem file")  # fmt: skip
        return problem_with_overrides(
            problem_path, cap=cap, placement=placement, v=v,
            objective=objective, offload=offload, recompute=recompute,
        )  # fmt: skip
    missing = [k for k in ("model", "hardware", "pp", "microbatches") if profile[k] is None]
    if missing:
        raise ProblemError(
            "PROBLEM", "give a problem file, or --model, --hardware, --pp and --microbatches "
            f"(missing --{missing[0]})",
        )  # fmt: skip
    from pp_opt.profiler import profile_problem

    target = placement or "loop"
    problem = profile_problem(
        model=profile["model"], hardware=profile["hardware"], pp=profile["pp"],
        v=v or (2 if target == "v" else 1),
        placement=target, microbatches=profile["microbatches"], mbs=profile["mbs"],
        seq=profile["seq"], tp=profile["tp"], layers=profile["layers"],
        measure=profile["measure"], **profile[JOB_FIELDS],
    )  # fmt: skip
    return apply_overrides(
        problem, cap=cap, objective=objective, offload=offload, recompute=recompute
    )


@with_job_options("profile", skip=("pp", "microbatches", "tp", "v", "placement", "mbs", "layers"))
def solve(
    problem_path: Path | None = typer.Argument(
        None, metavar="[PROBLEM]", help="Problem TOML or JSON (or use --model/--hardware)."
    ),
    solver: str = SolverOption,
    time_limit: float = TimeLimitOption,
    threads: int = ThreadsOption,
    seed: int = SeedOption,
    objective: str | None = ObjectiveOption,
    cap: float | None = CapOption,
    placement: str | None = PlacementOption,
    v: int | None = VOption,
    chunks: int | None = ChunksAlias,
    offload: bool | None = OffloadOption,
    recompute: bool | None = RecomputeOption,
    output: Path | None = typer.Option(None, "-o", "--output", help="Write schedule JSON."),
    quiet: bool = QuietOption,
    model: str | None = typer.Option(None, "--model", help="Model card (instead of PROBLEM)."),
    hardware: str | None = typer.Option(None, "--hardware", help="Hardware card."),
    pp: int | None = typer.Option(None, "--pp", help="Pipeline size (devices)."),
    vpp: int | None = VppAlias,
    microbatches: int | None = typer.Option(None, "--microbatches", "-m", help="Microbatches."),
    mbs: int = typer.Option(1, "--mbs", help="Microbatch size."),
    seq: int | None = typer.Option(None, "--seq", help="Sequence length."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    layers: str | None = LayersOption,
    measure: bool = typer.Option(False, "--measure", help="Measure costs with PyTorch."),
    job_fields: dict[str, Any] | None = None,
) -> None:
    """Find the best schedule under the memory caps (never worse than a classic one).

    Ctrl-C or SIGTERM stops the search and writes the best schedule found so far (exit
    130); a second one aborts. The output path is checked before solving.
    """
    from pp_opt.schedule_text import metrics_table

    if output is not None:
        check_writable(output)
    profile = dict(model=model, hardware=hardware, pp=pp, microbatches=microbatches,
                   mbs=mbs, seq=seq, tp=tp, layers=layers_per_stage(layers),
                   measure=measure, job_fields=dict(job_fields or {}))  # fmt: skip
    chunks_v = chunks_per_device(v, chunks=chunks, vpp=vpp)
    problem = _load(problem_path, profile=profile, cap=cap, placement=placement, v=chunks_v,
                    objective=objective, offload=offload, recompute=recompute)  # fmt: skip
    result = _run_solver(problem, solver=solver, time_limit=time_limit, threads=threads,
                         seed=seed, objective=objective, quiet=quiet)  # fmt: skip
    if output is not None:  # first: a closed stdout or a second Ctrl-C must not lose it
        _save(result.schedule, output)
    if not quiet:
        warm = result.warm_start
        say("warm start   " + ("none" if warm is None else f"{warm.name} ({warm.objective:.6g})"))
        say(metrics_table(result.schedule))
    else:
        say(
            f"{result.status} {result.objective:.6g} (bound {result.lower_bound:.6g}, "
            f"gap {result.gap:.2%}, {result.seconds:.1f} s)"
        )
    if output is not None:
        say(f"wrote {output}")
    _say_how_it_ended(result.schedule, time_limit, wrote=output is not None)


def _save(schedule: Schedule, output: Path) -> None:
    """Save the solved schedule; if the write fails (a full disk), save it in the temporary
    folder instead and say where, so a long solve is never lost (exit 4 all the same)."""
    import tempfile

    from pp_opt.schedule_io import dumps_schedule, save_schedule

    try:
        save_schedule(schedule, output)
    except OutputError as err:
        try:
            fd, rescue = tempfile.mkstemp(prefix="pp-opt-schedule-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(dumps_schedule(schedule))
        except OSError:
            raise err from None
        raise OutputError(err.field, f"{err.message}; the schedule was saved to {rescue}") from None


def _run_solver(problem: Problem, *, quiet: bool, **options: Any) -> SolveResult:
    """The solver's result; "interrupted" (exit 130) rather than "time limit" (exit 3)
    when a signal ended the run before any schedule was found."""
    from pp_opt.solvers import solve as run_solver

    try:
        return run_solver(problem, progress=_progress_printer(quiet), stop=run_token(),
                          **options)  # fmt: skip
    except TimeLimitError:
        reason = stop_reason()
        if reason is not None:
            raise Interrupted(f"{reason} before any schedule was found; nothing written") from None
        raise


def _say_how_it_ended(schedule: Schedule, time_limit: float, *, wrote: bool) -> None:
    """Say plainly when the run was interrupted (then exit 130) or stopped by its time
    limit before proving optimality."""
    reason = stop_reason()
    if reason is not None:
        kept = "wrote the best schedule found so far" if wrote else "best schedule shown above"
        say(f"{reason}: {kept}", err=True)
        raise typer.Exit(exit_codes.INTERRUPTED)
    failure = schedule.solver.extra.get("backend_failure")
    if failure:  # the warning that said so came when it happened
        kept = "wrote" if wrote else "showed"
        say(f"{failure['backend']} crashed ({failure['how']}): {kept} the best schedule "
            "found before the crash", err=True)  # fmt: skip
        raise typer.Exit(exit_codes.BACKEND_FAILED)
    if schedule.solver.status is Status.FEASIBLE:
        say(f"time limit ({time_limit:g} s): best schedule kept, not proved optimal", err=True)


def compare_rows(
    problem: Problem, result_schedule: Schedule | None = None, *, rule_time: float = 5.0
) -> list[list[str]]:
    """One row per classic or rule schedule (or why it has none), then the solver's if given.

    Rule schedules that search their settings get ``rule_time`` seconds each."""
    from pp_opt.cli.common import flag
    from pp_opt.errors import InfeasibleError, ceil_significant
    from pp_opt.orders import baseline, baseline_names
    from pp_opt.orders.common import same_placement

    rows = []
    for name in baseline_names():
        try:
            schedule = baseline(name, problem, time_limit=rule_time)
        except InfeasibleError as err:
            rows.append([name, f"over cap (needs {ceil_significant(err.min_cap, 4)})"])
            continue
        except PPOptError as err:
            rows.append([name, f"n/a: {err.describe(flag)}"[:60]])
            continue
        label = name
        if not same_placement(schedule.problem, problem):
            label += f" ({schedule.problem.placement}, v={schedule.problem.v})"
        rows.append(_metrics_row(label, schedule))
    if result_schedule is not None:
        rows.append(_metrics_row(f"{result_schedule.solver.name} ({result_schedule.solver.status})",
                                 result_schedule))  # fmt: skip
    return rows


def _metrics_row(label: str, schedule: Schedule) -> list[str]:
    m, info = schedule.metrics, schedule.solver
    gap = "-" if info.gap is None else f"{info.gap:.2%}"
    return [label, f"{m.makespan:.6g}", f"{max(m.span):.6g}", f"{m.bubble_rate:.4f}",
            f"{max(m.peak_memory):.4g}", gap]  # fmt: skip


def compare(
    problem_path: Path = typer.Argument(..., metavar="PROBLEM", help="Problem TOML or JSON."),
    solver: str = SolverOption,
    time_limit: float = TimeLimitOption,
    threads: int = ThreadsOption,
    seed: int = SeedOption,
    objective: str | None = ObjectiveOption,
    cap: float | None = CapOption,
    placement: str | None = PlacementOption,
    v: int | None = VOption,
    chunks: int | None = ChunksAlias,
    offload: bool | None = OffloadOption,
    recompute: bool | None = RecomputeOption,
    quiet: bool = QuietOption,
) -> None:
    """A table of every classic and rule schedule and the solver: makespan, span, bubble,
    memory, gap."""
    problem = problem_with_overrides(
        problem_path, cap=cap, placement=placement, v=chunks_per_device(v, chunks=chunks),
        objective=objective, offload=offload, recompute=recompute,
    )  # fmt: skip
    result = _run_solver(problem, solver=solver, time_limit=time_limit, threads=threads,
                         seed=seed, quiet=quiet)  # fmt: skip
    header = ["schedule", "makespan", "span", "bubble", "peak mem", "gap"]
    rows = [header] + compare_rows(problem, result.schedule, rule_time=min(5.0, time_limit / 4))
    widths = [max(len(r[i]) for r in rows if len(r) > i) for i in range(len(header))]
    say(f"objective {problem.objective}, lower bound {result.lower_bound:.6g}")
    for row in rows:
        if len(row) == 2:
            say(f"{row[0]:<{widths[0]}}  {row[1]}")
        else:
            cells = [row[0].ljust(widths[0])]
            cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
            say("  ".join(cells))
    _say_how_it_ended(result.schedule, time_limit, wrote=False)


def register(app: typer.Typer) -> None:
    app.command()(solve)
    app.command()(compare)
