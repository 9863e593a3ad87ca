"""Warm starts under caps that only offload meets: a classic schedule plus copies in its gaps.

A schedule made for a larger cap keeps its compute timing (so its objective)
when each activation is copied to the host right after its forward and copied
back just in time for its backward, wherever the copy streams have room.
Whether the result fits the real cap is left to the validator.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pp_opt.errors import PPOptError
from pp_opt.metrics import compute_metrics
from pp_opt.ops import BACKWARD_KINDS, OpKind, Stream, duration
from pp_opt.problem import Device, Problem
from pp_opt.schedule import Schedule, ScheduledOp, SolverInfo

log = logging.getLogger(__name__)


def with_offloads(problem: Problem, schedule: Schedule, fraction: float) -> Schedule | None:
    """``schedule``'s compute ops on ``problem``, with every activation offloaded that fits.

    Offloads run in forward order as early as possible; reloads in backward order
    as late as possible (ending at their backward's start); an activation whose
    offload would not end before its reload starts is kept. None when the problem
    does not allow offload, or devices share a host link (their copies would collide).
    """
    if not problem.offload or problem.host_links:
        return None
    compute = [op for op in schedule.ops if op.stream is Stream.COMPUTE]
    ops: list[ScheduledOp] = list(compute)
    for device in range(problem.p):
        own = [op for op in compute if problem.device_of(op.stage) == device]
        f_end = {(op.stage, op.microbatch): op.end for op in own if op.kind is OpKind.F}
        b_start = {(op.stage, op.microbatch): op.start for op in own if op.kind in BACKWARD_KINDS}
        offloads: dict[tuple[int, int], tuple[float, float]] = {}
        t = 0.0
        for act in sorted(f_end, key=lambda a: (f_end[a], a)):
            start = max(f_end[act], t)
            t = start + duration(problem, OpKind.OFFLOAD, act[0], fraction)
            offloads[act] = (start, t)
        reloads: dict[tuple[int, int], tuple[float, float]] = {}
        t = float("inf")
        for act in sorted(b_start, key=lambda a: (b_start[a], a), reverse=True):
            end = min(b_start[act], t)
            t = end - duration(problem, OpKind.RELOAD, act[0], fraction)
            reloads[act] = (t, end)
        for act, (o_start, o_end) in offloads.items():
            r_start, r_end = reloads[act]
            if o_end <= r_start:
                ops.append(ScheduledOp(OpKind.OFFLOAD, *act, Stream.D2H, o_start, o_end, fraction))
                ops.append(ScheduledOp(OpKind.RELOAD, *act, Stream.H2D, r_start, r_end, fraction))
    info = SolverInfo(name="offload-warm", status="heuristic", objective=0.0)
    return Schedule(problem=problem, ops=tuple(ops), solver=info,
                    metrics=compute_metrics(problem, ops))  # fmt: skip


def offload_candidates(problem: Problem, fractions: Sequence[float]) -> list[tuple[str, Schedule]]:
    """Classic and greedy schedules made without the cap, each given offloads."""
    from pp_opt.solvers.fallback import greedy_schedules
    from pp_opt.solvers.warm_start import baseline_candidates

    if not problem.offload or problem.host_links:
        return []
    roomy = problem.replace(
        offload=False,
        devices=tuple(Device(cap=1e300, static=d.static) for d in problem.devices),
    )
    out = []
    try:
        found = baseline_candidates(roomy) + greedy_schedules(roomy)
    except PPOptError as err:
        log.info("no offload warm start: %s", err)
        return []
    for name, schedule in found:
        made = with_offloads(problem, schedule, max(fractions))
        if made is not None:
            out.append((f"{name}+offload", made))
    return out
