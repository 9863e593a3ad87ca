"""From one pipeline's schedule to the step time of the whole job (DESIGN.md section 8).

``step_time = iteration_makespan + dp_sync + optimizer_step``:

- ``dp_sync``: each stage's bf16 gradients are all-reduced over the ``dp`` replicas as a
  ring (``2 (dp - 1) / dp`` of the bytes each way, ``2 (dp - 1)`` latencies) once the stage's
  last ``W`` (or fused ``BW``) has ended. A device reduces its stages one after another, in
  the order they finish, so the reduction hides behind the device's remaining cool-down; what
  runs past the makespan, on the worst device, is ``dp_sync``. GPUs are numbered tensor
  parallel first, then pipeline, then data parallel (the profiler packs pipeline neighbours
  the same way), so a dp group stays inside a node only when the whole job does: it then
  runs at the card's intra-node bandwidth, else at the inter-node one.
- ``optimizer_step``: Adam is memory-bound: :data:`OPTIMIZER_BYTES` per parameter a device
  updates (its share over ``dp`` when the optimizer state is sharded) at the card's HBM
  bandwidth; the slowest device counts.
- ``tokens_per_s_per_gpu = global_batch * seq / step_time / gpus``; ``mfu`` counts the model
  FLOPs of forward and backward (``6 N`` per token for the weights of the layers and the
  output layer, plus attention's ``QK^T`` and ``PV``), recompute not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pp_opt.job import Job
from pp_opt.ops import OpKind
from pp_opt.planner.config import PlanInputs
from pp_opt.profiler.comm import hbm_ms, node_link, ring_all_reduce_ms
from pp_opt.profiler.formulas import LayerShape, head_flops, layer_flops
from pp_opt.schedule import Schedule

GRAD_BYTES = 2.0
"""Bytes per gradient element all-reduced (bf16)."""
OPTIMIZER_BYTES = 28.0
"""HBM bytes Adam moves per parameter: reads the bf16 gradient (2), the fp32 master weight
and two moments (12), writes those three (12) and the bf16 weight (2)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class StepTime:
    """The step time of one configuration and the throughput it gives (times in ms)."""

    iteration_makespan: float
    """Makespan of one pipeline's schedule."""
    dp_sync: float
    """Gradient all-reduce time not hidden behind the cool-down."""
    optimizer_step: float
    """Optimizer step of the slowest device."""
    step_time: float
    """Their sum."""
    tokens_per_s_per_gpu: float
    """Tokens per second per GPU."""
    mfu: float
    """Model FLOPs utilisation."""


def dp_link(inputs: PlanInputs) -> tuple[float, float]:
    """``(GB/s, latency in µs)`` of a dp group's ring (see the module notes)."""
    return node_link(inputs.hardware, spans_nodes=inputs.gpus > inputs.hardware.gpus_per_node)


def stage_all_reduce_ms(inputs: PlanInputs, config: Job, params: Sequence[float]) -> list[float]:
    """All-reduce time of each stage's gradients (``params``: per stage, per GPU)."""
    gbs, latency = dp_link(inputs)
    return [ring_all_reduce_ms(GRAD_BYTES * n, config.dp, gbs, latency) for n in params]


def gradients_ready(schedule: Schedule) -> list[float]:
    """Per stage, when its last ``W`` (or fused ``BW``) ends: its gradients are complete."""
    ready = [0.0] * schedule.problem.num_stages
    for op in schedule.ops:
        if op.kind in (OpKind.W, OpKind.BW):
            ready[op.stage] = max(ready[op.stage], op.end)
    return ready


def dp_sync_ms(
    ready: Sequence[float], devices: Sequence[int], reduce: Sequence[float], makespan: float
) -> float:
    """What the per-device sequences of stage all-reduces add after ``makespan``."""
    worst = 0.0
    for d in sorted(set(devices)):
        clock = 0.0
        for s in sorted((s for s in range(len(devices)) if devices[s] == d), key=ready.__getitem__):
            clock = max(clock, ready[s]) + reduce[s]
        worst = max(worst, clock - makespan)
    return max(0.0, worst)


def dp_sync_bound(reduce: Sequence[float]) -> float:
    """A lower bound on ``dp_sync`` of any schedule: the op that ends last is a ``W`` or
    ``BW`` of some stage, whose all-reduce starts no earlier."""
    return min(reduce) if reduce else 0.0


def optimizer_ms(inputs: PlanInputs, config: Job, device_params: Sequence[float]) -> float:
    """Adam's step on the device with the most parameters (ms)."""
    share = config.dp if config.optimizer_sharding else 1
    return hbm_ms(max(device_params) * OPTIMIZER_BYTES / share, inputs.hardware)


def model_flops_per_sequence(inputs: PlanInputs) -> float:
    """Forward and backward FLOPs of one sequence: every layer's F, B and W, and the output
    layer's three matrix products (recompute not counted)."""
    card, s = inputs.model, inputs.seq
    shape = LayerShape.of(card, s=s, b=1)
    per_layer = sum(layer_flops(shape))
    head = 3 * head_flops(card, s)
    return card.layers * per_layer + head


def step_time(
    inputs: PlanInputs,
    config: Job,
    *,
    makespan: float,
    dp_sync: float,
    optimizer_step: float,
) -> StepTime:
    """The step time and the throughput figures of one configuration."""
    total = makespan + dp_sync + optimizer_step
    seconds = total / 1e3
    tokens = inputs.global_batch * inputs.seq
    flops = inputs.global_batch * model_flops_per_sequence(inputs)
    peak = inputs.gpus * inputs.hardware.peak_flops
    return StepTime(
        iteration_makespan=makespan,
        dp_sync=dp_sync,
        optimizer_step=optimizer_step,
        step_time=total,
        tokens_per_s_per_gpu=tokens / seconds / inputs.gpus,
        mfu=flops / (seconds * peak),
    )
