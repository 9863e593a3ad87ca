"""Measure ``t_comm``: one activation sent between pipeline neighbours as the runtime sends it.

PyTorch's pipeline runtime moves a stage output with ``dist.batch_isend_irecv`` on the
sender and a wait on the receiver. :func:`neighbour_latency` times that between each pair
of neighbouring ranks of an initialised process group, ping-pong style: half a round trip is
one message's latency as the schedule sees it (Python overhead, transport and the
receiver waking up included), which a hardware card can only estimate.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist


def _exchange(tensor: torch.Tensor, peer: int, send_first: bool) -> None:
    send = dist.P2POp(dist.isend, tensor, peer)
    recv = dist.P2POp(dist.irecv, tensor, peer)
    for op in (send, recv) if send_first else (recv, send):
        for work in dist.batch_isend_irecv([op]):
            work.wait()


def neighbour_latency(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *, repeats: int = 20
) -> dict[str, Any]:
    """One-way time (ms) of a ``shape`` message between ranks ``d`` and ``d + 1``, every ``d``.

    Every rank of the default group calls it; pairs take turns (the others wait at a
    barrier). Returns ``{"pairs": [median per pair], "t_comm": the largest}`` on every rank.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.zeros(shape, dtype=dtype, device=device)
    pairs: list[float] = []
    for d in range(world - 1):
        samples: list[float] = []
        if rank in (d, d + 1):
            peer = d + 1 if rank == d else d
            for i in range(repeats + 2):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                _exchange(tensor, peer, send_first=rank == d)
                _exchange(tensor, peer, send_first=rank != d)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if i >= 2:
                    samples.append(1e3 * (time.perf_counter() - start) / 2)
        got: list[Any] = [None] * world
        dist.all_gather_object(got, statistics.median(samples) if samples else None)
        pairs.append(float(got[d]))
    return {"pairs": pairs, "t_comm": max(pairs) if pairs else 0.0, "repeats": repeats}
