"""The independent validator: valid schedules of every kind pass, each broken rule is caught."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import replace

import pytest
from order_helpers import timed

from pp_opt.metrics import compute_metrics
from pp_opt.ops import OpKey, OpKind, Stream, stream_of
from pp_opt.problem import Problem, uniform_problem
from pp_opt.schedule import Schedule, ScheduledOp
from pp_opt.schedule_io import dumps_schedule, loads_schedule, schedule_from_dict
from pp_opt.validator import RULES, ValidationError, Violation, check_schedule, validate

F, B, W, BW = OpKind.F, OpKind.B, OpKind.W, OpKind.BW
OFFLOAD, RELOAD, R = OpKind.OFFLOAD, OpKind.RELOAD, OpKind.R


# --- building schedules -----------------------------------------------------------------


def gpipe_order(
    problem: Problem,
    *,
    fused: bool = False,
    offload: bool = False,
    recompute: frozenset[tuple[int, int]] | bool = False,
) -> dict[tuple[int, Stream], list[OpKey]]:
    """All forwards by stage, then all backwards by reversed stage, then all W.

    Every stream's list is a subsequence of one topological order, so it never
    deadlocks, on any placement. ``recompute`` is True (every activation) or a set
    of (stage, microbatch) pairs.
    """
    order: dict[tuple[int, Stream], list[OpKey]] = defaultdict(list)
    back = BW if fused else B

    def put(kind: OpKind, s: int, j: int) -> None:
        order[(problem.device_of(s), stream_of(kind))].append(OpKey(kind, s, j))

    stages, mbs = range(problem.num_stages), range(problem.m)
    for s in stages:
        for j in mbs:
            put(F, s, j)
            if offload:
                put(OFFLOAD, s, j)
    for s in reversed(stages):
        for j in mbs:
            if offload:
                put(RELOAD, s, j)
            if recompute is True or (recompute and (s, j) in recompute):
                put(R, s, j)
            put(back, s, j)
    if not fused:
        for s in reversed(stages):
            for j in mbs:
                put(W, s, j)
    return dict(order)


def with_costs(problem: Problem, **stage_changes: float) -> Problem:
    return problem.replace(stages=tuple(replace(st, **stage_changes) for st in problem.stages))


def offload_problem(t_copy: float = 0.5, **options: object) -> Problem:
    base = uniform_problem(p=2, m=3, offload=True, **options)
    return with_costs(base, t_offload=t_copy, t_reload=t_copy)


def op_of(schedule: Schedule, kind: OpKind, stage: int, microbatch: int) -> ScheduledOp:
    return next(op for op in schedule.ops if op.key == OpKey(kind, stage, microbatch))


def rebuilt(schedule: Schedule, ops: list[ScheduledOp] | tuple[ScheduledOp, ...]) -> Schedule:
    """The schedule with other ops and metrics that agree with them (to isolate one rule)."""
    ops = tuple(ops)
    return replace(schedule, ops=ops, metrics=compute_metrics(schedule.problem, ops))


def swapped(schedule: Schedule, old: ScheduledOp, new: ScheduledOp) -> Schedule:
    return rebuilt(schedule, [new if op is old else op for op in schedule.ops])


def shifted(op: ScheduledOp, by: float) -> ScheduledOp:
    return replace(op, start=op.start + by, end=op.end + by)


def rules(violations: list[Violation]) -> set[str]:
    return {v.rule for v in violations}


def only(violations: list[Violation], rule: str) -> Violation:
    """The single violation, which must be of ``rule``."""
    assert [v.rule for v in violations] == [rule], [str(v) for v in violations]
    return violations[0]


@pytest.fixture
def split_schedule() -> Schedule:
    """GPipe with B/W split on p = 2, m = 3, unit costs: F(0, j) runs j..j+1, B(1, 0) 4..5."""
    problem = uniform_problem(p=2, m=3)
    return timed(problem, gpipe_order(problem))


@pytest.fixture
def offload_schedule() -> Schedule:
    """GPipe on p = 2, m = 3 where every activation is offloaded (copies take 0.5)."""
    problem = offload_problem()
    return timed(problem, gpipe_order(problem, offload=True))


# --- valid schedules ----------------------------------------------------------------------


def _valid_cases() -> dict[str, tuple[Problem, dict]]:
    fused = uniform_problem(p=3, m=4, t_comm=0.25, split_backward=False)
    split = uniform_problem(p=3, m=4, t_comm=0.25, m_w=0.4)
    offload = offload_problem(t_copy=0.75, t_comm=0.1)
    recompute = with_costs(uniform_problem(p=2, m=3, recompute=True), m_in=0.25)
    loop2 = uniform_problem(p=2, m=4, v=2, t_comm=0.1)
    vshape = uniform_problem(p=2, m=4, v=2, placement="v", t_comm=0.1)
    linked = offload_problem(t_copy=1.5, host_links=((0, 1),))
    uneven = uniform_problem(p=3, m=3, t_comm=0.3).replace(
        stages=tuple(
            replace(st, t_f=1 + s, t_b=2 + 0.5 * s, t_w=0.5 + s, m_b=1 + 0.25 * s, m_w=0.5)
            for s, st in enumerate(uniform_problem(p=3, m=3).stages)
        ),
    )
    return {
        "fused": (fused, gpipe_order(fused, fused=True)),
        "split": (split, gpipe_order(split)),
        "offload": (offload, gpipe_order(offload, offload=True)),
        "recompute": (recompute, gpipe_order(recompute, recompute=True)),
        "recompute-some": (recompute, gpipe_order(recompute, recompute=frozenset({(0, 1)}))),
        "loop-v2": (loop2, gpipe_order(loop2)),
        "v-shape": (vshape, gpipe_order(vshape)),
        "shared-link": (linked, gpipe_order(linked, offload=True)),
        "uneven-stages": (uneven, gpipe_order(uneven)),
    }


@pytest.mark.parametrize("case", sorted(_valid_cases()))
def test_valid_schedule_passes(case: str) -> None:
    problem, order = _valid_cases()[case]
    schedule = timed(problem, order)
    assert validate(schedule) == []
    assert check_schedule(schedule) is schedule


def test_valid_schedule_passes_after_json_round_trip(offload_schedule: Schedule) -> None:
    assert validate(loads_schedule(dumps_schedule(offload_schedule))) == []


def test_partial_offload_fraction_passes() -> None:
    problem = offload_problem(t_copy=1.0)
    order = gpipe_order(problem, offload=True)
    halves = {OpKey(kind, 0, 1): 0.5 for kind in (OFFLOAD, RELOAD)}
    schedule = timed(problem, order, fractions=halves)
    assert op_of(schedule, OFFLOAD, 0, 1).duration == pytest.approx(0.5)
    assert validate(schedule) == []


def test_shared_link_really_serialises_copies() -> None:
    """The shared-link case above is not vacuous: without the link its copies overlap."""
    linked = offload_problem(t_copy=1.5, host_links=((0, 1),))
    alone = timed(linked.replace(host_links=()), gpipe_order(linked, offload=True))
    together = timed(linked, gpipe_order(linked, offload=True))
    assert together.metrics.makespan > alone.metrics.makespan


def test_frees_come_before_allocations_at_equal_times() -> None:
    # p = 1, fused: F0 0..1, BW0 1..3 frees at 3 exactly when F1 allocates; peak 1 = cap.
    problem = uniform_problem(p=1, m=2, split_backward=False, cap=1.0)
    order = {
        (0, Stream.COMPUTE): [OpKey(F, 0, 0), OpKey(BW, 0, 0), OpKey(F, 0, 1), OpKey(BW, 0, 1)]
    }
    schedule = timed(problem, order)
    assert op_of(schedule, BW, 0, 0).end == op_of(schedule, F, 0, 1).start == 3.0
    assert validate(schedule) == []
    lower = problem.replace(devices=(replace(problem.devices[0], cap=0.75),))
    v = only(validate(replace(schedule, problem=lower)), "memory")
    assert (v.op, v.amount) == (OpKey(F, 0, 0), 0.25)
    assert "2 allocation(s) over" in v.message


def test_rounding_within_tolerance_passes(split_schedule: Schedule) -> None:
    b = op_of(split_schedule, B, 0, 1)
    schedule = swapped(split_schedule, b, shifted(b, -1e-9))
    assert validate(schedule) == []
    # Exactly: it starts before B(1, 1) ends and while B(0, 0) still runs.
    assert rules(validate(schedule, tol=0.0)) == {"dependency", "stream_overlap"}


# --- one test per violation kind ------------------------------------------------------------


def test_duplicate(split_schedule: Schedule) -> None:
    w = op_of(split_schedule, W, 0, 2)
    late_copy = shifted(w, 10.0)
    v = only(validate(rebuilt(split_schedule, [*split_schedule.ops, late_copy])), "duplicate")
    assert (v.op, v.device, v.amount) == (w.key, 0, 1.0)


def test_unknown_op(split_schedule: Schedule) -> None:
    end = split_schedule.metrics.makespan
    extra_mb = ScheduledOp(W, 1, 3, Stream.COMPUTE, end, end + 1.0)
    no_stage = ScheduledOp(F, 2, 0, Stream.COMPUTE, end, end + 1.0)
    schedule = rebuilt(split_schedule, [*split_schedule.ops, extra_mb])
    schedule = replace(schedule, ops=(*schedule.ops, no_stage))  # metrics ignore stage 2
    found = validate(schedule)
    assert [(v.rule, v.op, v.device, v.amount) for v in found] == [
        ("unknown_op", OpKey(W, 1, 3), 1, 1.0),
        ("unknown_op", OpKey(F, 2, 0), None, 1.0),
    ]
    assert "microbatch 3 is outside 0..2" in found[0].message
    assert "stage 2 is outside 0..1" in found[1].message


def test_mixed_backward_kinds_reports_the_odd_op(split_schedule: Schedule) -> None:
    b = op_of(split_schedule, B, 0, 0)
    found = validate(swapped(split_schedule, b, replace(b, kind=BW, end=b.start + 2.0)))
    assert ("unknown_op", OpKey(BW, 0, 0)) in {(v.rule, v.op) for v in found}
    assert ("missing", OpKey(B, 0, 0)) in {(v.rule, v.op) for v in found}


def test_missing(split_schedule: Schedule) -> None:
    w = op_of(split_schedule, W, 1, 2)
    v = only(
        validate(rebuilt(split_schedule, [op for op in split_schedule.ops if op is not w])),
        "missing",
    )
    assert (v.op, v.device, v.amount) == (w.key, 1, 1.0)


def test_wrong_stream(split_schedule: Schedule) -> None:
    f = op_of(split_schedule, F, 1, 0)
    schedule = replace(
        split_schedule,
        ops=tuple(replace(op, stream=Stream.D2H) if op is f else op for op in split_schedule.ops),
    )
    v = only(validate(schedule), "stream")
    assert (v.op, v.device) == (f.key, 1)
    assert "d2h" in v.message and "compute" in v.message


def test_wrong_duration(split_schedule: Schedule) -> None:
    w = op_of(split_schedule, W, 0, 2)  # the last op: nothing waits for it
    v = only(validate(swapped(split_schedule, w, replace(w, end=w.end + 0.5))), "duration")
    assert (v.op, v.device, v.amount) == (w.key, 0, pytest.approx(0.5))


def test_negative_start(split_schedule: Schedule) -> None:
    f = op_of(split_schedule, F, 0, 0)
    v = only(validate(swapped(split_schedule, f, shifted(f, -1.0))), "start")
    assert (v.op, v.device, v.amount) == (f.key, 0, 1.0)
    nan = replace(
        split_schedule,
        ops=tuple(replace(op, start=math.nan) if op is f else op for op in split_schedule.ops),
    )
    v = only(validate(nan), "start")  # and no knock-on metrics or dependency reports
    assert (v.op, v.amount) == (f.key, math.inf)


def test_dependency_with_latency() -> None:
    problem = uniform_problem(p=2, m=3, t_comm=0.5)
    schedule = timed(problem, gpipe_order(problem))
    f = op_of(schedule, F, 1, 0)
    assert f.start == 1.5  # F(0, 0) ends at 1, plus t_comm
    v = only(validate(swapped(schedule, f, shifted(f, -0.25))), "dependency")
    assert (v.op, v.device, v.amount) == (f.key, 1, pytest.approx(0.25))
    assert str(OpKey(F, 0, 0)) in v.message and "latency 0.5" in v.message


def test_stream_overlap(split_schedule: Schedule) -> None:
    b = op_of(split_schedule, B, 1, 1)
    assert (op_of(split_schedule, B, 1, 0).end, b.start) == (5.0, 5.0)
    v = only(validate(swapped(split_schedule, b, shifted(b, -0.5))), "stream_overlap")
    assert (v.op, v.device, v.amount) == (b.key, 1, pytest.approx(0.5))
    assert str(OpKey(B, 1, 0)) in v.message


def test_link_overlap() -> None:
    # Timed without the shared link, then checked against it: d2h copies of the two devices
    # overlap. Device 0 offloads at 1..2.5, 2.5..4, 4..5.5; device 1 at 2..3.5, 3.5..5, 5..6.5.
    linked = offload_problem(t_copy=1.5, host_links=((0, 1),))
    alone = timed(linked.replace(host_links=()), gpipe_order(linked, offload=True))
    assert validate(alone) == []
    found = validate(replace(alone, problem=linked))
    assert rules(found) == {"link_overlap"}
    d2h = [(v.op, v.device, v.amount) for v in found if v.op.kind is OFFLOAD]
    assert d2h == [
        (OpKey(OFFLOAD, 1, 0), 1, pytest.approx(0.5)),
        (OpKey(OFFLOAD, 0, 1), 0, pytest.approx(1.0)),
        (OpKey(OFFLOAD, 1, 1), 1, pytest.approx(0.5)),
        (OpKey(OFFLOAD, 0, 2), 0, pytest.approx(1.0)),
        (OpKey(OFFLOAD, 1, 2), 1, pytest.approx(0.5)),
    ]


def test_memory_cap() -> None:
    # GPipe keeps all m = 3 activations: device 0 reaches 3 when F(0, 2) starts at 2,
    # device 1 when F(1, 2) starts at 3; the cap is 2.
    problem = uniform_problem(p=2, m=3, cap=2.0)
    found = validate(timed(problem, gpipe_order(problem)))
    assert [(v.rule, v.op, v.device, v.amount) for v in found] == [
        ("memory", OpKey(F, 0, 2), 0, 1.0),
        ("memory", OpKey(F, 1, 2), 1, 1.0),
    ]
    assert "reaches 3 at time 2 " in found[0].message and "cap 2 " in found[0].message


def test_memory_counts_static_and_recompute() -> None:
    # With recompute every F keeps only m_in = 0.25; R brings back 0.75 just before B.
    base = with_costs(uniform_problem(p=1, m=2, recompute=True, static=1.0), m_in=0.25)
    schedule = timed(base, gpipe_order(base, recompute=True))
    assert schedule.metrics.peak_memory == [1.0 + 0.25 + 1.0]  # static, F(0, 1) input, R(0, 0)
    tight = replace(schedule, problem=base.replace(devices=(replace(base.devices[0], cap=2.0),)))
    v = only(validate(tight), "memory")
    assert (v.op, v.device, v.amount) == (OpKey(R, 0, 0), 0, pytest.approx(0.25))


def test_offload_without_reload(offload_schedule: Schedule) -> None:
    reload = op_of(offload_schedule, RELOAD, 0, 1)
    kept = [op for op in offload_schedule.ops if op is not reload]
    v = only(validate(rebuilt(offload_schedule, kept)), "offload_pairing")
    assert (v.op, v.device, v.amount) == (OpKey(OFFLOAD, 0, 1), 0, 1.0)


def test_offload_fractions_differ(offload_schedule: Schedule) -> None:
    reload = op_of(offload_schedule, RELOAD, 1, 2)
    half = replace(reload, fraction=0.5, end=reload.start + 0.25)
    v = only(validate(swapped(offload_schedule, reload, half)), "offload_pairing")
    assert (v.op, v.device, v.amount) == (reload.key, 1, 0.5)


def test_fraction_outside_range(offload_schedule: Schedule) -> None:
    f = op_of(offload_schedule, F, 0, 0)
    v = only(validate(swapped(offload_schedule, f, replace(f, fraction=0.5))), "fraction")
    assert (v.op, v.amount) == (f.key, 0.5)
    problem = offload_schedule.problem
    too_much = {OpKey(kind, 0, 2): 1.25 for kind in (OFFLOAD, RELOAD)}
    found = validate(timed(problem, gpipe_order(problem, offload=True), fractions=too_much))
    assert [(v.rule, v.op, v.amount) for v in found] == [
        ("fraction", OpKey(OFFLOAD, 0, 2), 0.25),
        ("fraction", OpKey(RELOAD, 0, 2), 0.25),
    ]


def test_offload_not_allowed(offload_schedule: Schedule) -> None:
    problem = offload_schedule.problem.replace(offload=False)
    found = validate(replace(offload_schedule, problem=problem))
    assert rules(found) == {"offload_disabled"}
    assert len(found) == 2 * 2 * 3  # OFFLOAD and RELOAD of 2 stages x 3 microbatches
    assert all(v.amount == 1.0 for v in found)


def test_recompute_not_allowed() -> None:
    problem = with_costs(uniform_problem(p=2, m=2, recompute=True), m_in=0.25)
    schedule = timed(problem, gpipe_order(problem, recompute=frozenset({(1, 0)})))
    found = validate(replace(schedule, problem=problem.replace(recompute=False)))
    v = only(found, "recompute_disabled")
    assert (v.op, v.device, v.amount) == (OpKey(R, 1, 0), 1, 0.75)


def test_split_backward_not_allowed() -> None:
    """A problem with a fused backward takes no B/W schedule (a rule schedule made one, and
    the solve reported it optimal under a bound above its makespan)."""
    from pp_opt.orders import baseline

    problem = uniform_problem(p=2, m=3, t_w=0.5, m_w=0.2, cap=4.0)
    schedule = baseline("zb-h1", problem)
    found = validate(replace(schedule, problem=problem.replace(split_backward=False)))
    v = only(found, "split_disabled")
    assert (v.op, v.amount) == (OpKey(OpKind.B, 0, 0), 2 * 2 * 3)


def test_offload_and_recompute_together() -> None:
    problem = offload_problem(recompute=True)
    order = gpipe_order(problem, offload=True, recompute=frozenset({(0, 0)}))
    v = only(validate(timed(problem, order)), "offload_and_recompute")
    assert (v.op, v.device, v.amount) == (OpKey(OFFLOAD, 0, 0), 0, 1.0)


def test_offload_outside_window(offload_schedule: Schedule) -> None:
    offload = op_of(offload_schedule, OFFLOAD, 0, 0)
    assert (op_of(offload_schedule, F, 0, 0).end, offload.start) == (1.0, 1.0)
    early = validate(swapped(offload_schedule, offload, shifted(offload, -0.5)))
    assert [(v.rule, v.op, v.amount) for v in early] == [
        ("offload_window", offload.key, 0.5),
        ("dependency", offload.key, 0.5),
    ]
    backward_start = op_of(offload_schedule, B, 0, 0).start
    late = replace(offload, start=backward_start - 0.2, end=backward_start + 0.3)
    window = [
        v for v in validate(swapped(offload_schedule, offload, late)) if v.rule == "offload_window"
    ]
    assert [(v.op, v.amount) for v in window] == [(offload.key, pytest.approx(0.3))]


def test_stored_metrics_disagree(split_schedule: Schedule) -> None:
    metrics = replace(split_schedule.metrics, makespan=split_schedule.metrics.makespan + 1.5)
    v = only(validate(replace(split_schedule, metrics=metrics)), "metrics")
    assert (v.device, v.amount) == (None, 1.5)
    assert "makespan" in v.message


def test_hand_edited_json_is_caught(split_schedule: Schedule) -> None:
    data = json.loads(dumps_schedule(split_schedule))
    data["metrics"]["peak_memory"][1] -= 0.5
    data["metrics"]["bubble_rate"] = 0.0
    found = validate(schedule_from_dict(data))
    assert rules(found) == {"metrics"}
    by_name = {v.message.split()[1]: v for v in found}
    assert by_name["peak_memory[1]"].device == 1
    assert by_name["peak_memory[1]"].amount == pytest.approx(0.5)
    assert by_name["bubble_rate"].amount == pytest.approx(split_schedule.metrics.bubble_rate)


# --- the API around the checks ------------------------------------------------------------


def test_check_schedule_raises_with_the_violations(split_schedule: Schedule) -> None:
    w = op_of(split_schedule, W, 1, 2)
    broken = rebuilt(split_schedule, [op for op in split_schedule.ops if op is not w])
    with pytest.raises(ValidationError) as info:
        check_schedule(broken)
    assert info.value.violations == validate(broken)
    assert "missing" in str(info.value) and str(w.key) in str(info.value)


def test_violation_reads_as_one_line() -> None:
    v = Violation(
        rule="dependency", message="starts too early", op=OpKey(B, 2, 1), device=1, amount=0.25
    )
    assert str(v) == "B(stage=2, mb=1) on device 1: dependency broken by 0.25: starts too early"
    assert "\n" not in str(v)
    assert str(Violation(rule="metrics", message="x", amount=1.0)).startswith("schedule: metrics")


def test_every_reported_rule_is_documented(split_schedule: Schedule) -> None:
    problem = uniform_problem(p=2, m=3, cap=2.0)
    schedule = timed(problem, gpipe_order(problem))
    schedule = replace(schedule, metrics=replace(schedule.metrics, makespan=0.0))
    assert rules(validate(schedule)) <= set(RULES)


def test_bad_tolerance_is_rejected(split_schedule: Schedule) -> None:
    with pytest.raises(ValueError, match="tol"):
        validate(split_schedule, tol=-1.0)
