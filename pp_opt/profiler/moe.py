"""Costs of a Mixture-of-Experts (or MLA, or sliding-window) decoder layer, per GPU and
microbatch, with communication kept apart from compute.

A layer is attention (grouped-query, or DeepSeek's multi-head latent attention; full or
sliding-window) and an MLP: dense, or MoE (router, ``top_k`` routed experts, shared experts).
Counts follow :mod:`formulas`' conventions: ``2 in out`` FLOPs per token for each linear in F,
the same in B and in W; the attention core ``2 x keys`` FLOPs per token and head width for
each of its two products in F and twice that in B, with the keys a causal query attends to
on average (``s / 2``; the window for sliding layers); every per-GPU number split over
``tp`` (sequence parallel) and ``cp``.

Routed experts (Megatron-Core's parallel folding, torchtitan's EP): each GPU sends its
``T / tp`` tokens' ``top_k`` copies to the ``ep`` ranks holding their experts (dispatch) and
gets them back (combine); it computes ``T / tp x top_k`` copies' expert GEMMs whatever
``etp`` is (``etp`` splits each expert's width and multiplies its tokens). The grouped GEMM
runs slower with few tokens per expert (``n / (n + half)`` of the dense rate, the stack's
``grouped_gemm_half_tokens``). The dispatch and combine all-to-all move ``top_k`` copies of
each token's hidden vector (FP8 where the stack's DeepEP/HybridEP send FP8), on NVLink inside a
node and RDMA beyond; DeepEP and HybridEP send a token once per remote node (node-limited
routing caps those nodes), NCCL's all-to-all once per remote copy.

Every MoE layer's forward waits on the GPU for its token counts (the dispatchers' receive
counts, the grouped GEMM's per-expert splits as a host list), so the host cannot run ahead
there: a layer's pass lasts at least the time the host takes to launch it (the stack's
``moe_host_ms``; :func:`host_bound`). Small fine-grained layers run eager are host-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.profiler.attention_kernels import core_attention_ms
from pp_opt.profiler.cards import GB, HardwareCard, ModelCard
from pp_opt.profiler.comm import fp8_gemm_ms, gemm_ms, hbm_ms, node_link, ring_all_gather_ms
from pp_opt.profiler.context_parallel import gathered_attention
from pp_opt.profiler.stacks import StackCard, load_stack_card

ATTENTION_PASSES = 12.0
"""HBM passes over a token's ``h``-wide bf16 hidden vector by the attention block's
elementwise kernels in F (two norms, residual adds, rotary, casts): an estimate, as
:data:`pp_opt.profiler.analytic.FORWARD_PASSES` counts them for the Zero Bubble GPT."""
ROUTER_BYTES = 8.0
"""fp32 router logits and probabilities kept per token and expert."""


@dataclass(frozen=True, slots=True)
class Layout:
    """What one GPU runs of one microbatch: tokens and degrees."""

    tokens: float
    """Tokens of the microbatch on this CP rank (``s b / cp``)."""
    seq: int
    tp: int
    ep: int
    etp: int
    imbalance: float
    dispatcher: str
    fp8: bool

    @classmethod
    def of(cls, job: Job, stack: StackCard) -> Layout:
        return cls(tokens=job.seq * job.mbs / job.cp, seq=job.seq, tp=job.tp, ep=job.ep,
                   etp=job.etp, imbalance=job.expert_imbalance,
                   dispatcher=job.dispatcher or stack.dispatcher, fp8=job.fp8)  # fmt: skip


def context_length(card: ModelCard, seq: int) -> float:
    """Keys a query attends to on average: causal attention skips the masked half (flash
    kernels skip masked blocks), a sliding-window layer sees at most its window."""
    full = seq / 2
    if not card.sliding_window or not card.window_every:
        return full
    window = min(full, card.sliding_window)
    return (full + (card.window_every - 1) * window) / card.window_every


def attention_parts(card: ModelCard) -> dict[str, float]:
    """Per-token widths of attention: linear FLOPs, core width, params, saved activations."""
    h, a = card.hidden, card.heads
    if card.mla:
        qk, dv = card.qk_nope_head_dim + card.qk_rope_head_dim, card.v_head_dim
        q = card.q_lora_rank * (h + a * qk) if card.q_lora_rank else h * a * qk
        kv = h * (card.kv_lora_rank + card.qk_rope_head_dim)
        kv += card.kv_lora_rank * a * (card.qk_nope_head_dim + dv)
        weights = q + kv + a * dv * h
        norms = card.q_lora_rank + card.kv_lora_rank
        latents = card.q_lora_rank + card.kv_lora_rank + card.qk_rope_head_dim
        return {"weights": weights, "params": weights + norms, "core_qk": a * qk,
                "core_v": a * dv, "latents": latents, "qkv": 2 * a * qk + a * dv,
                "out": a * dv, "grad_out": (card.q_lora_rank or a * qk) + latents + h}  # fmt: skip
    d = card.attn_head_dim
    qkv = a * d + 2 * card.kv_hidden
    weights = h * qkv + a * d * h
    biases = qkv + h if card.bias else 0
    return {"weights": weights, "params": weights + biases, "core_qk": a * d, "core_v": a * d,
            "latents": 0.0, "qkv": qkv, "out": a * d, "grad_out": qkv + h}  # fmt: skip


def mlp_width(card: ModelCard, moe: bool) -> tuple[float, float]:
    """``(inner width run on every token's TP shard, routed expert width)`` of a layer."""
    if not moe:
        return float(card.ffn_size), 0.0
    return float(card.shared_experts * card.moe_ffn), float(card.moe_ffn)


def layer_params(card: ModelCard, moe: bool) -> tuple[float, float]:
    """``(dense, routed expert)`` parameters of one layer, all ranks together."""
    h = card.hidden
    shared, routed = mlp_width(card, moe)
    dense = attention_parts(card)["params"] + 2 * h + 3 * h * shared
    if moe:
        dense += h * card.experts  # the router
        return dense, card.experts * 3 * h * routed
    return dense, 0.0


def _gemm(flops: float, hw: HardwareCard, stack: StackCard, *, fp8: bool, scale: float = 1.0
          ) -> float:  # fmt: skip
    """``flops`` at the stack's rate on the card, ``scale`` of it (ms)."""
    ms = fp8_gemm_ms(flops, hw) if fp8 else gemm_ms(flops, hw)
    return ms / (stack.gemm_scale * scale)


def grouped_scale(card: ModelCard, lay: Layout, stack: StackCard) -> float:
    """The grouped expert GEMM's rate over a dense GEMM's: tokens per local expert ``n``
    over ``n + half``."""
    n = lay.tokens / lay.tp * card.top_k * lay.ep * lay.etp / card.experts
    return n / (n + stack.grouped_gemm_half_tokens)


def dispatch_ms(card: ModelCard, hw: HardwareCard, lay: Layout, stack: StackCard,
                *, dtype_bytes: float) -> float:  # fmt: skip
    """One dispatch (or combine) of this GPU's ``T / tp x top_k`` token copies (ms)."""
    if lay.ep == 1:
        return 0.0
    tokens = lay.tokens / lay.tp * lay.imbalance
    copies, vector = tokens * card.top_k, card.hidden * dtype_bytes
    eff = stack.dispatch_efficiency(lay.dispatcher)
    latency = stack.dispatch_latency_us * 1e-3
    span = lay.ep * lay.etp
    if lay.dispatcher == "allgather":
        return (
            ring_all_gather_ms(
                tokens * vector * lay.ep,
                lay.ep,
                *node_link(hw, spans_nodes=span > hw.gpus_per_node),
            )
            / eff
        )
    peers = min(lay.ep, max(1, hw.gpus_per_node // lay.etp))
    nodes = -(-lay.ep // peers)
    local = copies * (peers - 1) / lay.ep
    remote_copies = copies * (lay.ep - peers) / lay.ep
    if lay.dispatcher in ("deepep", "hybridep") and nodes > 1:
        reach = nodes * (1 - (1 - 1 / nodes) ** card.top_k)
        if card.node_limit:
            reach = min(reach, card.node_limit)
        remote = tokens * reach * (nodes - 1) / nodes
        local = copies * (1 - 1 / lay.ep)  # forwarded copies cross NVLink too
    else:
        remote = remote_copies
    nvlink = 1e3 * local * vector / (hw.intra_node_gbs * GB * eff)
    rdma = 1e3 * remote * vector / (hw.inter_node_gbs * GB * eff)
    return max(nvlink, rdma) + latency


def activation_terms(card: ModelCard, lay: Layout, moe: bool) -> dict[str, float]:
    """Bytes of one layer's tensors kept from F to B on this GPU, named by the module whose
    recompute drops them (Megatron-Core's ``--recompute-modules``); ``kept`` stays always."""
    e, t, h = 2.0, lay.tp, card.hidden
    tok = lay.tokens / t
    att = attention_parts(card)
    shared, routed = mlp_width(card, moe)
    terms = {
        "kept": (2 * (e * h + 4) + e * att["latents"]) * tok,  # norm inputs, MLA latents
        "layernorm": 2 * e * h * tok,  # the two norms' outputs (inputs of qkv and the MLP)
        "mla_up_proj": e * att["qkv"] * tok if card.mla else 0.0,
        "qkv": 0.0 if card.mla else e * att["qkv"] * tok,
        "core_attn": (e * att["out"] + 4 * card.heads) * tok,  # output and fp32 log-sum-exp
    }
    if not moe:
        terms["mlp"] = e * 3 * shared * tok  # SwiGLU: fc1's gate and up, the activation
        return terms
    copies = tok * card.top_k * lay.imbalance
    vector = 1.0 if lay.fp8 and lay.dispatcher in ("deepep", "hybridep") else e
    terms["router"] = ROUTER_BYTES * card.experts * tok
    terms["moe"] = copies * (vector * h + e * 2 * routed + e * h)  # dispatched, fc1, fc2 out
    terms["moe_act"] = copies * e * routed + e * shared * tok
    terms["shared_experts"] = e * 2 * shared * tok
    return terms


DROPPED = {
    "layernorm": ("layernorm",), "mla_up_proj": ("mla_up_proj",), "core_attn": ("core_attn",),
    "mlp": ("mlp",), "moe_act": ("moe_act",), "shared_experts": ("shared_experts",),
    "moe": ("moe", "moe_act", "router", "shared_experts"),
}  # fmt: skip
"""The activation terms each recomputed module drops."""


def layer_unit(card: ModelCard, hw: HardwareCard, job: Job, *, moe: bool) -> dict[str, float]:
    """One layer's ``t_f, t_b, t_w`` (ms, communication included), ``t_f_comm, t_b_comm``
    (the dispatch and combine all-to-all in them, what an overlapped pair hides, as
    Megatron-Core's and DualPipe's EP overlap do; TP collectives stay exposed unless the job
    hides them), ``m_b, m_w, transient`` (bytes) and ``params, expert_params`` (this GPU's),
    under the job's checkpointing mode."""
    stack = load_stack_card(job.stack)
    lay = Layout.of(job, stack)
    t, h, tok = lay.tp, card.hidden, lay.tokens
    att = attention_parts(card)
    shared, routed = mlp_width(card, moe)
    ctx = context_length(card, lay.seq)
    core = 2 * ctx * (att["core_qk"] + att["core_v"]) * tok / t
    lin_att = 2 * att["weights"] * tok / t
    lin_mlp = 2 * 3 * h * shared * tok / t + (2 * h * card.experts * tok / t if moe else 0.0)
    lin_routed = 2 * 3 * h * routed * tok / t * card.top_k * lay.imbalance if moe else 0.0
    scale = grouped_scale(card, lay, stack) if moe else 1.0
    fp8 = job.fp8
    g_att = _gemm(lin_att + lin_mlp, hw, stack, fp8=fp8)
    g_routed = _gemm(lin_routed, hw, stack, fp8=fp8, scale=scale) if moe else 0.0
    g_core, g_core_b = core_attention_ms(
        core,
        table=hw.attention,
        kernel=stack.attention_kernel,
        seq=lay.seq / job.cp,
        gemm_rate=hw.gemm_flops * stack.gemm_scale,
    )
    elem = hbm_ms(ATTENTION_PASSES * 2 * h * tok / t + 2 * 3 * 3 * shared * tok / t, hw)
    if moe:
        copies = tok / t * card.top_k * lay.imbalance
        elem += hbm_ms(copies * 2 * (4 * h + 3 * routed), hw)
    if fp8:  # each GEMM input cast to FP8: read bf16, write fp8
        widths = h + att["out"] + 2 * shared + (card.top_k * (h + routed) if moe else 0.0)
        elem += hbm_ms(3.0 * widths * tok / t, hw)
    a2a = _a2a_ms(card, hw, lay, stack) if moe else 0.0
    comm = tp_collectives_ms(card, hw, job) + a2a
    t_f = g_att + g_routed + g_core + elem + comm
    t_b = g_att + g_routed + g_core_b + 2 * elem + comm
    t_w = g_att + g_routed
    t_f, t_b, f_comm, b_comm = host_bound(t_f, t_b, t_w, a2a,
                                          stack.moe_host_ms if moe else 0.0)  # fmt: skip
    terms = activation_terms(card, lay, moe)
    m_b = sum(terms.values())
    e = 2.0
    m_w = e * tok / t * (h + att["out"] + att["grad_out"] + h + 3 * shared * 2)
    if moe:
        m_w += e * tok / t * card.top_k * lay.imbalance * (2 * h + 3 * routed)
    dense, experts = layer_params(card, moe)
    unit = {"t_f": t_f, "t_b": t_b, "t_w": t_w, "t_f_comm": f_comm, "t_b_comm": b_comm,
            "m_b": m_b, "m_w": min(m_w, m_b), "transient": 0.0,
            "params": dense / t + experts / (lay.ep * lay.etp),
            "expert_params": experts / (lay.ep * lay.etp)}  # fmt: skip
    gather_f, gather_b, gather_buffer = gathered_kv_costs(card, hw, job, stack)
    unit["t_f"] += gather_f
    unit["t_b"] += gather_b
    out = checkpointed(unit, terms, job, layer_input=2.0 * h * tok / t, recompute={
        "layernorm": elem / 3, "mla_up_proj": lin_att / 2 if card.mla else 0.0,
        "core_attn": g_core, "mlp": 0.0 if moe else _gemm(lin_mlp, hw, stack, fp8=fp8),
        "moe_act": hbm_ms(terms.get("moe_act", 0.0) * 3, hw),
        "shared_experts": _gemm(2 * 3 * h * shared * tok / t, hw, stack, fp8=fp8),
        "moe": g_routed + (comm if moe else 0.0) + elem / 2,
    })  # fmt: skip
    out["transient"] += gather_buffer
    return out


def gathered_kv_costs(card: ModelCard, hw: HardwareCard, job: Job,
                      stack: StackCard) -> tuple[float, float, float]:  # fmt: skip
    """``(F ms, B ms, B's buffer bytes)`` of gathering the keys and values under CP where the
    stack does (``cp_attention = "gathered"``, :func:`context_parallel.gathered_attention`);
    a ring's exchange (Megatron-Core's p2p) hides behind its rounds and is not counted."""
    if job.cp == 1 or stack.cp_attention != "gathered":
        return 0.0, 0.0, 0.0
    att = attention_parts(card)
    width = (att["core_qk"] + att["core_v"]) / 2 if card.mla else card.kv_hidden
    if stack.cp_kv_width == "query":
        width = att["core_qk"]
    gbs, latency = node_link(hw, spans_nodes=job.cp * job.tp > hw.gpus_per_node)
    got = gathered_attention(s=job.seq, b=job.mbs, h_kv=int(width), cp=job.cp, tp=job.tp,
                             link_gbs=gbs * stack.allgather_efficiency,
                             latency_us=latency)  # fmt: skip
    return 1e3 * got.forward_exposed_s, 1e3 * got.backward_exposed_s, got.backward_buffer_bytes


def host_bound(t_f: float, t_b: float, t_w: float, a2a: float, host: float
               ) -> tuple[float, float, float, float]:  # fmt: skip
    """``(t_f, t_b, t_f_comm, t_b_comm)`` of an MoE layer whose forward's host time is
    ``host`` and backward's ``2 host``: each pass lasts at least its host time (the forward
    waits on the GPU for its token counts, so the host cannot run ahead of it). The
    communication a pair may hide is what the pass loses when its all-to-all runs under the
    other half's compute: ``max(host, gpu) - max(host, gpu - a2a)``, the whole ``a2a`` when
    the host is quicker than the GPU's compute, none when the pass is host-bound."""
    if host <= 0:
        return t_f, t_b, a2a, a2a
    f = max(t_f, host)
    bw = max(t_b + t_w, 2 * host)
    return (f, bw - t_w, f - max(host, t_f - a2a), bw - max(2 * host, t_b + t_w - a2a))


def _a2a_ms(card: ModelCard, hw: HardwareCard, lay: Layout, stack: StackCard) -> float:
    """Dispatch and combine of one pass (F, or B's gradients); the dispatch in FP8 where the
    job runs FP8 and the stack's DeepEP/HybridEP send FP8 tokens."""
    fp8 = lay.fp8 and stack.fp8_dispatch and lay.dispatcher in ("deepep", "hybridep")
    return dispatch_ms(card, hw, lay, stack, dtype_bytes=1.0 if fp8 else 2.0) + dispatch_ms(
        card, hw, lay, stack, dtype_bytes=2.0
    )


def tp_collectives_ms(card: ModelCard, hw: HardwareCard, job: Job) -> float:
    """A layer's sequence-parallel all-gathers and reduce-scatters in one pass (4, as
    :data:`pp_opt.profiler.analytic.TP_COLLECTIVES`), exposed unless the job hides them."""
    if job.tp == 1 or not job.tp_comm:
        return 0.0
    full = 2.0 * job.seq * job.mbs / job.cp * card.hidden
    one = ring_all_gather_ms(full, job.tp, *node_link(hw, spans_nodes=False))
    return 4 * one * (0.0 if job.async_tp else 1.0)


def checkpointed(unit: dict[str, float], terms: dict[str, float], job: Job, *,
                 layer_input: float, recompute: dict[str, float]) -> dict[str, float]:  # fmt: skip
    """``unit`` under the job's checkpointing: ``full`` keeps the layer's input and re-runs
    its forward (communication included) in B; ``modules:...`` drops each module's tensors
    and re-runs it; ``selective_op`` (torchtitan's policy) keeps every second matmul's
    output: half the tensors, half the forward's GEMMs again (an estimate)."""
    out = dict(unit)
    if job.ac == "full":
        out.update(m_b=layer_input, m_w=min(unit["m_w"], layer_input), transient=unit["m_b"])
        out["t_b"] += unit["t_f"]
        out["t_b_comm"] += unit["t_f_comm"]
    elif job.ac == "selective_op":
        out["m_b"] = unit["m_b"] / 2
        out["m_w"] = min(unit["m_w"], out["m_b"])
        out["t_b"] += (unit["t_f"] - unit["t_f_comm"]) / 2
    for module in job.recompute_modules:
        for term in DROPPED[module]:
            out["m_b"] -= terms.get(term, 0.0)
        out["t_b"] += recompute.get(module, 0.0)
        if module == "moe":
            out["t_b_comm"] += unit["t_f_comm"]
    out["m_w"] = min(out["m_w"], out["m_b"])
    return out


def uses_layer_model(card: ModelCard) -> bool:
    """The card needs this module's layer (MoE, MLA, its own head width or windows); plain
    dense decoders keep :mod:`formulas`' counts."""
    return card.moe or card.mla or bool(card.head_dim) or bool(card.sliding_window)


def check_recompute_modules(card: ModelCard, job: Job) -> None:
    """``ac = modules:...`` names modules of this module's layer; a plain dense decoder's
    layer is :mod:`formulas`' count, which has none."""
    if job.recompute_modules and not uses_layer_model(card):
        raise ProblemError(
            "ac", f"{card.name} is a dense decoder, costed without Megatron-Core's named "
            "modules; use none, selective, selective_op or full",
        )  # fmt: skip


def mtp_costs(card: ModelCard, hw: HardwareCard, job: Job, layer: dict[str, float],
              head: dict[str, float]) -> dict[str, float]:  # fmt: skip
    """What the multi-token-prediction modules add to the last stage: per module one more
    layer, a ``2h x h`` projection and the output layer and loss again (weights shared)."""
    out = dict.fromkeys(head, 0.0)
    if not card.mtp_layers or not job.mtp:
        return out
    tok = job.seq * job.mbs / job.cp / job.tp
    proj = _gemm(2 * 2 * card.hidden * card.hidden * tok, hw, load_stack_card(job.stack),
                 fp8=False)  # fmt: skip
    for key in out:
        extra = {"t_f": proj, "t_b": proj, "t_w": proj}.get(key, 0.0)
        if key in ("params", "expert_params"):
            out[key] = card.mtp_layers * (
                layer.get(key, 0.0) + (2 * card.hidden**2 if key == "params" else 0.0) / job.tp
            )
        elif key != "transient":
            out[key] = card.mtp_layers * (layer.get(key, 0.0) + head.get(key, 0.0) + extra)
    return out


def model_flops_per_sequence(card: ModelCard, seq: int) -> float:
    """Forward and backward FLOPs of one sequence through every layer (each token's routed
    experts only, the shared ones, the router, attention's products over the keys it attends
    to) and the output layer: ``3 x`` the forward's matrix products, recompute not counted."""
    att = attention_parts(card)
    core = 2 * context_length(card, seq) * (att["core_qk"] + att["core_v"])
    per_token = 0.0
    for moe, count in ((True, card.moe_layers), (False, card.layers - card.moe_layers)):
        shared, routed = mlp_width(card, moe)
        mlp = 2 * 3 * card.hidden * (shared + card.top_k * routed)
        mlp += 2 * card.hidden * card.experts if moe else 0.0
        per_token += count * (2 * att["weights"] + core + mlp)
    per_token += 2 * card.hidden * card.vocab
    return 3.0 * per_token * seq
