"""Integer units for CP-SAT: times and memory scaled (and rounded) so that rounding is negligible.

Times are rounded to the nearest unit (the API re-times the solver's op order
with the exact durations afterwards). Memory is rounded *up* and the cap *down*
unless the scale is exact, so every schedule the model accepts fits the real cap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from pp_opt.problem import Problem

_TIME_RESOLUTION = 2000.0
"""Units in the shortest positive duration when no exact decimal scale exists."""
_MEMORY_RESOLUTION = 1e5
"""Units in the largest activation when no exact scale exists."""
_MAX_UNITS = 1e8
"""The largest number an exact scale may give."""
_INTEGER_ACTIVATION_UNITS = 1e6
"""Most units an exact integer memory scale may give the largest activation: ten times the
rounded scale's. Larger numbers slow the search (DeepSeek-V3 tp 4 pp 8 v 2 m 32 at its
exact unit of 256 bytes, 1.4e7 units an activation: 5695-5705 ms in 30 s against 5661-5686
rounded)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Scaling:
    """Multipliers from problem units to the model's integers."""

    time: float
    memory: float
    memory_exact: bool
    time_exact: bool = True

    @property
    def exact(self) -> bool:
        """Whether the model's numbers are the problem's (so its bound is the problem's)."""
        return self.memory_exact and self.time_exact

    def t(self, value: float) -> int:
        return int(round(value * self.time))

    def mem(self, value: float) -> int:
        """A memory demand (rounded up unless exact)."""
        scaled = value * self.memory
        return int(round(scaled)) if self.memory_exact else int(math.ceil(scaled - 1e-9))

    def cap(self, value: float) -> int:
        """A capacity (rounded down unless exact)."""
        scaled = value * self.memory
        return int(round(scaled)) if self.memory_exact else int(math.floor(scaled + 1e-9))


def _exact_decimal_scale(values: Iterable[float], largest: float) -> float | None:
    values = [v for v in values if v > 0]
    for k in range(0, 7):
        scale = 10.0**k
        if largest * scale > _MAX_UNITS:
            return None
        if all(abs(v * scale - round(v * scale)) <= 1e-9 * max(1.0, v * scale) for v in values):
            return scale
    return None


def _integer_scale(values: list[float], largest: float) -> float | None:
    """One over the largest integer dividing every value, where all are whole numbers and it
    leaves the largest activation at most :data:`_INTEGER_ACTIVATION_UNITS` units: a
    profile's bytes (multiples of some KiB), which no decimal scale keeps small."""
    unit = 0
    for value in values:
        if abs(value - round(value)) > 1e-9 * max(1.0, abs(value)):
            return None
        unit = math.gcd(unit, int(round(value)))
    if unit == 0 or largest / unit > _INTEGER_ACTIVATION_UNITS or max(values) / unit > _MAX_UNITS:
        return None
    return 1.0 / unit


def _common_unit(values: Iterable[float], scale: float) -> int:
    """The largest integer dividing every scaled value: a coarser unit that is still exact.

    With every duration and latency a multiple of it, the times of a schedule left-shifted to
    its earliest starts are too, so the model loses no optimum; its objective then moves
    only in steps a schedule can take (issue 28: ``0.05`` instead of ``0.01`` on
    ``t_comm = 0.05``, where CP-SAT's incumbents crept down by ``0.01`` of slack)."""
    unit = 0
    for value in values:
        unit = math.gcd(unit, int(round(value * scale)))
    return max(unit, 1)


def _times(problem: Problem, fractions: list[float]) -> list[float]:
    """Every duration and latency the model may hold."""
    times = [problem.t_comm]
    for st in problem.stages:
        times += [st.t_f, st.t_b, st.t_w, st.fused_backward, st.t_offload, st.t_reload]
        times += [a * st.t_offload for a in fractions] + [a * st.t_reload for a in fractions]
    return times


def choose_scaling(problem: Problem, fractions: Iterable[float] = (1.0,)) -> Scaling:
    """Decimal scales when the numbers are short decimals (exact), else fine rounding."""
    fractions = list(fractions)
    times = _times(problem, fractions)
    positive = [t for t in times if t > 0] or [1.0]
    time_scale = _exact_decimal_scale(times, max(positive) * 10 * problem.m)
    time_exact = time_scale is not None
    if time_scale is None:
        time_scale = _TIME_RESOLUTION / min(positive)
    else:
        time_scale /= _common_unit(times, time_scale)
    mems = [problem.activation_room(d) for d in range(problem.p)]
    for st in problem.stages:
        mems += [st.m_b, st.m_w, st.m_in, st.m_b - st.m_w, st.m_b - st.m_in]
        mems += [a * st.m_b for a in fractions]
    largest = max([st.m_b for st in problem.stages] + [1e-12])
    mem_scale = _exact_decimal_scale(mems, max(mems) if mems else 1.0)
    if mem_scale is None:
        mem_scale = _integer_scale(mems, largest)
    exact = mem_scale is not None
    if mem_scale is None:
        mem_scale = _MEMORY_RESOLUTION / largest
    return Scaling(time=time_scale, memory=mem_scale, memory_exact=exact, time_exact=time_exact)


def time_rounding(problem: Problem, scaling: Scaling) -> float:
    """The largest relative error of a positive time rounded to model units (0: exact):
    about ``1 / (2 x 2000)`` with :data:`_TIME_RESOLUTION` units in the shortest one."""
    if scaling.time_exact:
        return 0.0
    scaled = [(v * scaling.time, scaling.t(v)) for v in _times(problem, [1.0]) if v > 0]
    return max((abs(units - exact) / exact for exact, units in scaled), default=0.0)


def problem_bound(problem: Problem, scaling: Scaling, objective: str, bound: float, *,
                  paired: bool) -> float | None:  # fmt: skip
    """A lower bound of ``problem`` from ``bound``, one of its model (model units); None where
    the model's rounding makes it a bound of another problem only.

    With rounded times, an order of the problem lasts at most ``1 + e`` times as long in the
    model (``e``: :func:`time_rounding`; every duration and latency on its longest path is at
    most that much longer), so ``bound / (s (1 + e))`` holds for the problem, provided the
    model accepts each order the problem does: its memory exact, or never binding (each
    device's activations, every one rounded up, fit its rounded cap), no offload or recompute
    (their choices and copies have rounded memory of their own), no pairs (rounded pair
    times), and the makespan (a span is a difference of two times)."""
    if scaling.exact:
        return bound / scaling.time
    if objective != "makespan" or problem.offload or problem.recompute or paired:
        return None
    if not scaling.memory_exact and any(
        sum(problem.m * (scaling.mem(problem.stages[s].m_b) + 2) for s in problem.stages_on(d))
        > scaling.cap(problem.activation_room(d))
        for d in range(problem.p)
    ):  # rounded memory that can bind: the model may refuse an order the problem allows
        return None
    return bound / (scaling.time * (1.0 + time_rounding(problem, scaling)))
