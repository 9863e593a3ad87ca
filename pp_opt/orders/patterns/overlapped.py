"""Schedules that overlap one microbatch's forward with another's backward (pairs ``FB``).

An overlapped pair (docs/design.md §3) runs an ``F`` and a ``B`` or ``BW`` of another
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
- ``dualpipe``: DeepSeek's DualPipe (``deepseek-ai/DualPipe``, ``dualpipe/dualpipe.py``,
  ``DualPipe.step``; DeepSeek-V3 technical report, arXiv:2412.19437, section 3.2.1) on the
  ``dual`` placement: two copies of the model, half of the microbatches fed from each end.
  Its eight steps are those of DualPipeV on each half of the ranks (``half_rank``), with
  the forward direction's chunk and the reverse direction's as a rank's two phases.
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

from pp_opt.errors import ProblemError
from pp_opt.ops import OpKey, OpKind, has_pair_savings
from pp_opt.order import Order
from pp_opt.orders.common import SPLIT, compute_order, one_chunk, require_split_backward
from pp_opt.orders.patterns.classic import interleaved_1f1b
from pp_opt.orders.patterns.pytorch_schedules import dual_pipe_v_steps, pytorch_dual_pipe_v
from pp_opt.problem import Problem


def paired_order(order: Order, pairs: Mapping[OpKey, OpKey], name: str) -> Order:
    """``order`` with each ``F`` of ``pairs`` run together with its backward (taken out of
    its place in the stream: the ``F``'s place holds the pair). With nothing to hide (no
    communication in any op) a pair saves nothing and only ties its halves' starts, so the
    order stays as it is, unpaired."""
    if not has_pair_savings(order.problem):
        pairs = {}
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


def dual_placement(problem: Problem) -> Problem:
    """The problem on the ``dual`` placement: each device's layers (one stage per device,
    re-split from more chunks) in both copies, stage ``s`` and ``p + s`` the same layers
    (on devices ``s`` and ``p - 1 - s``), and twice the static memory (two copies of the
    parameters, their gradients and optimizer state)."""
    if problem.placement == "dual":
        return problem
    one = one_chunk(problem, "dualpipe")
    p = one.p
    stages = [replace(st, device=s) for s, st in enumerate(one.stages)]
    stages += [replace(st, device=p - 1 - s) for s, st in enumerate(one.stages)]
    devices = tuple(replace(d, static=2 * d.static) for d in one.devices)
    return one.replace(stages=tuple(stages), devices=devices, placement="dual")


def dual_pipe(problem: Problem) -> Order:
    """DeepSeek's DualPipe with its pairs overlapped (``dual`` placement; ``p`` even,
    ``m`` even and at least ``2p``, as ``DualPipe.step`` asserts)."""
    require_split_backward(problem, "DualPipe")
    problem = dual_placement(problem)
    p, m = problem.p, problem.m
    if p % 2 or m < 2 * p:
        field, need = ("p", "an even number of devices") if p % 2 else ("m", f"m >= 2p = {2 * p}")
        raise ProblemError(field, f"DeepSeek's DualPipe needs {need}; got p = {p}, m = {m}")
    per_device, pairs = [], {}
    for rank in range(p):
        forward, reverse = rank, 2 * p - 1 - rank  # this rank's stage of each copy
        chunks = (forward, reverse) if rank < p // 2 else (reverse, forward)
        steps = dual_pipe_v_steps(min(rank, p - 1 - rank), p // 2, m // 2, chunks)
        per_device.append([_second_half(key, p, m) for key in steps.ops])
        pairs.update({_second_half(f, p, m): _second_half(b, p, m) for f, b in steps.pairs.items()})
    order = compute_order(problem, per_device, SPLIT, "dualpipe")
    return paired_order(order, pairs, "dualpipe")


def _second_half(key: OpKey, p: int, m: int) -> OpKey:
    """Microbatch ``j`` of the second copy's stages is ``m/2 + j`` (Problem.routes)."""
    return key._replace(microbatch=key.microbatch + m // 2) if key.stage >= p else key


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
