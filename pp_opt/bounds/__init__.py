"""Bounds that hold for every schedule of a problem, independent of every solver.

- :func:`lower_bound`: no valid schedule has a smaller objective. Every schedule a
  solver or a baseline returns is reported with the gap to it. It is the largest of
  a few *terms* (:data:`MAKESPAN_TERMS`, :data:`SPAN_TERMS`), each a function of the
  problem proved below; adding a bound is adding a term.
- :func:`device_min_memory`, :func:`min_feasible_cap`, :func:`check_caps`: the
  least memory any schedule needs, and the error when a cap is below it.

Time bounds only use the required ops (``F``, ``B``/``W`` or ``BW``), never the
optional ones (offload copies and recomputation can only add work). Where overlapped
pairs can hide communication, they bound the problem whose ops cost what they may cost
inside a pair (:func:`pp_opt.bounds.pairs.variant_relaxed`), and the makespan also gets
:data:`PAIR_MAKESPAN_TERMS` (:mod:`pp_opt.bounds.pairs`): no pair runs before the first
backward nor after the last forward, and every unpaired op costs its full time.
"""

from __future__ import annotations

from collections.abc import Sequence

from pp_opt.arguments import check_problem_and_fractions
from pp_opt.bounds.caps import (
    cap_error,
    check_caps,
    check_static_caps,
    device_min_memory,
    kept_memory,
    min_feasible_cap,
)
from pp_opt.bounds.memory import (
    ENVELOPE_STEPS,
    admitted_limit,
    device_bounds,
    memory_area,
    memory_envelope,
    memory_makespan,
    turn_makespan,
)
from pp_opt.bounds.pairs import PAIR_MAKESPAN_TERMS, variant_relaxed
from pp_opt.bounds.paths import MAKESPAN_TERMS, SPAN_TERMS, Term, round_trip
from pp_opt.errors import ProblemError
from pp_opt.ops import has_pair_savings, pair_relaxed
from pp_opt.problem import OBJECTIVES, Problem

__all__ = [
    "ENVELOPE_STEPS",
    "MAKESPAN_TERMS",
    "PAIR_MAKESPAN_TERMS",
    "SPAN_TERMS",
    "Term",
    "admitted_limit",
    "cap_error",
    "check_caps",
    "check_static_caps",
    "device_bounds",
    "device_min_memory",
    "kept_memory",
    "lower_bound",
    "memory_area",
    "memory_envelope",
    "memory_makespan",
    "min_feasible_cap",
    "round_trip",
    "turn_makespan",
]


def lower_bound(
    problem: Problem,
    objective: str | None = None,
    *,
    offload_fractions: Sequence[float] = (1.0,),
) -> float:
    """The largest of the device bounds below, for ``makespan`` or ``span``.

    Notation: ``s0(d)`` is the lowest stage on device ``d``; ``fill(s)`` the
    forward chain of one microbatch before stage ``s`` (``sum t_f`` of stages
    ``0..s-1`` plus ``t_comm`` for every device change); ``drain(s)`` the backward
    chain after stage ``s`` (``sum t_b`` of stages ``s-1..0``, the device changes,
    and ``t_w`` of stage 0 when ``s > 0``; fused ``t_bw`` instead of ``t_b`` and
    no ``t_w`` when the backward is not split). ``F_d``, ``B_d``, ``W_d`` are the
    device's total forward, backward and weight-gradient times over ``m``
    microbatches.

    ``makespan >= fill(s0(d)) + F_d + B_d + max(W_d, drain(s0(d)))`` for every ``d``.
    Proof: every op on ``d`` waits, through the DAG, for the forward chain of
    its microbatch up to a stage on ``d``, so nothing on ``d`` starts before
    ``fill(s0(d))`` (``fill`` grows with ``s``). Let ``X`` be the backward on
    ``d`` that ends last. Every backward on ``d`` ends by then, and every forward
    before it, so ``X`` ends no earlier than ``fill + F_d + B_d + x`` where ``x`` is
    the ``W`` work done before it. After ``X`` the device still owes
    ``W_d - x``, and the backward chain of ``X``'s microbatch continues below
    ``X``'s stage; no stage below it is on ``d`` (that backward would end later
    than ``X``), so ``X`` is on ``s0(d)`` and the chain takes ``drain(s0(d))``.
    Hence ``makespan >= fill + F_d + B_d + x + max(W_d - x, drain) >=
    fill + F_d + B_d + max(W_d, drain)``. Also ``makespan >=`` the critical path
    of one microbatch (all forwards, all backwards, ``t_w`` of stage 0, and
    ``t_comm`` twice per device change).

    ``span[d] >= F_d + B_d + W_d`` (its compute stream is busy that long inside
    its window), and ``span[d] >= min over stages s on d of t_f(s) + loop(s) +
    t_b(s) + t_w(s)``: the window holds the first op on ``d``, some ``F(s, j)``,
    and the ``W`` of the same microbatch, which waits for the round trip
    ``loop(s)`` through the stages above ``s`` (their forwards and backwards and
    the device changes). The fill before the first op does not count in a span.

    With communication that overlapped pairs may hide, these terms hold for the problem of
    ops at their least share of a pair (:func:`pp_opt.bounds.pairs.variant_relaxed`), and
    the makespan adds :data:`PAIR_MAKESPAN_TERMS` of the problem itself (the critical
    path at full times, and per device the windows where no pair can run).

    The memory caps add the terms of :func:`memory_makespan`, :func:`memory_area`,
    :func:`turn_makespan` and :func:`memory_envelope`. A
    problem with a split backward is bounded for both variants (a schedule may fuse its
    backward, and a fused backward may cost less than ``t_b + t_w``); the smaller holds.

    Parameters
    ----------
    problem
        The problem; its placement, costs, ``t_comm``, caps and switches decide the bound.
    objective
        ``makespan`` or ``span``; the problem's own objective when None.
    offload_fractions
        Fractions one offload may move (with ``problem.offload``); the memory terms
        assume the most helpful of them.

    Returns
    -------
    float
        A value no valid schedule of ``problem`` can beat.
    """
    check_problem_and_fractions(problem, offload_fractions)
    objective = objective or problem.objective
    if objective not in OBJECTIVES:
        raise ProblemError("objective", f"unknown {objective!r}; use 'makespan' or 'span'")
    fractions = tuple(offload_fractions)
    if problem.placement == "dual":
        return _busiest_device(pair_relaxed(problem))
    bound = _variant_bound(problem, objective, fractions)
    if problem.split_backward:
        # A schedule may run the fused backward even so (the classic baselines do), and a
        # measured fused backward can be cheaper than its split parts: bound both.
        fused = problem.replace(split_backward=False)
        bound = min(bound, _variant_bound(fused, objective, fractions))
    return bound


def _busiest_device(problem: Problem) -> float:
    """The ``dual`` placement's bound (its microbatches do not run through every stage,
    which the terms assume): a device's compute, each microbatch's ``F`` and the cheaper of
    its split or fused backward on each stage of its route. Both objectives are at least a
    device's span, which holds its compute."""
    busy = [0.0] * problem.p
    for route, mbs in problem.routes():
        for s in route:
            st = problem.stages[s]
            busy[st.device] += len(mbs) * (st.t_f + min(st.t_b + st.t_w, st.fused_backward))
    return max(busy)


def _variant_bound(problem: Problem, objective: str, fractions: tuple[float, ...]) -> float:
    """The largest term for schedules of ``problem.split_backward``'s variant: the terms of
    the problem at its ops' pair shares (:func:`~pp_opt.bounds.pairs.variant_relaxed`:
    overlapped pairs may hide communication), and where pairs can hide some,
    :data:`PAIR_MAKESPAN_TERMS` of the problem itself."""
    relaxed = variant_relaxed(problem)
    if objective == "makespan":
        values = [term(relaxed) for term in MAKESPAN_TERMS]
        values += [memory_makespan(relaxed, fractions), memory_area(relaxed, fractions)]
        values += [turn_makespan(relaxed), memory_envelope(relaxed)]
        if has_pair_savings(problem):
            values += [term(problem) for term in PAIR_MAKESPAN_TERMS]
    else:
        values = [term(relaxed) for term in SPAN_TERMS]
    return max(values)
