"""The independent schedule validator: re-checks a timed schedule against its problem.

It shares nothing with whatever made the schedule (solver, baseline, simulator)
and nothing with :mod:`pp_opt.metrics`: dependencies come only from the DAG of the
schedule's variant (:func:`pp_opt.dag.dag_for`) and op costs and memory effects only
from :mod:`pp_opt.ops`. Each broken rule comes back as a :class:`Violation`
naming the rule, the op and device, and by how much; :data:`RULES` lists them.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from pp_opt.errors import ProblemError
from pp_opt.order import Variant
from pp_opt.problem import Problem
from pp_opt.schedule import Metrics, Schedule, ScheduledOp
from pp_opt.time_rule import TIME_TOLERANCE
from pp_opt.validator.context import Context, make_context
from pp_opt.validator.memory_check import check_memory
from pp_opt.validator.offload_checks import check_offload
from pp_opt.validator.op_checks import check_each_op, check_presence
from pp_opt.validator.runtime_checks import check_lower_bound, check_runtime_order
from pp_opt.validator.stored_metrics import check_metrics
from pp_opt.validator.timing_checks import check_dependencies, check_host_links, check_streams
from pp_opt.validator.violation import RULES, ValidationError, Violation

__all__ = [
    "RULES",
    "ValidationError",
    "Violation",
    "check_schedule",
    "require_valid",
    "validate",
]

logger = logging.getLogger(__name__)


def validate(schedule: Schedule, *, tol: float = TIME_TOLERANCE) -> list[Violation]:
    """Every rule the schedule breaks; an empty list means it is valid.

    Parameters
    ----------
    schedule
        A timed schedule with its problem and stored metrics.
    tol
        Relative tolerance (the time rule's 1e-7, docs/design.md §5, unless given): times are
        compared within ``tol * max(1, latest time)`` and a free that lands that much
        after an allocation counts as before it (:mod:`pp_opt.time_rule`); memory within
        ``tol * max(1, largest cap)``. Rounding in a solver's times is not reported, real
        conflicts are.

    Returns
    -------
    list[Violation]
        Grouped by check, in this order: ops present exactly once, each op on its
        own (stream, start, duration, fraction), offload and recompute, DAG edges,
        the runtimes' order rules (:mod:`pp_opt.runtime_rules`), streams, shared host
        links, memory caps, stored metrics and the stored lower bound (both skipped when
        some op has no stage of the problem or no finite time: that is reported already).
    """
    if not isinstance(schedule, Schedule):
        raise ProblemError("schedule", f"got {type(schedule).__name__}; expected a Schedule")
    if isinstance(tol, bool) or not isinstance(tol, int | float):
        raise ProblemError("tol", f"got {tol!r}; give a small non-negative number such as 1e-7")
    if not (math.isfinite(tol) and tol >= 0):
        raise ProblemError("tol", f"got {tol!r}; give a small non-negative number such as 1e-7")
    done = _op_checks(schedule, tol)
    violations = [
        *done.violations,
        *done.metric_checks(schedule.metrics),
        *check_lower_bound(done.ctx, schedule.solver),
    ]
    logger.debug(
        "validated %d ops: %d violation(s)%s",
        len(schedule.ops),
        len(violations),
        f", first: {violations[0]}" if violations else "",
    )
    return violations


_CHECKED: OrderedDict[tuple[int, Problem, Variant, float], _Checked] = OrderedDict()
"""The last few op checks: a schedule made from the same ops tuple (the solver's result
re-wrapped with its record, a schedule saved after a solve) is not checked twice."""
_CHECKED_KEPT = 4
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class _Checked:
    """The violations of one ops tuple: the checks of the ops, and of each metrics seen."""

    ops: tuple[ScheduledOp, ...]
    """Held, so that its ``id`` is not reused while the entry lives."""
    ctx: Context
    violations: list[Violation]
    metrics: dict[tuple[float, ...], list[Violation]] = field(default_factory=dict)

    def metric_checks(self, metrics: Metrics) -> list[Violation]:
        """:func:`check_metrics` of ``metrics`` (once per set of values)."""
        values = (metrics.makespan, metrics.bubble_rate, metrics.idle_fraction,
                  *metrics.span, *metrics.peak_memory, *metrics.busy)  # fmt: skip
        with _lock:
            found = self.metrics.get(values)
        if found is None:
            found = check_metrics(self.ctx, metrics)
            with _lock:
                self.metrics[values] = found
        return found


def _op_checks(schedule: Schedule, tol: float) -> _Checked:
    """The checks that depend only on the problem, the variant and the ops (all but the
    stored metrics and lower bound), done once per ops tuple."""
    key = (id(schedule.ops), schedule.problem, schedule.variant, tol)
    with _lock:
        done = _CHECKED.get(key)
        if done is not None and done.ops is schedule.ops:
            _CHECKED.move_to_end(key)
            return done
    ctx = make_context(schedule, tol)
    violations = [
        *check_presence(ctx),
        *check_each_op(ctx),
        *check_offload(ctx),
        *check_dependencies(ctx),
        *check_runtime_order(ctx),
        *check_streams(ctx),
        *check_host_links(ctx),
        *check_memory(ctx),
    ]
    done = _Checked(ops=schedule.ops, ctx=ctx, violations=violations)
    with _lock:
        _CHECKED[key] = done
        while len(_CHECKED) > _CHECKED_KEPT:
            _CHECKED.popitem(last=False)
    return done


def check_schedule(schedule: Schedule, *, tol: float = TIME_TOLERANCE) -> Schedule:
    """The schedule itself when it is valid; raises :class:`ValidationError` otherwise.

    Meant for the end of every path that hands a schedule out of the library,
    so that no caller has to trust the code that produced it.
    """
    violations = validate(schedule, tol=tol)
    if violations:
        raise ValidationError(violations)
    return schedule


def require_valid(
    schedule: Schedule, *, force: bool = False, action: str = "export"
) -> list[Violation]:
    """The one gate of every path that writes or shows a schedule (save, export, show).

    Raises :class:`ValidationError` naming the first violation (and how to go on anyway)
    when the schedule is invalid, unless ``force``: then it logs a warning and returns the
    violations, so the caller can say so loudly. Returns ``[]`` for a valid schedule.
    """
    violations = validate(schedule)
    if violations and not force:
        raise ValidationError(violations, action=action)
    if violations:
        logger.warning(
            "%s of an INVALID schedule forced (%d violations), first: %s",
            action, len(violations), violations[0],
        )  # fmt: skip
    return violations
