"""Schedules that overlap one microbatch's forward with another's backward (pairs ``FB``).

An overlapped pair (DESIGN.md §3) runs an ``F`` and a ``B`` or ``BW`` of another
microbatch on one device as one op, so each half's communication (the MoE all-to-all,
TP/CP collectives: ``t_f_comm``, ``t_b_comm``) hides under the other's compute; it lasts
:func:`pp_opt.ops.pair_time`. The hand-made schedules that do this, as op orders with
:attr:`pp_opt.order.Order.pairs`:

- ``dualpipev-overlap``: PyTorch's ``ScheduleDualPipeV`` (torch 2.13,
  ``torch/distributed/pipelining/schedules.py``, ``_calculate_single_rank_operations``)
  with its ``OVERLAP_F_B`` actions overlapped: each is a pair of the forward with the
  input backward ``B``, its ``W`` right after (pp_opt's ``DualPipeV`` runs the same order
  with the halves in sequence). DeepSeek's DualPipeV ("cut-in-half" DualPipe,
  ``deepseek-ai/DualPipe``, ``dualpipe/dualpipev.py``) is this schedule.
- ``interleaved-1f1b-a2a``: Megatron-Core's interleaved 1F1B with
  ``--overlap-moe-expert-parallel-comm`` (``megatron/core/pipeline_parallel/
  combined_1f1b.py``): in the steady state the forward of one microbatch runs with the
  fused backward of an earlier one; warm-up and cool-down stay as they are.

Both pair a forward only with a backward of another microbatch (every backward of a
microbatch waits for all of its forwards, so a pair within one microbatch never runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pp_opt.ops import OpKey, OpKind
from pp_opt.order import Order
from pp_opt.orders.patterns.classic import interleaved_1f1b
from pp_opt.orders.patterns.pytorch_schedules import dual_pipe_v_steps, pytorch_dual_pipe_v
from pp_opt.problem import Problem


def paired_order(order: Order, pairs: Mapping[OpKey, OpKey], name: str) -> Order:
    """``order`` with each ``F`` of ``pairs`` run together with its backward (taken out of
    its place in the stream: the ``F``'s place holds the pair)."""
    backs = set(pairs.values())
    streams = {queue: [key for key in keys if key not in backs]
               for queue, keys in order.streams.items()}  # fmt: skip
    return replace(order, streams=streams, pairs=dict(pairs), name=name)


def dual_pipe_v_overlapped(problem: Problem) -> Order:
    """PyTorch's ``ScheduleDualPipeV`` with its ``OVERLAP_F_B`` pairs overlapped (``v``)."""
    order = pytorch_dual_pipe_v(problem)  # PyTorch's checks, the v placement
    p, m = order.problem.p, order.problem.m
    pairs = {f: b for rank in range(p) for f, b in dual_pipe_v_steps(rank, p, m).pairs.items()}
    return paired_order(order, pairs, "dualpipev-overlap")


def interleaved_1f1b_a2a(problem: Problem) -> Order:
    """Megatron-Core's interleaved 1F1B with all-to-all overlap: each steady-state forward
    with the fused backward right after it (``loop``, ``v >= 2``)."""
    order = interleaved_1f1b(problem)
    pairs = {}
    for keys in order.streams.values():
        for f, b in zip(keys, keys[1:], strict=False):
            if f.kind is OpKind.F and b.kind is OpKind.BW and f.microbatch != b.microbatch:
                pairs[f] = b
    return paired_order(order, pairs, "interleaved-1f1b-a2a")
