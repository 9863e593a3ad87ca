"""Chrome trace export: every op once, on its device's process and stream's thread, timed right."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from pp_opt.errors import ProblemError
from pp_opt.export import trace_events, write_trace
from pp_opt.ops import duration
from pp_opt.schedule import Schedule


def _ops(events: list[dict]) -> list[dict]:
    return [e for e in events if e["ph"] == "X"]


def _names(events: list[dict], kind: str) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == kind}


@pytest.mark.parametrize("which", ["loop_schedule", "v_schedule", "offload_schedule"])
def test_every_op_once_on_its_thread(which: str, request: pytest.FixtureRequest) -> None:
    schedule: Schedule = request.getfixturevalue(which)
    events = trace_events(schedule)["traceEvents"]
    threads = _names(events, "thread_name")
    seen = Counter(
        (
            e["pid"] - 1,
            threads[(e["pid"], e["tid"])],
            e["args"]["op"],
            e["args"]["stage"],
            e["args"]["microbatch"],
        )  # fmt: skip
        for e in _ops(events)
    )
    expected = Counter(
        (
            schedule.problem.device_of(op.stage),
            op.stream.value,
            op.kind.value,
            op.stage,
            op.microbatch,
        )  # fmt: skip
        for op in schedule.ops
    )
    assert seen == expected
    assert max(seen.values()) == 1


@pytest.mark.parametrize("which", ["loop_schedule", "offload_schedule"])
def test_times_in_microseconds(which: str, request: pytest.FixtureRequest) -> None:
    schedule: Schedule = request.getfixturevalue(which)
    problem = schedule.problem
    ops = {(o.kind.value, o.stage, o.microbatch): o for o in schedule.ops}
    for event in _ops(trace_events(schedule)["traceEvents"]):
        args = event["args"]
        op = ops[(args["op"], args["stage"], args["microbatch"])]
        cost = duration(problem, op.kind, op.stage, args["fraction"])
        assert event["dur"] == pytest.approx(1000.0 * cost)
        assert event["ts"] == pytest.approx(1000.0 * op.start)
        assert args["fraction"] == op.fraction
    scaled = _ops(trace_events(schedule, time_unit_us=1.0)["traceEvents"])
    assert max(e["ts"] + e["dur"] for e in scaled) == pytest.approx(schedule.metrics.makespan)


def test_processes_and_threads_named(offload_schedule: Schedule, loop_schedule: Schedule) -> None:
    events = trace_events(offload_schedule)["traceEvents"]
    p = offload_schedule.problem.p
    assert _names(events, "process_name") == {(d + 1, 1): f"device {d}" for d in range(p)}
    assert set(_names(events, "thread_name").values()) == {"compute", "d2h", "h2d"}
    assert len(_names(events, "thread_name")) == 3 * p
    assert all(e["pid"] > 0 and e["tid"] > 0 for e in events)  # Perfetto treats 0 as special
    plain = trace_events(loop_schedule)["traceEvents"]
    assert set(_names(plain, "thread_name").values()) == {"compute"}


def test_offload_fraction_in_args(offload_schedule: Schedule) -> None:
    copies = [e for e in _ops(trace_events(offload_schedule)["traceEvents"]) if e["cat"] != "F"]
    halves = {
        (e["args"]["stage"], e["args"]["microbatch"])
        for e in copies
        if e["cat"] in ("OFFLOAD", "RELOAD") and e["args"]["fraction"] == 0.5
    }
    assert halves == {(s, j) for s in range(4) for j in (1, 3, 5)}
    reload_half = next(e for e in copies if e["cat"] == "RELOAD" and e["args"]["fraction"] == 0.5)
    assert reload_half["dur"] == pytest.approx(0.5 * 1.5 * 1000.0)


def test_memory_counters_follow_the_metrics(offload_schedule: Schedule) -> None:
    events = trace_events(offload_schedule)["traceEvents"]
    for device in range(offload_schedule.problem.p):
        counters = [e for e in events if e["ph"] == "C" and e["pid"] == device + 1]
        levels = [e["args"]["m_b"] for e in counters]
        assert max(levels) == pytest.approx(offload_schedule.metrics.peak_memory[device])
        assert levels[-1] == pytest.approx(0.0)  # everything freed at the end
        times = [e["ts"] for e in counters]
        assert times == sorted(times) and len(set(times)) == len(times)


def test_write_trace_is_json(tmp_path: Path, v_schedule: Schedule) -> None:
    path = tmp_path / "trace.json"
    write_trace(v_schedule, path)
    data = json.loads(path.read_text())
    assert data["displayTimeUnit"] == "ms"
    assert data["otherData"]["makespan"] == v_schedule.metrics.makespan
    assert len(_ops(data["traceEvents"])) == len(v_schedule.ops)
    assert {e["ph"] for e in data["traceEvents"]} == {"M", "X", "C"}


def test_bad_time_unit(loop_schedule: Schedule) -> None:
    with pytest.raises(ProblemError, match="time_unit_us"):
        trace_events(loop_schedule, time_unit_us=0.0)


def test_time_unit_named(loop_schedule: Schedule) -> None:
    assert trace_events(loop_schedule)["otherData"]["time_unit"] == "arbitrary"
    profiled = replace(
        loop_schedule,
        problem=loop_schedule.problem.replace(extra={"profile": {"time_unit": "ms"}}),
    )
    assert trace_events(profiled)["otherData"]["time_unit"] == "ms"
