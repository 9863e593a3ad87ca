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

from pp_opt.errors import ProblemError
from pp_opt.schedule import Schedule
from pp_opt.validator.context import make_context
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


def validate(schedule: Schedule, *, tol: float = 1e-6) -> list[Violation]:
    """Every rule the schedule breaks; an empty list means it is valid.

    Parameters
    ----------
    schedule
        A timed schedule with its problem and stored metrics.
    tol
        Relative tolerance: times are compared within ``tol * max(1, latest time)``,
        memory within ``tol * max(1, largest cap)``, so rounding in a solver's
        times or in a JSON file is not reported but real conflicts are.

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
        raise ProblemError("tol", f"got {tol!r}; give a small non-negative number such as 1e-6")
    if not (math.isfinite(tol) and tol >= 0):
        raise ProblemError("tol", f"got {tol!r}; give a small non-negative number such as 1e-6")
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
        *check_metrics(ctx, schedule.metrics),
        *check_lower_bound(ctx, schedule.solver),
    ]
    logger.debug(
        "validated %d ops: %d violation(s)%s",
        len(schedule.ops),
        len(violations),
        f", first: {violations[0]}" if violations else "",
    )
    return violations


def check_schedule(schedule: Schedule, *, tol: float = 1e-6) -> Schedule:
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
