"""Every schedule PyTorch ships, as op orders under PyTorch's own class names.

The names are those ``torch.distributed.pipelining.schedules.get_schedule_class`` takes
(``ScheduleGPipe`` is ``GPipe``, and so on; the catalogue, with the placement each name
implies, is :mod:`pp_opt.frameworks.pytorch`); each generator returns, per device, the
compute actions PyTorch's schedule runs on that rank, in PyTorch's order
(``_get_pipeline_order`` / ``_calculate_single_rank_operations`` of torch 2.13), with
PyTorch's checks on the problem raised as :class:`~pp_opt.errors.ProblemError`.

- ``GPipe``: all forwards, then all fused backwards (the order of ``gpipe``).
- ``1F1B``: ``p - 1 - i`` warm-up forwards, then one forward, one fused backward (the
  order of ``1f1b``); PyTorch needs ``m >= p``.
- ``Interleaved1F1B``: Megatron-LM's interleaved 1F1B on the ``loop`` placement with the
  problem's ``v >= 1`` (``v = 1`` warms up with ``2 (p - 1 - i)`` forwards, not 1F1B's
  ``p - 1 - i``); microbatches go in ``max(1, m // p)`` rounds, which must divide ``m``.
- ``LoopedBFS``: breadth-first (Lamy-Poirier, 2022): every microbatch's forward on each
  local stage in turn, then the fused backwards, last stage first, newest microbatch first.
- ``InterleavedZeroBubble``: the Zero Bubble paper's ZB-1P on the ``loop`` placement:
  interleaved 1F1B with split ``B`` and ``W``, rank ``i`` deferring ``W`` by ``i`` ops
  (same rounds rule as Interleaved1F1B).
- ``ZBVZeroBubble``: ZB-V on the ``v`` placement (the order of ``zb-v``).
- ``DualPipeV``: DeepSeek's DualPipe folded onto the ``v`` placement (``m >= 2p``).
  PyTorch overlaps a forward of one chunk with a backward of the other in one action
  (``OVERLAP_F_B``); that overlap is not modelled: the forward runs, then the backward.
  Its full backwards are a ``B`` followed at once by its ``W`` (the problem's DAG has one
  backward split for all stages), so the gradient leaves a stage after ``B`` rather than
  after the whole backward.

Every one is listed in :data:`PYTORCH_SCHEDULES`; ``pp_opt.baseline(NAME, problem)`` times
and validates it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from pp_opt.errors import ProblemError
from pp_opt.frameworks.pytorch import PYTORCH_SCHEDULES, SCHEDULE_NAMES
from pp_opt.ops import OpKey, OpKind
from pp_opt.order import Order
from pp_opt.orders.common import (
    FUSED,
    SPLIT,
    compute_order,
    require_split_backward,
    with_placement,
)
from pp_opt.orders.patterns.classic import gpipe, one_f_one_b
from pp_opt.orders.patterns.vshape import zb_v
from pp_opt.problem import Problem

F, B, W, BW = OpKind.F, OpKind.B, OpKind.W, OpKind.BW

__all__ = ["DESCRIPTIONS", "GENERATORS", "PYTORCH_SCHEDULES"]


# ---------------------------------------------------------------- one chunk per device


def pytorch_gpipe(problem: Problem) -> Order:
    """``ScheduleGPipe``: the order of :func:`pp_opt.orders.patterns.classic.gpipe`."""
    return gpipe(problem)


def pytorch_1f1b(problem: Problem) -> Order:
    """``Schedule1F1B``: the order of :func:`pp_opt.orders.patterns.classic.one_f_one_b`;
    ``m >= p``."""
    if problem.m < problem.p:
        raise ProblemError(
            "m",
            f"PyTorch's 1F1B needs at least as many microbatches as stages; got m = "
            f"{problem.m} for p = {problem.p}: set m >= {problem.p} or use 1f1b",
        )
    return one_f_one_b(problem)


# ---------------------------------------------------------------- loop placement, v >= 1


def _loop(problem: Problem, name: str) -> Problem:
    """The problem on the ``loop`` placement with its own chunk count."""
    return with_placement(problem, name, SCHEDULE_NAMES[name].placement, problem.v)


def microbatches_per_round(p: int, m: int, name: str) -> int:
    """PyTorch's round size for the interleaved schedules; ``m`` must be a multiple of the
    round count ``max(1, m // p)``."""
    rounds = max(1, m // p)
    if m % rounds:
        fits = next(k for k in range(m + 1, 2 * m + p) if k % max(1, k // p) == 0)
        raise ProblemError(
            "m",
            f"PyTorch's {name} needs m to be a multiple of its round count max(1, m // p) = "
            f"{rounds}; got m = {m} for p = {p}: use m = {fits} (m <= p or a multiple of "
            "the rounds), or interleaved-1f1b",
        )
    return m // rounds


def _interleaved_rank(p: int, m: int, v: int, rank: int, *, zero_bubble: bool) -> list[OpKey]:
    """One rank of PyTorch's ``_get_1f1b_rank_ops``: Interleaved1F1B or, with
    ``zero_bubble``, InterleavedZeroBubble (backward split, ``W`` deferred by ``rank``)."""
    per_round = microbatches_per_round(p, m, "InterleavedZeroBubble" if zero_bubble
                                       else "Interleaved1F1B")  # fmt: skip
    total = v * m
    warmup = min((v - 1) * per_round + (1 if zero_bubble else 2) * (p - 1 - rank), total)

    def forward_stage(step: int) -> int:
        return (step // per_round) % v * p + rank

    def backward_stage(step: int) -> int:
        return (v - 1 - ((step - warmup) // per_round) % v) * p + rank

    count: dict[tuple[OpKind, int], int] = defaultdict(int)
    ops: list[OpKey] = []

    def put(kind: OpKind, stage: int) -> None:
        ops.append(OpKey(kind, stage, count[(kind, stage)]))
        count[(kind, stage)] += 1

    backward_kind = B if zero_bubble else BW
    backward_steps: list[int] = []
    weights = 0
    for step in range(total + warmup):
        if step < total:
            put(F, forward_stage(step))
        if step >= warmup:
            put(backward_kind, backward_stage(step))
            backward_steps.append(step)
            if zero_bubble and step - warmup >= rank:
                put(W, backward_stage(backward_steps[weights]))
                weights += 1
    if zero_bubble:
        for step in backward_steps[weights:]:
            put(W, backward_stage(step))
    return ops


def _interleaved(problem: Problem, name: str, *, zero_bubble: bool) -> Order:
    if zero_bubble:
        require_split_backward(problem, name)
    problem = _loop(problem, name)
    p, m, v = problem.p, problem.m, problem.v
    microbatches_per_round(p, m, name)  # PyTorch's check, before any work
    per_device = [_interleaved_rank(p, m, v, r, zero_bubble=zero_bubble) for r in range(p)]
    return compute_order(problem, per_device, SPLIT if zero_bubble else FUSED, name)


def pytorch_interleaved_1f1b(problem: Problem) -> Order:
    """``ScheduleInterleaved1F1B`` on the ``loop`` placement with the problem's ``v``."""
    return _interleaved(problem, "Interleaved1F1B", zero_bubble=False)


def pytorch_interleaved_zero_bubble(problem: Problem) -> Order:
    """``ScheduleInterleavedZeroBubble`` (ZB-1P) on the ``loop`` placement."""
    return _interleaved(problem, "InterleavedZeroBubble", zero_bubble=True)


def pytorch_looped_bfs(problem: Problem) -> Order:
    """``ScheduleLoopedBFS``: all forwards stage by stage, then the fused backwards in reverse."""
    problem = _loop(problem, "LoopedBFS")
    p, m, v = problem.p, problem.m, problem.v
    per_device = []
    for r in range(p):
        stages = [c * p + r for c in range(v)]
        ops = [OpKey(F, s, j) for s in stages for j in range(m)]
        ops += [OpKey(BW, s, j) for s in reversed(stages) for j in reversed(range(m))]
        per_device.append(ops)
    return compute_order(problem, per_device, FUSED, "LoopedBFS")


# ---------------------------------------------------------------- v placement


def pytorch_zbv(problem: Problem) -> Order:
    """``ScheduleZBVZeroBubble``: the order of :func:`pp_opt.orders.patterns.vshape.zb_v`."""
    return zb_v(problem)


class _DualPipeRank:
    """One rank of DualPipeV: per-(stage, kind) microbatch counters and the queue of the
    ``W`` ops its split backwards leave."""

    def __init__(self, stages: tuple[int, int]) -> None:
        self.stages = stages
        self.count: dict[tuple[int, OpKind], int] = defaultdict(int)
        self.queue: list[OpKey] = []
        self.ops: list[OpKey] = []
        self.pairs: dict[OpKey, OpKey] = {}
        """Each ``OVERLAP_F_B``: its forward's key and its backward's (``B``, before its ``W``)."""

    def forward(self, chunk: int) -> None:
        stage = self.stages[chunk]
        self.ops.append(OpKey(F, stage, self.count[(stage, F)]))
        self.count[(stage, F)] += 1

    def backward(self, chunk: int, *, full: bool) -> None:
        """A full backward (``B`` then its ``W`` at once) or a split one (``W`` queued)."""
        stage = self.stages[chunk]
        j = self.count[(stage, B)]
        self.count[(stage, B)] += 1
        self.ops.append(OpKey(B, stage, j))
        if full:
            self.ops.append(OpKey(W, stage, j))
        else:
            self.queue.append(OpKey(W, stage, j))

    def weight(self) -> None:
        if self.queue:
            self.ops.append(self.queue.pop(0))

    def overlap(self, forward: int, backward: int, *, paired: bool = True) -> None:
        """PyTorch's ``OVERLAP_F_B``: forward, then full backward, in :attr:`pairs` when
        ``paired`` (PyTorch's own plain ``F`` then ``B`` when not)."""
        self.forward(forward)
        self.backward(backward, full=True)
        if paired:
            self.pairs[self.ops[-3]] = self.ops[-2]


def dual_pipe_v_rank(rank: int, p: int, m: int) -> list[OpKey]:
    """PyTorch's DualPipeV order of one rank (stages ``rank`` and ``2p - 1 - rank``)."""
    return dual_pipe_v_steps(rank, p, m).ops


def dual_pipe_v_steps(
    rank: int, p: int, m: int, stages: tuple[int, int] | None = None
) -> _DualPipeRank:
    """PyTorch's DualPipeV of one rank (``_calculate_single_rank_operations``, torch 2.13):
    its order and its overlapped pairs. ``stages`` are its chunks 0 and 1 (``rank`` and
    ``2p - 1 - rank`` by default); DeepSeek's DualPipe runs the same steps on each half of
    its ranks, with other chunks."""
    o = _DualPipeRank(stages or (rank, 2 * p - 1 - rank))
    for _ in range(2 * (p - rank - 1)):  # 1: F0
        o.forward(0)
    for _ in range(rank + 1):  # 2: F0 F1
        o.forward(0)
        o.forward(1)
    for _ in range(p - rank - 1):  # 3: I1 W F1
        o.backward(1, full=False)
        o.weight()
        o.forward(1)
    for i in range(m - 2 * p + rank + 1):  # 4: F0B1 F1B0 (overlapped in PyTorch)
        o.overlap(0, 1, paired=not (i == 0 and rank == p - 1))  # PyTorch: "to further
        o.overlap(1, 0)  # reduce bubble size", the last rank's first one is not overlapped
    for _ in range(p - rank - 1):  # 5: B1, F1B0
        o.backward(1, full=True)
        o.overlap(1, 0)
    split = False
    half = (rank + 1) // 2
    for i in range(rank + 1):  # 6: B1 B0, the second half split
        split = split or (i == half and rank % 2 == 1)
        o.backward(1, full=not split)
        split = split or (i == half and rank % 2 == 0)
        o.backward(0, full=not split)
    for _ in range(p - rank - 1):  # 7: W, B0
        o.weight()
        o.backward(0, full=not split)
    for _ in range(rank + 1):  # 8: W
        o.weight()
    return o


def pytorch_dual_pipe_v(problem: Problem) -> Order:
    """``ScheduleDualPipeV`` on the ``v`` placement, its overlapped pairs run in sequence."""
    require_split_backward(problem, "DualPipeV")
    problem = with_placement(problem, "DualPipeV", SCHEDULE_NAMES["DualPipeV"].placement, 2)
    p, m = problem.p, problem.m
    if m < 2 * p:
        raise ProblemError(
            "m",
            f"PyTorch's DualPipeV needs at least as many microbatches as stages (2p = "
            f"{2 * p}); got m = {m}: set m >= {2 * p} or use ZBVZeroBubble",
        )
    per_device = [dual_pipe_v_rank(r, p, m) for r in range(p)]
    return compute_order(problem, per_device, SPLIT, "DualPipeV")


GENERATORS: dict[str, Callable[[Problem], Order]] = {
    "GPipe": pytorch_gpipe,
    "1F1B": pytorch_1f1b,
    "Interleaved1F1B": pytorch_interleaved_1f1b,
    "LoopedBFS": pytorch_looped_bfs,
    "InterleavedZeroBubble": pytorch_interleaved_zero_bubble,
    "ZBVZeroBubble": pytorch_zbv,
    "DualPipeV": pytorch_dual_pipe_v,
}
"""PyTorch's name -> its generator, in :data:`PYTORCH_SCHEDULES` order."""

DESCRIPTIONS: dict[str, str] = {
    "GPipe": "PyTorch's ScheduleGPipe: all forwards, then all backwards (= gpipe)",
    "1F1B": "PyTorch's Schedule1F1B, m >= p (= 1f1b)",
    "Interleaved1F1B": "PyTorch's ScheduleInterleaved1F1B (loop, v >= 1, rounds divide m)",
    "LoopedBFS": "PyTorch's ScheduleLoopedBFS: breadth-first over local stages (loop)",
    "InterleavedZeroBubble": "PyTorch's ScheduleInterleavedZeroBubble, ZB-1P (loop, B/W split)",
    "ZBVZeroBubble": "PyTorch's ScheduleZBVZeroBubble (v placement, = zb-v)",
    "DualPipeV": "PyTorch's ScheduleDualPipeV, order only, F/B overlap run in sequence (v)",
}
"""One line per PyTorch schedule, for listings."""
