"""Context parallelism: ring attention over ``cp`` GPUs with causal load balancing.

torchtitan's ``context_parallel_degree`` (9dec370, ``train.py:268-279``) wraps SDPA with
``torch.distributed.tensor.experimental.context_parallel``: the sequence is cut into ``2 cp``
chunks and GPU ``i`` holds chunks ``i`` and ``2 cp - 1 - i`` (causal load balancing, torch's
default), so every GPU does the same share of the causal attention work. Keys and values
travel between the GPUs, either all-gathered after the first (local) block of attention
(``context_parallel_rotate_method = "allgather"``, torchtitan's default,
``config_manager.py:365-376``) or passed around the ring one block per step (``"alltoall"``).
B moves the same key/value blocks again and passes their fp32 gradients around the ring
(:func:`ring_attention` has the sources). Everything but attention is local: each GPU
computes ``s / cp`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from pp_opt.errors import ProblemError

ROTATE_METHODS = ("allgather", "alltoall")
CP_ATTENTION = ("ring", "gathered")
"""How a stack runs attention under CP: ``ring`` (torch's SDPA ring, :func:`ring_attention`)
or ``gathered`` (the key/value shards all-gathered, one kernel over every key,
:func:`gathered_attention`)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RingAttention:
    """One layer's attention on one GPU of a context-parallel group, per microbatch."""

    kv_block_bytes: float
    """Bytes of this GPU's key and value shard: ``2 e b (s / cp) h_kv / t``."""
    forward_bytes: float
    """Bytes each GPU receives in F: the other ``cp - 1`` key/value shards."""
    backward_bytes: float
    """Bytes each GPU receives in B: the key/value shards again, and the ``cp`` hops of the
    key/value gradients around the ring (in ``grad_dtype_bytes``)."""
    forward_exposed_s: float
    """Seconds of F's communication not hidden behind attention compute."""
    backward_exposed_s: float
    """Seconds of B's communication not hidden behind attention compute."""
    backward_buffer_bytes: float = 0.0
    """What B holds beside the layer's own tensors: the gathered key/value shards, the fp32
    query gradient, the key/value gradient accumulator and the two in flight (sent and
    received) copies of it."""


def kv_block_bytes(
    *, s: int, b: int, h_kv: int, cp: int, tp: int = 1, dtype_bytes: int = 2
) -> float:
    """Bytes of one GPU's key and value shard of one layer."""
    if cp < 1 or s % (2 * cp):
        raise ProblemError("cp", f"got {cp}; 2 * cp must divide the sequence length {s}")
    return 2.0 * dtype_bytes * b * (s / cp) * h_kv / tp


def ring_attention(
    *, s: int, b: int, h_kv: int, cp: int, tp: int = 1, dtype_bytes: int = 2,
    attention_f_s: float, attention_b_s: float, link_gbs: float, latency_us: float = 0.0,
    rotate: str = "allgather", grad_dtype_bytes: float = 4.0, h_q: int | None = None,
    serialized: bool = False, permute_gbs: float | None = None,
) -> RingAttention:  # fmt: skip
    """The communication of one layer's ring attention and what of it stays exposed.

    ``attention_f_s`` / ``attention_b_s``: this GPU's attention time in F and B (already its
    ``1 / cp`` share of the causal work). With load balancing the work splits into ``cp``
    equal rounds, one per key/value shard. ``h_kv``: the width of the keys and values that
    travel (torch's ring gets SDPA's inputs, so after a model's ``repeat_kv`` that is the
    query width); ``h_q`` the query width (default ``h_kv``).

    torch's ring (``_templated_ring_attention`` and ``_templated_ring_attention_backward`` in
    ``torch/distributed/tensor/experimental/_attention.py``, Dec 2024):

    * F: ``allgather`` gathers the other ``cp - 1`` shards once, issued before the first
      (local) round; ``alltoall`` passes one shard per round, issued before that round.
    * B: the key/value shards travel again (the same rotater), and the key/value gradients
      go around the ring with an all-to-all permute whatever the rotate method
      (``dkv_rotater = _create_rotater(group, 2, method=_RotateMethod.ALL_TO_ALL)``), one hop
      per round, ``cp`` hops, accumulated and sent in fp32 (``convert_to_f32`` true,
      ``accum_dtype = torch.float32``): ``grad_dtype_bytes``. Each hop is issued after a
      round and waited after the next; the last one, after the loop, is waited at once.
    * ``serialized``: the ring is traced (torch.compile of the block): a functional
      collective is waited as soon as it is issued (``_functional_collectives._maybe_wrap_tensor``
      returns ``wait_tensor(...)`` when tracing; inductor's comm reordering is off by
      default), so nothing of it hides behind attention.

    ``link_gbs``: the rate of the all-gather; ``permute_gbs`` (default ``link_gbs``) that of
    an all-to-all permute (``_functional_collectives.permute_tensor`` is an
    ``all_to_all_single`` with one non-zero split per rank): the gradient hops, and the
    key/value hops of ``alltoall``.
    """
    if rotate not in ROTATE_METHODS:
        raise ProblemError("rotate", f"unknown {rotate!r}; use one of {', '.join(ROTATE_METHODS)}")
    block = kv_block_bytes(s=s, b=b, h_kv=h_kv, cp=cp, tp=tp, dtype_bytes=dtype_bytes)
    if cp == 1:
        return RingAttention(kv_block_bytes=block, forward_bytes=0.0, backward_bytes=0.0,
                             forward_exposed_s=0.0, backward_exposed_s=0.0)  # fmt: skip
    steps = cp - 1
    grad_block = block * grad_dtype_bytes / dtype_bytes
    fwd_bytes, bwd_bytes = steps * block, steps * block + cp * grad_block
    permute = link_gbs if permute_gbs is None else permute_gbs
    kv_gbs = link_gbs if rotate == "allgather" else permute
    step_s = latency_us * 1e-6 + block / (kv_gbs * 1e9)
    grad_s = latency_us * 1e-6 + grad_block / (permute * 1e9)
    round_f, round_b = attention_f_s / cp, attention_b_s / cp
    if serialized:
        fwd = steps * step_s
        bwd = steps * step_s + cp * grad_s
    elif rotate == "allgather":
        fwd = max(steps * step_s - round_f, 0.0)
        bwd = max(steps * step_s - round_b, 0.0) + steps * max(grad_s - round_b, 0.0) + grad_s
    else:
        fwd = steps * max(step_s - round_f, 0.0)
        bwd = steps * max(step_s + grad_s - round_b, 0.0) + grad_s
    query = block * (h_q if h_q is not None else h_kv) / h_kv / 2  # one of q's size, dtype_bytes
    buffers = cp * block + query * 4.0 / dtype_bytes + 3 * grad_block
    return RingAttention(kv_block_bytes=block, forward_bytes=fwd_bytes, backward_bytes=bwd_bytes,
                         forward_exposed_s=fwd, backward_exposed_s=bwd,
                         backward_buffer_bytes=buffers)  # fmt: skip


def gathered_attention(
    *, s: int, b: int, h_kv: int, cp: int, tp: int = 1, dtype_bytes: int = 2,
    link_gbs: float, latency_us: float = 0.0,
) -> RingAttention:  # fmt: skip
    """One layer's CP communication when the key/value shards are all-gathered before one
    attention kernel over every key (torchtitan 0.3.0's FlexAttention path,
    ``distributed/context_parallel/api.py``: ``flex_cp_allgather``, torch's
    ``_context_parallel/_cp_custom_ops.py``): F all-gathers the other ``cp - 1`` shards, B
    reduce-scatters their gradients in the same dtype. Each collective is waited as soon as
    it is issued (``.wait()`` in the op), so none hides behind attention. B holds the
    gathered keys and values and their gradients."""
    block = kv_block_bytes(s=s, b=b, h_kv=h_kv, cp=cp, tp=tp, dtype_bytes=dtype_bytes)
    if cp == 1:
        return RingAttention(kv_block_bytes=block, forward_bytes=0.0, backward_bytes=0.0,
                             forward_exposed_s=0.0, backward_exposed_s=0.0)  # fmt: skip
    moved = (cp - 1) * block
    exposed = (cp - 1) * latency_us * 1e-6 + moved / (link_gbs * 1e9)
    return RingAttention(kv_block_bytes=block, forward_bytes=moved, backward_bytes=moved,
                         forward_exposed_s=exposed, backward_exposed_s=exposed,
                         backward_buffer_bytes=2 * cp * block)  # fmt: skip


MERGE_BYTES = 4.0 + 2.0 + 4.0
"""HBM bytes per output element of one merge round in F (``_SDPAMerger._merge_one``, fused
as a compiled block fuses it): read the fp32 running output and the round's bf16 output,
write the fp32 result; the log-sum-exp is ``1 / head_dim`` of that and left out."""
CAT_BYTES = 4.0 + 4.0
"""``_partial_update`` (a round that touches one of the two local chunks) rebuilds the whole
fp32 tensor with ``torch.cat``: read and write 4 bytes per element of it."""
FLASH_BWD_CALL_BYTES = 2.0 + 2.0 + 4.0 + 4.0 + 2.0
"""Per query element, what one flash backward call moves besides its GEMMs (FlashAttention-2
``mha_bwd``): ``rowsum(dO * O)`` reads dO and O (bf16), the fp32 ``dq_accum`` is zeroed and
converted to the bf16 ``dq``."""
ACCUMULATE_BYTES = 4.0 + 2.0 + 4.0
"""``grad += grad_`` in fp32 from a bf16 round gradient: read both, write fp32."""
SEND_BYTES = 4.0 + 4.0
"""``torch.cat([grad_key.flatten(), grad_value.flatten()])``: the fp32 gradients copied into
the buffer sent to the next rank."""


def ring_round_bytes(*, s: int, b: int, h_q: int, h_kv: int, cp: int, tp: int = 1) -> tuple[
    float, float
]:  # fmt: skip
    """HBM bytes the ring moves beside the attention kernels, per layer, in F and in B.

    F (torch ``_templated_ring_attention``): each of the rounds after the first merges its
    output into the fp32 running output (:data:`MERGE_BYTES`); a round that uses half of the
    local queries (about half of them under load balancing) rebuilds the whole output
    (:data:`CAT_BYTES`). B (``_templated_ring_attention_backward``): each of the ``cp``
    rounds pays one flash backward call's overhead (:data:`FLASH_BWD_CALL_BYTES`), adds its
    query gradient and its key/value gradients into the fp32 accumulators
    (:data:`ACCUMULATE_BYTES`; half the rounds rebuild one of them whole,
    :data:`CAT_BYTES`) and copies the key/value gradients into the send buffer
    (:data:`SEND_BYTES`). ``h_kv``: the width of the keys and values the ring carries."""
    if cp == 1:
        return 0.0, 0.0
    q = b * (s / cp) * h_q / tp
    kv = 2.0 * b * (s / cp) * h_kv / tp
    forward = (cp - 1) * q * (MERGE_BYTES + CAT_BYTES / 2)
    per_round = (q * (FLASH_BWD_CALL_BYTES + ACCUMULATE_BYTES + CAT_BYTES / 2)
                 + kv * (ACCUMULATE_BYTES + SEND_BYTES + CAT_BYTES / 2))  # fmt: skip
    return forward, cp * per_round
