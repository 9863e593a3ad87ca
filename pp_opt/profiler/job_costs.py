"""One decoder layer's costs under the job's training features, and a device's fixed memory.

The plain layer (:func:`pp_opt.profiler.analytic.layer_times`, :mod:`formulas`) is changed by
what the job runs, each effect from its own module:

* activation checkpointing (:mod:`checkpointing`): ``selective_op`` and ``full`` keep less in
  F and re-run part (or all) of the forward in B;
* Float8 (:mod:`kernels`): the block's linear GEMMs at the card's FP8 rate, plus the casts;
* torch.compile (:func:`kernels.elementwise_bytes`): the elementwise passes scaled by the
  compiled / eager byte counts of the block;
* tensor parallelism: the collectives of :func:`analytic.tp_comm_ms`, exposed in full or, with
  AsyncTP, as :func:`kernels.tp_exposed_s` leaves them;
* context parallelism (:mod:`context_parallel`): every per-GPU cost is ``1 / cp`` of the
  full sequence's (load-balanced causal ring attention), plus the key/value exchange.

A device's fixed memory beside its activations is :func:`memory_breakdown.static_terms`'.
"""

from __future__ import annotations

from pp_opt.job import Job
from pp_opt.profiler.attention_kernels import core_attention_ms, kernel_rates
from pp_opt.profiler.cards import HardwareCard, ModelCard
from pp_opt.profiler.checkpointing import layer_checkpoint_cost
from pp_opt.profiler.comm import fp8_gemm_ms, gemm_ms, hbm_ms, node_link
from pp_opt.profiler.context_parallel import (
    gathered_attention,
    ring_attention,
    ring_round_bytes,
)
from pp_opt.profiler.formulas import (
    LayerShape,
    attention_core_flops,
    layer_activation_bytes,
    layer_flops,
    linear_flops,
)
from pp_opt.profiler.kernels import (
    elementwise_bytes,
    fp8_cast_bytes,
    tp_collective_bytes,
    tp_exposed_s,
)
from pp_opt.profiler.stacks import load_stack_card

FORMULA_MODES = ("none", "selective")
"""Checkpointing modes :mod:`formulas` counts itself; the others start from ``none``."""


def gemm_time_ms(linear: float, other: float, hw: HardwareCard, *, fp8: bool) -> float:
    """Linear-layer FLOPs (FP8 under Float8) plus the attention core's (always BF16), ms."""
    if fp8:
        return fp8_gemm_ms(linear, hw) + gemm_ms(other, hw)
    return gemm_ms(linear + other, hw)


def compile_factor(shape: LayerShape, job: Job) -> float:
    """The compiled block's elementwise HBM bytes per eager byte (1 without compile)."""
    if not job.compile:
        return 1.0
    return elementwise_bytes(shape, compiled=True) / elementwise_bytes(shape, compiled=False)


def layer_unit(
    card: ModelCard, hw: HardwareCard, job: Job, *, mode: str, elementwise: tuple[float, float],
    tp_comm: float,
) -> dict[str, float]:  # fmt: skip
    """One layer's ``t_f, t_b, t_w`` (ms), ``m_b, m_w`` and ``transient`` (bytes) under
    ``mode``, per GPU and microbatch. ``elementwise``: the eager layer's non-GEMM time in F
    and B (ms, :func:`analytic.elementwise_ms`); ``tp_comm``: one pass of its
    tensor-parallel collectives (ms, bf16, :func:`analytic.tp_comm_ms`)."""
    shape = LayerShape.of(card, s=job.seq, b=job.mbs, tp=job.tp,
                          recompute=mode if mode in FORMULA_MODES else "none")  # fmt: skip
    w = layer_flops(shape)[2]
    lin = linear_flops(shape)
    elem_f, elem_b = elementwise
    scale = compile_factor(shape, job)
    att_f, att_b = dense_core_ms(shape, hw, job)
    gemm_f = gemm_time_ms(lin, 0.0, hw, fp8=job.fp8) + att_f
    rerun = att_f if shape.recompute == "selective" else 0.0  # B re-runs the core's F
    gemm_b = gemm_time_ms(lin, 0.0, hw, fp8=job.fp8) + att_b + rerun
    t_w = gemm_time_ms(w, 0.0, hw, fp8=job.fp8)
    t_f, t_b = gemm_f + scale * elem_f, gemm_b + scale * elem_b
    if job.fp8:
        cast = hbm_ms(fp8_cast_bytes(shape), hw)
        t_f, t_b = t_f + cast / 3, t_b + 2 * cast / 3
    if job.tp_comm and job.tp > 1:
        fwd_bytes, bwd_bytes = tp_collective_bytes(shape, fp8_gather=job.fp8)
        comm_f = tp_comm * fwd_bytes / bwd_bytes
        t_f += tp_exposed_s(comm_f, gemm_f, tp=job.tp, async_tp=job.async_tp)
        t_b += tp_exposed_s(tp_comm, gemm_b, tp=job.tp, async_tp=job.async_tp)
    m_b, m_w = layer_activation_bytes(shape)
    transient = 0.0
    if mode not in FORMULA_MODES:
        cost = layer_checkpoint_cost(shape, mode)
        m_b, m_w, transient = cost.kept_bytes, min(m_w, cost.kept_bytes), cost.transient_bytes
        if mode == "full":
            t_b += t_f  # B re-runs the layer's forward, collectives included
            transient += gathered_inputs_bytes(shape)
        else:
            t_b += gemm_time_ms(cost.recompute_flops, 0.0, hw, fp8=job.fp8) + scale * elem_f
    unit = {"t_f": t_f, "t_b": t_b, "t_w": t_w, "m_b": m_b, "m_w": m_w, "transient": transient}
    return context_parallel_unit(unit, card, hw, job, shape, mode=mode)


def dense_core_ms(shape: LayerShape, hw: HardwareCard, job: Job) -> tuple[float, float]:
    """The attention core's F and B (ms, B twice F's FLOPs as :mod:`formulas` counts them).
    A fused (``flash``) kernel the card has rates for skips the causal mask's upper half and
    runs at those rates (:mod:`attention_kernels`); otherwise the count's full square runs at
    the GEMM rate, as the fitted torchtitan rows were."""
    core = attention_core_flops(shape)
    kernel = load_stack_card(job.stack).attention_kernel
    if shape.attention != "flash" or kernel_rates(hw.attention, kernel) is None:
        return gemm_ms(core, hw), gemm_ms(2 * core, hw)
    return core_attention_ms(core / 2, table=hw.attention, kernel=kernel, seq=shape.s / job.cp,
                             gemm_rate=hw.gemm_flops)  # fmt: skip


def gathered_inputs_bytes(shape: LayerShape) -> float:
    """What a re-run layer saves beyond :mod:`formulas`' sequence-parallel count under DTensor
    TP: the inputs of the column-parallel linears (attention's and the MLP's normed input)
    are all-gathered before the matmul and saved whole (``e s b h`` each, not ``/ t``)."""
    if shape.tp == 1:
        return 0.0
    return 2.0 * shape.dtype_bytes * shape.tokens * shape.h * (shape.tp - 1) / shape.tp


def context_parallel_unit(
    unit: dict[str, float], card: ModelCard, hw: HardwareCard, job: Job, shape: LayerShape,
    *, mode: str = "none",
) -> dict[str, float]:  # fmt: skip
    """``unit`` (full sequence) as one of ``cp`` GPUs runs it: ``1 / cp`` of every cost, plus
    ring attention's exposed key/value exchange and its gathered key/value buffer."""
    if job.cp == 1:
        return unit
    out = {key: value / job.cp for key, value in unit.items()}
    att_f, att_b = dense_core_ms(shape, hw, job)
    gbs, latency = node_link(hw, spans_nodes=job.cp * job.tp > hw.gpus_per_node)
    stack = load_stack_card(job.stack)
    width = card.hidden if stack.cp_kv_width == "query" else card.kv_hidden
    if stack.cp_attention == "gathered":
        ring = gathered_attention(s=job.seq, b=job.mbs, h_kv=width, cp=job.cp, tp=job.tp,
                                  dtype_bytes=card.dtype_bytes, latency_us=latency,
                                  link_gbs=gbs * stack.allgather_efficiency)  # fmt: skip
        merge_f = merge_b = 0.0  # one kernel over every key: no rounds to merge
    else:
        ring = ring_attention(
            s=job.seq, b=job.mbs, h_kv=width, h_q=card.hidden, cp=job.cp, tp=job.tp,
            dtype_bytes=card.dtype_bytes, attention_f_s=att_f / 1e3 / job.cp,
            attention_b_s=att_b / 1e3 / job.cp,
            link_gbs=gbs * stack.allgather_efficiency, latency_us=latency,
            permute_gbs=gbs * stack.alltoall_efficiency, grad_dtype_bytes=stack.cp_grad_bytes,
            serialized=job.compile and stack.cp_serialized_when_compiled,
        )  # fmt: skip
        merge_f, merge_b = ring_round_bytes(s=job.seq, b=job.mbs, h_q=card.hidden, h_kv=width,
                                            cp=job.cp, tp=job.tp)  # fmt: skip
    forward = 1e3 * ring.forward_exposed_s + hbm_ms(merge_f, hw)
    out["t_f"] += forward
    out["t_b"] += 1e3 * ring.backward_exposed_s + hbm_ms(merge_b, hw)
    if mode == "full":  # B re-runs the forward, its key/value gather and merges included
        out["t_b"] += forward
    out["transient"] += ring.backward_buffer_bytes
    return out
