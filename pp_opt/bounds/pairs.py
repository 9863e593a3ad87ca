"""Makespan bounds that know when an overlapped pair ``FB`` can run (docs/design.md §3).

The terms of :mod:`pp_opt.bounds.paths` price every op at its least share of a pair
(:func:`pp_opt.ops.pair_relaxed`), as if every ``F`` and every backward ran paired all
along. But a pair needs a forward and a backward of one device at the same time: none
exists before the first backward of the pipeline, which waits for one microbatch's whole
forward chain, and none after the last forward. These terms take the problem with its
communication (unrelaxed) and bound the schedules of its backward variant
(``problem.split_backward``), pairs included.

Notation (``S`` stages, ``m`` microbatches): ``t_f(s)``, ``back(s)`` the full times of a
forward and a backward (``t_b``, or fused ``t_bw``), ``F'(s)``, ``B'(s)`` their relaxed
times (:func:`variant_relaxed`), ``e_F = t_f - F'`` and ``e_B = back - B'`` what an
op costs over its relaxed time when it runs unpaired. Every pair of ``F(s, i)`` with the
backward of ``(s2, j)`` lasts at least ``F'(s) + B'(s2)`` (:func:`variant_relaxed`),
a pair's halves end together, and an op that waits for either half waits for the pair's end.

Two facts carry every term (positive durations; a pair whose time is 0 has halves of
full time 0, see :func:`~pp_opt.ops.pair_time`):

- *First backward.* Let ``T0`` be the earliest end of a forward of the last stage and
  ``j0`` its microbatch. Every backward waits for its microbatch's forward of the last
  stage, so every pair starts at ``T0`` or later and ends after ``T0``. The forwards of
  ``j0`` all end by ``T0``: none is paired, and ``T0 >= C``, the forward chain at full
  times (``sum t_f`` over all stages plus ``t_comm`` per device change). The first op on a
  device ``d`` starts at ``T0`` or later, or its microbatch's forwards below it all end
  before ``T0``, unpaired: either way not before ``fill(s0(d))`` at full times.
- *Last forward.* Let ``L`` be the latest end of a forward of the last stage and ``j*``
  its microbatch. Every forward ends by ``L``, so every pair does; the backwards of ``j*``
  all start at ``L`` or later, so none is paired: ``makespan >= L + `` its backward chain
  at full times (``+ t_w(0)`` when split), and ``L >= T0 >= C``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from pp_opt.bounds.paths import Term, _critical_path, _drain, _fill, round_trip
from pp_opt.ops import OpKind, duration, pair_relaxed
from pp_opt.problem import Problem


def variant_relaxed(problem: Problem) -> Problem:
    """:func:`~pp_opt.ops.pair_relaxed` for the schedules of ``problem``'s backward variant.

    A schedule runs one variant (:class:`pp_opt.order.Variant`): with the split backward
    every pair's partner of an ``F`` is a ``B``, never a fused ``BW``, so the forward's
    communication hides under at most the largest ``B`` compute of its device (``Bc*``
    over ``t_b`` alone), where :func:`~pp_opt.ops.pair_relaxed` (which serves both
    variants) also admits the larger ``BW`` compute. The backward's share does not depend
    on the variant. The fused variant is :func:`~pp_opt.ops.pair_relaxed` itself.
    """
    relaxed = pair_relaxed(problem)
    if relaxed is problem or not problem.split_backward:
        return relaxed
    # a fused backward as long as t_b: its compute is B's, the partners of a split schedule
    probe = pair_relaxed(problem.replace(stages=tuple(replace(st, t_bw=st.t_b)
                                                      for st in problem.stages)))  # fmt: skip
    stages = tuple(replace(st, t_f=share.t_f) for st, share in zip(relaxed.stages, probe.stages,
                                                                   strict=True))  # fmt: skip
    return relaxed.replace(stages=stages)


def _back(problem: Problem) -> OpKind:
    return OpKind.B if problem.split_backward else OpKind.BW


def _hop(problem: Problem, s: int, t: int) -> float:
    return problem.t_comm if problem.device_of(s) != problem.device_of(t) else 0.0


def full_critical_path(problem: Problem) -> float:
    """One microbatch through every stage and back at full (unpaired) times.

    ``makespan >= L + `` the backward chain of ``j*`` at full times, ``+ t_w(0)`` when
    split (*last forward* above), and ``L >= C``: the critical path of
    :func:`pp_opt.bounds.paths._critical_path` at the times of ``problem`` itself.
    """
    return _critical_path(problem)


def _top_sums(values: list[tuple[float, int]], n: int) -> list[float]:
    """``out[k]``: the sum of the ``k`` largest of ``values`` (``(value, copies)``),
    ``k = 0..n``."""
    out = [0.0]
    for value, copies in sorted(values, reverse=True):
        for _ in range(copies):
            if len(out) > n:
                return out
            out.append(out[-1] + value)
    return out


def device_windows(problem: Problem) -> float:
    """The largest over devices of ``min(V1(d), V2(d))``: pairs only between a device's
    first backward and its last forward, and no more pairs than unpaired ops allow.

    On device ``d`` (stages ``on(d)``, ``N = m |on(d)|`` forwards and as many backwards,
    ``s0``/``s1`` its lowest and highest stage, ``W_d`` its ``W`` work, ``D =
    drain(s0)`` at relaxed times as in :func:`pp_opt.bounds.lower_bound`): ``fill =
    fill(s0)`` at full times; ``T0_d = C + min over s in on(d) of`` the backward chain from
    the last stage down to ``s + 1`` at relaxed times (with the device changes), no later
    than any backward on ``d`` starts (*first backward*); ``L_d`` the latest end of a
    forward on ``d``, which is a forward of ``s1``, of some microbatch ``j``; ``tail_d`` =
    ``round_trip(s1)`` at relaxed times, then the backwards of ``j`` from ``s1`` down to
    ``s0`` (full times on ``d``, relaxed elsewhere, the device changes).

    Proof. A pair on ``d`` has a backward on ``d`` (it starts at ``T0_d`` or later) and an
    ``F`` on ``d`` (it ends by ``L_d``). So every op that starts on ``d`` before ``T0_d``
    is an unpaired ``F``, and every op running on ``d`` after ``L_d`` is an unpaired
    backward or a ``W`` (or optional work: recompute adds as much busy time as it fills).
    Let ``X`` be the last backward on ``d`` to end, at ``e``, and ``w`` the busy time of
    ``d`` after ``e`` (``W`` ops only): as in :func:`pp_opt.bounds.lower_bound`, ``X`` is on
    ``s0`` and ``makespan >= e + max(w, D)``. The backward of ``j`` on ``s1`` starts at
    ``L_d + round_trip(s1)`` or later, unpaired, and so are ``j``'s backwards on ``d``
    below it, the last of them (on ``s0``) ending by ``e``: ``e - L_d >= tail_d``.

    If ``L_d < T0_d`` no pair runs on ``d``: ``V1 = fill + `` its forwards and backwards at
    full times ``+ max(W_d, D)``.

    Otherwise ``fill <= T0_d <= L_d <= e`` and ``e - fill >=`` the busy time before ``e``
    ``+`` the idle time in ``[fill, T0_d]`` and in ``[L_d, e]``. All busy time is at least
    ``R_d`` (the ops at relaxed times, ``W`` at ``t_w``) plus ``e_F``/``e_B`` of every
    unpaired op. Let ``n1`` forwards start before ``T0_d`` (unpaired; they cover at most
    ``sum t_f`` of the first window, ``A = T0_d - fill`` long) and ``n2`` backwards end
    after ``L_d`` (unpaired; with ``W`` work they cover at most ``sum back + W_d - w`` of
    ``[L_d, e]``). The first window costs ``sum e_F + max(0, A - sum t_f) = max(sum e_F,
    A - sum F') >= P(n1) = max(n1 e_F_min, A - top_F'(n1))`` (``top`` the sum of the ``n1``
    largest, ``m`` of each stage on ``d``). The end costs ``sum e_B - w + max(0, tail_d -
    sum back - W_d + w) + max(w, D)``, least over ``0 <= w <= W_d`` at ``w = min(D, W_d)``:
    ``max(sum e_B + max(0, D - W_d), tail_d + D - W_d - sum B') >= Q(n2) = max(n2 e_B_min
    + max(0, D - W_d), tail_d + D - W_d - top_B'(n2))``. Pairs match one ``F`` with one
    backward, so ``u``, the number of unpaired forwards, is also that of unpaired
    backwards, and ``u >= n1, n2``: the other unpaired ops add at least ``(u - n1) e_F_min +
    (u - n2) e_B_min``. Hence ``makespan >= V2 = fill + R_d + min over u <= N of [min over
    n1 <= u of (P(n1) - n1 e_F_min) + min over n2 <= u of (Q(n2) - n2 e_B_min) + u (e_F_min
    + e_B_min)]``.
    """
    costs = _Costs.of(problem)
    return max(_window_bound(problem, costs, device) for device in range(problem.p))


class _Costs(NamedTuple):
    """Per stage: full and relaxed times of a forward and a backward, ``W`` (0 when fused),
    the relaxed problem, ``C`` and the relaxed backward chain down to each stage."""

    relaxed: Problem
    t_f: list[float]
    f_rel: list[float]
    b_full: list[float]
    b_rel: list[float]
    t_w: list[float]
    chain: float
    """``C``: one microbatch's forward chain through every stage at full times."""
    below: list[float]
    """From the last stage's backward start to a backward of ``s`` (relaxed)."""

    @classmethod
    def of(cls, problem: Problem) -> _Costs:
        relaxed = variant_relaxed(problem)
        back = _back(problem)
        stages = range(problem.num_stages)
        t_f = [duration(problem, OpKind.F, s) for s in stages]
        b_rel = [duration(relaxed, back, s) for s in stages]
        last = problem.num_stages - 1
        below = [0.0] * (last + 1)
        for s in range(last - 1, -1, -1):
            below[s] = below[s + 1] + b_rel[s + 1] + _hop(problem, s + 1, s)
        return cls(
            relaxed=relaxed,
            t_f=t_f,
            f_rel=[duration(relaxed, OpKind.F, s) for s in stages],
            b_full=[duration(problem, back, s) for s in stages],
            b_rel=b_rel,
            t_w=[
                duration(problem, OpKind.W, s) if problem.split_backward else 0.0 for s in stages
            ],  # fmt: skip
            chain=_fill(problem, last) + t_f[last],
            below=below,
        )


def _window_bound(problem: Problem, c: _Costs, device: int) -> float:
    """``min(V1, V2)`` of :func:`device_windows` for ``device``."""
    m = problem.m
    own = problem.stages_on(device)
    low, top = min(own), max(own)
    fill = _fill(problem, low)
    w_load = m * sum(c.t_w[s] for s in own)
    drain = _drain(c.relaxed, low)
    v1 = fill + m * sum(c.t_f[s] + c.b_full[s] for s in own) + max(w_load, drain)
    t0 = c.chain + min(c.below[s] for s in own)
    tail = round_trip(c.relaxed, top)
    for s in range(top, low - 1, -1):
        tail += c.b_full[s] if s in own else c.b_rel[s]
        if s > low:
            tail += _hop(problem, s, s - 1)
    r_load = m * sum(c.f_rel[s] + c.b_rel[s] + c.t_w[s] for s in own)
    e_f = max(0.0, min(c.t_f[s] - c.f_rel[s] for s in own))
    e_b = max(0.0, min(c.b_full[s] - c.b_rel[s] for s in own))
    n = m * len(own)
    top_f = _top_sums([(c.f_rel[s], m) for s in own], n)
    top_b = _top_sums([(c.b_rel[s], m) for s in own], n)
    window = max(0.0, t0 - fill)
    room = tail + drain - w_load
    owed = max(0.0, drain - w_load)
    # prefix minima over n1, n2 <= u of P(n1) - n1 e_F and Q(n2) - n2 e_B
    pre = post = extra = float("inf")
    for u in range(n + 1):
        pre = min(pre, max(u * e_f, window - top_f[u]) - u * e_f)
        post = min(post, max(u * e_b + owed, room - top_b[u]) - u * e_b)
        extra = min(extra, pre + post + u * (e_f + e_b))
    return min(v1, fill + r_load + extra)


PAIR_MAKESPAN_TERMS: tuple[Term, ...] = (full_critical_path, device_windows)
"""Makespan bounds of a problem with communication that pairs may hide, each a function of
the unrelaxed problem (its backward variant); :func:`pp_opt.bounds.lower_bound` adds them."""
