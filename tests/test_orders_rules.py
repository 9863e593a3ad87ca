"""Rule schedules under tight memory (issue 10): V-Half, V-Min, PipeOffload, offload placement.

Every generator's order is timed by the simulator and must pass the independent
validator at the problem's cap; the replayed Zero Bubble anchors must too, and the
generators must not be slower than the anchors on the rows that run in seconds.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from families import tight_instances

from pp_opt.errors import InfeasibleError
from pp_opt.ops import OpKind
from pp_opt.orders.memory.controllable_memory import VBlock, grid_slots, v_half, v_min
from pp_opt.orders.memory.pipeoffload import GroupShape, group_interleaved_order, pipeoffload
from pp_opt.orders.offload.offload_links import OffloadPolicy, place_offloads, with_link_offloads
from pp_opt.orders.registry import get
from pp_opt.problem import Device, Problem, Stage, uniform_problem
from pp_opt.schedule_io import loads_schedule
from pp_opt.simulator import simulate
from pp_opt.validator import validate

ROOT = Path(__file__).resolve().parent.parent
ANCHORS = json.loads((ROOT / "scripts" / "anchors.json").read_text())["rows"]


def _v_problem(p: int, m: int, cap: float) -> Problem:
    return uniform_problem(p=p, m=m, placement="v", v=2, m_w=0.3, t_comm=0.05, t_w=0.6, cap=cap)


def _valid_under_cap(schedule) -> None:  # noqa: ANN001
    assert validate(schedule) == []
    caps = [d.cap for d in schedule.problem.devices]
    assert all(
        peak <= cap + 1e-9 for peak, cap in zip(schedule.metrics.peak_memory, caps, strict=True)
    )


def _offloads(schedule) -> int:  # noqa: ANN001
    return sum(1 for op in schedule.ops if op.kind is OpKind.OFFLOAD)


# --- V-Half and V-Min -------------------------------------------------------------------


@pytest.mark.parametrize("p, m", [(4, 8), (6, 12), (8, 16), (5, 7)])
@pytest.mark.parametrize("family", ["v-half", "v-min"])
def test_v_generators_are_valid_at_their_cap(p: int, m: int, family: str) -> None:
    cap = p / 2 + 1 if family == "v-half" else math.ceil(p / 3) + 1
    generator = v_half if family == "v-half" else v_min
    pieces = generator(_v_problem(p, m, cap), time_limit=0.5)
    schedule = simulate(pieces)
    _valid_under_cap(schedule)
    assert pieces.name == family and pieces.settings["step"] == (2 if family == "v-half" else 1)


def test_v_half_and_v_min_take_half_and_a_third_of_1f1b_memory() -> None:
    """Qi et al.: V-Half about half of 1F1B's activation memory, V-Min about a third."""
    p, m = 12, 24
    loop = uniform_problem(p=p, m=m, m_w=0.3, t_comm=0.05, t_w=0.6, cap=2.0 * p)
    one_f_one_b = simulate(get("1f1b").generator(loop))
    full = max(one_f_one_b.metrics.peak_memory)
    assert full == pytest.approx(p)
    half = simulate(v_half(_v_problem(p, m, full / 2 + 1), time_limit=0.5))
    third = simulate(v_min(_v_problem(p, m, full / 3 + 1), time_limit=0.5))
    _valid_under_cap(half)
    _valid_under_cap(third)
    assert max(half.metrics.peak_memory) <= full / 2 + 1
    assert max(third.metrics.peak_memory) <= full / 3 + 1
    assert max(third.metrics.peak_memory) < max(half.metrics.peak_memory)


def test_v_min_below_its_memory_says_which_cap_fits() -> None:
    with pytest.raises(InfeasibleError) as err:
        v_min(_v_problem(8, 16, 1.0), time_limit=0.1)
    assert err.value.min_cap is not None and err.value.min_cap > 1.0


def test_v_generators_resplit_a_loop_problem() -> None:
    loop = uniform_problem(p=4, m=8, t_comm=0.05, cap=3.0)
    pieces = v_half(loop, time_limit=0.2)
    assert pieces.problem.placement == "v" and pieces.problem.v == 2
    _valid_under_cap(simulate(pieces))


def test_building_blocks_follow_the_paper_offsets() -> None:
    """V-Min on p = 4: F0 at d, F1 at 2p-1-d, B1 at 2p+d, B0 at 4p-1-d (period 6)."""
    block = VBlock(step=1)
    assert block.slots(4) == [(0, 7, 8, 15), (1, 6, 9, 14), (2, 5, 10, 13), (3, 4, 11, 12)]
    assert block.is_valid(4)
    slots = grid_slots(_v_problem(4, 3, 10.0), block)
    assert len(slots) == 4 * 2 * 3 * 3  # F, B and W of both chunks, every microbatch
    assert len(
        {(op.stage % 4 if op.stage < 4 else 7 - op.stage, s) for op, s in slots.items()}
    ) == len(slots)


# --- offload placement under shared host links ----------------------------------------------


def _offload_problem(p: int, m: int, v: int, *, cap: float, copy: float, links) -> Problem:  # noqa: ANN001
    t = 1.0 / v
    stage = dict(
        t_f=t, t_b=t, t_w=t, m_b=1.0 / v, m_w=0.5 / v, t_offload=copy / v, t_reload=copy / v
    )
    return Problem(
        p=p,
        m=m,
        stages=tuple(Stage(device=s % p, **stage) for s in range(p * v)),
        devices=tuple(Device(cap=cap) for _ in range(p)),
        t_comm=0.05,
        host_links=links,
        offload=True,
    )


@pytest.mark.parametrize("links", [((0, 1), (2, 3)), ((0, 1, 2, 3),), ()])
def test_pipeoffload_places_offloads_on_shared_links(links) -> None:  # noqa: ANN001
    problem = _offload_problem(4, 8, 2, cap=1.25, copy=1.5, links=links)
    schedule = simulate(pipeoffload(problem, time_limit=2.0))
    _valid_under_cap(schedule)
    assert _offloads(schedule) > 0


def test_pipeoffload_without_need_for_offload_keeps_compute_only() -> None:
    problem = _offload_problem(4, 8, 2, cap=8.0, copy=1.5, links=((0, 1), (2, 3)))
    pieces = pipeoffload(problem, time_limit=1.0)
    assert pieces.settings["chunks_offloaded"] == 0
    _valid_under_cap(simulate(pieces))


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-v", "interleaved-1f1b"])
@pytest.mark.parametrize("links", [((0, 1), (2, 3)), ()])
def test_offload_pass_brings_classic_orders_under_the_cap(name: str, links) -> None:  # noqa: ANN001
    roomy = uniform_problem(p=4, m=8, m_w=0.2, t_comm=0.05, cap=100.0)
    order = get(name).generator(roomy)
    scheduled = order.problem
    free_run = simulate(order)
    peak = max(free_run.metrics.peak_memory)
    problem = scheduled.replace(
        devices=tuple(Device(cap=0.75 * peak) for _ in range(4)),
        host_links=links,
        offload=True,
        stages=tuple(replace(st, t_offload=0.5, t_reload=0.5) for st in scheduled.stages),
    )
    placed = with_link_offloads(problem, free_run, (0.5, 1.0))
    assert placed is not None
    _valid_under_cap(placed)
    assert _offloads(placed) > 0


def test_fractional_offload_moves_only_what_the_cap_needs() -> None:
    problem = _offload_problem(4, 8, 1, cap=3.5, copy=0.5, links=((0, 1), (2, 3)))
    streams = get("zb-h1").generator(problem).streams
    per_device = [streams[key] for key in sorted(streams)]
    placed = place_offloads(problem, per_device, policy=OffloadPolicy(fraction="need"))
    assert placed is not None
    pieces, schedule = placed
    _valid_under_cap(schedule)
    assert pieces.fractions and all(0 < f < 1 for f in pieces.fractions.values())


def test_short_windows_get_the_fraction_that_fits() -> None:
    """Copies far slower than compute: whole copies do not fit between F and B."""
    problem = _offload_problem(4, 8, 1, cap=3.5, copy=5.0, links=())
    streams = get("zb-h1").generator(problem).streams
    per_device = [streams[key] for key in sorted(streams)]
    placed = place_offloads(problem, per_device, policy=OffloadPolicy(lead=0.0))
    assert placed is not None
    pieces, schedule = placed
    _valid_under_cap(schedule)
    assert any(f < 1.0 for f in pieces.fractions.values())


def test_group_interleaved_order_is_interleaved_1f1b_for_full_groups() -> None:
    problem = _offload_problem(4, 8, 2, cap=8.0, copy=1.0, links=())
    order = group_interleaved_order(problem, GroupShape(group=4))
    first = [str(k) for k in order[0][:9]]
    assert first[:4] == [f"F(stage=0, mb={j})" for j in range(4)]
    assert first[4:8] == [f"F(stage=4, mb={j})" for j in range(4)]
    assert all(sum(1 for k in ops if k.kind is OpKind.W) == 2 * 8 for ops in order)


# --- the Zero Bubble anchors ------------------------------------------------------------------


def _anchor(name: str) -> dict:
    return next(row for row in ANCHORS if row["name"] == name)


@pytest.mark.parametrize("row", ANCHORS, ids=[row["name"] for row in ANCHORS])
def test_replayed_anchor_is_valid_with_its_recorded_makespan(row: dict) -> None:
    schedule = loads_schedule(gzip.decompress((ROOT / row["schedule"]).read_bytes()).decode())
    assert validate(schedule) == []
    assert schedule.metrics.makespan == pytest.approx(row["replay_makespan"], abs=1e-6)
    assert max(schedule.metrics.peak_memory) <= row["cap"] + 1e-9
    assert _offloads(schedule) == row["offloads"]
    instance = getattr(tight_instances(), row["instance"].split(":")[1])()
    assert (
        schedule.problem.stages == instance.stages and schedule.problem.devices == instance.devices
    )
    if row["offloads"] == 0:
        assert row["replay_makespan"] == pytest.approx(row["anchor_makespan"], abs=1e-6)


@pytest.mark.parametrize("name", ["1.5b-v-half", "1.5b-v-min"])
def test_v_generators_match_or_beat_the_1p5b_anchors(name: str) -> None:
    problem = tight_instances().INSTANCES[name]()
    generator = v_half if name.endswith("half") else v_min
    schedule = simulate(generator(problem, time_limit=3.0))
    _valid_under_cap(schedule)
    assert schedule.metrics.makespan <= _anchor(name)["anchor_makespan"] + 1e-6


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["pipeoffload-k0.5-cap2", "pipeoffload-k0.5-cap3.75", "pipeoffload-k1-cap4"]
)
def test_pipeoffload_matches_or_beats_its_anchors(name: str) -> None:
    problem = tight_instances().INSTANCES[name]()
    schedule = simulate(pipeoffload(problem, time_limit=5.0))
    _valid_under_cap(schedule)
    assert schedule.metrics.makespan <= _anchor(name)["anchor_makespan"] + 1e-6
