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
    serialized: bool = False,
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
    step_s = latency_us * 1e-6 + block / (link_gbs * 1e9)
    grad_s = latency_us * 1e-6 + grad_block / (link_gbs * 1e9)
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
