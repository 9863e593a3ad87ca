"""Schedules by name for a profiled problem: the solver's, classic ones, and offload ones.

The one place where the example and the fidelity benchmark call the solver, the baselines,
the offload pass, the simulator and the validator, so that a change of their API is adapted
here only.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from pp_opt.errors import ProblemError
from pp_opt.ops import OpKind
from pp_opt.orders import baseline, baseline_names
from pp_opt.orders.offload.offload_warm import with_offloads
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule
from pp_opt.simulator import order_of, simulate
from pp_opt.solvers import solve
from pp_opt.validator import check_schedule

logger = logging.getLogger(__name__)

SOLVED = ("cpsat", "cpsat-fused")
"""``cpsat``: the solver on the problem as profiled (PyTorch's I/W split: ``B`` and ``W``
ops); ``cpsat-fused``: the solver with the fused backward only (``BW`` ops, PyTorch's ``B``)."""
OFFLOAD_SUFFIX = "-offload"
"""``<name>-offload``: schedule ``<name>`` with every activation that has room for it copied
to host memory after its forward and back before its backward (:func:`with_offload`)."""


def schedule_names() -> list[str]:
    """The names :func:`plan_schedule` accepts (any of them may also end in ``-offload``)."""
    return [*SOLVED, *baseline_names()]


def plan_schedule(
    problem: Problem, name: str, *, time_limit: float = 10.0, threads: int = 1, seed: int = 0
) -> Schedule:
    """The schedule ``name`` (one of :func:`schedule_names`, maybe ``-offload``) for ``problem``.

    Solver runs give the same schedule for the same ``seed`` and ``threads`` when they end
    before ``time_limit`` (seconds).
    """
    if name.endswith(OFFLOAD_SUFFIX):
        base = plan_schedule(problem, name.removesuffix(OFFLOAD_SUFFIX), time_limit=time_limit,
                             threads=threads, seed=seed)  # fmt: skip
        return with_offload(base)
    if name == "cpsat":
        return _solve(problem, time_limit, threads, seed)
    if name == "cpsat-fused":
        return _solve(problem.replace(split_backward=False), time_limit, threads, seed)
    if name in baseline_names():
        return baseline(name, problem)
    known = ", ".join(schedule_names())
    raise ProblemError("schedule", f"unknown {name!r}; use one of {known} (or <name>-offload)")


def plan_schedules(
    problem: Problem,
    names: list[str] | tuple[str, ...],
    *,
    time_limit: float = 10.0,
    threads: int = 1,
    seed: int = 0,
) -> dict[str, Schedule]:
    """:func:`plan_schedule` for each name; ``X-offload`` reuses ``X`` when both are asked."""
    out: dict[str, Schedule] = {}
    for name in sorted(names, key=lambda n: n.endswith(OFFLOAD_SUFFIX)):
        base = name.removesuffix(OFFLOAD_SUFFIX)
        if name != base and base in out:
            out[name] = with_offload(out[base])
        else:
            out[name] = plan_schedule(problem, name, time_limit=time_limit, threads=threads,
                                      seed=seed)  # fmt: skip
    return {name: out[name] for name in names}


def with_offload(schedule: Schedule) -> Schedule:
    """``schedule`` with offloads in its copy streams' room, its compute timing kept.

    Each device's cap becomes the peak memory of the result, so the schedule is valid for the
    problem it carries (offload on); the validator checks it.
    """
    on = schedule.problem.replace(offload=True)
    if on.host_links:
        raise ProblemError(
            "host_links", "devices share a host link; give each its own to offload this way"
        )
    offloaded = simulate(with_offloads(on, schedule, 1.0), solver=schedule.solver)
    if not any(op.kind is OpKind.OFFLOAD for op in offloaded.ops):
        logger.warning("no activation of this schedule has room to be offloaded")
    devices = tuple(
        replace(dev, cap=peak)
        for dev, peak in zip(on.devices, offloaded.metrics.peak_memory, strict=True)
    )
    problem = on.replace(devices=devices)
    return check_schedule(replace(offloaded, problem=problem))


def _solve(problem: Problem, time_limit: float, threads: int, seed: int) -> Schedule:
    return solve(
        problem, solver="cpsat", time_limit=time_limit, threads=threads, seed=seed
    ).schedule


def with_measured_times(schedule: Schedule, op_times: dict[str, float]) -> Schedule:
    """``schedule``'s op order re-timed with other op durations (e.g. those the runtime ran).

    ``op_times`` maps ``"{kind}{stage}"`` (``F0``, ``B1``, ``W1``, ``BW0``) to ms; costs not in
    it keep the problem's. The order per device and stream is kept, so the difference to the
    measured iteration time is what the op durations do not explain (runtime overhead,
    communication, waits), and the difference to the prediction is what they do.
    """
    stages = []
    for s, st in enumerate(schedule.problem.stages):
        t_b = op_times.get(f"B{s}", st.t_b)
        t_w = op_times.get(f"W{s}", st.t_w)
        t_bw = op_times.get(f"BW{s}", st.fused_backward)
        stages.append(replace(st, t_f=op_times.get(f"F{s}", st.t_f), t_b=t_b, t_w=t_w, t_bw=t_bw))
    problem = schedule.problem.replace(stages=tuple(stages))
    return simulate(replace(order_of(schedule), problem=problem))
