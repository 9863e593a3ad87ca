"""PyTorch pipelining CSV (docs/design.md §6): the per-rank action order that
``torch.distributed.pipelining._PipelineScheduleRuntime._load_csv`` runs.

One row per rank; each cell is ``{stage}{type}{microbatch}`` with ``F`` forward,
``I`` backward-input (our ``B``), ``W`` backward-weight and ``B`` fused backward
(our ``BW``); an overlapped pair ``FB`` is ``({s}F{i};{s2}I{j})OVERLAP_F_B`` (``B`` for a
fused backward half), which PyTorch (>= 2.8) runs as its two halves in sequence unless a
function is registered for ``OVERLAP_F_B``. ``compute_only`` lists compute actions in the
schedule's order and lets PyTorch add communication; ``compute_comms`` also places
``SEND_F/RECV_F/SEND_B/RECV_B`` and ``{stage}REDUCE_GRAD`` where the solved times
put them: a send right after the op that produces it, a receive at the time its
message is sent (before the op that consumes it), so receives between two ranks
are posted in the order the sends are.

PyTorch has no offload action: :func:`torch_actions` with ``with_offload=True``
also yields ``OFFLOAD``/``RELOAD`` actions, which only :mod:`pp_opt.runtime`
executes. This module does not import torch.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pp_opt.errors import PPOptError, ProblemError
from pp_opt.ops import COPY_KINDS, OpKey, OpKind, Stream
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp, dag_ops
from pp_opt.time_rule import counts_before, time_slack

logger = logging.getLogger(__name__)

FORMATS = ("compute_only", "compute_comms")
TORCH_TYPE = {OpKind.F: "F", OpKind.B: "I", OpKind.W: "W", OpKind.BW: "B"}
"""PyTorch's action letter of each compute op kind."""
OVERLAP = "OVERLAP_F_B"
"""PyTorch's action of an overlapped pair (our ``FB``)."""


class TorchAction(NamedTuple):
    """One cell of the CSV: an action of one rank, written ``{stage}{kind}{microbatch}``."""

    stage: int
    kind: str
    """``F``, ``I``, ``W``, ``B``, ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``,
    ``REDUCE_GRAD``, or (runtime only) ``OFFLOAD`` / ``RELOAD``."""
    microbatch: int | None = None
    sub: tuple[TorchAction, ...] = ()
    """The halves of an ``OVERLAP_F_B`` action (its ``stage`` is -1, as in PyTorch)."""

    def __str__(self) -> str:
        if self.sub:
            return f"({';'.join(str(a) for a in self.sub)}){self.kind}"
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.kind}{mb}"

    @property
    def is_compute(self) -> bool:
        return self.kind in ("F", "I", "W", "B", OVERLAP)

    def computes(self) -> tuple[TorchAction, ...]:
        """The compute actions it runs: its halves for a pair, else itself."""
        return self.sub or (self,)


def torch_csv_rows(
    schedule: Schedule,
    *,
    format: str = "compute_only",
    drop_offload: bool = False,
    fused_backward: bool = False,
) -> list[list[str]]:
    """The CSV cells, one list per rank.

    Parameters
    ----------
    schedule
        A timed schedule; its per-device compute order becomes each rank's row.
    format
        ``compute_only`` (PyTorch adds communication itself) or ``compute_comms``.
    drop_offload
        A schedule with ``OFFLOAD``/``RELOAD`` ops cannot run on plain PyTorch:
        by default this raises; ``True`` writes its compute order without them
        (the activations then stay on the GPU) and logs a warning.
    fused_backward
        Write each microbatch's ``I`` and ``W`` as one ``B`` at the ``I``'s place, in the
        same order (``compute_only`` only): for a job whose activation checkpointing cannot
        run a split backward. :func:`pp_opt.export.fused.fused_backward_schedule` times it.
    """
    for name, value in (("drop_offload", drop_offload), ("fused_backward", fused_backward)):
        if not isinstance(value, bool):
            raise ProblemError(name, f"got {value!r}; expected True or False")
    if fused_backward and format != "compute_only":
        raise ProblemError(
            "fused_backward", "only the compute_only format (torch-csv) fuses the backward; "
            "PyTorch adds the communication of a fused B itself"
        )  # fmt: skip
    _refuse_offload(schedule, drop_offload)
    actions = torch_actions(schedule, format=format, with_offload=False)
    if fused_backward:
        actions = {rank: fuse_backward(row) for rank, row in actions.items()}
    return [[str(a) for a in actions[rank]] for rank in range(schedule.problem.p)]


def fuse_backward(actions: list[TorchAction]) -> list[TorchAction]:
    """``I`` becomes a fused ``B`` where it stands; its ``W`` is dropped."""

    def fused(a: TorchAction) -> TorchAction:
        if a.sub:
            return a._replace(sub=tuple(fused(half) for half in a.sub))
        return TorchAction(a.stage, "B", a.microbatch) if a.kind == "I" else a

    return [fused(a) for a in actions if a.kind != "W"]


def write_torch_csv(
    schedule: Schedule,
    path: str | Path,
    *,
    format: str = "compute_only",
    drop_offload: bool = False,
    fused_backward: bool = False,
    force: bool = False,
) -> None:
    """Write :func:`torch_csv_rows` to ``path`` for ``_PipelineScheduleRuntime._load_csv``.

    Load it with the same ``format`` and with ``n_microbatches`` equal to the
    schedule's ``m``; each stage must live on the rank the schedule gives it. The
    schedule is validated first (``force`` writes an invalid one anyway, with a
    warning); the file is written whole or not at all.
    """
    from pp_opt.atomic import atomic_write
    from pp_opt.validator import require_valid

    require_valid(schedule, force=force, action="export")
    rows = torch_csv_rows(
        schedule, format=format, drop_offload=drop_offload, fused_backward=fused_backward
    )
    with atomic_write(path, newline="", field="path") as f:
        csv.writer(f).writerows(rows)


def torch_actions(
    schedule: Schedule, *, format: str = "compute_only", with_offload: bool = False
) -> dict[int, list[TorchAction]]:
    """Per rank, the actions in execution order (``OFFLOAD``/``RELOAD`` included on request)."""
    if format not in FORMATS:
        raise ProblemError("format", f"unknown {format!r}; use 'compute_only' or 'compute_comms'")
    problem = schedule.problem
    if problem.placement == "dual":
        raise ProblemError("schedule", "a dual-placement (DualPipe) schedule runs two copies "
                           "of the model, which PyTorch pipelining cannot; run it with "
                           "DeepSeek's DualPipe, or export a v-placement schedule")  # fmt: skip
    recomputed = [op for op in schedule.ops if op.kind is OpKind.R]
    if recomputed:
        raise PPOptError(
            f"the schedule recomputes {len(recomputed)} forwards (R ops); PyTorch pipelining "
            "has no recompute action: solve without recompute, or checkpoint inside the model"
        )
    blocks = {rank: _rank_blocks(schedule, rank, format) for rank in range(problem.p)}
    if format == "compute_comms":
        _insert_receives(problem, blocks, time_slack(schedule.ops))
    return {
        rank: [
            a
            for block in blocks[rank]
            for a in block.actions
            if with_offload or a.kind not in ("OFFLOAD", "RELOAD")
        ]
        for rank in range(problem.p)
    }


def has_offload(schedule: Schedule) -> bool:
    return any(op.kind in COPY_KINDS for op in schedule.ops)


def _refuse_offload(schedule: Schedule, drop_offload: bool) -> None:
    count = sum(1 for op in schedule.ops if op.kind is OpKind.OFFLOAD)
    if not count:
        return
    message = (
        f"the schedule offloads {count} activations; plain PyTorch pipelining cannot run "
        "OFFLOAD/RELOAD ops. Run it with pp_opt.runtime.build_pipeline_schedule"
    )
    if not drop_offload:
        raise ProblemError(
            "drop_offload", message + ", or set this to export the compute order without offload"
        )
    logger.warning("%s; writing the compute order only, activations stay on the GPU", message)


@dataclass(kw_only=True, slots=True)
class _Block:
    """Actions a rank runs together: one compute op with its sends (and
    REDUCE_GRAD), or one copy op; ``end`` is when its sends are issued."""

    start: float
    end: float
    actions: list[TorchAction]


def _rank_blocks(schedule: Schedule, rank: int, format: str) -> list[_Block]:
    problem = schedule.problem
    comms = format == "compute_comms"
    last_backward = _last_backward(schedule, rank)
    blocks = []
    for op in _merge_streams(schedule, rank):
        if op.kind in COPY_KINDS:
            action = TorchAction(op.stage, op.kind.value, op.microbatch)
            blocks.append(_Block(start=op.start, end=op.end, actions=[action]))
            continue
        halves = op.halves()
        computes = [TorchAction(h.stage, TORCH_TYPE[h.kind], h.microbatch) for h in halves]
        actions = [TorchAction(-1, OVERLAP, None, tuple(computes))] if op.partner else computes
        if comms:
            actions += [send for half in halves for send in _sends(problem, half)]
            for half in halves:
                if last_backward.get(half.stage) == half.key:
                    actions.append(TorchAction(half.stage, "REDUCE_GRAD"))
        blocks.append(_Block(start=op.start, end=op.end, actions=actions))
    return blocks


def _merge_streams(schedule: Schedule, rank: int) -> list[ScheduledOp]:
    """The device's compute and copy ops as one sequence, by start time, never
    putting an offload before its forward, a reload before its offload, or a
    backward before its reload (ties: reload, then offload, then compute, so a
    copy is issued as early as its time allows)."""
    queues = [schedule.stream_order(rank, stream) for stream in Stream]
    reloads = {(op.stage, op.microbatch) for op in queues[2]}
    done: set[tuple[OpKind, int, int]] = set()
    heads = [0] * len(queues)
    tie = {OpKind.RELOAD: 0, OpKind.OFFLOAD: 1}

    def ready(op: ScheduledOp) -> bool:
        if op.partner is not None:  # a pair: its backward half waits for its reload
            op = op.halves()[1]
        pair = (op.stage, op.microbatch)
        if op.kind is OpKind.OFFLOAD:
            return (OpKind.F, *pair) in done
        if op.kind is OpKind.RELOAD:
            return (OpKind.OFFLOAD, *pair) in done
        if op.kind in (OpKind.B, OpKind.BW) and pair in reloads:
            return (OpKind.RELOAD, *pair) in done
        return True

    merged: list[ScheduledOp] = []
    while any(h < len(q) for h, q in zip(heads, queues, strict=True)):
        candidates = [
            (q[h].start, tie.get(q[h].kind, 2), i)
            for i, (h, q) in enumerate(zip(heads, queues, strict=True))
            if h < len(q) and ready(q[h])
        ]
        if not candidates:
            stuck = [str(q[h].key) for h, q in zip(heads, queues, strict=True) if h < len(q)]
            raise PPOptError(f"device {rank}: its streams wait on each other ({', '.join(stuck)})")
        i = min(candidates)[2]
        op = queues[i][heads[i]]
        heads[i] += 1
        done.update((half.kind, half.stage, half.microbatch) for half in op.halves())
        merged.append(op)
    return merged


def _last_backward(schedule: Schedule, rank: int) -> dict[int, OpKey]:
    """Per stage, the op after which PyTorch reduces its gradients (last ``W`` or ``BW``)."""
    last: dict[int, OpKey] = {}
    for op in dag_ops(schedule.stream_order(rank, Stream.COMPUTE)):
        if op.kind in (OpKind.W, OpKind.BW):
            last[op.stage] = op.key
    return last


def _sends(problem: Problem, op: ScheduledOp) -> list[TorchAction]:
    """The send of what ``op`` produces, when the stage that needs it is on another rank."""
    if op.kind is OpKind.F:
        peer, kind = op.stage + 1, "SEND_F"
    elif op.kind in (OpKind.B, OpKind.BW):
        peer, kind = op.stage - 1, "SEND_B"
    else:
        return []
    if not 0 <= peer < problem.num_stages or problem.device_of(peer) == problem.device_of(op.stage):
        return []
    return [TorchAction(op.stage, kind, op.microbatch)]


class _Recv(NamedTuple):
    sender: int
    seq: int
    """Position of the send's block on the sender (the order sends are issued in)."""
    time: float
    action: TorchAction


def _insert_receives(problem: Problem, blocks: dict[int, list[_Block]], slack: float) -> None:
    """Put each receive on its rank at the time its send is issued.

    A receive goes before the first block that starts at or after its send time,
    never after the compute op that consumes it, and receives from one peer keep
    the order of that peer's sends (point-to-point messages match in order). A send up to
    the time rule's ``slack`` after a block's start counts as before it (docs/design.md §5).
    """
    incoming: dict[int, list[_Recv]] = {}
    for rank, rank_blocks in blocks.items():
        for seq, block in enumerate(rank_blocks):
            for send in block.actions:
                if send.kind in ("SEND_F", "SEND_B"):
                    forward = send.kind == "SEND_F"
                    stage = send.stage + 1 if forward else send.stage - 1
                    kind = "RECV_F" if forward else "RECV_B"
                    incoming.setdefault(problem.device_of(stage), []).append(
                        _Recv(rank, seq, block.end, TorchAction(stage, kind, send.microbatch))
                    )
    for rank, recvs in incoming.items():
        rank_blocks = blocks[rank]
        consumer = {
            (a.stage, a.kind in ("I", "B"), a.microbatch): i
            for i, b in enumerate(rank_blocks)
            for first in b.actions[:1]
            for a in first.computes()
            if a.kind in ("F", "I", "B")
        }
        starts = [b.start for b in rank_blocks]
        placed: dict[int, list[_Recv]] = {}
        last_of_sender: dict[int, int] = {}
        for recv in sorted(recvs, key=lambda r: (r.sender, r.seq)):
            a = recv.action
            limit = consumer[(a.stage, a.kind == "RECV_B", a.microbatch)]
            at_time = next(
                (i for i, t in enumerate(starts) if counts_before(recv.time, t, slack)), limit
            )
            pos = max(min(at_time, limit), last_of_sender.get(recv.sender, 0))
            if pos > limit:
                raise PPOptError(
                    f"rank {rank}: {a} cannot be received in the order its peer sends; "
                    "the schedule's times contradict its op order (re-time it with retime)"
                )
            last_of_sender[recv.sender] = pos
            placed.setdefault(pos, []).append(recv)
        for pos in sorted(placed, reverse=True):
            # Within one position, receives follow their send times.
            order = [r.action for r in sorted(placed[pos], key=lambda r: (r.time, r.sender, r.seq))]
            rank_blocks.insert(pos, _Block(start=starts[pos], end=starts[pos], actions=order))
