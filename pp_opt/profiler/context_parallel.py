"""Context parallelism: ring attention over ``cp`` GPUs with causal load balancing.

torchtitan's ``context_parallel_degree`` (9dec370, ``train.py:268-279``) wraps SDPA with
``torch.distributed.tensor.experimental.context_parallel``: the sequence is cut into ``2 cp``
chunks and GPU ``i`` holds chunks ``i`` and ``2 cp - 1 - i`` (causal load balancing, torch's
default), so every GPU does the same share of the causal attention work. Keys and values
travel between the GPUs, either all-gathered after the first (local) block of attention
(``context_parallel_rotate_method = "allgather"``, torchtitan's default,
``config_manager.py:365-376``) or passed around the ring one block per step (``"alltoall"``).
B moves the same key/value blocks again and sends their gradients back (a reduce-scatter of
the same size). Everything but attention is local: each GPU computes ``s / cp`` tokens.
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
    """Bytes each GPU receives and sends in B: key/value shards again plus their gradients."""
    forward_exposed_s: float
    """Seconds of F's communication not hidden behind attention compute."""
    backward_exposed_s: float
    """Seconds of B's communication not hidden behind attention compute."""


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
    rotate: str = "allgather",
) -> RingAttention:  # fmt: skip
    """The communication of one layer's ring attention and what of it stays exposed.

    ``attention_f_s`` / ``attention_b_s``: this GPU's attention time in F and B (already its
    ``1 / cp`` share of the causal work). With load balancing the work splits into ``cp``
    equal blocks, one per key/value shard. ``allgather``: the gather runs behind the first
    (local) block, ``1 / cp`` of the time. ``alltoall``: each of the ``cp - 1`` transfers
    runs behind one block.
    """
    if rotate not in ROTATE_METHODS:
        raise ProblemError("rotate", f"unknown {rotate!r}; use one of {', '.join(ROTATE_METHODS)}")
    block = kv_block_bytes(s=s, b=b, h_kv=h_kv, cp=cp, tp=tp, dtype_bytes=dtype_bytes)
    if cp == 1:
        return RingAttention(kv_block_bytes=block, forward_bytes=0.0, backward_bytes=0.0,
                             forward_exposed_s=0.0, backward_exposed_s=0.0)  # fmt: skip
    steps = cp - 1
    fwd_bytes, bwd_bytes = steps * block, 2.0 * steps * block
    step_s = latency_us * 1e-6 + block / (link_gbs * 1e9)
    if rotate == "allgather":
        fwd = max(steps * step_s - attention_f_s / cp, 0.0)
        bwd = max(2 * steps * step_s - attention_b_s / cp, 0.0)
    else:
        fwd = steps * max(step_s - attention_f_s / cp, 0.0)
        bwd = steps * max(2 * step_s - attention_b_s / cp, 0.0)
    return RingAttention(kv_block_bytes=block, forward_bytes=fwd_bytes, backward_bytes=bwd_bytes,
                         forward_exposed_s=fwd, backward_exposed_s=bwd)  # fmt: skip
