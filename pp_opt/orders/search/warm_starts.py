"""Warm starts: every registered generator's schedule that fits the problem as it is.

:func:`candidates` runs the warm-start generators of :data:`~.registry.REGISTRY` in
their order, times each order with the simulator, keeps those that have the problem's
placement and fit its caps, and (with offload allowed) also tries the classic and list
schedules made without the caps with copies in their gaps. A deadline stops it early,
keeping what it has (and at least one schedule when the caps admit any).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from pp_opt.dag import dag_for, op_count
from pp_opt.errors import PPOptError
from pp_opt.order import Order
from pp_opt.orders.common import same_placement
from pp_opt.orders.offload.offload_links import with_link_offloads
from pp_opt.orders.offload.offload_warm import raised, roomy, with_offloads
from pp_opt.orders.registry import REGISTRY, Entry
from pp_opt.problem import Problem
from pp_opt.runtime_rules import in_runtime_order
from pp_opt.schedule import Schedule, SolverInfo, Status
from pp_opt.simulator import simulate

log = logging.getLogger(__name__)

LARGE_OPS = 20_000
"""From this many ops (of the problem's own DAG) a warm-start search under a deadline
tries :data:`QUICK_FIRST` first: every generator takes seconds there, and the first
one found may be the only one the deadline allows."""
QUICK_FIRST = ("1f1b", "zb-h1", "zb-v")
"""Cheap to time (1F1B's fused backward has a third fewer ops) and within ``p``
activations, so they fit most caps (ZB-V for the ``v`` placement, which the others leave);
GPipe, first in the registry, holds all ``m``."""

MEMORY_TOL = 1e-6
"""Relative slack on the caps, that of :func:`pp_opt.validator.validate`."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A warm start: its name (generator and setting) and its timed schedule."""

    name: str
    schedule: Schedule

    @property
    def objective(self) -> float:
        return self.schedule.objective_value()


def candidates(
    problem: Problem,
    *,
    fractions: Sequence[float] = (1.0,),
    deadline: float | None = None,
    names: Collection[str] | None = None,
) -> list[Candidate]:
    """Warm starts of ``problem``, best objective first (ties: the lower peak memory, then
    registry order).

    Parameters
    ----------
    problem
        The problem as it will be solved: candidates keep its placement and fit its caps.
    fractions
        Offload fractions allowed; offload warm starts move the largest.
    deadline
        ``time.perf_counter()`` value after which no further generator starts (the
        running one may finish; on a problem of :data:`LARGE_OPS` or more, none starts
        that would end past it if it took as long as the last one); None for no limit.
        Generation goes on past it until one candidate is found.
    names
        Only these registry entries (all warm-start entries by default).

    Returns
    -------
    list[Candidate]
        Timed by the simulator and under the caps, not validated yet: the caller
        validates the one it takes.
    """
    fraction = max(fractions, default=1.0)
    found: list[tuple[float, int, Candidate]] = []
    entries = [
        (name, entry)
        for name, entry in REGISTRY.items()
        if entry.warm_start
        and (names is None or name in names)
        and (problem.pairs or not entry.pairs)  # paired orders where pairs are allowed
    ]
    large = deadline is not None and op_count(problem) >= LARGE_OPS
    if large:
        entries.sort(key=lambda item: item[0] not in QUICK_FIRST)  # stable: the rest as listed
    _add_generated(found, entries, problem, fraction=fraction, deadline=deadline, large=large)
    if problem.offload:
        _add_offloaded(found, entries, problem, fractions, fraction=fraction, deadline=deadline)
    found.sort(key=_best_first)
    return [candidate for _, _, candidate in found]


def _best_first(item: tuple[float, int, Candidate]) -> tuple[float, float, int]:
    """Objective first; of equal ones (to 12 digits: sums in another order round apart) the
    one with the lower peak on its fullest device, then registry order."""
    objective, rank, candidate = item
    return float(f"{objective:.12g}"), max(candidate.schedule.metrics.peak_memory), rank


def _add_generated(
    found: list[tuple[float, int, Candidate]],
    entries: list[tuple[str, Entry]],
    problem: Problem,
    *,
    fraction: float,
    deadline: float | None,
    large: bool,
) -> None:
    """Each entry's order of ``problem`` itself, timed, while the deadline allows."""
    last = 0.0  # on a large problem, the time the last generator took (and its timing)
    for rank, (name, entry) in enumerate(entries):
        if found and _past(deadline, ahead=last):
            log.info("warm starts: out of time before %s", name)
            break
        if entry.placements is not None and problem.placement not in entry.placements:
            continue
        begun = time.perf_counter()
        order = _generate(name, entry, problem, fraction=fraction, deadline=deadline)
        if order is None or not same_placement(order.problem, problem):
            continue
        _keep(found, rank, order, problem, order.name or name)
        if large:  # the next one would take about as long: start it only if that fits
            last = time.perf_counter() - begun


def _add_offloaded(
    found: list[tuple[float, int, Candidate]],
    entries: list[tuple[str, Entry]],
    problem: Problem,
    fractions: Sequence[float],
    *,
    fraction: float,
    deadline: float | None,
) -> None:
    """Orders made without the caps (classic and list schedules) or for somewhat more
    memory (also the rule schedules of the placement), plus copies. (``loop`` orders take
    copies well without it: no raised caps there.)"""
    bases = [(roomy(problem), False)]
    if problem.placement != "loop":
        bases += [(b, True) for b in raised(problem)]
    for n, (base, capped) in enumerate(bases):
        for rank, (name, entry) in enumerate(entries, start=(n + 1) * len(entries)):
            rule = capped and entry.placements is not None and problem.placement in entry.placements
            if not (entry.offload_base or rule) or (found and _past(deadline)):
                continue
            made = _generate(name, entry, base, fraction=fraction, deadline=deadline)
            if made is None or not same_placement(made.problem, problem):
                continue
            try:
                _keep_with_copies(found, rank, made, problem, fractions=fractions,
                                  fraction=fraction, name=made.name or name)  # fmt: skip
            except PPOptError as err:
                log.debug("offload warm start from %s skipped: %s", name, err)
            except Exception as err:  # a failing warm start must never sink the solve
                log.warning("offload warm start from %s failed (%s); skipped", name, err)


def _keep_with_copies(
    found: list[tuple[float, int, Candidate]],
    rank: int,
    made: Order,
    problem: Problem,
    *,
    fractions: Sequence[float],
    fraction: float,
    name: str,
) -> None:
    """Time ``made`` on ``problem`` and keep it with offload copies in its gaps: copies
    over the host links, and (where the problem has no host links) copies of ``fraction``."""
    # The roomy problem's DAG is the problem's: only caps and switches differ.
    dag = dag_for(problem, made.variant)
    timed = simulate(made, dag=dag, solver=_info(name))
    if not problem.host_links:
        offloaded = with_offloads(problem, timed, fraction)
        _keep(found, rank, offloaded, problem, offloaded.name)
    linked = with_link_offloads(problem, timed, fractions)
    if linked is not None:
        _keep_schedule(found, rank, linked, problem, f"{name}+offload-links")


def _past(deadline: float | None, *, ahead: float = 0.0) -> bool:
    """Whether ``deadline`` has passed, or will have ``ahead`` seconds from now."""
    return deadline is not None and time.perf_counter() + ahead > deadline


def _generate(
    name: str, entry: Entry, problem: Problem, *, fraction: float, deadline: float | None
) -> Order | None:
    """The entry's order of ``problem``, or None (logged) when it has none."""
    available = {"fraction": fraction, "deadline": deadline}
    options = {key: value for key, value in available.items() if key in entry.options}
    try:
        order: Order = entry.generator(problem, **options)
    except PPOptError as err:
        log.debug("warm start %s skipped: %s", name, err)
        return None
    except Exception as err:  # a failing warm start must never sink the solve
        log.warning("warm start %s failed (%s: %s); skipped", name, type(err).__name__, err)
        return None
    return order


def _keep(
    found: list[tuple[float, int, Candidate]], rank: int, order: Order, problem: Problem, name: str
) -> None:
    """Time ``order`` and keep it (as ``name``) when it fits the caps."""
    try:
        schedule = simulate(order, solver=_info(name, order))
    except PPOptError as err:
        log.debug("warm start %s skipped: %s", name, err)
        return
    except Exception as err:  # a failing warm start must never sink the solve
        log.warning("warm start %s failed (%s: %s); skipped", name, type(err).__name__, err)
        return
    _keep_schedule(found, rank, schedule, problem, name)


def _keep_schedule(
    found: list[tuple[float, int, Candidate]],
    rank: int,
    schedule: Schedule,
    problem: Problem,
    name: str,
) -> None:
    """Keep a timed warm start (as ``name``) when it fits the caps and uses only ops the
    problem allows (a rule schedule splits its backward whatever the problem says)."""
    if schedule.variant.split_backward and not problem.split_backward:
        log.debug("warm start %s splits a fused backward", name)
        return
    if not fits(problem, schedule):
        log.debug("warm start %s is over the caps", name)
        return
    # Numbered as the runtimes need (pp_opt.runtime_rules); same times and memory.
    schedule = in_runtime_order(schedule)
    found.append((schedule.objective_value(), rank, Candidate(name, schedule)))


def fits(problem: Problem, schedule: Schedule) -> bool:
    """Whether every device's peak memory is within its cap (the validator's slack)."""
    slack = MEMORY_TOL * max(1.0, max(d.cap for d in problem.devices))
    return all(
        peak <= d.cap + slack
        for peak, d in zip(schedule.metrics.peak_memory, problem.devices, strict=True)
    )


def _info(name: str, order: Order | None = None) -> SolverInfo:
    extra = {"settings": dict(order.settings)} if order is not None and order.settings else {}
    return SolverInfo(name=name, status=Status.HEURISTIC, objective=0.0, extra=extra)
