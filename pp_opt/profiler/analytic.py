"""Analytic stage costs: FLOPs and bytes (formulas.py) turned into times on a hardware card.

Time model, per layer and op: ``GEMM FLOPs / (peak x gemm_efficiency)`` plus a memory-bound
part for everything that is not a GEMM (norms, dropout, GeLU, softmax, residual adds,
transposes): ``passes x bytes / (HBM bandwidth x hbm_efficiency)``, where ``bytes`` are the
layer's saved activations that scale with ``s b h`` (the score matrix excluded). W is pure GEMM.

The pass counts were fit once, to the Zero Bubble paper's A100 profile of its 1.5B model
(DESIGN.md section 7), and checked on the other three models, which they reproduce to 3%
(``t_f : t_b : t_w`` ratios and absolute times alike); fitting the score-matrix traffic too gave
it a zero weight (Megatron's fused softmax), so it is left out. Absolute times on other GPUs
rest on their cards' efficiency estimates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.profiler.cards import GB, GIB, HardwareCard, ModelCard
from pp_opt.profiler.formulas import (
    LayerShape,
    activation_terms,
    embedding_params,
    head_params,
    layer_activation_bytes,
    layer_flops,
    layer_params,
)
from pp_opt.profiler.layout import Layout

log = logging.getLogger(__name__)

FORWARD_PASSES = 11.75
"""HBM bytes moved by F's non-GEMM kernels per byte of saved (``s b h``-sized) activation."""
BACKWARD_PASSES = 10.0
"""The same for B (fit: 0.85 of F's on all four Zero Bubble models)."""
LOSS_PASSES = 4.0
"""HBM passes over the fp32 logits by the softmax cross-entropy (F and B each): an estimate."""


@dataclass(kw_only=True, slots=True)
class StageCost:
    """Costs of one microbatch on one stage, in ms and bytes, before they become a Stage."""

    device: int
    layers: int
    t_f: float = 0.0
    t_b: float = 0.0
    t_w: float = 0.0
    m_b: float = 0.0
    m_w: float = 0.0
    m_in: float = 0.0
    params: float = 0.0
    """Parameters on this GPU (already divided by the tensor-parallel degree)."""
    embedding: bool = False
    head: bool = False
    t_bw: float | None = None
    """Fused backward when it is not ``t_b + t_w`` (measured profiles)."""
    t_offload: float | None = None
    """Measured OFFLOAD time; None: from ``m_b`` and the copy bandwidth."""
    t_reload: float | None = None
    """Measured RELOAD time; None: from ``m_b`` and the copy bandwidth."""
    timings: dict[str, Any] | None = None
    """Measured spread per cost (median, iqr, min, max, repeats), keyed like the costs."""


def layer_shape(card: ModelCard, layout: Layout, **over: object) -> LayerShape:
    return LayerShape.of(
        card, s=layout.seq, b=layout.mbs, tp=layout.tp, recompute=layout.recompute, **over
    )


def layer_times(shape: LayerShape, hw: HardwareCard) -> tuple[float, float, float]:
    """``(t_f, t_b, t_w)`` of one layer in ms."""
    f, b, w = layer_flops(shape)
    rate = hw.peak_flops * hw.gemm_efficiency
    bandwidth = hw.hbm_gbs * GB * hw.hbm_efficiency
    plain = replace(shape, recompute="none")
    hidden_bytes = sum(v for k, v in activation_terms(plain).items() if not k.endswith("scores"))
    t_f = f / rate + FORWARD_PASSES * hidden_bytes / bandwidth
    t_b = b / rate + BACKWARD_PASSES * hidden_bytes / bandwidth
    return 1e3 * t_f, 1e3 * t_b, 1e3 * w / rate


def head_costs(card: ModelCard, layout: Layout, hw: HardwareCard) -> dict[str, float]:
    """Final norm, output layer and softmax cross-entropy (last stage), per GPU."""
    sb, h, t, e = layout.seq * layout.mbs, card.hidden, layout.tp, card.dtype_bytes
    flops = 2.0 * sb * h * card.vocab / t
    logits = 4.0 * sb * card.vocab / t  # fp32 softmax kept by the loss for its backward
    rate = hw.peak_flops * hw.gemm_efficiency
    bandwidth = hw.hbm_gbs * GB * hw.hbm_efficiency
    elementwise = LOSS_PASSES * logits / bandwidth
    stats = 8 if card.norm == "layernorm" else 4
    return {
        "t_f": 1e3 * (flops / rate + elementwise),
        "t_b": 1e3 * (flops / rate + elementwise),
        "t_w": 1e3 * flops / rate,
        "m_b": ((2 * e * h + stats) * sb) / t + logits,
        "m_w": (e * h + e * card.vocab) * sb / t,
    }


def embedding_costs(card: ModelCard, layout: Layout, hw: HardwareCard) -> dict[str, float]:
    """Embedding gather (F) and its gradient scatter-add (W), first stage, per GPU."""
    sb, e = layout.seq * layout.mbs, card.dtype_bytes
    moved = 2.0 * e * sb * card.hidden / layout.tp
    ms = 1e3 * moved / (hw.hbm_gbs * GB * hw.hbm_efficiency)
    return {"t_f": ms, "t_b": 0.0, "t_w": ms, "m_b": 8.0 * sb, "m_w": 0.0}


TP_COLLECTIVES = 4
"""Collectives per layer in F (and again in B) under sequence parallelism: an all-gather
before and a reduce-scatter after each of attention and the MLP (Megatron-LM)."""


def tp_comm_ms(card: ModelCard, hw: HardwareCard, layout: Layout) -> float:
    """Time of one layer's tensor-parallel collectives in F (the same in B, none in W), ms.

    Each of :data:`TP_COLLECTIVES` ring collectives moves ``(t - 1) / t`` of the layer's
    ``s b h`` activation per GPU at the intra-node bandwidth (``tp`` stays inside a node)
    and pays ``t - 1`` latencies; 0 when ``tp = 1``.
    """
    t = layout.tp
    if t == 1:
        return 0.0
    full = card.dtype_bytes * layout.seq * layout.mbs * card.hidden
    one = (t - 1) / t * full / (hw.intra_node_gbs * GB) + (t - 1) * hw.intra_node_latency_us * 1e-6
    return 1e3 * TP_COLLECTIVES * one


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


def unit_costs(
    card: ModelCard, hw: HardwareCard, layout: Layout, *, tp_comm: bool = False
) -> UnitCosts:
    """The per-layer costs :func:`stage_costs` sums, for a planner that splits layers itself."""
    shape = layer_shape(card, layout)
    t_f, t_b, t_w = _layer_times(card, hw, layout, shape, tp_comm)
    m_b, m_w = layer_activation_bytes(shape)
    layer = {"t_f": t_f, "t_b": t_b, "t_w": t_w, "m_b": m_b, "m_w": m_w,
             "params": layer_params(card) / layout.tp}  # fmt: skip
    embedding = embedding_costs(card, layout, hw)
    embedding["params"] = embedding_params(card) / layout.tp
    head = head_costs(card, layout, hw)
    head["params"] = head_params(card) / layout.tp
    stage_input = card.dtype_bytes * layout.seq * layout.mbs * card.hidden / layout.tp
    return UnitCosts(layer=layer, embedding=embedding, head=head, m_in=stage_input,
                     m_in_first=8.0 * layout.seq * layout.mbs)  # fmt: skip


def _layer_times(
    card: ModelCard, hw: HardwareCard, layout: Layout, shape: LayerShape, tp_comm: bool
) -> tuple[float, float, float]:
    t_f, t_b, t_w = layer_times(shape, hw)
    if tp_comm and layout.tp > 1:
        comm = tp_comm_ms(card, hw, layout)
        return t_f + comm, t_b + comm, t_w
    return t_f, t_b, t_w


def stage_costs(
    card: ModelCard, hw: HardwareCard, layout: Layout, *, tp_comm: bool = False
) -> list[StageCost]:
    """Per-stage costs of ``layout``: its layers, plus the embedding and the output layer.

    ``tp_comm`` adds the tensor-parallel collectives (:func:`tp_comm_ms`) to each layer's
    F and B (off by default: profiles made without it stay as they were).
    """
    shape = layer_shape(card, layout)
    t_layer = _layer_times(card, hw, layout, shape, tp_comm)
    m_b_layer, m_w_layer = layer_activation_bytes(shape)
    p_layer = layer_params(card) / layout.tp
    stage_input = card.dtype_bytes * layout.seq * layout.mbs * card.hidden / layout.tp
    last = layout.num_stages - 1
    out = []
    for s, (d, n) in enumerate(zip(layout.stage_devices, layout.layers, strict=True)):
        cost = StageCost(device=d, layers=n, embedding=s == 0, head=s == last)
        cost.t_f, cost.t_b, cost.t_w = (n * t for t in t_layer)
        cost.m_b, cost.m_w, cost.params = n * m_b_layer, n * m_w_layer, n * p_layer
        cost.m_in = stage_input
        if cost.embedding:
            _add(cost, embedding_costs(card, layout, hw))
            cost.params += embedding_params(card) / layout.tp
            cost.m_in = 8.0 * layout.seq * layout.mbs  # token ids
        if cost.head:
            _add(cost, head_costs(card, layout, hw))
            cost.params += head_params(card) / layout.tp
        cost.m_in = min(cost.m_in, cost.m_b)
        out.append(cost)
    return out


def _add(cost: StageCost, part: dict[str, float]) -> None:
    for key, value in part.items():
        setattr(cost, key, getattr(cost, key) + value)


def static_bytes(stages: list[StageCost], layout: Layout, hw: HardwareCard) -> list[float]:
    """Weights, gradients and optimizer state per device; fails when they alone overflow."""
    static = [0.0] * layout.pp
    for st in stages:
        static[st.device] += st.params * layout.bytes_per_param
    cap = hw.cap_bytes
    worst = max(range(layout.pp), key=lambda d: static[d])
    if static[worst] > cap:
        raise ProblemError(
            "hardware",
            f"device {worst}: weights, gradients and optimizer state need "
            f"{static[worst] / GIB:.1f} GiB, {(static[worst] - cap) / GIB:.1f} GiB more than the "
            f"{cap / GIB:.1f} GiB cap of {hw.name} ({hw.hbm_gib:g} GiB minus {hw.reserve_gib:g} "
            "reserved); use a larger pp or tp, or fewer bytes per parameter",
        )
    return static


def link_costs(card: ModelCard, hw: HardwareCard, layout: Layout) -> dict[str, Any]:
    """``t_comm`` between pipeline neighbours, host-link groups and per-GPU copy bandwidth.

    Devices are numbered along the pipeline and packed into nodes in order, ``tp`` GPUs each.
    ``t_comm`` is one number for every cross-device edge, so it takes the slowest link in use
    (inter-node when the pipeline spans nodes). GPUs of one tensor-parallel group that share a
    host link split its bandwidth; distinct devices that share one are returned as groups.
    """
    message = card.dtype_bytes * layout.seq * layout.mbs * card.hidden / layout.tp
    spans_nodes = layout.pp * layout.tp > hw.gpus_per_node
    gbs = hw.inter_node_gbs if spans_nodes else hw.intra_node_gbs
    latency_us = hw.inter_node_latency_us if spans_nodes else hw.intra_node_latency_us
    t_comm = latency_us * 1e-3 + 1e3 * message / (gbs * GB)
    sharing = min(layout.tp, hw.gpus_per_host_link)
    per_link = max(1, hw.gpus_per_host_link // layout.tp)
    groups: dict[tuple[int, int], list[int]] = {}
    for d in range(layout.pp):
        gpu = d * layout.tp
        node, local = divmod(gpu, hw.gpus_per_node)
        groups.setdefault((node, local // (per_link * layout.tp)), []).append(d)
    host_links = [g for g in groups.values() if len(g) > 1] if per_link > 1 else []
    return {
        "t_comm": t_comm,
        "host_links": host_links,
        "d2h_gbs": hw.d2h_gbs / sharing,
        "h2d_gbs": hw.h2d_gbs / sharing,
        "spans_nodes": spans_nodes,
    }


def profile_analytic(
    card: ModelCard, hw: HardwareCard, layout: Layout, *, tp_comm: bool = False
) -> dict[str, Any]:
    """Everything a cost profile holds, from the formulas (see costs.py for the JSON)."""
    stages = stage_costs(card, hw, layout, tp_comm=tp_comm)
    static = static_bytes(stages, layout, hw)
    links = link_costs(card, hw, layout)
    log.debug("analytic profile of %s on %s: %d stages", card.name, hw.name, len(stages))
    return {"stages": stages, "static": static, "cap": hw.cap_bytes, **links}
