"""A pipeline rank's memory as named terms, with no multiplier on the total (issue 40).

Each term is one kind of tensor the training step holds (bytes per GPU). The static terms
(:func:`static_terms`) are what a device holds beside the activations of its in-flight
microbatches; :func:`peak_breakdown` adds the schedule's part at the device's peak, so that
the terms of a rank add up to its reported peak:

* ``parameters``, ``gradients``, ``optimizer_state``: the sharded (FSDP) or replicated
  state: FSDP2 keeps fp32 parameters, fp32 gradients and AdamW's two fp32 moments, each over
  the shard degree (``dp_shard x cp``, torchtitan's ``dp_shard_cp`` mesh,
  :func:`fsdp.fsdp_shard`); without FSDP bf16 weights and gradients and 12 bytes of optimizer
  state (split over ``dp`` when sharded);
* ``fsdp_unsharded_params``: FSDP's all-gathered parameters (bf16, FP8 with FP8 all-gather):
  a pipelined stage's whole, from its first forward to its last backward; without a pipeline
  two blocks' and the root's (prefetch one block ahead);
* ``fsdp_accumulated_grads``: a pipelined FSDP stage's unsharded gradients, accumulated in
  fp32 from its first backward to its last (only the stages whose window holds the peak);
* ``pipeline_buffers``: torch pipelining's per-microbatch receive buffers (activations and
  gradients);
* ``output_logits``: the last stage's ``output_chunks`` (bf16 logits of every microbatch),
  where the stack's pipelining keeps them (:attr:`StackCard.keeps_stage_outputs`);
* ``activations``: what the in-flight microbatches' layers keep for their backward, under
  the job's checkpointing mode;
* ``loss``: the fp32 log-softmax the loss keeps per in-flight microbatch of the last stage
  and, when it is the device's largest transient, the loss backward's fp32 gradients;
* ``recompute_buffer``: a re-run layer's saved tensors while its backward runs (full and op
  checkpointing; compiled blocks materialise only part of the eager intermediates);
* ``layer_grad_buffers``: beside the re-run layer, FSDP's unsharded bf16 gradients of one
  block and the fp32 copy its reduce-scatter reads (``foreach_reduce``'s copy-in), when a
  layer's backward is the device's largest transient;
* ``allocator``: reserved over allocated bytes, :func:`allocator_static_bytes` (the FSDP
  all-gather stream's cached buffers), without a pipeline and when the loss holds the peak
  the last layer's cached working set (:func:`cached_layer_bytes`), and, under a pipeline,
  the card's fitted
  ``pipeline_fragmentation`` of the bytes that come and go within the step.

``allocated`` is the sum of all terms but ``allocator``; ``reserved`` the sum of all (what
torchtitan reports, ``max reserved``; Megatron-Core and NeMo report ``max allocated``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pp_opt.errors import ProblemError
from pp_opt.job import Job
from pp_opt.profiler.cards import GIB, HardwareCard, ModelCard
from pp_opt.profiler.costs import StageCost
from pp_opt.profiler.formulas import embedding_params, head_params, layer_params
from pp_opt.profiler.fsdp import (
    ADAM_BYTES,
    MASTER_BYTES,
    SHARDED_GRAD_BYTES,
    fsdp_on,
    unsharded_bytes,
)
from pp_opt.profiler.moe import layer_params as moe_layer_params
from pp_opt.profiler.moe import uses_layer_model
from pp_opt.profiler.stacks import load_stack_card

STATE_TERMS = ("parameters", "gradients", "optimizer_state")
STATIC_TERMS = (
    *STATE_TERMS, "fsdp_unsharded_params", "fsdp_accumulated_grads", "pipeline_buffers",
    "output_logits", "loss", "recompute_buffer", "layer_grad_buffers", "allocator",
)  # fmt: skip
"""Terms fixed before the schedule (``fsdp_accumulated_grads`` as a bound: all stages)."""
TERMS = (*STATE_TERMS, "fsdp_unsharded_params", "fsdp_accumulated_grads", "pipeline_buffers",
         "output_logits", "activations", "loss", "recompute_buffer", "layer_grad_buffers",
         "allocator")  # fmt: skip
"""The named terms of a rank's peak, in print order."""
REPORTED = ("reserved", "allocated")
"""What a stack's published memory means: torchtitan ``max reserved``, Megatron-Core and NeMo
``max allocated``."""
REPLICATED_STATE = {"parameters": 2.0, "gradients": 2.0}
"""Bytes per parameter of bf16 weights and gradients without FSDP (the rest is optimizer)."""
FSDP_STATE = {"parameters": MASTER_BYTES, "gradients": SHARDED_GRAD_BYTES,
              "optimizer_state": ADAM_BYTES}  # fmt: skip
FSDP_GATHERS_IN_FLIGHT = 2
"""All-gather output buffers FSDP2 keeps in flight on its all-gather stream: the current
group's and the one prefetched (``foreach_all_gather`` allocates them on the copy-in stream;
freed after the copy-out, they stay cached in that stream's pool, out of the compute
stream's reach: reserved, not allocated, at the compute peak)."""


def state_split(job: Job, per_param: float) -> dict[str, float]:
    """Bytes per parameter of each state term; they add up to ``per_param``."""
    if fsdp_on(job):
        total = sum(FSDP_STATE.values())
        return {k: v * per_param / total for k, v in FSDP_STATE.items()}
    weights = min(REPLICATED_STATE["parameters"], per_param)
    grads = min(REPLICATED_STATE["gradients"], per_param - weights)
    return {"parameters": weights, "gradients": grads,
            "optimizer_state": per_param - weights - grads}  # fmt: skip


def fsdp_param_bytes(job: Job) -> float:
    """Bytes of one all-gathered parameter: 1 with FP8 all-gather, else bf16."""
    return 1.0 if job.fp8_all_gather else 2.0


def static_terms(
    card: ModelCard, job: Job, stages: Sequence[StageCost],
    transients: Sequence[tuple[float, float]], per_param: float, *,
    expert_per_param: float | None = None,
) -> list[dict[str, float]]:  # fmt: skip
    """Per device, the terms fixed before the schedule (bytes; see the module). ``transients``:
    per stage, ``(recompute buffer, loss gradients)`` one backward holds (the device keeps
    room for the largest); ``per_param``: static state bytes per parameter;
    ``expert_per_param``: the same per routed expert parameter (sharded over ``edp``)."""
    terms = [dict.fromkeys(STATIC_TERMS, 0.0) for _ in range(job.pp)]
    split = state_split(job, per_param)
    expert_split = state_split(job, per_param if expert_per_param is None else expert_per_param)
    pipelined = fsdp_on(job) and job.pp > 1  # torchtitan's runtime: FSDP2 on torch pipelining
    keeps_outputs = load_stack_card(job.stack).keeps_stage_outputs
    tokens, last = job.mbs * job.seq / job.cp, len(stages) - 1
    message = card.dtype_bytes * tokens * card.hidden / job.tp
    for s, st in enumerate(stages):
        mine = terms[st.device]
        for key, value in split.items():
            mine[key] += (st.params - st.expert_params) * value
            mine[key] += st.expert_params * expert_split[key]
        if holds_unsharded(job):
            mine["fsdp_unsharded_params"] += gathered_params(job, st) * fsdp_param_bytes(job)
            mine["fsdp_accumulated_grads"] += held_gradient_bytes(job, st)
        if pipelined:
            mine["pipeline_buffers"] += job.microbatches * message * ((s > 0) + (s < last))
            if s == last and keeps_outputs:
                mine["output_logits"] += (job.microbatches * card.dtype_bytes * tokens
                                          * card.vocab / job.tp)  # fmt: skip
    for d, mine in enumerate(terms):
        on = [x for st, x in zip(stages, transients, strict=True) if st.device == d]
        recompute = max((r for r, _ in on), default=0.0)
        loss = max((lo for _, lo in on), default=0.0)
        grads = layer_grad_buffer_bytes(card, job) if on else 0.0
        mine["allocator"] = allocator_static_bytes(card, job, stages, d)
        if recompute + grads >= loss:
            mine["recompute_buffer"], mine["layer_grad_buffers"] = recompute, grads
        else:
            mine["loss"] = loss
            mine["allocator"] += cached_layer_bytes(job, recompute)
    if fsdp_on(job) and not holds_unsharded(job):  # prefetch one block ahead
        root = (embedding_params(card) + head_params(card)) / job.tp
        terms[0]["fsdp_unsharded_params"] += unsharded_bytes(
            FSDP_GATHERS_IN_FLIGHT * block_params(card, job) + root, with_grads=False
        )
    return terms


def cached_layer_bytes(job: Job, layer_transient: float) -> float:
    """Reserved, not allocated, when the loss holds the peak: the last layer's working set.

    A checkpointed layer's forward allocates what its backward will re-run (the transient
    :func:`stage_transients` counts) and frees it at the layer's end; PyTorch's caching
    allocator keeps those blocks in their segments (``torch.cuda.memory_reserved``: freed
    blocks stay cached, a block is split inside its segment but never merged across
    segments). The loss that follows allocates the fp32 logits and their gradients, each
    larger than any of those blocks, in new segments, so the layer's cached blocks sit
    beside the loss's peak. Without a pipeline only: a pipelined step's reserve is the
    card's ``pipeline_fragmentation``, which already carries it on its fit row."""
    return layer_transient if job.pp == 1 else 0.0


def holds_unsharded(job: Job) -> bool:
    """A pipelined FSDP stage keeps its gathered weights and fp32 gradients across the step
    (torchtitan; a stack whose FSDP reshards after each layer does not)."""
    return fsdp_on(job) and job.pp > 1 and load_stack_card(job.stack).fsdp_holds_unsharded


def gathered_params(job: Job, stage: StageCost) -> float:
    """The parameters FSDP all-gathers: all but routed experts it leaves whole (``edp = 1``)."""
    return stage.params - (stage.expert_params if job.edp == 1 else 0.0)


def block_params(card: ModelCard, job: Job) -> float:
    """One decoder block's parameters on this GPU (an MoE block: its share of the experts)."""
    if uses_layer_model(card):
        dense, experts = moe_layer_params(card, card.moe)
        return dense / job.tp + experts / (job.ep * job.etp)
    return layer_params(card) / job.tp


FSDP_LAYER_GRAD_BYTES = 2.0 + 4.0
"""Bytes per parameter of one block's backward under FSDP2: its bf16 unsharded gradient and
the fp32 reduce-scatter input it is copied into (``reduce_dtype`` float32)."""


def layer_grad_buffer_bytes(card: ModelCard, job: Job) -> float:
    """One block's gradient buffers during its backward (:data:`FSDP_LAYER_GRAD_BYTES`; 0
    without FSDP, whose bf16 gradients are part of ``gradients``)."""
    if not fsdp_on(job):
        return 0.0
    return FSDP_LAYER_GRAD_BYTES * block_params(card, job)


def held_gradient_bytes(job: Job, stage: StageCost) -> float:
    """fp32 unsharded gradients a pipelined FSDP stage holds from its first backward to its
    last (FSDP2 accumulates them in the reduce dtype while gradient sync is off; 0 otherwise)."""
    if not holds_unsharded(job):
        return 0.0
    return unsharded_bytes(gathered_params(job, stage), param_bytes=0.0)


def allocator_static_bytes(
    card: ModelCard, job: Job, stages: Sequence[StageCost], device: int
) -> float:
    """Reserved, never allocated at the compute peak: FSDP2's all-gather output buffers of
    :data:`FSDP_GATHERS_IN_FLIGHT` groups (the device's largest: its blocks, and the root's
    embedding and output layer), cached in the all-gather stream's pool."""
    if not fsdp_on(job):
        return 0.0
    groups = [block_params(card, job)] * max(
        (st.layers for st in stages if st.device == device), default=0
    )
    if job.pp == 1:  # the root group: embedding, norm and output layer together
        groups.append((embedding_params(card) + head_params(card)) / job.tp)
    else:
        groups += [embedding_params(card) / job.tp for st in stages
                   if st.device == device and st.embedding]  # fmt: skip
        groups += [head_params(card) / job.tp for st in stages
                   if st.device == device and st.head]  # fmt: skip
    largest = sorted(groups, reverse=True)[:FSDP_GATHERS_IN_FLIGHT]
    param_bytes = fsdp_param_bytes(job) if job.pp > 1 else 2.0
    return param_bytes * sum(largest)


def fragmentation_share(hw: HardwareCard, job: Job) -> float:
    """Reserved over allocated per byte that comes and goes within a pipelined step (the
    card's ``pipeline_fragmentation``; 0 without a pipeline, whose activations are freed in
    the reverse of their allocation order)."""
    return hw.pipeline_fragmentation if job.pp > 1 else 0.0


def cap_bytes(
    hw: HardwareCard, job: Job, static: Sequence[float], held: Sequence[float] = ()
) -> float:
    """The tightest of :func:`device_caps` (the card's usable memory without devices)."""
    return min(device_caps(hw, job, static, held), default=hw.usable_bytes)


def device_caps(
    hw: HardwareCard, job: Job, static: Sequence[float], held: Sequence[float] = ()
) -> list[float]:
    """Per device, the allocated bytes it may reach so that its reserved peak fits the card's
    usable memory. ``static`` counts the fp32 gradients a pipelined FSDP stage holds
    (``held``, per device) as always held; they come and go like the activations, so the
    allocator's fragmentation applies to both: ``s + A + share (A + H) <= usable``, as
    :func:`pp_opt.profiler.memory_peak.device_peaks` reports the reserved peak."""
    share = fragmentation_share(hw, job)
    usable = hw.usable_bytes
    held = list(held) or [0.0] * len(static)
    return [s + max(usable - s - share * h, 0.0) / (1 + share)
            for s, h in zip(static, held, strict=True)]  # fmt: skip


def usable_needed(
    hw: HardwareCard, job: Job, static: float, held: float, allocated: float
) -> float:
    """The usable memory a device with ``static`` bytes (``held`` of them fp32 gradients)
    needs to reach ``allocated`` bytes: :func:`device_caps` solved for the card's memory, the
    reserved peak of that allocation."""
    share = fragmentation_share(hw, job)
    return static + share * held + (1 + share) * (allocated - static)


def held_bytes_per_device(job: Job, stages: Sequence[StageCost]) -> list[float]:
    """Per device, the fp32 gradients its stages hold at most (:func:`held_gradient_bytes`)."""
    held = [0.0] * job.pp
    for st in stages:
        held[st.device] += held_gradient_bytes(job, st)
    return held


def breakdown_table(breakdown: Sequence[dict[str, float]]) -> str:
    """The terms per pipeline rank in GiB, one line per term (zero terms left out)."""
    used = [t for t in TERMS if any(rank.get(t, 0.0) > 0 for rank in breakdown)]
    width = max((len(t) for t in (*used, *REPORTED)), default=10)
    head = " ".join(f"{f'rank {d}':>8}" for d in range(len(breakdown)))
    lines = [f"{'GiB':{width}} {head}"]
    for term in (*used, *REPORTED):
        lines.append(f"{term:{width}} " + " ".join(f"{rank.get(term, 0.0) / GIB:8.1f}"
                                                   for rank in breakdown))  # fmt: skip
    return "\n".join(lines)


def largest_term(rank: dict[str, float], *, total: str = "reserved") -> str:
    """``"activations 61.0 GiB of 95.0"``: the largest term of a rank and its ``total``
    (``reserved`` or ``allocated``, :data:`REPORTED`; an allocated total says so, since caps
    count reserved bytes)."""
    if total not in REPORTED:
        raise ProblemError("total", f"got {total!r:.40}; use reserved or allocated")
    name = max(TERMS, key=lambda t: rank.get(t, 0.0))
    kind = " GiB" if total == "reserved" else f" GiB {total}"
    return f"{name} {rank.get(name, 0.0) / GIB:.1f} GiB of {rank.get(total, 0.0) / GIB:.1f}{kind}"
