"""A named generator's schedule, timed by the simulator, validated, with its bound and gap.

:func:`baseline` is what ``pp-opt baseline NAME`` runs: the registry's generator makes
the order (re-splitting the problem when its pattern needs another placement),
:func:`pp_opt.simulator.simulate` times it, and the independent validator checks it,
so a schedule that does not fit the memory caps raises
:class:`~pp_opt.errors.InfeasibleError` naming the cap it needs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from pp_opt.arguments import MAX_TIME_LIMIT, a_problem, number, of_type
from pp_opt.bounds import lower_bound
from pp_opt.errors import InfeasibleError
from pp_opt.orders.registry import REGISTRY, get
from pp_opt.orders.search.warm_starts import candidates
from pp_opt.problem import Problem
from pp_opt.runtime_rules import in_runtime_order
from pp_opt.schedule import Schedule, SolverInfo, Status
from pp_opt.simulator import simulate
from pp_opt.validator import ValidationError, check_schedule

logger = logging.getLogger(__name__)

_MEMORY_TOL = 1e-9


def baseline_names() -> list[str]:
    """Names of the classic schedules, in the order they are listed to users.

    :func:`baseline` also takes the other registered names (the warm-start rules).
    """
    return [name for name, entry in REGISTRY.items() if entry.baseline]


def baseline(name: str, problem: Problem, *, time_limit: float | None = None) -> Schedule:
    """Time a registered generator's order with the simulator, validate it, add its gap.

    Parameters
    ----------
    name
        One of :func:`baseline_names` (``gpipe``, ``1f1b``, ``interleaved-1f1b``,
        ``zb-h1``, ``zb-h2``, ``zb-v``, ``v-half``, ``v-min``, ``pipeoffload``), one of
        PyTorch's schedules (:data:`pp_opt.orders.PYTORCH_SCHEDULES`: ``GPipe``, ``1F1B``,
        ``Interleaved1F1B``, ``LoopedBFS``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``,
        ``DualPipeV``), or another name of the registry.
    problem
        The problem. GPipe, 1F1B, ZB-H1 and ZB-H2 need one stage per device and merge
        a problem with more chunks back to ``loop``, ``v = 1``; interleaved 1F1B needs
        ``loop`` with ``v >= 2`` (it keeps the problem's ``v`` when that holds, else
        uses ``v = 2``); ZB-V needs the ``v`` placement. Re-splitting divides each
        device's totals by the chunk count (:func:`pp_opt.problem_io.resplit`), as the
        Zero Bubble paper does; ``solver.extra["resplit"]`` then says so. V-Half and
        V-Min need ``v`` (two chunks); PipeOffload needs ``loop``. PyTorch's
        Interleaved1F1B, LoopedBFS and InterleavedZeroBubble use ``loop`` with the
        problem's ``v``; ZBVZeroBubble and DualPipeV use ``v``.
    time_limit
        Seconds for the rule schedules that search their own parameters for the cap
        (V-Half, V-Min, PipeOffload); each has its own default when None.

    Returns
    -------
    Schedule
        The timed schedule, for the (possibly re-split) problem, with
        ``SolverInfo(name=name, status="heuristic")``, the problem's lower bound and the
        gap to it; it has passed :func:`pp_opt.validator.check_schedule`.

    Raises
    ------
    InfeasibleError
        When the only violations are memory caps; ``min_cap`` is the smallest cap,
        given to every device, under which this schedule fits.
    ValidationError
        For any other violation (a bug in the generator or the simulator).
    ProblemError
        For an unknown name, a zero-bubble pattern on a problem whose
        ``split_backward`` is false, or a problem PyTorch's schedule does not take (its
        microbatch count, say).
    """
    started = time.perf_counter()
    of_type("name", name, str, "a baseline name (pp_opt.baseline_names())")
    a_problem(problem)
    if time_limit is not None:
        number("time_limit", time_limit, above=0, high=MAX_TIME_LIMIT)
    entry = get(name)
    if time_limit is not None and "deadline" in entry.options:
        order = entry.generator(problem, deadline=started + time_limit)
    else:
        order = entry.generator(problem)
    info = SolverInfo(name=name, status=Status.HEURISTIC, objective=0.0)
    if order.settings:
        info.extra["settings"] = dict(order.settings)
    # Numbered as the runtimes need (pp_opt.runtime_rules); same times and memory.
    schedule = in_runtime_order(simulate(order, solver=info))
    info.seconds = time.perf_counter() - started
    if order.problem is not problem:
        info.extra["resplit"] = {"placement": order.problem.placement, "v": order.problem.v}
    return _with_lower_bound(_validated(name, schedule))


def best_baseline(problem: Problem) -> Schedule | None:
    """The classic schedule with the best objective that keeps ``problem``'s placement and
    fits its caps (validated), or None when none does."""
    found = candidates(problem, names=baseline_names())
    return check_schedule(found[0].schedule) if found else None


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


def _validated(name: str, schedule: Schedule) -> Schedule:
    """The schedule once the validator passes it; memory-only violations become infeasibility."""
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
    return InfeasibleError(device=device, need=peak, cap=cap, min_cap=max(peaks), schedule=name,
                           unit=schedule.problem.unit)  # fmt: skip


def _with_lower_bound(schedule: Schedule) -> Schedule:
    """The schedule with the problem's lower bound and its gap to it."""
    objective = schedule.problem.objective
    bound = lower_bound(schedule.problem, objective)
    value = schedule.objective_value(objective)
    gap = (value - bound) / value if value > 0 else 0.0
    solver = replace(schedule.solver, objective=value, lower_bound=bound, gap=max(gap, 0.0))
    return replace(schedule, solver=solver)
