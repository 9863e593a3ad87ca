"""Schedule JSON: docs/design.md §5 shape, byte-identical round trips, clear errors."""

from __future__ import annotations

import json

import pytest
from order_helpers import timed

from pp_opt.errors import ProblemError
from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.problem import uniform_problem
from pp_opt.schedule_io import dumps_schedule, loads_schedule, schedule_to_dict


def _schedule():
    problem = uniform_problem(p=2, m=2, t_comm=0.1, offload=True, split_backward=False)
    order = {
        (d, Stream.COMPUTE): [OpKey(OpKind.F, d, 0), OpKey(OpKind.F, d, 1),
                              OpKey(OpKind.BW, d, 0), OpKey(OpKind.BW, d, 1)]
        for d in range(2)
    }  # fmt: skip
    order[(0, Stream.D2H)] = [OpKey(OpKind.OFFLOAD, 0, 0)]
    order[(0, Stream.H2D)] = [OpKey(OpKind.RELOAD, 0, 0)]
    return timed(problem, order, fractions={OpKey(OpKind.OFFLOAD, 0, 0): 0.5,
                                               OpKey(OpKind.RELOAD, 0, 0): 0.5})  # fmt: skip


def test_shape_follows_design() -> None:
    data = schedule_to_dict(_schedule())
    assert data["format"] == "pp-opt.schedule" and data["version"] == 1
    assert {"p", "m", "placement", "v", "objective", "stages", "t_comm", "devices"} <= set(
        data["problem"]
    )
    assert {"makespan", "span", "bubble_rate", "idle_fraction", "peak_memory"} <= set(
        data["metrics"]
    )
    ops = data["devices"][0]["ops"]
    assert ops[0] == {"op": "F", "stage": 0, "microbatch": 0, "stream": "compute",
                      "start": 0.0, "end": 1.0}  # fmt: skip
    offload = next(op for op in ops if op["op"] == "OFFLOAD")
    assert offload["stream"] == "d2h" and offload["fraction"] == 0.5


def test_round_trip_is_byte_identical() -> None:
    text = dumps_schedule(_schedule())
    assert dumps_schedule(loads_schedule(text)) == text


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.update(version=99), "version"),
        (lambda d: d.pop("metrics"), "metrics"),
        (lambda d: d["devices"][0]["ops"][0].update(op="JUMP"), "devices[0].ops[0].op"),
        (lambda d: d["problem"]["stages"][0].update(t_f=-1), "problem.stages[0].t_f"),
        (lambda d: d["devices"][1]["ops"][0].update(stage=0), "devices[1].ops[0].stage"),
    ],
)
def test_malformed_files(mutate, field: str) -> None:
    data = schedule_to_dict(_schedule())
    mutate(data)
    with pytest.raises(ProblemError) as err:
        loads_schedule(json.dumps(data))
    assert err.value.field == field
