"""From one pipeline's schedule to the step time of the whole job (docs/design.md §8).

``step_time = grad_accum x (iteration_makespan + dp_sync) + optimizer_step``. The job's terms
come from the cost profile (:mod:`pp_opt.profiler.step_terms`: each stage's gradient
reduction, FSDP's exposed all-gathers, the optimizer step); this module places them after a
schedule:

- ``dp_sync``: a device reduces its stages one after another, in the order their last ``W``
  (or fused ``BW``) ends, so the reduction hides behind the device's remaining cool-down;
  what runs past the makespan, on the worst device, is ``dp_sync`` (plus FSDP's all-gathers
  not hidden).
- ``tokens_per_s_per_gpu = global_batch * seq / step_time / gpus``; ``mfu`` counts the model
  FLOPs of forward and backward, recompute not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pp_opt.job import Job
from pp_opt.ops import OpKind
from pp_opt.planner.config import PlanInputs
from pp_opt.profiler.step_terms import model_flops_per_sequence
from pp_opt.schedule import Schedule


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


def step_time(
    inputs: PlanInputs,
    config: Job,
    *,
    makespan: float,
    dp_sync: float,
    optimizer_step: float,
) -> StepTime:
    """The step time and the throughput figures of one configuration: with gradient
    accumulation the schedule runs ``grad_accum`` times, each ending in its gradient
    reduction (torch's pipeline stage syncs FSDP at every step's last backward,
    ``backward_maybe_with_nosync``), then the optimizer once."""
    total = config.grad_accum * (makespan + dp_sync) + optimizer_step
    seconds = total / 1e3
    tokens = inputs.global_batch * inputs.seq
    flops = inputs.global_batch * model_flops_per_sequence(inputs.model, inputs.seq)
    peak = inputs.gpus * inputs.hardware.peak_flops
    return StepTime(
        iteration_makespan=makespan,
        dp_sync=dp_sync,
        optimizer_step=optimizer_step,
        step_time=total,
        tokens_per_s_per_gpu=tokens / seconds / inputs.gpus,
        mfu=flops / (seconds * peak),
    )
