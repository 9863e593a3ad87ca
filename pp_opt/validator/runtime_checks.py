"""What the runtimes need beyond the DAG (:mod:`pp_opt.runtime_rules`), and the stored bound."""

from __future__ import annotations

from pp_opt.runtime_rules import RULE, runtime_chains
from pp_opt.schedule import SolverInfo
from pp_opt.validator.context import Context
from pp_opt.validator.violation import Violation


def check_runtime_order(ctx: Context) -> list[Violation]:
    """Each pair of :func:`~pp_opt.runtime_rules.runtime_chains`: the second op starts no
    earlier than the first one ends."""
    found = []
    for a, b in runtime_chains(ctx.problem):
        first, then = ctx.first.get(a), ctx.first.get(b)
        if first is None or then is None:
            continue  # a missing op is reported already
        early = first.end - then.start
        if early > ctx.time_tol:
            found.append(
                Violation(
                    rule="runtime_order",
                    message=f"starts at {then.start:.6g}, before {a} ends at {first.end:.6g}; "
                    f"{RULE}: renumber the microbatches (pp_opt.runtime_rules.in_runtime_order)",
                    op=b,
                    device=ctx.device_of(then),
                    amount=early,
                )
            )
    return found


def check_lower_bound(ctx: Context, solver: SolverInfo) -> list[Violation]:
    """A stored lower bound no larger than the objective the ops give (no schedule beats
    a bound, its own included)."""
    bound = solver.lower_bound
    if bound is None or not ctx.placed or len(ctx.placed) < len(ctx.ops):
        return []
    first = min(op.start for op in ctx.placed)
    if ctx.problem.objective == "makespan":
        value = max(op.end for op in ctx.placed) - first
    else:
        spans = []
        for own in ctx.by_device:
            if own:
                spans.append(max(op.end for op in own) - min(op.start for op in own))
        value = max(spans)
    excess = bound - value
    if excess > ctx.time_tol or excess != excess:  # NaN too
        message = (
            f"stored lower bound {bound:.6g} is above the schedule's {ctx.problem.objective} "
            f"{value:.6g}; a bound no schedule beats cannot exceed one; fix solver.lower_bound"
        )
        return [Violation(rule="lower_bound", message=message, amount=excess)]
    return []
