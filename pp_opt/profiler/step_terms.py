"""What a training step adds to one pipeline's iteration, per job (docs/design.md §8): each
stage's gradient reduction over the data-parallel ranks, FSDP's all-gathers not hidden, the
optimizer step, and the model FLOPs a step's throughput is counted in.

- Gradient reduction: each stage's bf16 gradients are all-reduced over the ``dp`` replicas as
  a ring (``2 (dp - 1) / dp`` of the bytes each way, ``2 (dp - 1)`` latencies) once the
  stage's last ``W`` (or fused ``BW``) has ended; :mod:`pp_opt.planner.step` places them
  after the schedule's ops. GPUs are numbered tensor parallel first, then pipeline, then data
  parallel (the profiler packs pipeline neighbours the same way), so a dp group stays inside
  a node only when the whole job does: it then runs at the card's intra-node bandwidth, else
  at the inter-node one.
- With FSDP (``dp_shard x cp > 1``: torchtitan shards over its ``dp_shard_cp`` mesh,
  :func:`pp_opt.profiler.fsdp.fsdp_shard`) the per-stage reduction is the fp32 gradient
  reduce-scatter over the shard group (plus HSDP's all-reduce of the shards over the
  replicas), after the stage's last backward (torch's pipeline stage turns gradient sync off
  for the others); the all-gathers not hidden are :func:`fsdp_exposed_ms`. The shard group is
  ``tp * cp`` GPUs apart (torchtitan's mesh ``[pp, dp_replicate, dp_shard, cp, tp]``): inside
  a node when ``dp_shard * cp * tp`` fits.
- Optimizer step: Adam is memory-bound: :data:`OPTIMIZER_BYTES` per parameter a device
  updates (its share over ``dp`` when the optimizer state is sharded) at the card's HBM
  bandwidth; the slowest device counts.
- Model FLOPs: forward and backward (``6 N`` per token for the weights of the layers and the
  output layer, plus attention's ``QK^T`` and ``PV``), recompute not counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pp_opt.job import Job
from pp_opt.profiler.analytic import unit_costs
from pp_opt.profiler.cards import HardwareCard, ModelCard
from pp_opt.profiler.comm import (
    hbm_ms,
    node_link,
    ring_all_gather_ms,
    ring_all_reduce_ms,
    ring_reduce_scatter_ms,
)
from pp_opt.profiler.costs import CostProfile
from pp_opt.profiler.formulas import LayerShape, head_flops, layer_flops
from pp_opt.profiler.fsdp import exposed_per_layer, fsdp_on, fsdp_shard, pipelined_exposed_time
from pp_opt.profiler.moe import model_flops_per_sequence as moe_model_flops
from pp_opt.profiler.moe import uses_layer_model

GRAD_BYTES = 2.0
"""Bytes per gradient element all-reduced (bf16)."""
FSDP_GRAD_BYTES = 4.0
"""Bytes per gradient element FSDP reduce-scatters (torchtitan's ``reduce_dtype`` fp32)."""
OPTIMIZER_BYTES = 28.0
"""HBM bytes Adam moves per parameter: reads the bf16 gradient (2), the fp32 master weight
and two moments (12), writes those three (12) and the bf16 weight (2)."""


def dp_link(job: Job, hardware: HardwareCard) -> tuple[float, float]:
    """``(GB/s, latency in µs)`` of a dp group's ring (see the module notes)."""
    return node_link(hardware, spans_nodes=job.gpus > hardware.gpus_per_node)


def fsdp_links(config: Job, hardware: HardwareCard
               ) -> tuple[tuple[float, float], tuple[float, float]]:  # fmt: skip
    """``(GB/s, latency)`` of the shard group's ring and of the replicas' ring."""
    per_node = hardware.gpus_per_node
    inner = config.dp_shard * config.cp * config.tp
    outer = inner * config.dp_replicate
    return (node_link(hardware, spans_nodes=inner > per_node),
            node_link(hardware, spans_nodes=outer > per_node))  # fmt: skip


def stage_all_reduce_ms(config: Job, hardware: HardwareCard, params: Sequence[float],
                        expert_params: Sequence[float] | None = None) -> list[float]:  # fmt: skip
    """Gradient reduction time of each stage (``params``: per stage, per GPU, ``expert_params``
    the routed experts' part of them) once its last backward has run: a bf16 all-reduce over
    ``dp``, or FSDP's fp32 reduce-scatter (and HSDP's all-reduce); 0 for FSDP without a
    pipeline (its per-layer reduce-scatters overlap the backward, :func:`fsdp_exposed_ms`).
    Routed experts reduce over their own data-parallel group (``edp``, none when it is 1), as
    Megatron-Core's expert data parallelism and torchtitan's expert FSDP mesh do."""
    experts = list(expert_params) if expert_params is not None else [0.0] * len(params)
    dense = [n - e for n, e in zip(params, experts, strict=True)]
    if not fsdp_on(config):
        gbs, latency = dp_link(config, hardware)
        return [ring_all_reduce_ms(GRAD_BYTES * n, config.dp, gbs, latency)
                + ring_all_reduce_ms(GRAD_BYTES * e, config.edp, gbs, latency)
                for n, e in zip(dense, experts, strict=True)]  # fmt: skip
    if config.pp == 1:
        return [0.0 for _ in params]
    shard, replicate = fsdp_links(config, hardware)
    return [reduce_ms(config, FSDP_GRAD_BYTES * n, shard, replicate)
            + ring_reduce_scatter_ms(FSDP_GRAD_BYTES * e, config.edp, *shard)
            for n, e in zip(dense, experts, strict=True)]  # fmt: skip


def fsdp_units(config: Job, model: ModelCard, hardware: HardwareCard
               ) -> tuple[dict[str, float], float]:  # fmt: skip
    """One decoder layer's costs and the root's parameters per GPU, for :func:`fsdp_exposed_ms`."""
    if not fsdp_on(config):
        return {}, 0.0
    units = unit_costs(model, hardware, config)
    return units.layer, units.embedding["params"] + units.head["params"]


def fsdp_exposed_ms(config: Job, model: ModelCard, hardware: HardwareCard,
                    layer: Mapping[str, float], root_params: float) -> float:  # fmt: skip
    """FSDP's all-gathers (and, without a pipeline, reduce-scatters) not hidden behind compute.

    ``layer``: one decoder layer's costs (``t_f``, ``t_b``, ``t_w``, ``params`` per GPU);
    ``root_params``: the embedding's and output layer's parameters per GPU. Under a pipeline
    the first layer's all-gather is exposed and the others hide behind a layer's forward
    (:func:`fsdp.pipelined_exposed_time`; the reduce-scatters go by :func:`stage_all_reduce_ms`).
    Without one, each layer's all-gather runs in F and again in B (resharded after forward),
    prefetched one layer ahead, and its reduction in B (HSDP's all-reduce over the replicas
    included); the root's are exposed.
    """
    if not fsdp_on(config):
        return 0.0
    (gbs, latency), replicas = fsdp_links(config, hardware)
    param_bytes = 1.0 if config.fp8_all_gather else 2.0
    gather = ring_all_gather_ms(param_bytes * layer["params"], fsdp_shard(config), gbs, latency)
    if config.pp > 1:
        layers = max(config.layers) if config.layers else 1
        return 1e3 * pipelined_exposed_time(
            first_layer_gather_s=gather / 1e3, layer_gather_s=gather / 1e3,
            layer_forward_s=layer["t_f"] / 1e3, layers=layers, last_stage_reduce_scatter_s=0.0,
        )  # fmt: skip
    scatter = reduce_ms(config, FSDP_GRAD_BYTES * layer["params"], (gbs, latency), replicas)
    root = ring_all_gather_ms(2.0 * root_params, fsdp_shard(config), gbs, latency)
    root += reduce_ms(config, FSDP_GRAD_BYTES * root_params, (gbs, latency), replicas)
    per_layer = exposed_per_layer(gather, layer["t_f"]) + exposed_per_layer(
        gather + scatter, layer["t_b"] + layer["t_w"]
    )
    return root + model.layers * per_layer


def reduce_ms(config: Job, nbytes: float, shard: tuple[float, float],
              replicas: tuple[float, float]) -> float:  # fmt: skip
    """FSDP2's gradient reduction of ``nbytes``: a reduce-scatter over the shard group, then
    (HSDP) an all-reduce of the shard over the replicas."""
    return ring_reduce_scatter_ms(nbytes, fsdp_shard(config), *shard) + ring_all_reduce_ms(
        nbytes / fsdp_shard(config), config.dp_replicate, *replicas
    )


def optimizer_ms(config: Job, hardware: HardwareCard, device_params: Sequence[float],
                 device_expert_params: Sequence[float] | None = None) -> float:  # fmt: skip
    """Adam's step on the slowest device (ms): its dense parameters' share over the shard
    group when the state is sharded, its routed experts' over ``edp``."""
    sharded = fsdp_on(config) or config.optimizer_sharding
    share = fsdp_shard(config) if fsdp_on(config) else config.dp if sharded else 1
    experts = device_expert_params or [0.0] * len(device_params)
    expert_share = config.edp if sharded else 1
    updated = max((n - e) / share + e / expert_share
                  for n, e in zip(device_params, experts, strict=True))  # fmt: skip
    return hbm_ms(updated * OPTIMIZER_BYTES, hardware)


def model_flops_per_sequence(card: ModelCard, s: int) -> float:
    """Forward and backward FLOPs of one sequence: every layer's F, B and W, and the output
    layer's three matrix products (recompute not counted)."""
    if uses_layer_model(card):
        return moe_model_flops(card, s)
    shape = LayerShape.of(card, s=s, b=1)
    per_layer = sum(layer_flops(shape))
    head = 3 * head_flops(card, s)
    return card.layers * per_layer + head


def profile_reduce_ms(profile: CostProfile) -> list[float]:
    """Each of the profile's stages' gradient reduction (:func:`stage_all_reduce_ms`)."""
    experts = [st.expert_params for st in profile.stages]
    return stage_all_reduce_ms(profile.job, profile.hardware, profile.stage_params(), experts)


def profile_fsdp_exposed_ms(profile: CostProfile) -> float:
    """The profile's job's FSDP communication not hidden (:func:`fsdp_exposed_ms`)."""
    job, model, hardware = profile.job, profile.model, profile.hardware
    return fsdp_exposed_ms(job, model, hardware, *fsdp_units(job, model, hardware))


def profile_optimizer_ms(profile: CostProfile) -> float:
    """The optimizer step of the profile's device with the most parameters."""
    return optimizer_ms(profile.job, profile.hardware, profile.device_params(),
                        profile.device_params(experts=True))  # fmt: skip
