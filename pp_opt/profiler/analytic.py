"""Analytic stage costs: FLOPs and bytes (formulas.py) turned into times on a hardware card.

Time model, per layer and op: ``GEMM FLOPs / (peak x gemm_efficiency)`` plus a memory-bound
part for everything that is not a GEMM (norms, dropout, GeLU, softmax, residual adds,
transposes): ``passes x bytes / (HBM bandwidth x hbm_efficiency)``, where ``bytes`` are the
layer's saved activations that scale with ``s b h`` (the score matrix excluded). W is pure GEMM.

The pass counts were fit once, to the Zero Bubble paper's A100 profile of its 1.5B model
(docs/design.md §7), and checked on the other three models, which they reproduce to 3%
(``t_f : t_b : t_w`` ratios and absolute times alike); fitting the score-matrix traffic too gave
it a zero weight (Megatron's fused softmax), so it is left out. Absolute times on other GPUs
rest on their cards' efficiency estimates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from pp_opt.errors import ProblemError, StaticMemoryError
from pp_opt.job import Job
from pp_opt.profiler.cards import GIB, HardwareCard, ModelCard
from pp_opt.profiler.comm import gemm_ms, hbm_ms, node_link, p2p_ms, ring_all_gather_ms
from pp_opt.profiler.costs import CostProfile, LinkCosts, StageCost
from pp_opt.profiler.formulas import (
    LayerShape,
    activation_terms,
    embedding_params,
    head_flops,
    head_params,
    layer_flops,
    layer_params,
)
from pp_opt.profiler.fsdp import fsdp_on, fsdp_shard
from pp_opt.profiler.job_costs import (
    FORMULA_MODES,
    layer_unit,
)
from pp_opt.profiler.kernels import elementwise_bytes
from pp_opt.profiler.layer_split import stage_total
from pp_opt.profiler.loss import (
    LOG_SOFTMAX_BYTES,
    loss_chunks,
    loss_kept_bytes,
    loss_transient_bytes,
)
from pp_opt.profiler.memory_breakdown import (
    device_caps,
    fragmentation_share,
    held_bytes_per_device,
    static_terms,
)
from pp_opt.profiler.moe import check_recompute_modules, mtp_costs, uses_layer_model
from pp_opt.profiler.moe import layer_unit as moe_layer_unit
from pp_opt.profiler.stacks import StackCard, load_stack_card

log = logging.getLogger(__name__)

FORWARD_PASSES = 11.75
"""HBM bytes moved by F's non-GEMM kernels per byte of saved (``s b h``-sized) activation."""
BACKWARD_PASSES = 10.0
"""The same for B (fit: 0.85 of F's on all four Zero Bubble models)."""
LOSS_PASSES = 4.0
"""HBM passes over the fp32 logits by the softmax cross-entropy (F and B each): an estimate."""


def layer_shape(card: ModelCard, job: Job, **over: object) -> LayerShape:
    """The formula shape of one of ``job``'s layers (the full sequence; see ``cp``)."""
    mode = job.ac if job.ac in FORMULA_MODES else "none"
    return LayerShape.of(card, s=job.seq, b=job.mbs, tp=job.tp, recompute=mode, **over)


def elementwise_ms(shape: LayerShape, hw: HardwareCard) -> tuple[float, float]:
    """The non-GEMM time of one eager layer in F and in B (ms).

    Llama layers (SwiGLU, RMSNorm) by the count of their ops
    (:func:`kernels.elementwise_bytes`; B moves twice F's bytes); other layers by the pass
    counts fit to the Zero Bubble GPT profile (:data:`FORWARD_PASSES`)."""
    if shape.gated and shape.norm == "rmsnorm":
        forward = hbm_ms(elementwise_bytes(shape, compiled=False), hw)
        return forward, 2 * forward
    plain = replace(shape, recompute="none")
    hidden_bytes = sum(v for k, v in activation_terms(plain).items() if not k.endswith("scores"))
    return FORWARD_PASSES * hbm_ms(hidden_bytes, hw), BACKWARD_PASSES * hbm_ms(hidden_bytes, hw)


def layer_times(shape: LayerShape, hw: HardwareCard) -> tuple[float, float, float]:
    """``(t_f, t_b, t_w)`` of one plain layer (eager, BF16, no collectives) in ms."""
    f, b, w = layer_flops(shape)
    elem_f, elem_b = elementwise_ms(shape, hw)
    return gemm_ms(f, hw) + elem_f, gemm_ms(b, hw) + elem_b, gemm_ms(w, hw)


def head_costs(card: ModelCard, job: Job, hw: HardwareCard) -> dict[str, float]:
    """Final norm, output layer and softmax cross-entropy (last stage), per GPU. A chunked
    loss (:mod:`loss`) runs the output layer's F, B and W and the loss's inside F, and keeps
    the hidden states' gradient instead of the log-softmax."""
    sb, h, t, e = job.seq * job.mbs, card.hidden, job.tp, card.dtype_bytes
    gemm = gemm_ms(head_flops(card, sb) / t, hw)
    elementwise = LOSS_PASSES * hbm_ms(LOG_SOFTMAX_BYTES * sb * card.vocab / t, hw)
    stats = 8 if card.norm == "layernorm" else 4
    kept, transient = loss_kept_bytes(card, job, sb), loss_transient_bytes(card, job, sb)
    if loss_chunks(job) > 1:  # the norm's input stays for B, the rest is done in F
        return {
            "t_f": 3 * gemm + 2 * elementwise,
            "t_b": 0.0,
            "t_w": 0.0,
            "m_b": (e * h + stats) * sb / t + kept,
            "m_w": 0.0,
            "transient": transient,
        }
    return {
        "t_f": gemm + elementwise,
        "t_b": gemm + elementwise,
        "t_w": gemm,
        "m_b": ((2 * e * h + stats) * sb) / t + kept + gathered_head_input_bytes(card, job),
        "m_w": (e * h + e * card.vocab) * sb / t,
        "transient": transient,
    }


def gathered_head_input_bytes(card: ModelCard, job: Job) -> float:
    """Under torchtitan's DTensor TP the colwise output layer saves its all-gathered input
    whole (``e s b h``), not the ``1 / t`` sequence shard :func:`head_costs` counts."""
    if job.tp == 1 or not fsdp_on(job):
        return 0.0
    return card.dtype_bytes * job.seq * job.mbs * card.hidden * (job.tp - 1) / job.tp


def embedding_costs(card: ModelCard, job: Job, hw: HardwareCard) -> dict[str, float]:
    """Embedding gather (F) and its gradient scatter-add (W), first stage, per GPU."""
    sb, e = job.seq * job.mbs, card.dtype_bytes
    ms = hbm_ms(2.0 * e * sb * card.hidden / job.tp, hw)
    return {"t_f": ms, "t_b": 0.0, "t_w": ms, "m_b": 8.0 * sb, "m_w": 0.0}


TP_COLLECTIVES = 4
"""Collectives per layer in F (and again in B) under sequence parallelism: an all-gather
before and a reduce-scatter after each of attention and the MLP (Megatron-LM)."""


def tp_comm_ms(card: ModelCard, hw: HardwareCard, job: Job) -> float:
    """Time of one layer's tensor-parallel collectives in F (the same in B, none in W), ms.

    Each of :data:`TP_COLLECTIVES` ring collectives moves ``(t - 1) / t`` of the layer's
    ``s b h`` activation per GPU at the intra-node bandwidth (``tp`` stays inside a node)
    and pays ``t - 1`` latencies; 0 when ``tp = 1``.
    """
    full = card.dtype_bytes * job.seq * job.mbs * card.hidden
    one = ring_all_gather_ms(full, job.tp, *node_link(hw, spans_nodes=False))
    return TP_COLLECTIVES * one


def bytes_per_param(
    *,
    dp: int = 1,
    optimizer_sharding: bool = False,
    weights: float = 2.0,
    grads: float = 2.0,
    optimizer: float = 12.0,
) -> float:
    """Static bytes per parameter: bf16 weights and gradients, and the optimizer's fp32 master
    copy and two Adam moments (12 bytes), split over the ``dp`` replicas when sharded
    (Megatron-LM's distributed optimizer, torchtitan's FSDP of the optimizer state).

    The default, 16, is the profiler's ``bytes_per_param`` default.
    """
    share = optimizer / dp if optimizer_sharding else optimizer
    return weights + grads + share


CP_SCALED = ("t_f", "t_b", "t_w", "m_b", "m_w", "transient")
"""Costs that scale with the tokens a GPU holds: ``1 / cp`` of them under context parallelism."""


@dataclass(kw_only=True, slots=True, frozen=True)
class UnitCosts:
    """Costs of one decoder layer, the embedding and the output layer, per microbatch and GPU:
    a stage's costs are ``layers x layer`` plus ``embedding`` (first stage) and ``head`` (last
    stage), exactly as :func:`stage_costs` adds them. Keys ``t_f``, ``t_b``, ``t_w`` (ms),
    ``m_b``, ``m_w`` (bytes) and ``params`` (per GPU)."""

    layer: dict[str, float]
    """One decoder layer."""
    embedding: dict[str, float]
    """The embedding (first stage), beyond its layers."""
    head: dict[str, float]
    """Final norm, output layer and loss (last stage), beyond its layers."""
    m_in: float
    """The input a recomputed stage keeps (the embedding stage keeps its token ids)."""
    m_in_first: float
    """``m_in`` of the first stage (token ids)."""
    full_layer: dict[str, float] | None = None
    """One fully checkpointed layer, for stages that checkpoint some layers in full
    (None: the job has no such stage)."""
    dense_layer: dict[str, float] | None = None
    """One of an MoE model's first, dense layers (None: every layer is ``layer``)."""

    def parts(self) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        return self.layer, self.embedding, self.head


def job_bytes_per_param(job: Job) -> float:
    """The job's static bytes per parameter: FSDP's sharded state, its own, Megatron-Core's
    distributed optimizer (a ``distributed`` stack), else from its optimizer sharding."""
    stack = load_stack_card(job.stack)
    if stack.optimizer == "distributed" and job.bytes_per_param is None:
        return distributed_bytes_per_param(stack, job.dp * job.cp)
    if fsdp_on(job):
        return fsdp_state_bytes(stack) / fsdp_shard(job)
    if job.bytes_per_param is not None:
        return float(job.bytes_per_param)
    return bytes_per_param(dp=job.dp, optimizer_sharding=job.optimizer_sharding)


def distributed_bytes_per_param(stack: StackCard, ranks: int) -> float:
    """Megatron-Core's distributed optimizer: bf16 weights and the gradient buffer whole, the
    master weights and moments over ``ranks``."""
    return 2.0 + stack.main_grad_bytes + (stack.master_bytes + stack.moment_bytes) / ranks


def fsdp_state_bytes(stack: StackCard) -> float:
    """FSDP's sharded bytes per parameter: master weight, gradient and moments (16 in fp32,
    torchtitan's; AutoModel's bf16 weights keep bf16 gradients and moments)."""
    return stack.master_bytes + stack.main_grad_bytes + stack.moment_bytes


def expert_bytes_per_param(job: Job) -> float:
    """Static bytes per routed-expert parameter: the state over the expert data-parallel
    ranks (``edp``) instead of the data-parallel ones."""
    stack = load_stack_card(job.stack)
    if job.bytes_per_param is not None:
        return float(job.bytes_per_param)
    if stack.optimizer == "distributed":
        return distributed_bytes_per_param(stack, job.edp)
    if fsdp_on(job):
        return fsdp_state_bytes(stack) / job.edp
    return bytes_per_param(dp=job.edp, optimizer_sharding=job.optimizer_sharding)


def unit_costs(card: ModelCard, hw: HardwareCard, job: Job) -> UnitCosts:
    """The per-layer costs :func:`stage_costs` sums, for a planner that splits layers itself.

    The tensor-parallel collectives (:func:`tp_comm_ms`) are in each layer's F and B when
    ``tp > 1`` and the job exposes them (``job.tp_comm``); the job's checkpointing, Float8,
    compile, AsyncTP and context parallelism as :func:`job_costs.layer_unit` applies them.
    """
    if uses_layer_model(card):
        return _layer_model_units(card, hw, job)
    check_recompute_modules(card, job)
    shape = layer_shape(card, job)
    elementwise, comm = elementwise_ms(shape, hw), tp_comm_ms(card, hw, job)
    layer = layer_unit(card, hw, job, mode=job.ac, elementwise=elementwise,
                       tp_comm=comm)  # fmt: skip
    full = None
    if any(job.full_layers) and job.ac != "full":
        full = layer_unit(card, hw, job, mode="full", elementwise=elementwise, tp_comm=comm)
        full["params"] = layer_params(card) / job.tp
    layer["params"] = layer_params(card) / job.tp
    embedding = _per_cp(embedding_costs(card, job, hw), job)
    embedding["params"] = embedding_params(card) / job.tp
    head = _per_cp(head_costs(card, job, hw), job)
    head["params"] = head_params(card) / job.tp
    stage_input = card.dtype_bytes * job.seq * job.mbs * card.hidden / job.tp / job.cp
    return UnitCosts(layer=layer, embedding=embedding, head=head, m_in=stage_input,
                     m_in_first=8.0 * job.seq * job.mbs / job.cp, full_layer=full)  # fmt: skip


def _layer_model_units(card: ModelCard, hw: HardwareCard, job: Job) -> UnitCosts:
    """:func:`unit_costs` of an MoE, MLA or windowed model (:mod:`moe`'s layers; the first
    ``dense_layers`` dense), the multi-token-prediction modules with the output layer."""
    if any(job.full_layers):
        raise ProblemError("full_layers", f"{card.name}: per-stage full layers are for dense "
                           "decoders; use --ac full or modules:...")  # fmt: skip
    layer = moe_layer_unit(card, hw, job, moe=card.moe)
    dense = moe_layer_unit(card, hw, job, moe=False) if card.moe and card.dense_layers else None
    embedding = _per_cp(embedding_costs(card, job, hw), job)
    embedding["params"] = embedding_params(card) / job.tp
    head = _per_cp(head_costs(card, job, hw), job)
    head["params"] = head_params(card) / job.tp
    for key, value in mtp_costs(card, hw, job, layer, head).items():
        head[key] = head.get(key, 0.0) + value
    stage_input = card.dtype_bytes * job.seq * job.mbs * card.hidden / job.tp / job.cp
    return UnitCosts(layer=layer, embedding=embedding, head=head, m_in=stage_input,
                     m_in_first=8.0 * job.seq * job.mbs / job.cp, dense_layer=dense)  # fmt: skip


def _per_cp(costs: dict[str, float], job: Job) -> dict[str, float]:
    return {key: value / job.cp if key in CP_SCALED else value for key, value in costs.items()}


STAGE_KEYS = ("t_f", "t_b", "t_w", "m_b", "m_w", "params", "expert_params", "t_f_comm",
              "t_b_comm")  # fmt: skip
"""The per-layer costs a stage adds up."""


def stage_costs(card: ModelCard, hw: HardwareCard, job: Job) -> list[StageCost]:
    """Per-stage costs of ``job`` (its layers split): ``layers x`` :func:`unit_costs`' layer
    (an MoE model's first layers its dense layer), plus the embedding on the first stage and
    the output layer on the last."""
    units = unit_costs(card, hw, job)
    layer, embedding, head = ([part.get(k, 0.0) for k in STAGE_KEYS] for part in units.parts())
    full = [units.full_layer.get(k, 0.0) for k in STAGE_KEYS] if units.full_layer else layer
    dense = [units.dense_layer.get(k, 0.0) for k in STAGE_KEYS] if units.dense_layer else layer
    last, start = job.stages - 1, 0
    out = []
    for s, (d, n) in enumerate(zip(job.stage_devices, job.layers, strict=True)):
        n_full = job.stage_full_layers(s) if units.full_layer else 0
        n_dense = max(0, min(start + n, card.dense_layers) - start) if units.dense_layer else 0
        start += n
        part = stage_total(n - n_full - n_dense, layer, embedding, head, first=s == 0,
                           last=s == last)  # fmt: skip
        total = {k: a + n_full * b + n_dense * c
                 for k, a, b, c in zip(STAGE_KEYS, part, full, dense, strict=True)}  # fmt: skip
        m_in = units.m_in_first if s == 0 else units.m_in  # the first stage keeps token ids
        out.append(StageCost(device=d, layers=n, embedding=s == 0, head=s == last,
                             m_in=min(m_in, total["m_b"]), **total))  # fmt: skip
    return out


def stage_transients(units: UnitCosts, job: Job) -> list[tuple[float, float]]:
    """Per stage, what it holds only during one backward (bytes): ``(a re-run layer's
    transient, the loss's fp32 gradients on the last stage)``."""
    out = []
    for s, n in enumerate(job.layers):
        n_full = job.stage_full_layers(s) if units.full_layer else 0
        full = units.full_layer["transient"] if units.full_layer and n_full else 0.0
        last = s == len(job.layers) - 1
        head = units.head["transient"] if last and fsdp_on(job) else 0.0  # torchtitan's fp32 loss
        out.append((max(full, units.layer["transient"] if n > n_full else 0.0), head))
    return out


def static_memory_terms(
    card: ModelCard, stages: list[StageCost], job: Job, hw: HardwareCard
) -> list[dict[str, float]]:
    """Per device, the named static terms of :func:`memory_breakdown.static_terms` (bytes)."""
    transients = stage_transients(unit_costs(card, hw, job), job)
    return static_terms(card, job, stages, transients, job_bytes_per_param(job),
                        expert_per_param=expert_bytes_per_param(job))  # fmt: skip


def static_bytes(
    card: ModelCard, stages: list[StageCost], job: Job, hw: HardwareCard
) -> list[float]:
    """What each device holds beside its activations (:func:`static_memory_terms` summed:
    weights, gradients and optimizer state, FSDP's unsharded copies, re-run transients,
    receive buffers, the allocator's cached buffers); fails when they alone overflow."""
    terms = reserved_static_terms(card, stages, job, hw)
    need = [sum(t.values()) for t in terms]
    cap = hw.usable_bytes
    worst = max(range(job.pp), key=lambda d: need[d])
    if need[worst] > cap:
        largest = sorted(terms[worst].items(), key=lambda kv: -kv[1])[:3]
        named = ", ".join(f"{k.replace('_', ' ')} {v / GIB:.1f}" for k, v in largest)
        raise StaticMemoryError(
            f"device {worst}: weights, gradients, optimizer state and buffers need "
            f"{need[worst] / GIB:.1f} GiB ({named} GiB), {(need[worst] - cap) / GIB:.1f} GiB "
            f"more than the {cap / GIB:.1f} GiB cap of {hw.name} ({hw.hbm_gib:g} GiB minus "
            f"{hw.reserve_gib:g} reserved); {_static_fix(largest[0][0])}",
            need=need[worst], cap=cap,
        )  # fmt: skip
    return [n - t[HELD_FRAGMENTATION] for n, t in zip(need, terms, strict=True)]


PER_TOKEN_TERMS = ("loss", "output_logits", "recompute_buffer", "pipeline_buffers")
"""Static terms that grow with a microbatch's tokens, not with the parameters."""


def _static_fix(largest: str) -> str:
    """What lowers static memory whose largest term is ``largest``."""
    if largest in PER_TOKEN_TERMS:
        return "use fewer tokens per microbatch (a smaller mbs), a larger cp or tp"
    return "use a larger pp or tp, or fewer bytes per parameter"


HELD_FRAGMENTATION = "fragmentation_of_held_gradients"
"""The reserved bytes the allocator's fragmentation adds to a pipelined FSDP stage's held
fp32 gradients (:func:`reserved_static_terms`)."""


def reserved_static_terms(
    card: ModelCard, stages: list[StageCost], job: Job, hw: HardwareCard
) -> list[dict[str, float]]:
    """Per device, :func:`static_memory_terms` and :data:`HELD_FRAGMENTATION`: what the cap
    (:func:`pp_opt.profiler.memory_breakdown.cap_bytes`) counts as reserved beside the
    activations, and the split model's rows (:mod:`pp_opt.planner.candidates`)."""
    share = fragmentation_share(hw, job)
    held = held_bytes_per_device(job, stages)
    return [
        {**t, HELD_FRAGMENTATION: share * h}
        for t, h in zip(static_memory_terms(card, stages, job, hw), held, strict=True)
    ]


def link_costs(card: ModelCard, hw: HardwareCard, job: Job) -> LinkCosts:
    """``t_comm`` between pipeline neighbours, host-link groups and per-GPU copy bandwidth.

    Devices are numbered along the pipeline and packed into nodes in order, ``tp`` GPUs each.
    ``t_comm`` is one number for every cross-device edge, so it takes the slowest link in use
    (inter-node when the pipeline spans nodes). GPUs of one tensor-parallel group that share a
    host link split its bandwidth; distinct devices that share one are returned as groups.
    """
    message = card.dtype_bytes * job.seq * job.mbs * card.hidden / job.tp / job.cp
    spans_nodes = job.pp * job.tp > hw.gpus_per_node
    gbs, latency_us = node_link(hw, spans_nodes)
    sharing = min(job.tp, hw.gpus_per_host_link)
    per_link = max(1, hw.gpus_per_host_link // job.tp)
    groups: dict[tuple[int, int], list[int]] = {}
    for d in range(job.pp):
        node, local = divmod(d * job.tp, hw.gpus_per_node)
        groups.setdefault((node, local // (per_link * job.tp)), []).append(d)
    host_links = [g for g in groups.values() if len(g) > 1] if per_link > 1 else []
    return LinkCosts(t_comm=p2p_ms(message, gbs, latency_us), host_links=host_links,
                     d2h_gbs=hw.d2h_gbs / sharing, h2d_gbs=hw.h2d_gbs / sharing,
                     spans_nodes=spans_nodes)  # fmt: skip


def profile_analytic(card: ModelCard, hw: HardwareCard, job: Job) -> CostProfile:
    """The cost profile of ``job`` (its layers split) from the formulas."""
    stages = stage_costs(card, hw, job)
    static = static_bytes(card, stages, job, hw)
    caps = device_caps(hw, job, static, held_bytes_per_device(job, stages))
    log.debug("analytic profile of %s on %s: %d stages", card.name, hw.name, len(stages))
    return CostProfile(job=job, kind="analytic", model=card, hardware=hw, stages=tuple(stages),
                       static=tuple(static), cap=min(caps), caps=tuple(caps),
                       bytes_per_param=job_bytes_per_param(job),
                       links=link_costs(card, hw, job))  # fmt: skip
