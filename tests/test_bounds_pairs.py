"""The makespan bounds that know when an overlapped pair can run (pp_opt/bounds/pairs.py):
closed forms, never above the best schedule with pairs (enumerated) or a named overlapped
baseline, never below the bound without them."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from test_pairs import _brute_force_makespan, two_stages, with_comm

import pp_opt.bounds as bounds
from pp_opt.bounds import lower_bound
from pp_opt.bounds.pairs import device_windows, full_critical_path, variant_relaxed
from pp_opt.errors import PPOptError
from pp_opt.ops import pair_relaxed
from pp_opt.orders import baseline
from pp_opt.problem import Problem, Stage, uniform_problem


def _without_pair_terms(problem: Problem, monkeypatch: pytest.MonkeyPatch) -> float:
    """The bound before these terms: every op at its pair share, nothing else."""
    with monkeypatch.context() as patched:
        patched.setattr(bounds, "PAIR_MAKESPAN_TERMS", ())
        return lower_bound(problem)


def test_one_device_closed_form_is_the_optimum(monkeypatch):
    """One stage, three microbatches, half of every op communication (t_f = t_bw = 2): a
    pair takes 2 (F' = B' = 1). The first F runs before any backward, the last backward
    after the last F: at most two pairs, 2 + 2 + 2 + 2 = 8. Priced all paired it was 6."""
    problem = with_comm(
        uniform_problem(p=1, m=3, t_f=2.0, t_b=2.0, t_w=0.0, split_backward=False), 0.5, 0.5
    ).replace(pairs=True)
    assert _without_pair_terms(problem, monkeypatch) == pytest.approx(6.0)
    assert device_windows(problem) == pytest.approx(8.0)
    assert lower_bound(problem) == pytest.approx(8.0)
    assert _brute_force_makespan(problem) == pytest.approx(8.0)


def test_forward_chain_and_last_backward_chain_run_unpaired():
    """The critical path at full times: the first backward waits for a whole forward chain,
    and the last microbatch's backwards run after every forward."""
    problem = with_comm(uniform_problem(p=4, m=1, t_comm=0.25), 0.5, 0.5)
    assert full_critical_path(problem) == pytest.approx(4 + 4 + 1 + 6 * 0.25)
    assert lower_bound(problem) >= 4 + 4 + 1 + 6 * 0.25 - 1e-9


def test_split_schedules_hide_the_forward_under_b_alone():
    """t_f 4, t_b 6, t_w 2 with 3 and 5 of communication: a split schedule pairs F with B
    (compute 1), a fused one with BW (compute 3)."""
    plain = two_stages()
    stages = tuple(dataclasses.replace(st, t_f_comm=3.0, t_b_comm=5.0) for st in plain.stages)
    problem = plain.replace(stages=stages, pair_overhead=0.1)
    split = variant_relaxed(problem).stages[0]
    fused = variant_relaxed(problem.replace(split_backward=False)).stages[0]
    assert split.t_f == pytest.approx(1 + (3 - 1) + 0.1 * 1)  # shows 2 past B's 1, slows it
    # hidden under BW's 3, slowing it
    assert fused.t_f == pytest.approx(1 + 0.1 * 3) == pair_relaxed(problem).stages[0].t_f
    assert split.t_b == fused.t_b == pair_relaxed(problem).stages[0].t_b
    assert variant_relaxed(plain) is plain


def _random_tiny(rng: random.Random) -> Problem:
    p, m = rng.choice([(2, 2), (1, 3)])
    base = uniform_problem(p=p, m=m, t_f=rng.choice([1.0, 2.0, 3.0]),
                           t_b=rng.choice([1.0, 2.0, 4.0]), t_w=0.0,
                           t_comm=rng.choice([0.0, 0.1, 0.5]), split_backward=False)  # fmt: skip
    problem = with_comm(base, rng.choice([0.2, 0.5, 0.8, 1.0]), rng.choice([0.2, 0.5, 0.8, 1.0]),
                        rng.choice([0.0, 0.15]))  # fmt: skip
    stages = tuple(dataclasses.replace(st, t_f=st.t_f * rng.choice([1.0, 1.5]))
                   for st in problem.stages)  # fmt: skip
    return problem.replace(stages=stages, pairs=True)


@pytest.mark.parametrize("seed", range(4))
def test_never_above_the_enumerated_optimum(seed, monkeypatch):
    rng = random.Random(seed)
    tighter = 0
    for _ in range(8):
        problem = _random_tiny(rng)
        bound, before = lower_bound(problem), _without_pair_terms(problem, monkeypatch)
        assert before - 1e-9 <= bound <= _brute_force_makespan(problem) + 1e-9, problem
        tighter += bound > before + 1e-9
    assert tighter >= 2


def _overlapped(problem: Problem):
    """``(the problem of its variant, schedule)`` of every named overlapped schedule of
    ``problem``, and each one's order re-timed with the backward fused."""
    from pp_opt.export.fused import fused_backward_schedule

    for name in ("dualpipev-overlap", "interleaved-1f1b-a2a", "dualpipe"):
        try:
            schedule = baseline(name, problem)
        except PPOptError:
            continue
        yield schedule.problem, schedule
        if schedule.problem.split_backward and schedule.problem.placement != "dual":
            fused = fused_backward_schedule(schedule)
            assert fused.violations == ()
            yield schedule.problem.replace(split_backward=False), fused.schedule


SWEEP = list(itertools.product(
    (2, 3, 4), (2, 5, 8), ((0.2, 0.9), (0.5, 0.5), (0.9, 0.2)), (0.0, 0.2), (True, False),
    (("loop", 1), ("v", 2), ("loop", 2)),
))  # fmt: skip


@pytest.mark.parametrize("chunk", range(4))
def test_never_above_the_overlapped_baselines(chunk, monkeypatch):
    """A sweep of sizes, communication shares, overheads, both backward variants and three
    placements: every named overlapped schedule (DualPipe on its own dual placement), and
    its order with the backward fused, stays above the bound of its problem and variant,
    which never drops below the bound before."""
    rng = random.Random(chunk)
    ran = 0
    for p, m, (f, b), overhead, split, (placement, v) in SWEEP[chunk::4][::5]:
        t_f, t_b, t_w = rng.choice([(1.0, 2.0, 1.0), (2.0, 2.0, 1.0), (1.5, 2.5, 0.5)])
        base = uniform_problem(p=p, m=m, t_f=t_f, t_b=t_b, t_w=t_w, placement=placement, v=v,
                               t_comm=rng.choice([0.0, 0.05, 0.3]), split_backward=split,
                               cap=1e9)  # fmt: skip
        problem = with_comm(base, f, b, overhead)
        for solved, schedule in _overlapped(problem):
            bound = lower_bound(solved)
            assert bound <= schedule.metrics.makespan + 1e-9, solved
            assert bound >= _without_pair_terms(solved, monkeypatch) - 1e-9
            ran += 1
    assert ran >= 10


def test_uneven_stages_on_a_v_placement(monkeypatch):
    """A cheap dense first stage and a heavier last one share device 0 (DeepSeek-V3's
    layout in miniature): the per-device terms take the least excess over its stages."""
    base = uniform_problem(p=3, m=6, placement="v", v=2, t_f=2.0, t_b=4.0, t_w=1.0, t_comm=0.05)
    stages = list(with_comm(base, 0.7, 0.7, 0.15).stages)
    stages[0] = dataclasses.replace(stages[0], t_f=0.3, t_b=0.6, t_w=0.2, t_f_comm=0.0,
                                    t_b_comm=0.0)  # fmt: skip
    stages[-1] = dataclasses.replace(stages[-1], t_f=1.5, t_f_comm=0.5)
    problem = base.replace(stages=tuple(stages), pair_overhead=0.15)
    checked = 0
    for variant, schedule in _overlapped(problem):
        bound = lower_bound(variant)
        assert _without_pair_terms(variant, monkeypatch) < bound
        assert bound <= schedule.metrics.makespan + 1e-9
        checked += 1
    assert checked >= 2


def test_nothing_to_hide_changes_nothing(monkeypatch):
    problem = uniform_problem(p=4, m=8, placement="v", v=2, t_comm=0.1)
    assert lower_bound(problem) == _without_pair_terms(problem, monkeypatch)


def test_stage_with_all_communication_and_no_partner_is_priced_in_full():
    """Stages whose backward has no compute give a forward nothing to hide under: its
    relaxed time is its full time, and the window terms agree with the classic ones."""
    stages = tuple(Stage(device=d, t_f=1.0, t_b=1.0, t_w=0.0, t_f_comm=0.5, t_b_comm=1.0)
                   for d in (0, 1))  # fmt: skip
    problem = uniform_problem(p=2, m=4, split_backward=False).replace(stages=stages)
    relaxed = variant_relaxed(problem)
    assert relaxed.stages[0].t_f == pytest.approx(1.0)
    assert lower_bound(problem) <= baseline("1f1b", problem).metrics.makespan + 1e-9
