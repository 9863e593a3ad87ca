"""The least memory any schedule needs, and the error when a cap is below it."""

from __future__ import annotations

from collections.abc import Sequence

from pp_opt.arguments import check_problem_and_fractions
from pp_opt.errors import InfeasibleError
from pp_opt.problem import Problem


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
    hints = []
    if not problem.offload:
        hints.append("offload")
    if not problem.recompute and any(st.m_in < st.m_b for st in problem.stages):
        hints.append("recompute")
    raise cap_error(problem, short[0], problem.devices[short[0]].cap, need, hints=hints)


def cap_error(
    problem: Problem, device: int, cap: float, need: Sequence[float], hints: Sequence[str] = ()
) -> InfeasibleError:
    """The one "cap below what is needed" error: ``device``'s ``cap`` against its ``need``
    (:func:`device_min_memory`), with the smallest cap that works for every device."""
    return InfeasibleError(device=device, need=need[device], cap=cap, min_cap=max(need),
                           hints=tuple(hints), unit=problem.unit)  # fmt: skip


def check_static_caps(problem: Problem, caps: Sequence[object]) -> Problem:
    """``problem`` when every given cap (None: not given) holds its device's static memory;
    else :func:`cap_error` for the first that does not (exit 2)."""
    for d, (cap, device) in enumerate(zip(caps, problem.devices, strict=True)):
        if isinstance(cap, int | float) and cap < device.static:
            raise cap_error(problem, d, float(cap), device_min_memory(problem))
    return problem
