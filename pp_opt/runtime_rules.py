"""Order rules of the runtimes that execute pp_opt's schedules, in one place.

The op DAG (:mod:`pp_opt.dag`) says what an op needs; a runtime may need more. PyTorch's
pipeline runtime (``_PipelineScheduleRuntime``, which runs the exported CSV and
:mod:`pp_opt.runtime`; checked on torch 2.5 to 2.13) computes the loss right after each
forward of the last stage and *appends* it to a list; the backward of microbatch ``j``
then reads entry ``j`` of that list (``Loss for microbatch j is not available``, or the
loss of another microbatch). The last stage's outputs are merged in the same order. So:

    **the forwards of the last stage run in microbatch order**:
    ``F(S-1, j)`` ends before ``F(S-1, j+1)`` starts, for every ``j``.

Nothing is lost by the rule: microbatches are interchangeable, so numbering them in the
order the last stage runs their forwards turns any schedule into one that keeps it, with
the same times, memory and objective (:func:`in_runtime_order`).

Who uses what:

- :func:`runtime_chains` lists the rule as pairs ``(a, b)``: ``b`` starts no earlier than
  ``a`` ends (same device, same stream). The CP-SAT and MILP models add each pair as a
  precedence; any other model (e.g. a large-neighbourhood search over windows of a
  schedule) must add them too, or renumber its result with :func:`in_runtime_order`.
- The validator (:mod:`pp_opt.validator`) checks each pair (rule ``runtime_order``).
- Order generators' schedules are renumbered with :func:`in_runtime_order`
  (:mod:`pp_opt.orders.named`, :mod:`pp_opt.orders.search.warm_starts`).
"""

from __future__ import annotations

from dataclasses import replace

from pp_opt.ops import OpKey, OpKind
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp, dag_ops

RULE = (
    "PyTorch's pipeline runtime needs the last stage's forwards in microbatch order "
    "(it keeps each loss in the order the forwards ran)"
)
"""Why :func:`runtime_chains` exists, for messages."""


def loss_stage(problem: Problem) -> int:
    """The stage whose forwards compute the loss: the last one."""
    return problem.num_stages - 1


def runtime_chains(problem: Problem) -> list[tuple[OpKey, OpKey]]:
    """Pairs ``(a, b)``: ``b`` may start only once ``a`` has ended (same device and stream).

    Today: ``F(S-1, j) -> F(S-1, j+1)`` for ``j = 0..m-2``. The ops exist in every DAG
    variant (split or fused backward, with or without offload and recompute). In the
    ``dual`` placement each copy's last stage keeps its own microbatches in order.
    """
    return [(OpKey(OpKind.F, route[-1], j), OpKey(OpKind.F, route[-1], j + 1))
            for route, mbs in problem.routes() for j in mbs[:-1]]  # fmt: skip


def in_runtime_order(schedule: Schedule) -> Schedule:
    """The same schedule with microbatches renumbered so that :func:`runtime_chains` hold.

    Microbatch ``k`` becomes the one whose last-stage forward runs ``k``-th; every op of a
    microbatch (all stages, copies, recompute) is renumbered alike, times unchanged. The
    schedule itself comes back when it keeps the rule already or when its last-stage
    forwards are not one per microbatch (the validator reports that).
    """
    labels: dict[int, int] = {}
    for route, mbs in schedule.problem.routes():  # renumbered within each copy (dual)
        forwards = sorted(
            (op for op in dag_ops(schedule.ops) if op.kind is OpKind.F and op.stage == route[-1]),
            key=lambda op: (op.start, op.microbatch),
        )
        mine = {op.microbatch: mbs.start + k for k, op in enumerate(forwards)}
        if len(mine) != len(forwards) or sorted(mine) != list(mbs):
            return schedule
        labels.update(mine)
    if all(old == new for old, new in labels.items()):
        return schedule
    ops = tuple(_renumbered(op, labels) for op in schedule.ops)
    return replace(schedule, ops=ops)


def _renumbered(op: ScheduledOp, labels: dict[int, int]) -> ScheduledOp:
    """``op`` with its microbatch (and a pair's backward half's) renumbered by ``labels``."""
    back = op.partner
    if back is not None:
        back = back._replace(microbatch=labels[back.microbatch])
    return replace(op, microbatch=labels[op.microbatch], partner=back)
