"""Bounds that hold for every schedule of a problem, independent of every solver.

- :func:`lower_bound`: no valid schedule has a smaller objective. Every schedule a
  solver or a baseline returns is reported with the gap to it. It is the largest of
  a few *terms* (:data:`MAKESPAN_TERMS`, :data:`SPAN_TERMS`), each a function of the
  problem proved below; adding a bound is adding a term.
- :func:`device_min_memory`, :func:`min_feasible_cap`, :func:`check_caps`: the
  least memory any schedule needs, and the error when a cap is below it.

Time bounds only use the required ops (``F``, ``B``/``W`` or ``BW``), never the
optional ones (offload copies and recomputation can only add work).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pp_opt.arguments import check_problem_and_fractions
from pp_opt.errors import InfeasibleError, ProblemError
from pp_opt.ops import OpKind, duration
from pp_opt.problem import OBJECTIVES, Problem

Term = Callable[[Problem], float]
"""One lower bound on an objective, as a function of the problem."""


def lower_bound(problem: Problem, objective: str | None = None) -> float:
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

    Parameters
    ----------
    problem
        The problem; its placement, costs and ``t_comm`` decide the bound.
    objective
        ``makespan`` or ``span``; the problem's own objective when None.

    Returns
    -------
    float
        A value no valid schedule of ``problem`` can beat.
    """
    check_problem_and_fractions(problem)
    objective = objective or problem.objective
    if objective not in OBJECTIVES:
        raise ProblemError("objective", f"unknown {objective!r}; use 'makespan' or 'span'")
    terms = MAKESPAN_TERMS if objective == "makespan" else SPAN_TERMS
    return max(term(problem) for term in terms)


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


def _round_trip(problem: Problem, stage: int) -> float:
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
            + _round_trip(problem, s)
            for s in problem.stages_on(device)
        )
        for device in range(problem.p)
    )


MAKESPAN_TERMS: tuple[Term, ...] = (_critical_path, _device_makespan)
"""Lower bounds on the makespan; :func:`lower_bound` takes the largest."""
SPAN_TERMS: tuple[Term, ...] = (_device_load, _first_round_trip)
"""Lower bounds on the largest per-device span; :func:`lower_bound` takes the largest."""


# --- memory -------------------------------------------------------------------------------


def kept_memory(problem: Problem, stage: int, offload_fractions: Sequence[float] = (1.0,)) -> float:
    """The least activation memory of ``stage`` that must stay resident between ``F`` and ``B``.

    ``m_b`` when kept; ``(1 - a) m_b`` once an offload of fraction ``a`` has ended;
    ``m_in`` when the forward is recomputed.
    """
    st = problem.stages[stage]
    options = [st.m_b]
    if problem.offload:
        options += [(1.0 - a) * st.m_b for a in offload_fractions]
    if problem.recompute:
        options.append(st.m_in)
    return min(options)


def device_min_memory(problem: Problem, offload_fractions: Sequence[float] = (1.0,)) -> list[float]:
    """Per device, the least peak memory (static included) of any schedule.

    ``static(d) + max over stages s on d of [m_b(s) + sum over stages s' < s on d
    of kept(s')]``, with ``kept`` from :func:`kept_memory`.

    It is needed: when ``F(s, j)`` allocates ``m_b(s)`` (or, recomputed, when
    ``R(s, j)`` brings it back to ``m_b(s)``), the same microbatch's activation of
    every lower stage ``s'`` on the device is alive (its backward comes after the
    backward of ``s``), so at least ``kept(s')`` of it is resident.

    It is enough: running one microbatch at a time through the whole pipeline,
    waiting for each offload to end before the next forward on the device (or
    recomputing), and running ``W`` right after ``B``, never holds more.
    """
    check_problem_and_fractions(problem, offload_fractions)
    need = []
    for device in range(problem.p):
        stages = sorted(problem.stages_on(device))
        peak = 0.0
        for i, s in enumerate(stages):
            below = sum(kept_memory(problem, t, offload_fractions) for t in stages[:i])
            peak = max(peak, problem.stages[s].m_b + below)
        need.append(problem.devices[device].static + peak)
    return need


def min_feasible_cap(problem: Problem, offload_fractions: Sequence[float] = (1.0,)) -> float:
    """The smallest cap that, given to every device, admits a schedule."""
    return max(device_min_memory(problem, offload_fractions))


def check_caps(problem: Problem, offload_fractions: Sequence[float] = (1.0,)) -> None:
    """Raise :class:`InfeasibleError` (with ``min_cap``) when a cap admits no schedule."""
    need = device_min_memory(problem, offload_fractions)
    short = [d for d in range(problem.p) if problem.devices[d].cap < need[d] * (1 - 1e-12)]
    if not short:
        return
    d = short[0]
    hints = []
    if not problem.offload:
        hints.append("offload")
    if not problem.recompute and any(st.m_in < st.m_b for st in problem.stages):
        hints.append("recompute")
    raise InfeasibleError(
        device=d, need=need[d], cap=problem.devices[d].cap, min_cap=max(need), hints=tuple(hints),
        unit=problem.unit,
    )  # fmt: skip
