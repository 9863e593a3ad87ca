"""What every solver backend takes and returns, so the API treats CP-SAT and MILP alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp, Status
from pp_opt.solvers.process.stop import StopToken


@dataclass(frozen=True, slots=True)
class Progress:
    """One progress report: the incumbent and the best bound so far."""

    seconds: float
    objective: float | None
    bound: float | None


ProgressCallback = Callable[[Progress], None]


@dataclass(kw_only=True, slots=True, frozen=True)
class SolveOptions:
    """The options of one solve, as every backend reads them.

    :func:`pp_opt.solve` makes one from its arguments; each phase gets a copy with what it
    adds (its share of the time, the warm start), made with :func:`dataclasses.replace`:
    nothing writes into a solve's options while it runs.
    """

    time_limit: float = 60.0
    """Wall-clock seconds: of the whole solve as :func:`pp_opt.solve` made them, of the
    phase in the copy a backend gets (its share of the time left)."""
    threads: int = 2
    """Worker threads (CP-SAT workers, MILP threads)."""
    seed: int = 0
    """Random seed; the same seed and threads give the same schedule."""
    objective: str = "makespan"
    """``makespan`` or ``span`` (docs/design.md §4)."""
    warm_start: Schedule | None = None
    """A valid schedule to start from (a hint); the answer is never worse than it."""
    progress: ProgressCallback | None = None
    """Called as the incumbent or the bound improves; None for silence."""
    offload_fractions: tuple[float, ...] = (1.0,)
    """Fractions of an activation an ``OFFLOAD`` may move (when the problem allows offload)."""
    alternatives: tuple[Schedule, ...] = ()
    """Further warm starts of other compute orders (with offload): CP-SAT re-places the
    copies of the most promising ones with their compute order fixed
    (:mod:`pp_opt.solvers.cpsat.fixed_order`) before the full model."""
    memory_model: str = "auto"
    """CP-SAT's memory constraints: ``sequence`` (over each device's op order,
    :mod:`pp_opt.solvers.cpsat.sequence`; no offload or recompute), ``cumulative`` (a
    cumulative of lifetimes) or ``auto`` (sequence where it applies)."""
    stop: StopToken | None = None
    """The caller's request to end the solve early (:class:`StopToken`); None: nothing
    but the time limit and the progress callback ends it. Stays in the process that made
    it: a child process gets its own, relayed over its pipe."""


PIN_MIN_MICROBATCHES = 12
"""An offload problem whose copies are weak (shared host links, or placements beyond
``loop``) with this many microbatches or more gets its fastest compute order's copies
placed window by window (:mod:`pp_opt.solvers.cpsat.pinned`), and the CP-SAT backend
most of its solve's time for that; smaller ones are left to the whole fixed-order
model."""


def pins_copies(problem: Problem) -> bool:
    """Whether a CP-SAT solve of ``problem`` places copies window by window first."""
    weak = bool(problem.host_links) or problem.placement != "loop"
    return problem.offload and weak and problem.m >= PIN_MIN_MICROBATCHES


class OutOfTime(Exception):
    """Building a model used up the backend's time; it then reports ``timeout``."""


def check_time(deadline: float | None) -> None:
    """Raise :class:`OutOfTime` once ``time.perf_counter()`` is past ``deadline``.

    Backends call it between the steps of building their model, so a large model does
    not overrun the time limit by its whole build time.
    """
    if deadline is not None and time.perf_counter() > deadline:
        raise OutOfTime


@dataclass(kw_only=True, slots=True)
class BackendResult:
    """What a backend found, before the API validates it and computes metrics."""

    status: Status
    """``optimal``, ``feasible``, ``infeasible`` or ``timeout`` (nothing found in time)."""
    objective: float | None
    bound: float | None
    seconds: float
    ops: tuple[ScheduledOp, ...] | None
    """The timed ops of the best schedule found, or None."""
    rounding: float = 0.0
    """The largest relative error of the model's rounded times (0: exact): a schedule within
    about twice that of ``bound`` is all the model can prove (``cpsat.scaling.time_rounding``)."""
