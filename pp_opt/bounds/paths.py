"""Time bounds from dependency paths and per-device work, with no memory cap."""

from __future__ import annotations

from collections.abc import Callable

from pp_opt.ops import OpKind, duration
from pp_opt.problem import Problem

Term = Callable[[Problem], float]
"""One lower bound on an objective, as a function of the problem."""


def _backward_kinds(problem: Problem) -> tuple[OpKind, ...]:
    return (OpKind.B, OpKind.W) if problem.split_backward else (OpKind.BW,)


def _hop(problem: Problem, s: int, t: int) -> float:
    return problem.t_comm if problem.device_of(s) != problem.device_of(t) else 0.0


def _fill(problem: Problem, stage: int) -> float:
    """Earliest start of ``F(stage, j)``: the forward chain below it."""
    return sum(duration(problem, OpKind.F, s) + _hop(problem, s, s + 1) for s in range(stage))


def _drain(problem: Problem, stage: int) -> float:
    """Least time from the end of a backward on ``stage`` to the end of its microbatch."""
    if stage == 0:
        return 0.0
    back = OpKind.B if problem.split_backward else OpKind.BW
    chain = sum(duration(problem, back, s) + _hop(problem, s + 1, s) for s in range(stage))
    if problem.split_backward:
        chain += duration(problem, OpKind.W, 0)
    return chain


def _loads(problem: Problem, device: int) -> dict[OpKind, float]:
    kinds = (OpKind.F, *_backward_kinds(problem))
    return {
        kind: problem.m * sum(duration(problem, kind, s) for s in problem.stages_on(device))
        for kind in kinds
    }


def _critical_path(problem: Problem) -> float:
    """One microbatch through every stage and back (``makespan``)."""
    last = problem.num_stages - 1
    back = OpKind.B if problem.split_backward else OpKind.BW
    critical = _fill(problem, last) + duration(problem, OpKind.F, last)
    critical += duration(problem, back, last) + _drain(problem, last)
    if last == 0 and problem.split_backward:
        critical += duration(problem, OpKind.W, 0)
    return critical


def _device_makespan(problem: Problem) -> float:
    """``fill(s0(d)) + F_d + B_d + max(W_d, drain(s0(d)))``, the largest over devices."""
    back = OpKind.B if problem.split_backward else OpKind.BW
    best = 0.0
    for device in range(problem.p):
        load = _loads(problem, device)
        first = min(problem.stages_on(device))
        w_load = load.get(OpKind.W, 0.0)
        value = _fill(problem, first) + load[OpKind.F] + load[back]
        value += max(w_load, _drain(problem, first))
        best = max(best, value)
    return best


def round_trip(problem: Problem, stage: int) -> float:
    """From the end of ``F(stage, j)`` to the start of its backward: the stages above."""
    back = OpKind.B if problem.split_backward else OpKind.BW
    total = 0.0
    for s in range(stage + 1, problem.num_stages):
        total += duration(problem, OpKind.F, s) + duration(problem, back, s)
        total += 2 * _hop(problem, s - 1, s)
    return total


def _device_load(problem: Problem) -> float:
    """``F_d + B_d + W_d``: a device's compute stream is busy that long in its window."""
    return max(sum(_loads(problem, device).values()) for device in range(problem.p))


def _first_round_trip(problem: Problem) -> float:
    """The first op on a device, a forward, and the ``W`` of its microbatch (``span``)."""
    return max(
        min(
            sum(duration(problem, kind, s) for kind in (OpKind.F, *_backward_kinds(problem)))
            + round_trip(problem, s)
            for s in problem.stages_on(device)
        )
        for device in range(problem.p)
    )


MAKESPAN_TERMS: tuple[Term, ...] = (_critical_path, _device_makespan)
"""Lower bounds on the makespan; :func:`lower_bound` takes the largest."""
SPAN_TERMS: tuple[Term, ...] = (_device_load, _first_round_trip)
"""Lower bounds on the largest per-device span; :func:`lower_bound` takes the largest."""
