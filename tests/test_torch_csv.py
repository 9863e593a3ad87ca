"""PyTorch pipelining CSV export: rows, comms placement, offload refusal, and the
round trip through PyTorch's own ``_load_csv`` (no processes needed)."""

from __future__ import annotations

import csv
import dataclasses
import logging
from collections import defaultdict
from types import SimpleNamespace

import pytest
from torch_pipeline_helpers import make_schedule, uneven_problem

from pp_opt.errors import PPOptError, ProblemError
from pp_opt.export.torch_csv import TORCH_TYPE, torch_actions, torch_csv_rows, write_torch_csv
from pp_opt.ops import OpKind, Stream
from pp_opt.problem import Problem, uniform_problem
from pp_opt.schedule import Schedule

TESTED_TORCH = ("2.13.",)
"""PyTorch versions whose underscore pipelining APIs these tests pin (docs/design.md §6)."""


def offload_problem(**kw) -> Problem:
    problem = uniform_problem(offload=True, **kw)
    stages = tuple(dataclasses.replace(st, t_offload=0.5, t_reload=0.5) for st in problem.stages)
    return problem.replace(stages=stages)


SCHEDULES = {
    "1f1b": lambda: make_schedule(uniform_problem(p=4, m=6, t_comm=0.2), split=False, inflight=4),
    "zb-loop2": lambda: make_schedule(
        uniform_problem(p=4, m=6, t_comm=0.2, v=2), split=True, defer_w=True
    ),
    "zb-v": lambda: make_schedule(
        uniform_problem(p=4, m=6, t_comm=0.2, placement="v", v=2), split=True, defer_w=True
    ),
    "explicit-uneven": lambda: make_schedule(uneven_problem(), split=True, defer_w=True),
    "fused-v-nocomm": lambda: make_schedule(
        uniform_problem(p=2, m=3, placement="v", v=2), split=False
    ),
}


def compute_cells(schedule: Schedule) -> list[list[str]]:
    """The expected compute_only rows, straight from the schedule's compute streams."""
    return [
        [
            f"{op.stage}{TORCH_TYPE[op.kind]}{op.microbatch}"
            for op in schedule.stream_order(d, Stream.COMPUTE)
        ]
        for d in range(schedule.problem.p)
    ]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_compute_only_rows_follow_the_compute_streams(name):
    schedule = SCHEDULES[name]()
    rows = torch_csv_rows(schedule)
    assert rows == compute_cells(schedule)
    assert sum(len(r) for r in rows) == len(schedule.ops)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_compute_comms_rows_are_consistent(name):
    schedule = SCHEDULES[name]()
    problem = schedule.problem
    rows = torch_csv_rows(schedule, format="compute_comms")
    compute = [[c for c in row if _kind(c) in ("F", "I", "W", "B")] for row in rows]
    assert compute == compute_cells(schedule)
    sends: dict[tuple[int, int], list[tuple[str, int, int]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[str, int, int]]] = defaultdict(list)
    for rank, row in enumerate(rows):
        seen: set[str] = set()
        for cell in row:
            kind, stage, mb = _kind(cell), _stage(cell), _mb(cell)
            if kind in ("SEND_F", "SEND_B"):
                # a send follows the op that produced it
                assert seen & _producers(kind, stage, mb)
                peer = stage + 1 if kind == "SEND_F" else stage - 1
                sends[(rank, problem.device_of(peer))].append((kind[-1], peer, mb))
            elif kind in ("RECV_F", "RECV_B"):
                # a receive comes before the op that consumes it
                assert not seen & _producers(kind, stage, mb)
                src = stage - 1 if kind == "RECV_F" else stage + 1
                recvs[(problem.device_of(src), rank)].append((kind[-1], stage, mb))
            elif kind == "REDUCE_GRAD":
                done = [c for c in seen if _stage(c) == stage and _kind(c) in ("W", "B")]
                assert len(done) == problem.m
            seen.add(cell)
        assert sum(1 for c in row if _kind(c) == "REDUCE_GRAD") == len(problem.stages_on(rank))
    # point-to-point messages match in order: each pair's receives follow its sends
    assert sends == recvs
    cross = sum(1 for s in range(problem.num_stages - 1)
                if problem.device_of(s) != problem.device_of(s + 1))  # fmt: skip
    assert sum(len(v) for v in sends.values()) == 2 * cross * problem.m


def test_write_torch_csv_writes_the_rows(tmp_path):
    schedule = SCHEDULES["zb-loop2"]()
    path = tmp_path / "order.csv"
    write_torch_csv(schedule, path, format="compute_comms")
    with open(path, newline="") as f:
        assert list(csv.reader(f)) == torch_csv_rows(schedule, format="compute_comms")
    assert path.read_text().splitlines()[0].startswith("0F0,")


def test_offload_schedule_is_refused_plainly(caplog):
    schedule = make_schedule(offload_problem(p=2, m=4), split=True, offload=[(0, 0), (1, 1)])
    with pytest.raises(PPOptError, match=r"pp_opt\.runtime"):
        torch_csv_rows(schedule)
    with caplog.at_level(logging.WARNING, logger="pp_opt.export.torch_csv"):
        rows = torch_csv_rows(schedule, drop_offload=True)
    assert "cannot run" in caplog.text
    assert rows == compute_cells(schedule)
    # the runtime's view keeps them: each OFFLOAD after its F, each RELOAD before its B
    for row in torch_actions(schedule, with_offload=True).values():
        cells = [str(a) for a in row]
        for a in row:
            if a.kind == "OFFLOAD":
                assert cells.index(f"{a.stage}F{a.microbatch}") < cells.index(str(a))
            if a.kind == "RELOAD":
                assert cells.index(f"{a.stage}OFFLOAD{a.microbatch}") < cells.index(str(a))
                assert cells.index(str(a)) < cells.index(f"{a.stage}I{a.microbatch}")
        assert sum(a.kind == "RELOAD" for a in row) == sum(a.kind == "OFFLOAD" for a in row)


def test_unknown_format_names_the_field():
    with pytest.raises(ProblemError, match="format"):
        torch_csv_rows(SCHEDULES["1f1b"](), format="csv")


# ------------------------------------------------------------ through PyTorch


@pytest.fixture
def torch_schedules():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    if not torch.__version__.startswith(TESTED_TORCH):
        pytest.skip(f"underscore pipelining APIs are pinned to torch {TESTED_TORCH}")
    from torch.distributed.pipelining import schedules

    return schedules


def _runtime(schedules, problem: Problem):
    """A ``_PipelineScheduleRuntime`` of rank 0 without a process group (stub stage)."""
    stage = SimpleNamespace(num_stages=problem.num_stages, group_size=problem.p, group_rank=0)
    return schedules._PipelineScheduleRuntime([stage], n_microbatches=problem.m)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("fmt", ["compute_only", "compute_comms"])
def test_round_trip_through_pytorch_load_csv(torch_schedules, tmp_path, name, fmt):
    schedule = SCHEDULES[name]()
    problem = schedule.problem
    path = tmp_path / "order.csv"
    write_torch_csv(schedule, path, format=fmt)
    runtime = _runtime(torch_schedules, problem)
    runtime._load_csv(str(path), format=fmt)
    lowered = runtime.pipeline_order_with_comms
    if fmt == "compute_only":
        order = {r: [str(a) for a in runtime.pipeline_order[r]] for r in runtime.pipeline_order}
    else:
        order = {r: [str(a) for a in row if a.is_compute_op] for r, row in lowered.items()}
    assert [order[r] for r in range(problem.p)] == compute_cells(schedule)
    # PyTorch inferred our placement from the rows
    assert runtime.stage_index_to_group_rank == {
        s: problem.device_of(s) for s in range(problem.num_stages)
    }
    # and its own dry run of the sends and receives finishes (no deadlock); that
    # dry run knows no REDUCE_GRAD/UNSHARD/RESHARD, which its own lowering adds
    skip = (torch_schedules.REDUCE_GRAD, torch_schedules.UNSHARD, torch_schedules.RESHARD)
    comms = {r: [a for a in row if a.computation_type not in skip] for r, row in lowered.items()}
    torch_schedules._simulate_comms_compute(
        comms, lambda s: runtime.stage_index_to_group_rank[s], problem.num_stages
    )


def _kind(cell: str) -> str:
    return cell.lstrip("0123456789").rstrip("0123456789")


def _stage(cell: str) -> int:
    return int(cell[: len(cell) - len(cell.lstrip("0123456789"))])


def _mb(cell: str) -> int:
    tail = cell[len(cell.rstrip("0123456789")) :]
    return int(tail) if tail else -1


def _producers(kind: str, stage: int, mb: int) -> set[str]:
    """Cells of the op a send follows, or a receive precedes."""
    if kind.endswith("_F"):
        return {f"{stage}F{mb}"}
    return {f"{stage}I{mb}", f"{stage}B{mb}"}


def test_recompute_schedule_is_refused():
    from order_helpers import timed

    from pp_opt.ops import OpKey, OpKind

    problem = uniform_problem(p=1, m=2, recompute=True)
    keys = [(OpKind.F, 0), (OpKind.F, 1), (OpKind.R, 0), (OpKind.B, 0), (OpKind.W, 0),
            (OpKind.R, 1), (OpKind.B, 1), (OpKind.W, 1)]  # fmt: skip
    order = {(0, Stream.COMPUTE): [OpKey(kind, 0, mb) for kind, mb in keys]}
    schedule = timed(problem, order)
    with pytest.raises(PPOptError, match="recompute"):
        torch_csv_rows(schedule)


# ---------------------------------------------------------------- overlapped pairs


def _paired(name: str) -> Schedule:
    from pp_opt.orders import baseline

    if name == "dualpipev-overlap":
        problem = uniform_problem(p=2, m=4, placement="v", v=2, t_comm=0.1)
    else:
        problem = uniform_problem(p=2, m=4, v=2, t_comm=0.1, split_backward=False)
    stages = tuple(dataclasses.replace(st, t_f_comm=0.2 * st.t_f, t_b_comm=0.3 * st.t_b)
                   for st in problem.stages)  # fmt: skip
    return baseline(name, problem.replace(stages=stages))


PAIRED = ("dualpipev-overlap", "interleaved-1f1b-a2a")


@pytest.mark.parametrize("name", PAIRED)
def test_pairs_are_written_as_overlap_f_b_cells(name):
    schedule = _paired(name)
    rows = torch_csv_rows(schedule)
    letter = {OpKind.B: "I", OpKind.BW: "B"}
    expected = []
    for d in range(schedule.problem.p):
        row = []
        for op in schedule.stream_order(d, Stream.COMPUTE):
            if op.partner is None:
                row.append(f"{op.stage}{TORCH_TYPE[op.kind]}{op.microbatch}")
            else:
                back = op.partner
                row.append(f"({op.stage}F{op.microbatch};{back.stage}{letter[back.kind]}"
                           f"{back.microbatch})OVERLAP_F_B")  # fmt: skip
        expected.append(row)
    assert rows == expected
    assert any("OVERLAP_F_B" in cell for row in rows for cell in row)


@pytest.mark.parametrize("name", PAIRED)
@pytest.mark.parametrize("fmt", ["compute_only", "compute_comms"])
def test_pairs_round_trip_through_pytorch_load_csv(torch_schedules, tmp_path, name, fmt):
    schedule = _paired(name)
    problem = schedule.problem
    path = tmp_path / "order.csv"
    write_torch_csv(schedule, path, format=fmt)
    runtime = _runtime(torch_schedules, problem)
    runtime._load_csv(str(path), format=fmt)
    overlap = torch_schedules._ComputationType.OVERLAP_F_B
    if fmt == "compute_only":
        order = runtime.pipeline_order
    else:
        order = {r: [a for a in row if a.is_compute_op]
                 for r, row in runtime.pipeline_order_with_comms.items()}  # fmt: skip
    parsed = [[str(a) for a in order[r]] for r in range(problem.p)]
    assert parsed == torch_csv_rows(schedule, format="compute_only")
    pairs = [a for row in order.values() for a in row if a.computation_type == overlap]
    assert len(pairs) == sum(1 for op in schedule.ops if op.partner is not None)
    assert all(len(a.sub_actions) == 2 for a in pairs)
    skip = (torch_schedules.REDUCE_GRAD, torch_schedules.UNSHARD, torch_schedules.RESHARD)
    # torch's dry run knows no OVERLAP_F_B: its halves, in the sequence the runtime runs them
    comms = {r: [h for a in row if a.computation_type not in skip for h in a.sub_actions or (a,)]
             for r, row in runtime.pipeline_order_with_comms.items()}  # fmt: skip
    torch_schedules._simulate_comms_compute(
        comms, lambda s: runtime.stage_index_to_group_rank[s], problem.num_stages
    )
