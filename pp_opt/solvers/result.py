"""What :func:`pp_opt.solvers.solve` returns: the schedule, and the warm start it began from."""

from __future__ import annotations

from dataclasses import dataclass

from pp_opt.schedule import Schedule, Status


@dataclass(kw_only=True, slots=True, frozen=True)
class WarmStart:
    """The schedule a solve started from."""

    name: str
    """Generator name (and setting), or ``given`` for a schedule passed in."""
    objective: float


@dataclass(kw_only=True, slots=True, frozen=True)
class SolveResult:
    """A validated schedule and how it was found; the numbers are read from
    ``schedule.solver`` (one record, written to JSON as it is)."""

    schedule: Schedule
    warm_start: WarmStart | None

    @property
    def status(self) -> Status:
        """``optimal`` (proved) or ``feasible``; infeasible caps raise
        :class:`~pp_opt.errors.InfeasibleError`, and a backend that found nothing in time
        hands over the warm start as ``feasible`` (its own status is kept in
        ``schedule.solver.extra["backend_status"]``)."""
        return self.schedule.solver.status

    @property
    def objective(self) -> float:
        """The simulator's objective of :attr:`schedule` (re-timing its order gives it again)."""
        return self.schedule.solver.objective

    @property
    def lower_bound(self) -> float:
        bound = self.schedule.solver.lower_bound
        return self.objective if bound is None else bound

    @property
    def gap(self) -> float:
        """``(objective - lower_bound) / objective``."""
        gap = self.schedule.solver.gap
        return 0.0 if gap is None else gap

    @property
    def seconds(self) -> float:
        """Wall time of the whole solve (warm starts, model, search, checks)."""
        return self.schedule.solver.seconds
