"""Tuning the Zero Bubble greedy rules: every setting under a few memory limits, the best kept.

Both rules (:mod:`.zb_greedy` for ``loop``, :mod:`.zb_v_greedy` for ``v``) take a few
switches and a memory limit per device. The paper tunes how many forwards warm up; here
every switch setting runs under the full room and one activation less, the rules'
own span estimates pick the ``keep`` most promising, and the simulator times those.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from pp_opt.errors import NoOrderError, PPOptError
from pp_opt.order import Order
from pp_opt.orders.common import SPLIT
from pp_opt.orders.greedy.zb_state import StreamLists, Stuck
from pp_opt.problem import Problem
from pp_opt.simulator import simulate

log = logging.getLogger(__name__)

Setting = tuple[str, tuple[object, ...]]
"""A setting's name and the switches passed to the rule after the memory limit."""
Rule = Callable[..., tuple[StreamLists, float]]
"""``(problem, limit, *switches) -> (per-device compute lists, estimated longest span)``."""


def limits(problem: Problem) -> list[list[float]]:
    """Activation limits per device: the full room, then one activation less."""
    room = [d.cap - d.static for d in problem.devices]
    one = [max(problem.stages[s].m_b for s in problem.stages_on(d)) for d in range(problem.p)]
    return [[r - k * a for r, a in zip(room, one, strict=True)] for k in range(2)]


def best_order(
    problem: Problem,
    rule: Rule,
    settings: Sequence[Setting],
    *,
    generator: str,
    keep: int = 2,
    deadline: float | None = None,
) -> Order:
    """The best order of ``rule`` over ``settings`` that fits the caps (problem's objective).

    Every setting is tried under each limit of :func:`limits` (until ``deadline``, a
    ``time.perf_counter()`` value, passes: then the best so far); the ``keep`` with the
    shortest estimated span are simulated, and of those that fit the caps the one with
    the best objective is returned (ties: the shorter estimated span). The order's name
    says the setting and the limit, e.g. ``zb-auto111+1@8``.

    Raises
    ------
    NoOrderError
        When every setting gets stuck under the caps (or none ran before the deadline).
    """
    tried: dict[tuple[tuple[object, ...], ...], tuple[float, str, StreamLists]] = {}
    runs = [(limit, name, flags) for limit in limits(problem) for name, flags in settings]
    for count, (limit, name, flags) in enumerate(runs):
        if deadline is not None and count and time.perf_counter() > deadline:
            log.info("%s: out of time after %d of %d settings", generator, count, len(runs))
            break
        try:
            streams, span = rule(problem, limit, *flags)
        except (Stuck, KeyError):
            continue
        signature = tuple(tuple(keys) for keys in streams.values())
        tried.setdefault(signature, (span, f"{name}@{limit[0]:g}", streams))
    # The rules time their orders as the simulator does: simulate only the best few.
    timed: list[tuple[float, float, Order]] = []
    for _, name, streams in sorted(tried.values(), key=lambda t: t[0])[:keep]:
        order = Order(problem=problem, streams=streams, variant=SPLIT, name=name)
        try:
            schedule = simulate(order)
        except PPOptError as err:
            log.debug("%s %s skipped: %s", generator, name, err)
            continue
        if _fits(problem, schedule.metrics.peak_memory):
            timed.append((max(schedule.metrics.span), schedule.objective_value(), order))
    if not timed:
        raise NoOrderError(generator, "every setting gets stuck or goes over the caps")
    timed.sort(key=lambda t: t[0])  # shortest span first, so it wins ties of the objective
    return min(timed, key=lambda t: t[1])[2]


def _fits(problem: Problem, peaks: Sequence[float]) -> bool:
    return all(peak <= d.cap + 1e-6 for peak, d in zip(peaks, problem.devices, strict=True))
