"""From one pipeline's schedule to the step time of the whole job (docs/design.md §8).

``step_time = iteration_makespan + dp_sync + optimizer_step``:

- ``dp_sync``: each stage's bf16 gradients are all-reduced over the ``dp`` replicas as a
  ring (``2 (dp - 1) / dp`` of the bytes each way, ``2 (dp - 1)`` latencies) once the stage's
  last ``W`` (or fused ``BW``) has ended. A device reduces its stages one after another, in
  the order they finish, so the reduction hides behind the device's remaining cool-down; what
  runs past the makespan, on the worst device, is ``dp_sync``. GPUs are numbered tensor
  parallel first, then pipeline, then data parallel (the profiler packs pipeline neighbours
  the same way), so a dp group stays inside a node only when the whole job does: it then
  runs at the card's intra-node bandwidth, else at the inter-node one.
- With FSDP (``dp_shard x cp > 1``: torchtitan shards over its ``dp_shard_cp`` mesh,
  :func:`pp_opt.profiler.fsdp.fsdp_shard`) the per-stage reduction is the fp32
  gradient reduce-scatter over the shard group (plus HSDP's all-reduce of the shards over
  the replicas), after the stage's last backward (torch's pipeline stage turns gradient
  sync off for the others); ``dp_sync`` also holds the all-gathers not hidden
  (:func:`fsdp_exposed_ms`). The shard group is ``tp * cp`` GPUs apart (torchtitan's mesh
  ``[pp, dp_replicate, dp_shard, cp, tp]``): inside a node when ``dp_shard * cp * tp`` fits.
- ``optimizer_step``: Adam is memory-bound: :data:`OPTIMIZER_BYTES` per parameter a device
  updates (its share over ``dp`` when the optimizer state is sharded) at the card's HBM
  bandwidth; the slowest device counts.
- ``tokens_per_s_per_gpu = global_batch * seq / step_time / gpus``; ``mfu`` counts the model
  FLOPs of forward and backward (``6 N`` per token for the weights of the layers and the
  output layer, plus attention's ``QK^T`` and ``PV``), recompute not counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pp_opt.job import Job
from pp_opt.ops import OpKind
from pp_opt.planner.config import PlanInputs
from pp_opt.profiler.analytic import unit_costs
from pp_opt.profiler.comm import (
    hbm_ms,
    node_link,
    ring_all_gather_ms,
    ring_all_reduce_ms,
    ring_reduce_scatter_ms,
)
from pp_opt.profiler.formulas import LayerShape, head_flops, layer_flops
from pp_opt.profiler.fsdp import exposed_per_layer, fsdp_on, fsdp_shard, pipelined_exposed_time
from pp_opt.profiler.moe import model_flops_per_sequence as moe_model_flops
from pp_opt.profiler.moe import uses_layer_model
from pp_opt.schedule import Schedule

GRAD_BYTES = 2.0
"""Bytes per gradient element all-reduced (bf16)."""
FSDP_GRAD_BYTES = 4.0
"""Bytes per gradient element FSDP reduce-scatters (torchtitan's ``reduce_dtype`` fp32)."""
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


def fsdp_links(inputs: PlanInputs, config: Job) -> tuple[tuple[float, float], tuple[float, float]]:
    """``(GB/s, latency)`` of the shard group's ring and of the replicas' ring."""
    per_node = inputs.hardware.gpus_per_node
    inner = config.dp_shard * config.cp * config.tp
    outer = inner * config.dp_replicate
    return (node_link(inputs.hardware, spans_nodes=inner > per_node),
            node_link(inputs.hardware, spans_nodes=outer > per_node))  # fmt: skip


def stage_all_reduce_ms(inputs: PlanInputs, config: Job, params: Sequence[float]) -> list[float]:
    """Gradient reduction time of each stage (``params``: per stage, per GPU) once its last
    backward has run: a bf16 all-reduce over ``dp``, or FSDP's fp32 reduce-scatter (and HSDP's
    all-reduce); 0 for FSDP without a pipeline (its per-layer reduce-scatters overlap the
    backward, :func:`fsdp_exposed_ms`)."""
    if not fsdp_on(config):
        gbs, latency = dp_link(inputs)
        return [ring_all_reduce_ms(GRAD_BYTES * n, config.dp, gbs, latency) for n in params]
    if config.pp == 1:
        return [0.0 for _ in params]
    shard, replicate = fsdp_links(inputs, config)
    return [ring_reduce_scatter_ms(FSDP_GRAD_BYTES * n, fsdp_shard(config), *shard)
            + ring_all_reduce_ms(FSDP_GRAD_BYTES * n / fsdp_shard(config), config.dp_replicate,
                                 *replicate) for n in params]  # fmt: skip


def fsdp_units(inputs: PlanInputs, config: Job) -> tuple[dict[str, float], float]:
    """One decoder layer's costs and the root's parameters per GPU, for :func:`fsdp_exposed_ms`."""
    if not fsdp_on(config):
        return {}, 0.0
    units = unit_costs(inputs.model, inputs.hardware, config)
    return units.layer, units.embedding["params"] + units.head["params"]


def fsdp_exposed_ms(inputs: PlanInputs, config: Job, layer: Mapping[str, float],
                    root_params: float) -> float:  # fmt: skip
    """FSDP's all-gathers (and, without a pipeline, reduce-scatters) not hidden behind compute.

    ``layer``: one decoder layer's costs (``t_f``, ``t_b``, ``t_w``, ``params`` per GPU);
    ``root_params``: the embedding's and output layer's parameters per GPU. Under a pipeline
    the first layer's all-gather is exposed and the others hide behind a layer's forward
    (:func:`fsdp.pipelined_exposed_time`; the reduce-scatters go by :func:`dp_sync_ms`).
    Without one, each layer's all-gather runs in F and again in B (resharded after forward),
    prefetched one layer ahead, and its reduce-scatter in B; the root's are exposed.
    """
    if not fsdp_on(config):
        return 0.0
    (gbs, latency), _ = fsdp_links(inputs, config)
    param_bytes = 1.0 if config.fp8_all_gather else 2.0
    gather = ring_all_gather_ms(param_bytes * layer["params"], fsdp_shard(config), gbs, latency)
    if config.pp > 1:
        layers = max(config.layers) if config.layers else 1
        return 1e3 * pipelined_exposed_time(
            first_layer_gather_s=gather / 1e3, layer_gather_s=gather / 1e3,
            layer_forward_s=layer["t_f"] / 1e3, layers=layers, last_stage_reduce_scatter_s=0.0,
        )  # fmt: skip
    scatter = ring_reduce_scatter_ms(FSDP_GRAD_BYTES * layer["params"], fsdp_shard(config), gbs,
                                     latency)  # fmt: skip
    root = ring_all_gather_ms(2.0 * root_params, fsdp_shard(config), gbs, latency)
    root += ring_reduce_scatter_ms(FSDP_GRAD_BYTES * root_params, fsdp_shard(config), gbs, latency)
    per_layer = exposed_per_layer(gather, layer["t_f"]) + exposed_per_layer(
        gather + scatter, layer["t_b"] + layer["t_w"]
    )
    return root + inputs.model.layers * per_layer


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
    share = fsdp_shard(config) if fsdp_on(config) else config.dp if config.optimizer_sharding else 1
    return hbm_ms(max(device_params) * OPTIMIZER_BYTES / share, inputs.hardware)


def model_flops_per_sequence(inputs: PlanInputs) -> float:
    """Forward and backward FLOPs of one sequence: every layer's F, B and W, and the output
    layer's three matrix products (recompute not counted)."""
    card, s = inputs.model, inputs.seq
    if uses_layer_model(card):
        return moe_model_flops(card, s)
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
