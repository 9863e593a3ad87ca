"""Copies for a fixed compute order, pinned near its uncapped timing, a few microbatches at a time.

The fixed-order model (:mod:`.fixed_order`) of a whole problem with many microbatches is
too large for CP-SAT to place copies in well within seconds (the ``v`` offload family of
``bench_solvers.py --parts v-offload`` at m 32: no schedule at all in 60 s). Two
restrictions make it small and local:

- *pinned*: every compute op keeps its device's order and starts within a slack of its
  start in that order's timing without caps (:func:`~.fixed_order.order_makespan`'s
  timing): at most :data:`PIN_SLACK` longest compute ops plus :data:`PIN_RATE` of that
  start later. A good copy placement keeps the order's speed, so it lies in there;
- *rolling*: the model of the first :data:`FIRST_MICROBATCHES` microbatches (the
  problem with ``m`` cut to them, each device's order cut alike) is solved first; then
  the ops and copy choices of all but the last :data:`FREE_MICROBATCHES` of them are
  fixed, :data:`STEP_MICROBATCHES` more microbatches are added, and so on to ``m``.

Each window is the full CP-SAT model (:func:`~.model.build_model`) of a problem with fewer
microbatches, so every constraint holds within it; the last window is the whole problem,
its ops the answer (validated like any backend result). A window that finds nothing ends
the pass with no result. The microbatches still free overlap the ones added, so the
copies of a window can move to make room for the next microbatches' forwards; those fixed
are far enough back (about two round trips on the ``v`` family) that the later
microbatches do not run among them.

On that family (p 4, cap 2, copies of 0.8 on shared host links) this keeps the steady
state at the uncapped order's rate: m 32 in 91.21 against 90.16 for the order without
caps, where the greedy copies of :mod:`pp_opt.orders.offload.offload_links` give 100.57.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from ortools.sat.python import cp_model

from pp_opt.dag import dag_for
from pp_opt.ops import OpKey, Stream, duration
from pp_opt.order import Order
from pp_opt.orders.offload.offload_warm import roomy
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp
from pp_opt.simulator import simulate
from pp_opt.solvers.base import PIN_MIN_MICROBATCHES, OutOfTime, SolveOptions
from pp_opt.solvers.cpsat.fixed_order import compute_orders
from pp_opt.solvers.cpsat.model import CpsatModel, build_model
from pp_opt.solvers.cpsat.solution import read_ops
from pp_opt.solvers.process.stop import Search, handling_signals

__all__ = ["PIN_MIN_MICROBATCHES", "pinned_copies"]

log = logging.getLogger(__name__)

PIN_SLACK = 2.0
"""Longest compute ops a pinned op may start after its uncapped start (plus the rate)."""
PIN_RATE = 0.01
"""Share of its uncapped start a pinned op may start later on top of :data:`PIN_SLACK`: the
copies may slow the steady state by this much."""
FIRST_MICROBATCHES = 10
"""Microbatches of the first window (the warm-up, where the copies are hardest to fit)."""
STEP_MICROBATCHES = 4
"""Microbatches each later window adds."""
FREE_MICROBATCHES = 8
"""Microbatches at the end of each window that the next window may still move."""
FIRST_SHARE = 0.35
"""Share of the pass's time the first window may use; the later ones share the rest."""

Fixed = dict[OpKey, int]
"""Start (model units) of each op fixed by an earlier window (compute ops and the copies
of the choices taken)."""
Choices = dict[tuple[int, int], tuple[bool, ...]]
"""Per activation of the fixed microbatches, which offload choice it took."""


def pinned_copies(
    problem: Problem,
    schedule: Schedule,
    options: SolveOptions,
    *,
    until: float,
    search: Search | None = None,
) -> tuple[ScheduledOp, ...] | None:
    """The ops of ``schedule``'s compute order with copies placed window by window (module
    docstring) by ``until`` (``time.perf_counter()``); None when a window found nothing."""
    orders = compute_orders(schedule)
    uncapped = _uncapped(problem, schedule, orders)
    fixed: Fixed = {}
    choices: Choices = {}
    m = problem.m
    end = min(m, FIRST_MICROBATCHES)
    windows = 1 + max(0, -(-(m - end) // STEP_MICROBATCHES))
    for n in range(windows):
        left = until - time.perf_counter()
        if left < 0.2 or (search is not None and search.stopped):
            return None
        share = FIRST_SHARE * left if n == 0 and windows > 1 else left / (windows - n)
        sub = problem.replace(m=end)
        try:
            built = build_model(sub, dag_for(sub), replace(options, warm_start=None),
                                deadline=time.perf_counter() + share)  # fmt: skip
        except OutOfTime:
            return None
        _restrict(built, orders, uncapped, fixed, choices, end)
        solver = _solve(built, options, share, search)
        if solver is None and n > 0:  # once more with half of what is left, if any
            solver = _solve(built, options, 0.5 * (until - time.perf_counter()), search)
        if solver is None:
            log.info("pinned copies: nothing for the first %d microbatches", end)
            return None
        log.info("pinned copies: first %d microbatches in %.6g (%.2f of %.2f s)", end,
                 solver.value(built.objective) / built.scaling.time, solver.wall_time,
                 share)  # fmt: skip
        if end == m:
            return read_ops(solver, built.vars)
        keep = max(0, end + STEP_MICROBATCHES - FREE_MICROBATCHES)
        _fix(built, solver, keep, fixed, choices)
        end = min(m, end + STEP_MICROBATCHES)
    return None


def _uncapped(
    problem: Problem, schedule: Schedule, orders: list[list[OpKey]]
) -> dict[OpKey, float]:
    """Each compute op's start in the order's timing without caps and copies: no schedule
    of that order starts it earlier."""
    free = roomy(problem)
    streams = {(d, Stream.COMPUTE): keys for d, keys in enumerate(orders)}
    timed = simulate(Order(problem=free, streams=streams,
                           variant=schedule.variant._replace(offload=False)))  # fmt: skip
    return {op.key: op.start for op in timed.ops}


def _pins(problem: Problem, uncapped: dict[OpKey, float]) -> dict[OpKey, float]:
    """Latest start (problem units) of each compute op: its uncapped start plus the slack."""
    longest = max(duration(problem, key.kind, key.stage) for key in uncapped)
    return {key: start * (1 + PIN_RATE) + PIN_SLACK * longest for key, start in uncapped.items()}


def _restrict(
    built: CpsatModel,
    orders: list[list[OpKey]],
    uncapped: dict[OpKey, float],
    fixed: Fixed,
    choices: Choices,
    end: int,
) -> None:
    """Each device's order, the pins, the fixed ops. Where the order runs ops of later
    microbatches (not in the window) between two of the window's, the second waits for
    room for them: as long as they take, and no earlier than they can end."""
    model, ops, scale = built.model, built.vars.ops, built.scaling.time
    problem = built.vars.problem
    for keys in orders:
        last: OpKey | None = None
        later: list[OpKey] = []
        for key in keys:
            if key.microbatch >= end:
                later.append(key)
                continue
            if last is not None:
                _after(model, built, last, key, later, uncapped)
            last, later = key, []
    for key, latest in _pins(problem, uncapped).items():
        if key in ops:
            model.add(ops[key].start <= int(latest * scale))
    for key, start in fixed.items():
        if key in ops:
            model.add(ops[key].start == start)
    for act, taken in choices.items():
        for choice, value in zip(built.vars.offloads[act], taken, strict=True):
            model.add(choice.literal == int(value))
            if value:
                for op in (choice.offload, choice.reload):
                    model.add(op.start == fixed[op.key])


def _after(
    model: cp_model.CpModel,
    built: CpsatModel,
    a: OpKey,
    b: OpKey,
    between: list[OpKey],
    uncapped: dict[OpKey, float],
) -> None:
    """``b`` starts after ``a`` and the ops ``between`` them in the order (not in the model)
    ran, each no earlier than its uncapped start."""
    ops, scaling = built.vars.ops, built.scaling
    sizes = [scaling.t(duration(built.vars.problem, k.kind, k.stage)) for k in between]
    model.add(ops[b].start >= ops[a].start + ops[a].size + sum(sizes))
    for n, key in enumerate(between):
        model.add(ops[b].start >= int(uncapped[key] * scaling.time) + sum(sizes[n:]))


def _fix(built: CpsatModel, solver: cp_model.CpSolver, keep: int, fixed: Fixed,
         choices: Choices) -> None:  # fmt: skip
    """Record the ops and copy choices of the microbatches below ``keep``."""
    for key, op in built.vars.ops.items():
        if key.microbatch < keep:
            fixed[key] = solver.value(op.start)
    for (s, j), options in built.vars.offloads.items():
        if j >= keep:
            continue
        taken = tuple(solver.boolean_value(c.literal) for c in options)
        choices[(s, j)] = taken
        for choice, value in zip(options, taken, strict=True):
            if value:
                fixed[choice.offload.key] = solver.value(choice.offload.start)
                fixed[choice.reload.key] = solver.value(choice.reload.start)


def _solve(
    built: CpsatModel, options: SolveOptions, seconds: float, search: Search | None
) -> cp_model.CpSolver | None:
    """One window's solve; the solver when it found a schedule."""
    solver = cp_model.CpSolver()
    params = solver.parameters
    if seconds < 0.2:
        return None
    params.max_time_in_seconds = seconds
    params.num_workers = max(1, options.threads)
    params.random_seed = options.seed
    # The parallel portfolio, not ``interleave_search``: on the v family at m 16 its windows
    # end in 2-4 s where the interleaved search needs 15 s. Which optimum of a window it
    # returns depends on the threads' timing, as in the large-neighbourhood search.
    if handling_signals():
        params.catch_sigint_signal = False
    if search is not None:
        search.on_stop(solver.stop_search)
    code = solver.solve(built.model)
    return solver if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
