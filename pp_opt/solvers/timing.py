"""A solver's timed ops as a valid schedule: re-timed by the simulator, or as solved.

Solvers work in rounded integer times, so their ops are re-timed with the exact
durations by the simulator (:func:`pp_opt.simulator.retime`), which keeps every stream's
order and cross-stream wait. A shared host link is the exception: the simulator serves
it earliest-ready copy first, while a solver may order the copies of two devices
otherwise and be faster (the ``v`` offload instance of ``bench_solvers.py --parts
exact``: 36.40 as solved, 37.00 re-timed), or stay under a cap the re-timed order
breaks (a reload the simulator starts earlier). There the solver's own times stand
when the validator passes them and they are faster, aligned first
(:func:`pp_opt.simulator.align`): a start meant to equal an end is written equal to it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pp_opt.errors import PPOptError
from pp_opt.metrics import compute_metrics
from pp_opt.ops import OpKind
from pp_opt.order import Variant
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp, SolverInfo
from pp_opt.simulator import align, retime
from pp_opt.solvers.base import BackendResult
from pp_opt.validator import check_schedule, validate

__all__ = ["checked_result", "checked_timing", "ops_variant"]

log = logging.getLogger(__name__)


def checked_timing(raw: Schedule, *, solver: SolverInfo | None = None) -> Schedule:
    """The faster valid one of ``raw`` re-timed and (on shared host links) ``raw`` itself.

    Raises the re-timed schedule's :class:`~pp_opt.errors.PPOptError` (a validation
    error, or the simulator's) when neither is valid.
    """
    raw = align(raw)
    try:
        timed = check_schedule(retime(raw, solver=solver))
    except PPOptError:
        if raw.problem.host_links and not validate(raw):
            return raw
        raise
    faster = raw.objective_value() < timed.objective_value() - 1e-9
    if raw.problem.host_links and faster and not validate(raw):
        return raw
    return timed


def ops_variant(problem: Problem, ops: Sequence[ScheduledOp]) -> Variant:
    """The problem's variant, fused where the ops are: a backend hands back a warm start it
    proved optimal as it is, and a classic warm start may fuse a split problem's backward."""
    own = Variant.of_problem(problem)
    kinds = {k.kind for op in ops for k in (op.key, op.partner) if k is not None}
    if own.split_backward and OpKind.BW in kinds and OpKind.B not in kinds:
        return own._replace(split_backward=False)
    return own


def checked_result(problem: Problem, result: BackendResult, solver: str) -> Schedule | None:
    """The backend's ops re-timed with exact durations and validated; None if unusable."""
    if not result.ops:
        return None
    ops: tuple[ScheduledOp, ...] = result.ops
    info = SolverInfo(name=solver, status=result.status, objective=0.0)
    raw = Schedule(problem=problem, ops=ops, solver=info, metrics=compute_metrics(problem, ops),
                   variant=ops_variant(problem, ops))  # fmt: skip
    try:
        return checked_timing(raw, solver=info)
    except PPOptError as err:
        log.warning("%s result rejected: %s", solver, err)
        return None
