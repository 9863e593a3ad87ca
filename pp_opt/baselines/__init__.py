"""Classic pipeline schedules (baselines) as op orders, timed by the simulator and validated.

Each baseline is an order generator: given a problem, it returns the problem it
actually schedules (re-split when its pattern needs another placement) and the
per-``(device, stream)`` op order. :func:`make_baseline` times that order with
:func:`pp_opt.simulator.simulate` and passes the result through the independent
validator, so a baseline that does not fit the memory caps raises
:class:`~pp_opt.errors.InfeasibleError` naming the cap it needs.

Where each pattern comes from is written in :mod:`.classic`, :mod:`.zero_bubble`
and :mod:`.vshape`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from pp_opt.baselines.classic import gpipe, interleaved_1f1b, one_f_one_b
from pp_opt.baselines.common import Order, OrderGenerator
from pp_opt.baselines.vshape import zb_v
from pp_opt.baselines.zero_bubble import zb_h1, zb_h2
from pp_opt.errors import InfeasibleError, ProblemError, ValidationError
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, SolverInfo
from pp_opt.simulator import simulate

__all__ = [
    "BASELINES",
    "FUSED_BACKWARD",
    "Order",
    "OrderGenerator",
    "baseline_names",
    "baseline_order",
    "best_baseline",
    "cap_shortfall",
    "fits_cap",
    "make_baseline",
]

logger = logging.getLogger(__name__)

BASELINES: dict[str, OrderGenerator] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
    "zb-h2": zb_h2,
    "zb-v": zb_v,
}
"""Name -> order generator, in the order the baselines are listed to users."""

FUSED_BACKWARD = frozenset({"gpipe", "1f1b", "interleaved-1f1b"})
"""Baselines that run the fused ``BW`` op; the others split it into ``B`` and ``W``."""

_MEMORY_TOL = 1e-9


def baseline_names() -> list[str]:
    """Names of every baseline, as :func:`make_baseline` accepts them."""
    return list(BASELINES)


def baseline_order(name: str, problem: Problem) -> tuple[Problem, Order]:
    """The op order of a classic schedule, without timing it.

    Parameters
    ----------
    name
        One of :func:`baseline_names`.
    problem
        The problem to schedule. GPipe, 1F1B, ZB-H1 and ZB-H2 need one stage per
        device and merge a problem with more chunks back to ``loop``, ``v = 1``;
        interleaved 1F1B needs ``loop`` with ``v >= 2`` (it keeps the problem's
        ``v`` when that holds, else uses ``v = 2``); ZB-V needs the ``v``
        placement. Re-splitting divides each device's totals by the chunk count
        (:func:`pp_opt.problem_io.resplit`), as the Zero Bubble paper does.

    Returns
    -------
    tuple[Problem, Order]
        The problem the order is for (``problem`` itself unless re-split) and the
        per-``(device, stream)`` op order.

    Raises
    ------
    ProblemError
        For an unknown name, or a zero-bubble baseline on a problem whose
        ``split_backward`` is false.
    """
    generator = BASELINES.get(name)
    if generator is None:
        raise ProblemError("baseline", f"unknown {name!r}; use one of {', '.join(BASELINES)}")
    return generator(problem)


def cap_shortfall(schedule: Schedule) -> list[tuple[int, float, float]]:
    """``(device, peak, cap)`` for each device whose peak memory is above its cap."""
    devices = schedule.problem.devices
    return [
        (d, peak, devices[d].cap)
        for d, peak in enumerate(schedule.metrics.peak_memory)
        if peak > devices[d].cap + _MEMORY_TOL * max(1.0, devices[d].cap)
    ]


def fits_cap(schedule: Schedule) -> bool:
    """Whether every device's peak memory (activations plus static) is within its cap."""
    return not cap_shortfall(schedule)


def _simulate(name: str, problem: Problem, scheduled: Problem, order: Order) -> Schedule:
    """Time a baseline's order (not validated yet); notes a re-split in ``solver.extra``."""
    started = time.perf_counter()
    info = SolverInfo(name=name, status="heuristic", objective=0.0)
    schedule = simulate(scheduled, order, solver=info)
    info.seconds = time.perf_counter() - started
    if scheduled is not problem:
        info.extra["resplit"] = {"placement": scheduled.placement, "v": scheduled.v}
    return schedule


def _validated(name: str, schedule: Schedule) -> Schedule:
    """The schedule once the validator passes it; memory-only violations become infeasibility."""
    from pp_opt.validator import check_schedule

    try:
        return check_schedule(schedule)
    except ValidationError as err:
        if err.violations and all(v.rule == "memory" for v in err.violations):
            raise _infeasible(name, schedule) from None
        raise


def _infeasible(name: str, schedule: Schedule) -> InfeasibleError:
    """The error for a schedule over its caps: the worst device, and the cap that fits all."""
    peaks, devices = schedule.metrics.peak_memory, schedule.problem.devices
    rows = cap_shortfall(schedule) or [(d, peaks[d], devices[d].cap) for d in range(len(peaks))]
    device, peak, cap = max(rows, key=lambda row: row[1] - row[2])
    need = max(schedule.metrics.peak_memory)
    return InfeasibleError(
        f"{name} needs {peak:g} (activation + static) on device {device} but its cap is "
        f"{cap:g}; raise --cap to at least {need:g}",
        min_cap=need,
    )


def make_baseline(name: str, problem: Problem) -> Schedule:
    """Time a classic schedule with the simulator and validate it.

    Parameters
    ----------
    name
        One of :func:`baseline_names`.
    problem
        The problem; see :func:`baseline_order` for when it is re-split.

    Returns
    -------
    Schedule
        The timed schedule, for the (possibly re-split) problem, with
        ``SolverInfo(name=name, status="heuristic")``; it has passed
        :func:`pp_opt.validator.check_schedule`.

    Raises
    ------
    InfeasibleError
        When the only violations are memory caps; ``min_cap`` is the smallest
        cap, given to every device, under which this baseline fits.
    ValidationError
        For any other violation (a bug in the generator or the simulator).
    ProblemError
        See :func:`baseline_order`.
    """
    scheduled, order = baseline_order(name, problem)
    return _validated(name, _simulate(name, problem, scheduled, order))


def best_baseline(
    problem: Problem,
    *,
    names: Iterable[str] | None = None,
    objective: str | None = None,
    same_problem: bool = True,
) -> Schedule | None:
    """The baseline with the best objective that fits the caps, e.g. as a solver's warm start.

    Parameters
    ----------
    problem
        The problem to schedule.
    names
        Baselines to try; all of :data:`BASELINES` by default.
    objective
        ``makespan`` or ``span``; the problem's own by default.
    same_problem
        Skip baselines that would re-split the problem, so the schedule answers
        ``problem`` itself (what a warm start needs).

    Returns
    -------
    Schedule or None
        The best validated schedule, or None when no baseline fits.
    """
    best: Schedule | None = None
    for name in BASELINES if names is None else names:
        try:
            scheduled, order = baseline_order(name, problem)
        except ProblemError as err:
            logger.debug("best_baseline: skipping %s: %s", name, err)
            continue
        if same_problem and scheduled is not problem:
            continue
        try:
            schedule = _validated(name, _simulate(name, problem, scheduled, order))
        except InfeasibleError as err:
            logger.debug("best_baseline: %s does not fit: %s", name, err)
            continue
        value = schedule.objective_value(objective)
        if best is None or value < best.objective_value(objective):
            best = schedule
    if best is not None:
        logger.info("best baseline: %s (%s %.6g)", best.solver.name,
                    objective or problem.objective, best.objective_value(objective))  # fmt: skip
    return best
