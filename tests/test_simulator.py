"""Simulator: closed forms, latencies, shared host links, deadlocks, metrics."""

from __future__ import annotations

import pytest
from order_helpers import timed

from pp_opt.errors import DeadlockError, ProblemError
from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.problem import uniform_problem
from pp_opt.simulator import order_of, retime

K = OpKind
C = Stream.COMPUTE


def gpipe_order(p: int, m: int) -> dict:
    return {
        (d, C): [OpKey(K.F, d, j) for j in range(m)] + [OpKey(K.BW, d, j) for j in range(m)]
        for d in range(p)
    }


@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 3), (4, 8), (3, 7)])
def test_gpipe_closed_form(p: int, m: int) -> None:
    problem = uniform_problem(p=p, m=m, t_f=1.0, t_b=1.5, t_w=0.5, m_w=0.3, cap=float(m))
    schedule = timed(problem, gpipe_order(p, m))
    t_bw = 2.0
    assert schedule.metrics.makespan == pytest.approx((m + p - 1) * (1.0 + t_bw))
    assert schedule.metrics.busy == [pytest.approx(m * 3.0)] * p
    assert schedule.metrics.peak_memory == [pytest.approx(m)] * p
    bubble = (p - 1) * 3.0
    assert schedule.metrics.bubble_rate == pytest.approx(bubble / (bubble + m * 3.0))


def test_latency_on_cross_device_edges() -> None:
    problem = uniform_problem(p=2, m=1, t_comm=0.25)
    schedule = timed(problem, gpipe_order(2, 1))
    # F0, comm, F1, BW1, comm, BW0
    assert schedule.metrics.makespan == pytest.approx(1 + 0.25 + 1 + 2 + 0.25 + 2)
    assert schedule.metrics.span == [pytest.approx(6.5), pytest.approx(3.0)]


def offload_order(p: int, m: int) -> dict:
    order = gpipe_order(p, m)
    for d in range(p):
        order[(d, Stream.D2H)] = [OpKey(K.OFFLOAD, d, j) for j in range(m)]
        order[(d, Stream.H2D)] = [OpKey(K.RELOAD, d, j) for j in range(m)]
    return order


def test_offload_frees_memory_and_shared_link_serialises() -> None:
    base = dict(p=2, m=3, offload=True, split_backward=False)
    problem = uniform_problem(**base)
    problem = problem.replace(
        stages=tuple(
            st.__class__(**{**_fields(st), "t_offload": 0.5, "t_reload": 0.5})
            for st in problem.stages
        )  # fmt: skip
    )
    # a reload waits for the previous backward (or the last forward): a runtime's event wait
    waits = [
        (OpKey(K.BW, d, j - 1) if j else OpKey(K.F, d, 2), OpKey(K.RELOAD, d, j))
        for d in range(2)
        for j in range(3)
    ]
    eager = timed(problem, offload_order(2, 3))
    own_links = timed(problem, offload_order(2, 3), waits=waits)
    shared = timed(problem.replace(host_links=((0, 1),)), offload_order(2, 3), waits=waits)
    # GPipe holds all 3 activations; offloading each keeps at most 2, unless reloads
    # start as soon as their offload ends
    assert eager.metrics.peak_memory == [3.0, 3.0]
    assert own_links.metrics.peak_memory == [2.0, 2.0]
    assert retime(own_links).metrics.peak_memory == [2.0, 2.0]
    d2h = [op for op in shared.ops if op.stream is Stream.D2H]
    d2h.sort(key=lambda op: op.start)
    for a, b in zip(d2h, d2h[1:], strict=False):
        assert b.start >= a.end - 1e-12
    assert shared.metrics.makespan >= own_links.metrics.makespan


def _fields(stage) -> dict:
    return {name: getattr(stage, name) for name in stage.__slots__}


def test_deadlock_names_the_waiting_ops() -> None:
    problem = uniform_problem(p=2, m=2)
    order = {
        (0, C): [OpKey(K.F, 0, 0), OpKey(K.B, 0, 1), OpKey(K.F, 0, 1), OpKey(K.B, 0, 0)],
        (1, C): [OpKey(K.F, 1, 0), OpKey(K.B, 1, 0), OpKey(K.F, 1, 1), OpKey(K.B, 1, 1)],
    }
    order[(0, C)] += [OpKey(K.W, 0, 0), OpKey(K.W, 0, 1)]
    order[(1, C)] += [OpKey(K.W, 1, 0), OpKey(K.W, 1, 1)]
    with pytest.raises(DeadlockError) as err:
        timed(problem, order)
    message = str(err.value)
    assert "B(stage=0, mb=1)" in message and "waits for" in message


def test_wrong_order_contents_are_rejected() -> None:
    problem = uniform_problem(p=2, m=1)
    order = gpipe_order(2, 1)
    order[(0, C)] = order[(0, C)][:1]
    with pytest.raises(ProblemError, match="missing"):
        timed(problem, order)
    order = gpipe_order(2, 1)
    order[(0, C)] = order[(0, C)][1:]
    order[(1, C)] = [OpKey(K.F, 0, 0)] + order[(1, C)]
    with pytest.raises(ProblemError, match="runs on device 0"):
        timed(problem, order)


def test_retime_reproduces_the_schedule() -> None:
    problem = uniform_problem(p=3, m=5, t_comm=0.1)
    schedule = timed(problem, gpipe_order(3, 5))
    again = retime(schedule)
    assert set(again.ops) == set(schedule.ops)
    assert order_of(again) == order_of(schedule)
