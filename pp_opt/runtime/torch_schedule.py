"""Run a pp_opt schedule on ``PipelineStage``s through PyTorch's own pipeline runtime.

:func:`build_pipeline_schedule` returns a ``_PipelineScheduleRuntime`` whose
action order is the schedule's (docs/design.md §6), with two action types PyTorch
lacks, ``OFFLOAD`` and ``RELOAD``, executed by an
:class:`~pp_opt.runtime.offload.ActivationOffloader`. A training loop then reads
like PyTorch's own: ``pipe.step(x, target=y, losses=losses)`` on every rank.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

import torch
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    _Action,
    _ComputationType,
    _PipelineContext,
    _PipelineScheduleRuntime,
)

from pp_opt.errors import ProblemError
from pp_opt.export.torch_csv import FORMATS, TorchAction, torch_actions
from pp_opt.ops import OpKind
from pp_opt.runtime.offload import ActivationOffloader, storage_pointers
from pp_opt.schedule import Schedule

logger = logging.getLogger(__name__)


class OffloadActionType(StrEnum):
    """The action types pp_opt adds to PyTorch's (``_ComputationType`` is closed)."""

    OFFLOAD = "OFFLOAD"
    RELOAD = "RELOAD"


class PPOptPipelineSchedule(_PipelineScheduleRuntime):
    """PyTorch's ``_PipelineScheduleRuntime`` with pp_opt's order and offload actions.

    Build it with :func:`build_pipeline_schedule`; ``offloader`` is ``None`` when
    the schedule offloads nothing on this rank.
    """

    offloader: ActivationOffloader | None = None
    schedule: Schedule

    def __init__(
        self,
        stages: list[PipelineStage],
        *,
        n_microbatches: int,
        loss_fn: Callable[..., torch.Tensor] | None,
        scale_grads: bool,
    ) -> None:
        super().__init__(  # type: ignore[no-untyped-call]  # PyTorch's takes *args, **kwargs
            stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads
        )

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if self.offloader is not None:
            self.offloader.reset()
        return super().step(*args, **kwargs)

    def _add_copy_action(self, kind: OffloadActionType, fn: Callable[..., None]) -> None:
        # register_custom_function only accepts PyTorch's own action types (2.13.0),
        # but its dispatch is a dict lookup on the action's type: add ours there.
        self._comp_type_to_function_map[kind] = fn  # type: ignore[index]


def build_pipeline_schedule(
    schedule: Schedule,
    stages: Sequence[PipelineStage],
    *,
    loss_fn: Callable[..., torch.Tensor] | None,
    format: str = "compute_only",
    scale_grads: bool = True,
    n_microbatches: int | None = None,
    record_offload: bool = False,
) -> PPOptPipelineSchedule:
    """A pipeline schedule object for this rank's ``stages`` that runs ``schedule``.

    Parameters
    ----------
    schedule
        A pp_opt schedule; its ``p`` must be the pipeline group size and its
        placement must put exactly ``stages`` on this rank.
    stages
        This rank's ``PipelineStage``s (any order).
    loss_fn
        Loss of the last stage's output and target, as for PyTorch's schedules.
    format
        ``compute_only``: PyTorch inserts the sends and receives itself;
        ``compute_comms``: pp_opt places them where the solved times put them
        (no UNSHARD/RESHARD then: use ``compute_only`` for FSDP-wrapped stages).
    scale_grads
        Divide gradients by ``m`` (for a loss that averages), as PyTorch does.
    n_microbatches
        If given, the microbatch count the caller splits its batch into; it must
        equal the schedule's ``m``.
    record_offload
        Keep a log of every offload, reload and unpack in ``offloader.events``.

    Returns
    -------
    PPOptPipelineSchedule
        Call ``.step(inputs, target=..., losses=...)`` on every rank, as with
        PyTorch's ``ScheduleInterleaved1F1B``.
    """
    stages = sorted(stages, key=lambda st: st.stage_index)
    check_stages(schedule, stages, n_microbatches=n_microbatches)
    if format not in FORMATS:
        raise ProblemError("format", f"unknown {format!r}; use 'compute_only' or 'compute_comms'")
    problem = schedule.problem
    pipe = PPOptPipelineSchedule(
        list(stages), n_microbatches=problem.m, loss_fn=loss_fn, scale_grads=scale_grads
    )
    pipe.schedule = schedule
    actions = torch_actions(schedule, format=format, with_offload=True)
    _load_actions(pipe, actions, format)
    rank = stages[0].group_rank
    offloaded = {
        (a.stage, a.microbatch)
        for a in actions[rank]
        if a.kind == "OFFLOAD" and a.microbatch is not None
    }
    if offloaded:
        _install_offload(pipe, stages, offloaded, record=record_offload)
    return pipe


def check_stages(
    schedule: Schedule, stages: Sequence[PipelineStage], *, n_microbatches: int | None = None
) -> None:
    """Refuse stages that do not match the schedule: stage count, placement or microbatches."""
    problem = schedule.problem
    if not stages:
        raise ProblemError("stages", "no PipelineStage given; pass this rank's stages")
    num_stages = stages[0].num_stages
    if num_stages != problem.num_stages:
        raise ProblemError(
            "stages",
            f"the PipelineStages have num_stages={num_stages} but the schedule has "
            f"{problem.num_stages} stages; split the model into {problem.num_stages} stages "
            "or solve a problem with as many stages as the model has",
        )
    group_size, rank = stages[0].group_size, stages[0].group_rank
    if group_size != problem.p:
        raise ProblemError(
            "p",
            f"the pipeline group has {group_size} ranks but the schedule is for p={problem.p} "
            f"devices; launch {problem.p} processes or solve for p={group_size}",
        )
    have = sorted(st.stage_index for st in stages)
    want = problem.stages_on(rank)
    if have != want:
        raise ProblemError(
            "placement",
            f"rank {rank} holds stages {have} but the schedule's {problem.placement!r} "
            f"placement puts stages {want} on it; build those stages on this rank",
        )
    if n_microbatches is not None and n_microbatches != problem.m:
        raise ProblemError(
            "m",
            f"the batch is split into {n_microbatches} microbatches but the schedule has "
            f"m={problem.m}; split it into {problem.m} or solve for m={n_microbatches}",
        )


def to_torch_action(action: TorchAction) -> _Action:
    if action.sub:  # an overlapped pair: PyTorch's OVERLAP_F_B with its two halves
        halves = tuple(to_torch_action(a) for a in action.sub)
        return _Action(action.stage, _ComputationType(action.kind), None, halves)
    if action.kind in ("OFFLOAD", "RELOAD"):
        kind: Any = OffloadActionType(action.kind)
    else:
        kind = _ComputationType(action.kind)
    return _Action(action.stage, kind, action.microbatch)


def _load_actions(
    pipe: PPOptPipelineSchedule, actions: dict[int, list[TorchAction]], format: str
) -> None:
    """Give PyTorch the order (its lowering adds comms for ``compute_only``), then
    put each copy action right before the compute action that follows it."""
    compute = {
        rank: [to_torch_action(a) for a in row if a.is_compute] for rank, row in actions.items()
    }
    pipe.pipeline_order = dict(compute)  # type: ignore[arg-type]
    if format == "compute_only":
        pipe._prepare_schedule_with_comms(compute, format="compute_only")  # type: ignore[arg-type]
    else:
        with_comms = {
            rank: [to_torch_action(a) for a in row if a.kind not in ("OFFLOAD", "RELOAD")]
            for rank, row in actions.items()
        }
        pipe._prepare_schedule_with_comms(with_comms, format="compute_comms")  # type: ignore[arg-type]
    for rank, row in actions.items():
        lowered = pipe.pipeline_order_with_comms[rank]
        pending: list[_Action] = []
        anchors: list[tuple[_Action | None, list[_Action]]] = []
        for a in row:
            if a.kind in ("OFFLOAD", "RELOAD"):
                pending.append(to_torch_action(a))
            elif a.is_compute and pending:
                anchors.append((to_torch_action(a), pending))
                pending = []
        if pending:
            anchors.append((None, pending))
        for anchor, copies in anchors:
            at = len(lowered) if anchor is None else lowered.index(anchor)
            lowered[at:at] = copies


def _install_offload(
    pipe: PPOptPipelineSchedule,
    stages: Sequence[PipelineStage],
    offloaded: set[tuple[int, int]],
    *,
    record: bool,
) -> None:
    """Capture the saved tensors of offloaded forwards and run OFFLOAD/RELOAD actions."""
    offloader = ActivationOffloader(stages[0].device, record=record)
    pipe.offloader = offloader
    by_index = {st.stage_index: st for st in stages}
    fractions = {
        (op.stage, op.microbatch): op.fraction
        for op in pipe.schedule.ops
        if op.kind is OpKind.OFFLOAD
    }
    for stage in stages:
        mbs = {mb for s, mb in offloaded if s == stage.stage_index}
        if mbs:
            _wrap_forward(stage, offloader, mbs)

    def offload(action: _Action, ctx: _PipelineContext) -> None:
        stage = by_index[action.stage_index]
        mb = action.microbatch_index
        if mb is None:
            raise RuntimeError(f"offload action {action} carries no microbatch")
        outputs, inputs = stage.fwd_cache[mb]
        params = storage_pointers(stage.submod.parameters())
        keep = params | storage_pointers(outputs) | storage_pointers(inputs)
        offloader.offload(action.stage_index, mb, fraction=fractions[(action.stage_index, mb)],
                          keep=keep)  # fmt: skip

    def reload(action: _Action, ctx: _PipelineContext) -> None:
        if action.microbatch_index is None:
            raise RuntimeError(f"reload action {action} carries no microbatch")
        offloader.reload(action.stage_index, action.microbatch_index)

    pipe._add_copy_action(OffloadActionType.OFFLOAD, offload)
    pipe._add_copy_action(OffloadActionType.RELOAD, reload)


def _wrap_forward(stage: PipelineStage, offloader: ActivationOffloader, mbs: set[int]) -> None:
    """Run this stage's forward of the offloaded microbatches under the offloader's hooks.

    PyTorch's runtime calls ``stage.forward_one_chunk(mb, ...)`` for every F action;
    wrapping it on the instance is the one place that knows the microbatch.
    """
    original = stage.forward_one_chunk
    if getattr(original, "_pp_opt_wrapped", False):
        logger.warning(
            "stage %d was set up for another pp_opt schedule; that one no longer offloads",
            stage.stage_index,
        )
        original = original.__wrapped__  # type: ignore[attr-defined]

    @functools.wraps(original)
    def forward_one_chunk(fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        if fwd_chunk_id not in mbs:
            return original(fwd_chunk_id, *args, **kwargs)
        with offloader.capture(stage.stage_index, fwd_chunk_id):
            return original(fwd_chunk_id, *args, **kwargs)

    forward_one_chunk._pp_opt_wrapped = True  # type: ignore[attr-defined]
    stage.forward_one_chunk = forward_one_chunk  # type: ignore[method-assign]
