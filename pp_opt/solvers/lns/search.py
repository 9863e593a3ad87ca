"""Large-neighbourhood search: improve a valid schedule one time window at a time.

Each step cuts the incumbent into fixed ops, free ops and shifted tails
(:mod:`.window`), lets CP-SAT re-place the free ops and shift the tails
(:mod:`.submodel`), re-times the result with the simulator (its own order and
cross-stream waits, which never raises memory nor the objective) and keeps it only
when the independent validator passes it and its objective is lower. So the incumbent
is valid after every step, and the search can stop at any moment.

Windows sweep the schedule from its start to its end, half a window at a time, so a
gain in one window pulls every later op earlier and the next windows see it; the
window grows while its sub-models solve to optimality quickly and shrinks while they
do not.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from ortools.sat.python.cp_model import CpSolver

from pp_opt.errors import PPOptError
from pp_opt.metrics import compute_metrics
from pp_opt.schedule import Schedule, ScheduledOp, SolverInfo
from pp_opt.simulator import order_of
from pp_opt.solvers.cpsat.scaling import choose_scaling
from pp_opt.solvers.lns.submodel import WindowResult, solve_window
from pp_opt.solvers.lns.window import Window, cut_window
from pp_opt.solvers.process.stop import Search
from pp_opt.solvers.timing import checked_timing

log = logging.getLogger(__name__)

Improved = Callable[[Schedule], None]


@dataclass(kw_only=True, slots=True)
class SearchStats:
    """How a search went (for logs and the schedule's ``solver.extra``)."""

    windows: int = 0
    improvements: int = 0
    restarts: int = 0
    """Times the search found no gain in two sweeps and started over with other windows."""
    seconds: float = 0.0


STEP_LIMIT_GROWTH = 1.5
"""Each restart gives a window's sub-solve this much more time (up to :data:`MAX_STEP_LIMIT`)."""
MAX_STEP_LIMIT = 20.0
"""Most seconds one window's sub-solve gets after restarts."""


@dataclass(kw_only=True, slots=True)
class _Walk:
    """Where the sweep stands: the next window's size and offset (in ops, by start), how
    many windows in a row gave no gain, and the sub-solve's time limit."""

    size: int
    """Ops in the next window's free part."""
    step_limit: float
    """Seconds one window's sub-solve gets (before the deadline cuts it)."""
    position: int = 0
    """Index, in start order, of the next window's first free op."""
    stale: int = 0
    """Windows in a row without a gain."""

    def bounds(
        self, starts: list[float], rng: random.Random, elastic_ops: int
    ) -> tuple[float, float, float]:
        """The next window's start, end and elastic edge on the sorted op ``starts``."""
        n = len(starts)
        self.size = min(self.size, n)
        if self.position >= n - 1:  # wrap around, to a random offset within half a window
            self.position = rng.randrange(0, max(1, min(self.size // 2, n - 1)))
        low = starts[self.position]
        end = self.position + self.size
        high = starts[end] if end < n else float("inf")
        reach = end + elastic_ops
        return low, high, starts[reach] if reach < n else float("inf")

    def step(self, n: int, *, gained: bool, optimal: bool) -> None:
        """Move half a window on: grow it after an optimal sub-solve, shrink it otherwise."""
        self.stale = 0 if gained else self.stale + 1
        if optimal:
            self.size = min(int(self.size * 1.25) + 1, n)
        else:
            self.size = min(n, max(50, int(self.size * 0.8)))
        self.position += max(1, self.size // 2)
        if self.position + 1 >= n:
            self.position = n  # wrap to a random offset on the next step

    def exhausted(self, n: int) -> bool:
        """Two full sweeps without a gain: a local optimum for these windows."""
        return self.stale > 4 * max(1, n // max(1, self.size))

    def restart(self, n: int, rng: random.Random, window_ops: int, stats: SearchStats) -> None:
        """Start over at a random offset with a random window size and a longer step."""
        self.stale = 0
        stats.restarts += 1
        self.step_limit = min(MAX_STEP_LIMIT, self.step_limit * STEP_LIMIT_GROWTH)
        self.size = rng.randint(min(n, 50), max(min(n, 50), min(n, 2 * window_ops)))
        self.position = rng.randrange(0, max(1, n - 1))
        log.info("lns: restart %d (window %d ops, step %.3g s)", stats.restarts, self.size,
                 self.step_limit)  # fmt: skip


def improve(
    schedule: Schedule,
    *,
    deadline: float,
    threads: int = 2,
    seed: int = 0,
    window_ops: int = 400,
    elastic_ops: int = 1200,
    step_limit: float = 2.0,
    on_improve: Improved | None = None,
    stats: SearchStats | None = None,
    search: Search | None = None,
    stop_when_stale: bool = False,
) -> Schedule:
    """The best schedule found from ``schedule`` by ``deadline`` (``time.perf_counter()``).

    ``schedule`` must be valid; so is every schedule this returns. ``search``
    (:mod:`pp_opt.solvers.process.stop`) ends it early when asked to stop. After two full
    sweeps without a gain (a local optimum for these windows) the search restarts at a
    random offset with a random window size and a longer ``step_limit`` (times
    :data:`STEP_LIMIT_GROWTH`), so the whole time to ``deadline`` is used; with
    ``stop_when_stale`` it returns there instead.
    """
    started = time.perf_counter()
    stats = stats if stats is not None else SearchStats()
    rng = random.Random(seed)
    fractions = sorted({op.fraction for op in schedule.ops if op.fraction != 1.0}) or [1.0]
    scaling = choose_scaling(schedule.problem, fractions)
    best = schedule
    walk = _Walk(size=window_ops, step_limit=step_limit)
    running: list[CpSolver] = []
    if search is not None:
        search.on_stop(lambda: _stop_all(running))
    overhead = 0.0  # a step's time outside its sub-solve (cutting, re-timing, validating)
    steps = 0
    while True:
        step_started = time.perf_counter()
        left = deadline - step_started - overhead
        if left < 0.05 or (search is not None and search.stopped):
            break
        starts = sorted(op.start for op in best.ops)
        n = len(starts)
        low, high, elastic_until = walk.bounds(starts, rng, elastic_ops)
        window = cut_window(best, low, high, elastic_until)
        stats.windows += 1
        steps += 1
        # The first step knows no overhead yet: it keeps half the time left for it.
        limit = min(walk.step_limit, left if steps > 1 else left / 2)
        solving = time.perf_counter()
        result = solve_window(best, window, scaling, waits=order_of(best).waits,
                              time_limit=limit, threads=threads,
                              seed=seed + stats.windows, running=running)  # fmt: skip
        solved = time.perf_counter()
        candidate = _kept(best, result, window, stats, on_improve)
        best = candidate if candidate is not None else best
        # A step's time outside its sub-solve's limit is kept back from the next limits, so
        # the last step ends about at the deadline, neither seconds early nor past the grace
        # its process gets (on 18,000 ops it is 1-2 s): a running mean that follows a
        # longer step at once.
        outside = (solving - step_started) + max(0.0, solved - solving - limit)
        outside += time.perf_counter() - solved
        overhead = outside if steps == 1 else max(outside, 0.5 * (overhead + outside))
        walk.step(n, gained=candidate is not None, optimal=result is not None and result.optimal)
        if walk.exhausted(n):
            if stop_when_stale:
                break
            walk.restart(n, rng, window_ops, stats)
    stats.seconds += time.perf_counter() - started
    return best


def _stop_all(running: list[CpSolver]) -> None:
    """Ask every sub-solve still running to stop."""
    for solver in list(running):
        solver.stop_search()


def _kept(
    best: Schedule,
    result: WindowResult | None,
    window: Window,
    stats: SearchStats,
    on_improve: Improved | None,
) -> Schedule | None:
    """The new incumbent from a window's sub-solve, or None if it gained nothing or did not
    check out; each gain is counted, logged and reported to ``on_improve``."""
    objective = best.problem.objective
    if result is None or result.objective >= best.objective_value(objective) - 1e-9:
        return None
    candidate = _accepted(best, result.ops)
    if candidate is None:
        return None
    stats.improvements += 1
    log.info("lns: %s %.6g (window %d ops at %.6g)", objective,
             candidate.objective_value(objective), len(window.free), window.start)  # fmt: skip
    if on_improve is not None:
        on_improve(candidate)
    return candidate


def _accepted(best: Schedule, ops: tuple[ScheduledOp, ...]) -> Schedule | None:
    """The window's ops re-timed exactly and validated, or None if they do not check out."""
    info = SolverInfo(name=best.solver.name, status=best.solver.status, objective=0.0,
                      extra=dict(best.solver.extra))  # fmt: skip
    raw = Schedule(problem=best.problem, ops=ops, solver=info,
                   metrics=compute_metrics(best.problem, ops), variant=best.variant)  # fmt: skip
    try:
        timed = checked_timing(raw, solver=info)
        if timed.objective_value() >= best.objective_value() - 1e-9:
            return None
        return timed
    except PPOptError as err:
        log.warning("lns step rejected: %s", err)
        return None
