"""Overlapped pairs ``FB`` (docs/design.md §3): their time, the problem fields they need, and
every part that knows them (simulator, validator, metrics, bounds, JSON, trace, plot)."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from pp_opt.bounds import lower_bound
from pp_opt.errors import ProblemError
from pp_opt.export.trace import trace_events
from pp_opt.ops import OpKey, OpKind, Stream, pair_relaxed, pair_time
from pp_opt.orders import baseline
from pp_opt.problem import Problem, Stage, uniform_problem
from pp_opt.problem_io import problem_from_dict, problem_from_spec, problem_to_dict
from pp_opt.schedule import dag_ops
from pp_opt.schedule_io import dumps_schedule, loads_schedule
from pp_opt.simulator import order_of, retime, simulate
from pp_opt.solvers import solve
from pp_opt.validator import validate

F, B, W, BW, FB = OpKind.F, OpKind.B, OpKind.W, OpKind.BW, OpKind.FB


def with_comm(problem: Problem, f: float, b: float, overhead: float = 0.0) -> Problem:
    """``problem`` with a fraction ``f`` of every t_f and ``b`` of every t_b communication."""
    stages = tuple(
        dataclasses.replace(st, t_f_comm=f * st.t_f, t_b_comm=b * st.t_b) for st in problem.stages
    )
    return problem.replace(stages=stages, pair_overhead=overhead)


def two_stages(**kw: float) -> Problem:
    stages = (
        Stage(device=0, t_f=4.0, t_b=6.0, t_w=2.0, **kw),
        Stage(device=0, t_f=4.0, t_b=6.0, t_w=2.0, **kw),
    )
    return Problem(
        p=1,
        m=2,
        stages=stages,
        devices=(uniform_problem(p=1, m=1).devices[0],),
        placement="explicit",
    )


# ---------------------------------------------------------------- pair_time


@pytest.mark.parametrize(
    ("f_comm", "b_comm", "overhead", "backward", "expected"),
    [
        (0.0, 0.0, 0.0, B, 10.0),  # nothing to hide: the halves in sequence
        (0.0, 0.0, 0.5, B, 10.0),  # overhead alone: never above the sequence
        (2.0, 2.0, 0.0, B, 6.0),  # Fc 2 + Bc 4; Fm 2 hides under Bc, Bm 2 under Fc
        (2.0, 3.0, 0.0, B, 6.0),  # Fc 2 + Bc 3, and Bm 3 shows 1 past Fc 2
        (2.0, 3.0, 0.1, B, 6.4),  # 2 + 3 + 1, and 0.1 of the 4 hidden (2 + 2)
        (3.0, 1.0, 0.0, B, 6.0),  # Fc 1 + Bc 5; Fm 3 hides under Bc 5
        (4.0, 0.0, 0.0, B, 6.0),  # all of F is comm: hidden under B's 6 of compute
        (4.0, 6.0, 0.0, B, 10.0),  # all comm: 0 + max(0, 4 - 0) + max(0, 6 - 0)
        (2.0, 3.0, 0.0, BW, 8.0),  # fused backward: Bc = 6 + 2 - 3 = 5, Bm 3 shows 1
    ],
)
def test_pair_time_closed_forms(f_comm, b_comm, overhead, backward, expected):
    problem = two_stages(t_f_comm=f_comm, t_b_comm=b_comm).replace(pair_overhead=overhead)
    assert pair_time(problem, 0, 1, backward) == pytest.approx(expected)


def test_pair_time_is_clamped_between_the_longer_compute_and_the_sequence():
    problem = two_stages(t_f_comm=1.0, t_b_comm=1.0).replace(pair_overhead=5.0)
    assert pair_time(problem, 0, 1, B) == pytest.approx(10.0)  # 3 + 5 + 5 * 2 > 4 + 6
    low = two_stages(t_f_comm=0.5, t_b_comm=0.5)
    for backward in (B, BW):
        t = pair_time(low, 0, 1, backward)
        back = 6.0 if backward is B else 8.0
        assert max(4.0 - 0.5, back - 0.5) <= t <= 4.0 + back
    with pytest.raises(ValueError, match="B or BW"):
        pair_time(low, 0, 1, W)


# ---------------------------------------------------------------- problem fields


def test_new_fields_default_to_nothing_and_stay_out_of_files():
    problem = uniform_problem(p=2, m=4)
    assert problem.pairs is False and problem.pair_overhead == 0.0
    assert all(st.t_f_comm == 0.0 == st.t_b_comm for st in problem.stages)
    data = problem_to_dict(problem)
    assert "pairs" not in data and "pair_overhead" not in data
    assert all("t_f_comm" not in row and "t_b_comm" not in row for row in data["stages"])


def test_new_fields_round_trip_through_dict_and_toml_spec():
    problem = with_comm(uniform_problem(p=2, m=4), 0.25, 0.5, overhead=0.1).replace(pairs=True)
    data = problem_to_dict(problem)
    assert data["pairs"] is True and data["pair_overhead"] == 0.1
    assert data["stages"][0]["t_f_comm"] == 0.25 and data["stages"][0]["t_b_comm"] == 0.5
    assert problem_from_dict(json.loads(json.dumps(data))) == problem
    stage = {"t_f": 1.0, "t_b": 1.0, "t_w": 1.0, "t_f_comm": 0.25, "t_b_comm": 0.5}
    spec = {"p": 2, "m": 4, "pairs": True, "pair_overhead": 0.1, "stage": stage}
    assert problem_from_spec(spec).stages == problem.stages
    assert problem_from_spec(spec).pairs and problem_from_spec(spec).pair_overhead == 0.1


@pytest.mark.parametrize(
    ("field", "stage", "problem", "match"),
    [
        ("t_f_comm", {"t_f_comm": 2.0}, {}, "t_f_comm: got 2 > t_f = 1"),
        ("t_b_comm", {"t_b_comm": -1.0}, {}, "t_b_comm: got -1"),
        ("pair_overhead", {}, {"pair_overhead": -0.5}, "pair_overhead: got -0.5"),
        ("pairs", {}, {"pairs": "yes"}, "pairs: got 'yes'; expected true or false"),
    ],
)
def test_bad_pair_fields_name_the_field(field, stage, problem, match):
    spec = {"p": 1, "m": 1, "stage": {"t_f": 1.0, "t_b": 1.0, "t_w": 1.0, **stage}, **problem}
    with pytest.raises(ProblemError, match=match) as caught:
        problem_from_spec(spec)
    assert field in str(caught.value) and "\n" not in str(caught.value)


# ---------------------------------------------------------------- schedules with pairs


def dual_pipe_v(p: int = 2, m: int = 4, f: float = 0.5, b: float = 0.5, **kw) -> Problem:
    base = uniform_problem(p=p, m=m, placement="v", v=2, t_f=2.0, t_b=2.0, t_w=1.0, **kw)
    return with_comm(base, f, b)


def test_pairs_hide_communication_and_nothing_else():
    problem = dual_pipe_v(t_comm=0.1)
    plain, paired = baseline("DualPipeV", problem), baseline("dualpipev-overlap", problem)
    pairs = [op for op in paired.ops if op.kind is FB]
    p, m = 2, 4  # PyTorch's OVERLAP_F_B actions (steps 4 and 5), the last rank's first not
    assert len(pairs) == sum(2 * (m - 2 * p + r + 1) + p - r - 1 for r in range(p)) - 1
    for op in pairs:
        assert op.partner is not None and op.partner.kind is B and op.stream is Stream.COMPUTE
        assert problem.device_of(op.partner.stage) == problem.device_of(op.stage)
        assert op.duration == pytest.approx(pair_time(problem, op.stage, op.partner.stage, B))
        assert op.duration < problem.stages[0].t_f + problem.stages[0].t_b
    # same order, same ops: the pairs are what makes it faster
    assert sorted(h.key for h in dag_ops(paired.ops)) == sorted(op.key for op in plain.ops)
    assert paired.metrics.makespan < plain.metrics.makespan
    assert validate(paired) == []
    # the busy time counts a pair once, at its pair time
    for d, busy in enumerate(paired.metrics.busy):
        own = [op for op in paired.ops if problem.device_of(op.stage) == d]
        assert busy == pytest.approx(sum(op.duration for op in own))
    # without communication a pair saves nothing: the same order runs unpaired
    quiet = dual_pipe_v(f=0.0, b=0.0, t_comm=0.1)
    still = baseline("dualpipev-overlap", quiet)
    assert not any(op.kind is FB for op in still.ops)
    assert still.metrics.makespan == pytest.approx(baseline("DualPipeV", quiet).metrics.makespan)


def test_pair_holds_the_memory_of_both_halves():
    """F's allocation at the pair's start, the backward's free at its end: one device,
    F(0, 1) paired with B(1, 0) holds three activations of stage size at once."""
    problem = Problem(
        p=1, m=2, placement="explicit", pairs=True,
        stages=(Stage(device=0, t_f=1.0, t_b=1.0, t_w=0.0, t_f_comm=0.5, t_b_comm=0.5),) * 2,
        devices=uniform_problem(p=1, m=1, cap=10.0).devices,
    )  # fmt: skip
    order = simulate_pairs(problem, [[(F, 0, 0), (F, 1, 0), (F, 0, 1), (W, 1, 0), (B, 0, 0),
                                      (W, 0, 0), (F, 1, 1), (B, 1, 1), (W, 1, 1), (B, 0, 1),
                                      (W, 0, 1)]], {(F, 0, 1): (B, 1, 0)})  # fmt: skip
    assert validate(order) == []
    pair = next(op for op in order.ops if op.kind is FB)
    assert (pair.start, pair.end) == (2.0, 3.0)  # pair_time: 0.5 + 0.5 + 0 + 0
    assert order.metrics.peak_memory == [3.0]  # F(0,0), F(1,0) held, F(0,1) allocates
    assert validate(dataclasses.replace(order, problem=problem.replace(
        devices=uniform_problem(p=1, m=1, cap=2.5).devices)))[0].rule == "memory"  # fmt: skip


def simulate_pairs(problem, per_device, pairs):
    from pp_opt.order import Order, Variant, compute_streams

    keys = [[OpKey(*k) for k in ops] for ops in per_device]
    order = Order(problem=problem, streams=compute_streams(keys),
                  variant=Variant.of_problem(problem),
                  pairs={OpKey(*f): OpKey(*b) for f, b in pairs.items()})  # fmt: skip
    return simulate(order)


def test_validator_re_checks_every_pair_rule():
    schedule = baseline("dualpipev-overlap", dual_pipe_v(t_comm=0.1))
    index = next(i for i, op in enumerate(schedule.ops) if op.kind is FB)
    pair = schedule.ops[index]

    def broken(**changes):
        ops = list(schedule.ops)
        ops[index] = dataclasses.replace(pair, **changes)
        return {v.rule for v in validate(dataclasses.replace(schedule, ops=tuple(ops)))}

    assert "duration" in broken(end=pair.end + 0.5)
    assert "pair" in broken(partner=pair.partner._replace(kind=W))
    problem = schedule.problem
    other = next(s for s in range(4) if problem.device_of(s) != problem.device_of(pair.stage))
    assert "pair" in broken(partner=pair.partner._replace(stage=other))
    # pairing an F with its own microbatch's backward waits for itself
    assert "dependency" in broken(partner=pair.partner._replace(microbatch=pair.microbatch))
    assert "stream" in broken(stream=Stream.D2H)


def test_simulator_re_times_pairs_and_refuses_a_pair_that_waits_for_itself():
    schedule = baseline("dualpipev-overlap", dual_pipe_v(t_comm=0.1))
    order = order_of(schedule)
    assert order.pairs and all(f.kind is F and b.kind is B for f, b in order.pairs.items())
    again = retime(schedule)
    assert again.ops == schedule.ops or sorted(again.ops, key=str) == sorted(schedule.ops, key=str)
    f = next(iter(order.pairs))
    bad = dict(order.pairs)
    bad[f] = OpKey(B, f.stage, f.microbatch)
    with pytest.raises(ProblemError, match="pairs"):
        simulate(dataclasses.replace(order, pairs=bad))


def test_schedule_json_round_trips_pairs_byte_for_byte():
    schedule = baseline("dualpipev-overlap", dual_pipe_v(t_comm=0.1))
    text = dumps_schedule(schedule)
    rows = [row for dev in json.loads(text)["devices"] for row in dev["ops"] if row["op"] == "FB"]
    assert rows and list(rows[0]) == ["op", "stage", "microbatch", "stage_b", "microbatch_b",
                                      "backward", "stream", "start", "end"]  # fmt: skip
    assert rows[0]["backward"] == "B" and rows[0]["stream"] == "compute"
    again = loads_schedule(text)
    assert again.ops and sorted(again.ops, key=str) == sorted(schedule.ops, key=str)
    assert dumps_schedule(again) == text
    assert json.dumps(json.loads(text), indent=1) + "\n" == text  # the fast writer is json's
    assert validate(again) == []
    with pytest.raises(ProblemError, match=r"ops\[\d+\]\.backward: got 'X'; use B or BW"):
        loads_schedule(text.replace('"backward": "B"', '"backward": "X"', 1))
    with pytest.raises(ProblemError, match=r"ops\[\d+\]\.backward: missing"):
        loads_schedule(text.replace('"backward": "B",\n     ', "", 1))
    with pytest.raises(ProblemError, match=r"ops\[\d+\]\.stage_b: only an FB pair"):
        loads_schedule(text.replace('"op": "FB"', '"op": "F"', 1))


def test_trace_names_both_halves_of_a_pair():
    schedule = baseline("dualpipev-overlap", dual_pipe_v(t_comm=0.1))
    events = [e for e in trace_events(schedule)["traceEvents"] if e.get("cat") == "FB"]
    assert events and all(" + B s" in e["name"] for e in events)
    assert {"stage_b", "microbatch_b", "backward"} <= set(events[0]["args"])


def test_plot_draws_pairs(tmp_path):
    pytest.importorskip("matplotlib")
    from pp_opt.export.plot import KIND_COLORS, save_figure

    assert FB in KIND_COLORS
    schedule = baseline("dualpipev-overlap", dual_pipe_v(t_comm=0.1))
    save_figure(schedule, tmp_path / "pairs.png")
    assert (tmp_path / "pairs.png").stat().st_size > 1000


def test_lower_bound_holds_for_schedules_with_pairs():
    """Pairs can beat the compute-sum bound of the problem with communication; the bound of
    the problem of compute alone (pair_relaxed) holds, and nothing changes without comm."""
    plain = uniform_problem(p=2, m=8, placement="v", v=2, t_f=2.0, t_b=2.0, t_w=1.0)
    assert pair_relaxed(plain) is plain
    problem = with_comm(plain, 0.6, 0.6)
    relaxed = pair_relaxed(problem)
    assert relaxed.stages[0].t_f == pytest.approx(0.4) and relaxed.stages[0].t_b_comm == 0.0
    schedule = baseline("dualpipev-overlap", problem)
    compute_sum = max(sum(st.t_f + st.t_b + st.t_w for st in problem.stages
                          if st.device == d) * problem.m for d in range(problem.p))  # fmt: skip
    assert schedule.metrics.makespan < compute_sum  # the unrelaxed sum bound would be invalid
    assert lower_bound(problem) <= schedule.metrics.makespan
    assert schedule.solver.lower_bound == lower_bound(problem)
    assert lower_bound(problem) <= lower_bound(plain)


def test_pair_relaxation_keeps_the_communication_no_partner_can_hide():
    """Closed form on two stages of one device (t_f 4, t_b 6, t_w 2): F carries 3 of comm,
    B 5. Partners' compute: forward 1, backward at most 6 + 2 - 5 = 3 (a fused BW)."""
    problem = two_stages().replace(
        stages=tuple(
            dataclasses.replace(st, t_f_comm=3.0, t_b_comm=5.0) for st in two_stages().stages
        ),  # fmt: skip
        pair_overhead=0.1,
    )
    st = pair_relaxed(problem).stages[0]
    assert st.t_f == pytest.approx(1 + 0.1 * 3)  # Fm 3 hides under BW's 3, slowing it
    assert st.t_b == pytest.approx(1 + (5 - 1) + 0.1 * 1)  # Bm shows 4 past Fc 1
    assert st.t_bw == pytest.approx(3 + (5 - 1) + 0.1 * 1)
    # every pair lasts at least its halves' relaxed times
    for backward, relaxed_back in ((B, st.t_b), (BW, st.t_bw)):
        assert pair_time(problem, 0, 1, backward) >= st.t_f + relaxed_back - 1e-12


def test_every_pair_lasts_at_least_its_relaxed_halves_on_random_costs():
    """pair_time(F(s), back(s2)) >= F'(s) + back'(s2) for every same-device pair, over random
    times, communication shares and overheads (fixed seed)."""
    import random

    rng = random.Random(7)
    for _ in range(300):
        stages = tuple(
            Stage(device=0, t_f=(tf := rng.uniform(0.5, 5)), t_b=(tb := rng.uniform(0.5, 8)),
                  t_w=rng.uniform(0, 3), t_f_comm=rng.uniform(0, 1) * tf,
                  t_b_comm=rng.uniform(0, 1) * tb,
                  t_bw=rng.choice([None, rng.uniform(0.5, 10)]))
            for _ in range(3)
        )  # fmt: skip
        problem = two_stages().replace(stages=stages, pair_overhead=rng.choice([0, 0.15, 0.5]))
        relaxed = pair_relaxed(problem).stages
        for s, s2 in itertools.product(range(3), repeat=2):
            for backward, back in ((B, relaxed[s2].t_b), (BW, relaxed[s2].t_bw)):
                assert pair_time(problem, s, s2, backward) >= relaxed[s].t_f + back - 1e-9


@pytest.mark.parametrize("name", ["even", "uneven", "comm-heavy"])
def test_lower_bound_with_pairs_holds_at_the_brute_force_optimum(name):
    """The relaxation counts the communication a pair cannot hide; the bound still never
    exceeds the best schedule with pairs, found by enumeration."""
    problem = _tiny(name).replace(pairs=True)
    compute_only = problem.replace(stages=tuple(
        dataclasses.replace(st, t_f=st.t_f - st.t_f_comm, t_b=st.t_b - st.t_b_comm,
                            t_f_comm=0.0, t_b_comm=0.0) for st in problem.stages))  # fmt: skip
    bound = lower_bound(problem)
    assert bound <= _brute_force_makespan(problem) + 1e-9
    assert bound >= lower_bound(compute_only) - 1e-9
    if name == "comm-heavy":  # communication no compute can hide: strictly tighter
        assert bound > lower_bound(compute_only) + 0.1


# ---------------------------------------------------------------- the DualPipe table


def _bubble(schedule) -> float:
    """Idle time of the most idle device: makespan minus its compute (a pair at its time)."""
    return max(schedule.metrics.makespan - busy for busy in schedule.metrics.busy)


@pytest.mark.parametrize("pp", [4, 6, 8])
def test_dualpipe_table_1f1b_and_zb1p(pp):
    """deepseek-ai/DualPipe README, "Pipeline Bubbles and Memory Usage Comparison": 1F1B
    ``(PP-1)(F+B)``, ZB1P ``(PP-1)(F+B-2W)``, both PP activations and 1x parameters; F a
    forward chunk, B a full backward chunk (t_b + t_w), W its weight part."""
    t_f, t_b, t_w = 1.0, 1.2, 0.5
    problem = uniform_problem(p=pp, m=2 * pp, t_f=t_f, t_b=t_b, t_w=t_w, cap=100.0)
    full = t_b + t_w
    for name, bubble in (("1f1b", (pp - 1) * (t_f + full)),
                         ("zb-h1", (pp - 1) * (t_f + full - 2 * t_w))):  # fmt: skip
        schedule = baseline(name, problem)
        assert _bubble(schedule) == pytest.approx(bubble), name
        assert max(schedule.metrics.peak_memory) == pytest.approx(pp * 1.0), name
        assert all(len(problem.stages_on(d)) == 1 for d in range(pp))


@pytest.mark.parametrize("pp", [4, 6, 8, 12])
@pytest.mark.parametrize(("f_comm", "b_comm"), [(0.0, 0.0), (0.5, 0.5), (0.2, 0.7), (0.6, 0.1)])
def test_dualpipe_table_dualpipev(pp, f_comm, b_comm):
    """The same table's DualPipeV row, ``PP`` stages on ``PP/2`` devices: bubble
    ``(PP/2-1)(F&B+B-3W)`` with ``F&B`` the overlapped pair's time, ``PP+1`` activations
    (of a stage) per device and 2x parameters (two stages per device).

    Reproduced exactly on uniform costs with ``F = B`` and ``W = 0``. (With ``W > 0`` pp_opt
    sends a stage's gradient after its input backward ``B``, where the README's full
    backward sends it after ``B + W``, so the two bubbles differ by design.)"""
    p = pp // 2
    base = uniform_problem(p=p, m=3 * pp, placement="v", v=2, t_f=2.0, t_b=2.0, t_w=0.0,
                           cap=100.0)  # fmt: skip
    problem = with_comm(base, f_comm, b_comm)
    schedule = baseline("dualpipev-overlap", problem)
    f_and_b = pair_time(problem, 0, 1, B)
    chunk_b = problem.stages[0].t_b
    table = (pp / 2 - 1) * (f_and_b + chunk_b - 3 * 0.0)
    if f_comm or b_comm:
        assert _bubble(schedule) == pytest.approx(table)
    else:  # nothing to hide: the order runs unpaired, its halves free to start apart
        assert _bubble(schedule) <= table + 1e-9
    stage_activation = problem.stages[0].m_b
    assert max(schedule.metrics.peak_memory) == pytest.approx((pp + 1) * stage_activation)
    assert all(len(problem.stages_on(d)) == 2 for d in range(p))  # 2x the stages of 1F1B
    if f_comm or b_comm:
        assert f_and_b < 2 * chunk_b  # the pairs hide communication
        assert schedule.metrics.makespan < baseline("DualPipeV", problem).metrics.makespan


# ---------------------------------------------------------------- pairs as a solver decision


def _brute_force_makespan(problem: Problem) -> float:
    """The best makespan over every per-device order of F and BW ops and every set of
    pairs (any two microbatches), timed by the simulator: tiny fused problems only."""
    import itertools

    from pp_opt.errors import PPOptError
    from pp_opt.order import Order, Variant, compute_streams

    per_device = []
    for d in range(problem.p):
        own = problem.stages_on(d)
        fs = [OpKey(F, s, j) for s in own for j in range(problem.m)]
        bs = [OpKey(BW, s, j) for s in own for j in range(problem.m)]
        candidates = [(f, b) for f in fs for b in bs]
        options = []
        for k in range(min(len(fs), len(bs)) + 1):
            for chosen in itertools.combinations(candidates, k):
                used = [key for pair in chosen for key in pair]
                if len(set(used)) < len(used):
                    continue
                items = [key for key in fs + bs if key not in used] + [f for f, _ in chosen]
                options += [(list(perm), dict(chosen)) for perm in itertools.permutations(items)]
        per_device.append(options)
    best = float("inf")
    for combo in itertools.product(*per_device):
        pairs = {f: b for _, chosen in combo for f, b in chosen.items()}
        order = Order(problem=problem, streams=compute_streams([keys for keys, _ in combo]),
                      variant=Variant(False, False, False), pairs=pairs)  # fmt: skip
        try:
            best = min(best, simulate(order).metrics.makespan)
        except PPOptError:  # a pair that waits for itself, a deadlock
            continue
    return best


TINY = {
    "even": with_comm(
        uniform_problem(p=2, m=2, t_f=2.0, t_b=2.0, t_w=1.0, t_comm=0.1, split_backward=False),
        0.5,
        0.5,
    ),  # fmt: skip
    "uneven": with_comm(
        uniform_problem(p=2, m=2, t_f=1.0, t_b=3.0, t_w=0.0, t_comm=0.3, split_backward=False),
        0.6,
        0.2,
        overhead=0.1,
    ),  # fmt: skip
    "one-device": with_comm(  # three microbatches: pairs of F(j+1) with BW(j), by enumeration
        uniform_problem(p=1, m=3, t_f=1.5, t_b=2.0, t_w=0.0, t_comm=0.1, split_backward=False),
        0.45,
        0.4,
        overhead=0.15,
    ),  # fmt: skip
}


def _tiny(name: str) -> Problem:
    if name == "comm-heavy":  # 80% of F and B is all-to-all: more than any partner computes
        base = uniform_problem(p=2, m=2, t_f=2.0, t_b=2.0, t_w=0.0, t_comm=0.1,
                               split_backward=False)  # fmt: skip
        return with_comm(base, 0.8, 0.8, overhead=0.15)
    return TINY[name]


@pytest.mark.parametrize("name", sorted(TINY))
def test_cpsat_with_pairs_finds_the_brute_force_optimum(name):
    problem = TINY[name].replace(pairs=True)
    result = solve(problem, solver="cpsat", time_limit=20, threads=1, seed=0).schedule
    assert validate(result) == []
    assert result.solver.status == "optimal"
    assert result.metrics.makespan == pytest.approx(_brute_force_makespan(problem))
    without = solve(problem.replace(pairs=False), solver="cpsat", time_limit=20, threads=1)
    assert result.metrics.makespan < without.schedule.metrics.makespan
    assert not any(op.partner for op in without.schedule.ops)


def _pairs_problem(**kw) -> Problem:
    base = uniform_problem(t_f=2.0, t_b=2.0, t_w=1.0, t_comm=0.1, **kw)
    return with_comm(base, 0.5, 0.5).replace(pairs=True)


@pytest.mark.parametrize(
    "kw",
    [dict(p=2, m=4), dict(p=2, m=4, placement="v", v=2), dict(p=3, m=6, v=2)],
    ids=["loop", "v", "interleaved"],
)
def test_cpsat_pairs_on_every_placement_beat_its_warm_start_and_the_baselines(kw):
    problem = _pairs_problem(**kw)
    result = solve(problem, solver="cpsat", time_limit=30, threads=1, seed=0)
    schedule = result.schedule
    assert validate(schedule) == []
    assert any(op.partner for op in schedule.ops)
    assert result.warm_start is not None
    assert schedule.metrics.makespan <= result.warm_start.objective + 1e-9
    assert schedule.solver.lower_bound <= schedule.metrics.makespan + 1e-9
    named = "dualpipev-overlap" if problem.placement == "v" else "interleaved-1f1b-a2a"
    if problem.placement == "v" or problem.v > 1:
        fused = problem if named == "dualpipev-overlap" else problem.replace(split_backward=False)
        assert schedule.metrics.makespan <= baseline(named, fused).metrics.makespan + 1e-9


def test_pairs_off_or_nothing_to_hide_change_nothing():
    problem = _pairs_problem(p=2, m=4)
    off = solve(problem.replace(pairs=False), solver="cpsat", time_limit=20, threads=1, seed=0)
    quiet = with_comm(problem, 0.0, 0.0)  # pairs allowed, nothing to hide
    still = solve(quiet, solver="cpsat", time_limit=20, threads=1, seed=0)
    plain = solve(quiet.replace(pairs=False), solver="cpsat", time_limit=20, threads=1, seed=0)
    assert not any(op.partner for r in (off, still) for op in r.schedule.ops)
    assert still.schedule.metrics.makespan == pytest.approx(plain.schedule.metrics.makespan)
    assert still.schedule.solver.status == plain.schedule.solver.status == "optimal"


@pytest.mark.parametrize("name", ["even", "uneven", "loop"])
def test_cpsat_and_milp_agree_on_optima_with_pairs(name):
    problem = TINY[name] if name in TINY else _pairs_problem(p=2, m=4)
    problem = problem.replace(pairs=True)
    found = {}
    for solver in ("cpsat", "milp"):
        schedule = solve(problem, solver=solver, time_limit=30, threads=1, seed=0).schedule
        assert validate(schedule) == [] and any(op.partner for op in schedule.ops)
        assert schedule.solver.status == "optimal", solver
        found[solver] = schedule.metrics.makespan
    assert found["cpsat"] == pytest.approx(found["milp"])


@pytest.mark.parametrize("solver", ["cpsat", "milp"])
@pytest.mark.parametrize("switch", ["offload", "recompute"])
def test_pairs_with_offload_or_recompute_under_a_tight_cap(switch, solver):
    problem = _pairs_problem(p=2, m=4, cap=1.5).replace(**{switch: True})
    if switch == "offload":
        stages = tuple(
            dataclasses.replace(st, t_offload=0.3, t_reload=0.3) for st in problem.stages
        )
        problem = problem.replace(stages=stages)
    else:
        stages = tuple(dataclasses.replace(st, m_in=0.1) for st in problem.stages)
        problem = problem.replace(stages=stages)
    # CP-SAT proves it in about a second; the MILP proves nothing in 30 s, and its schedule
    # at 5 s already offloads or recomputes (the cap forces it)
    limit = 30 if solver == "cpsat" else 5
    schedule = solve(problem, solver=solver, time_limit=limit, threads=1, seed=0).schedule
    assert validate(schedule) == []
    assert max(schedule.metrics.peak_memory) <= 1.5 + 1e-9
    kinds = {op.kind for op in schedule.ops}
    assert (OpKind.OFFLOAD if switch == "offload" else OpKind.R) in kinds


def test_fused_backward_export_keeps_the_pairs():
    from pp_opt.export.fused import fused_backward_schedule

    schedule = baseline("dualpipev-overlap", dual_pipe_v(t_comm=0.1))
    fused = fused_backward_schedule(schedule)
    pairs = [op for op in fused.schedule.ops if op.partner is not None]
    assert len(pairs) == sum(1 for op in schedule.ops if op.partner is not None)
    assert all(op.partner.kind is BW for op in pairs) and fused.violations == ()


# ---------------------------------------------------------------- DualPipe (dual placement)


@pytest.mark.parametrize("pp", [2, 4, 6, 8])
@pytest.mark.parametrize(("f_comm", "b_comm"), [(0.0, 0.0), (0.5, 0.5), (0.2, 0.7)])
def test_dualpipe_table_dualpipe(pp, f_comm, b_comm):
    """The README table's DualPipe row: ``PP`` stages on ``PP`` devices, bubble
    ``(PP/2-1)(F&B+B-3W)``, ``PP+1`` activations per device, 2x parameters (each device holds
    a stage of both copies; its static memory doubles). Exact on uniform costs with
    ``F = B`` and ``W = 0`` (see test_dualpipe_table_dualpipev)."""
    problem = with_comm(uniform_problem(p=pp, m=3 * pp, t_w=0.0, static=0.5, cap=100.0),
                        f_comm, b_comm)  # fmt: skip
    schedule = baseline("dualpipe", problem)
    dual = schedule.problem
    assert dual.placement == "dual" and dual.num_stages == 2 * pp
    f_and_b = pair_time(dual, 0, 2 * pp - 1, B)
    table = (pp / 2 - 1) * (f_and_b + 1.0 - 3 * 0.0)
    if f_comm or b_comm:
        assert _bubble(schedule) == pytest.approx(table)
    else:  # nothing to hide: unpaired (see test_dualpipe_table_dualpipev)
        assert _bubble(schedule) <= table + 1e-9
    static = 2 * 0.5  # two copies of the parameters
    assert max(schedule.metrics.peak_memory) == pytest.approx((pp + 1) * 1.0 + static)
    assert all(dual.devices[d].static == static for d in range(pp))
    assert all(len(dual.stages_on(d)) == 2 for d in range(pp))
    assert validate(schedule) == []
    paired = sum(1 for op in schedule.ops if op.partner is not None)
    assert paired > 0 if (f_comm or b_comm) and pp > 2 else paired == 0 or pp == 2


def test_dual_placement_routes_half_the_microbatches_through_each_copy():
    from pp_opt.dag import dag_for, op_count

    schedule = baseline("dualpipe", uniform_problem(p=4, m=8, t_comm=0.1))
    problem = schedule.problem
    assert problem.routes() == [(range(0, 4), range(0, 4)), (range(4, 8), range(4, 8))]
    dag = dag_for(problem)
    assert len(dag) == op_count(problem) == 2 * 4 * 4 * 3  # F, B, W of 4 stages, 8 mbs
    assert OpKey(F, 0, 5) not in dag and OpKey(F, 4, 5) in dag and OpKey(F, 3, 1) in dag
    assert OpKey(B, 3, 1) in dag.successors(OpKey(F, 3, 1))  # the first copy's last stage
    assert OpKey(B, 7, 5) in dag.successors(OpKey(F, 7, 5))  # the second copy's
    text = dumps_schedule(schedule)
    assert dumps_schedule(loads_schedule(text)) == text
    for m, match in ((7, "m: got 7; the dual placement feeds half"),):
        with pytest.raises(ProblemError, match=match):
            problem.replace(m=m)
    with pytest.raises(ProblemError, match="placement: the dual placement is DeepSeek"):
        solve(problem, time_limit=5)
    from pp_opt.export.torch_csv import torch_csv_rows

    with pytest.raises(ProblemError, match="schedule: a dual-placement"):
        torch_csv_rows(schedule)
    with pytest.raises(ProblemError, match="DualPipe needs an even number of devices"):
        baseline("dualpipe", uniform_problem(p=3, m=8))


def test_search_windows_keep_pairs_and_stay_valid():
    """The large-neighbourhood search moves a pair as one op (its halves stay paired)."""
    import time

    from pp_opt.solvers.cpsat.scaling import choose_scaling
    from pp_opt.solvers.lns import improve
    from pp_opt.solvers.lns.submodel import solve_window
    from pp_opt.solvers.lns.window import cut_window

    problem = _pairs_problem(p=4, m=12, placement="v", v=2)
    start = baseline("dualpipev-overlap", problem)
    pairs = {(op.key, op.partner) for op in start.ops if op.partner}
    middle = start.metrics.makespan / 3
    window = cut_window(start, middle, 2 * middle)
    assert any(op.partner for op in window.free.values())
    found = solve_window(start, window, choose_scaling(problem, (1.0,)),
                         waits=order_of(start).waits, time_limit=5, threads=1, seed=0)  # fmt: skip
    assert found is not None
    assert {(op.key, op.partner) for op in found.ops if op.partner} == pairs
    better = improve(start, deadline=time.perf_counter() + 5, threads=1, window_ops=60)
    assert validate(better) == [] and better.metrics.makespan <= start.metrics.makespan + 1e-9
    assert {(op.key, op.partner) for op in better.ops if op.partner} == pairs


def test_copies_fit_into_a_paired_schedule():
    from pp_opt.orders.offload.offload_warm import with_offloads

    problem = dual_pipe_v(t_comm=0.1).replace(offload=True)
    stages = tuple(dataclasses.replace(st, t_offload=0.2, t_reload=0.2) for st in problem.stages)
    problem = problem.replace(stages=stages)
    paired = baseline("dualpipev-overlap", problem)
    copied = simulate(with_offloads(problem, paired, 1.0))
    assert validate(copied) == []
    assert any(op.kind is OpKind.OFFLOAD for op in copied.ops)
    assert sum(1 for op in copied.ops if op.partner) == sum(1 for op in paired.ops if op.partner)
    assert copied.metrics.makespan == pytest.approx(paired.metrics.makespan)


def test_dual_placement_from_a_problem_file():
    spec = {"p": 2, "m": 4, "placement": "dual", "stage": {"t_f": 1.0, "t_b": 1.0, "t_w": 0.5}}
    problem = problem_from_spec(spec)
    assert problem.placement == "dual" and [st.device for st in problem.stages] == [0, 1, 1, 0]
    assert problem_from_dict(problem_to_dict(problem)) == problem
    assert validate(baseline("dualpipe", problem)) == []
