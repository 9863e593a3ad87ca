"""PyTorch's schedules under PyTorch's names: our per-device compute order is PyTorch's own
(its ``pipeline_order``, built with stand-in stage objects), every one validates, and the
problems PyTorch rejects raise a ProblemError naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pp_opt import ProblemError, baseline, uniform_problem
from pp_opt.ops import Stream
from pp_opt.orders import PYTORCH_SCHEDULES, REGISTRY, baseline_names
from pp_opt.problem import Problem

CASES = [(2, 4, 2), (4, 8, 2), (4, 12, 3), (3, 9, 1), (4, 4, 2), (5, 10, 2), (4, 9, 2), (4, 6, 2)]
"""(p, m, v) the orders are compared on (v is ignored by the one-chunk schedules)."""

V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
SINGLE = ("GPipe", "1F1B")


def _problem(name: str, p: int, m: int, v: int) -> Problem:
    costs = dict(t_w=0.5, m_w=0.4, t_comm=0.1, cap=float(m))  # GPipe's m activations fit
    if name in V_SCHEDULES:
        return uniform_problem(p=p, m=m, placement="v", v=2, **costs)
    return uniform_problem(p=p, m=m, v=1 if name in SINGLE else v, **costs)


def test_the_names_are_pytorchs() -> None:
    assert PYTORCH_SCHEDULES == ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS",
                                 "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")  # fmt: skip
    assert set(PYTORCH_SCHEDULES) <= set(REGISTRY)
    # Run by name only: `compare` and the warm starts keep their own (lowercase) list.
    assert not set(PYTORCH_SCHEDULES) & set(baseline_names())


@pytest.mark.parametrize("name", PYTORCH_SCHEDULES)
def test_every_schedule_validates_in_either_argument_order(name: str) -> None:
    problem = _problem(name, 4, 8, 2)
    schedule = baseline(name, problem)
    assert schedule.solver.name == name
    assert schedule.problem.v == (1 if name in SINGLE else 2)
    assert baseline(name, problem).metrics.makespan == schedule.metrics.makespan


def test_interleaved_1f1b_equals_megatrons_order_where_both_apply() -> None:
    problem = uniform_problem(p=4, m=8, v=2)
    ours = REGISTRY["interleaved-1f1b"].generator(problem).streams
    assert REGISTRY["Interleaved1F1B"].generator(problem).streams == ours


@pytest.mark.parametrize(
    ("name", "p", "m", "v", "field"),
    [
        ("Interleaved1F1B", 4, 9, 2, "m"),  # 2 rounds do not divide 9
        ("InterleavedZeroBubble", 4, 11, 2, "m"),
        ("1F1B", 4, 3, 1, "m"),
        ("DualPipeV", 4, 7, 2, "m"),
    ],
)
def test_problems_pytorch_rejects_name_the_field(
    name: str, p: int, m: int, v: int, field: str
) -> None:
    problem = _problem(name, p, m, v)
    with pytest.raises(ProblemError) as err:
        baseline(name, problem)
    assert err.value.field == field
    assert "use m = " in str(err.value) or "set m >=" in str(err.value)


def test_rounds_need_not_be_multiples_of_p() -> None:
    # PyTorch's flexible rounds: m = 10 on p = 4 is 2 rounds of 5.
    for name in ("Interleaved1F1B", "InterleavedZeroBubble"):
        assert baseline(name, uniform_problem(p=4, m=10, v=2)).problem.m == 10


def test_zero_bubble_orders_need_the_split_backward() -> None:
    problem = uniform_problem(p=4, m=8, v=2, split_backward=False)
    for name in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
        with pytest.raises(ProblemError, match="split_backward"):
            baseline(name, problem)


# ---------------------------------------------------------------- against PyTorch itself


class _Stage:
    """What the schedules read of a stage; records the compute a one-stage schedule runs."""

    def __init__(self, index: int, rank: int, p: int, n: int) -> None:
        self.stage_index, self.group_rank, self.group_size, self.num_stages = index, rank, p, n
        self.is_first, self.is_last = index == 0, index == n - 1
        self.log: list[tuple[str, int, int]] = []

    def forward_one_chunk(self, j: int, *args: object, **kwargs: object) -> None:
        self.log.append(("F", self.stage_index, j))

    def backward_one_chunk(self, j: int, **kwargs: object) -> None:
        self.log.append(("BW", self.stage_index, j))

    def __getattr__(self, name: str) -> Any:  # p2p ops (none: one process), reduce_grad
        return lambda *args, **kwargs: [] if name.endswith("_ops") else None


def _torch_single(name: str, p: int, m: int) -> list[list[tuple[str, int, int]]]:
    """What ScheduleGPipe and Schedule1F1B run on each rank (``_step_microbatches``; their
    ``pipeline_order`` is only a picture, and 1F1B's numbers the last rank's forwards
    from 1)."""
    from torch.distributed.pipelining import schedules as S

    orders = []
    for rank in range(p):
        stage = _Stage(rank, rank, p, p)
        schedule = S.get_schedule_class(name)(stage, m)
        schedule._initialize_stage = lambda *args, **kwargs: None
        schedule._step_microbatches([()] * m, [{}] * m)
        orders.append(stage.log)
    return orders


def _torch_order(name: str, p: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    """PyTorch's per-rank compute actions as (kind, stage, microbatch), overlapped pairs
    and full backwards as pp_opt runs them (F then B; a split-schedule full backward is
    B, W)."""
    from torch.distributed.pipelining import schedules as S

    if name in SINGLE:
        return _torch_single(name, p, m)
    n = 2 * p if name in V_SCHEDULES else p * v
    local = [0, n - 1] if name in V_SCHEDULES else [c * p for c in range(v)]
    schedule = S.get_schedule_class(name)([_Stage(i, 0, p, n) for i in local], m)
    kinds = {S.FORWARD: ["F"], S.BACKWARD_INPUT: ["B"], S.BACKWARD_WEIGHT: ["W"]}
    full = ["BW"] if name in ("Interleaved1F1B", "LoopedBFS") else ["B", "W"]
    orders = []
    for rank in range(p):
        actions = []
        for action in schedule.pipeline_order[rank]:
            if action is None:
                continue
            for a in action.sub_actions or (action,):
                names = full if a.computation_type == S.FULL_BACKWARD else kinds[a.computation_type]
                actions += [(k, a.stage_index, a.microbatch_index) for k in names]
        orders.append(actions)
    return orders


def _our_order(name: str, p: int, m: int, v: int) -> list[list[tuple[str, int, int]]]:
    order = REGISTRY[name].generator(_problem(name, p, m, v))
    return [
        [(k.kind.value, k.stage, k.microbatch) for k in order.streams[(d, Stream.COMPUTE)]]
        for d in range(p)
    ]


@pytest.mark.torch
@pytest.mark.parametrize("name", PYTORCH_SCHEDULES)
@pytest.mark.parametrize(("p", "m", "v"), CASES)
def test_the_compute_order_is_pytorchs(name: str, p: int, m: int, v: int) -> None:
    pytest.importorskip("torch")
    try:
        expected = _torch_order(name, p, m, v)
    except ValueError:  # PyTorch rejects (p, m, v): so must we
        with pytest.raises(ProblemError):
            _our_order(name, p, m, v)
        return
    assert _our_order(name, p, m, v) == expected
    baseline(name, _problem(name, p, m, v))  # and it runs: timed and validated


def test_the_command_line_runs_them_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli_helpers import run

    problem = tmp_path / "p.toml"
    problem.write_text('p = 4\nm = 6\nt_comm = 0.1\n[stage]\nt_f = 1.0\nt_b = 1.0\nt_w = 0.5\n'
                       'm_b = 1.0\nm_w = 0.4\n[device]\ncap = 16.0\n')  # fmt: skip
    code, out, _ = run(["baseline", "ZBVZeroBubble", str(problem), "-o", str(tmp_path / "s.json")],
                       capsys)  # fmt: skip
    assert code == 0 and "ZBVZeroBubble" in out
    assert run(["validate", str(tmp_path / "s.json")], capsys)[0] == 0
    code, out, err = run(["baseline", "DualPipeV", str(problem)], capsys)
    assert code == 1 and "Traceback" not in err
    assert err.strip().count("\n") == 0 and "m" in err and "set m >= 8" in err
