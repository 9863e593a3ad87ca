"""Chrome trace-event JSON of a schedule, for Perfetto and chrome://tracing.

Time mapping: the trace format counts in microseconds, and one problem time
unit is written as one millisecond (``time_unit_us=1000``). Profiled problems
are in milliseconds, so their traces show true times; hand-written problems
use arbitrary units, which then show as "ms" in the viewer.

Layout: one process per device (``"device d"``, pid ``d + 1``), one thread per stream
(``compute``, ``d2h``, ``h2d``), one complete event (``"ph": "X"``) per op with
its stage, microbatch and fraction in ``args``, and a ``memory`` counter
(``"ph": "C"``) per device that follows :func:`pp_opt.metrics.memory_profile`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.metrics import memory_profile
from pp_opt.ops import STREAM_ORDER, Stream
from pp_opt.problem import Problem
from pp_opt.schedule import Schedule, ScheduledOp

TIME_UNIT_US = 1000.0
"""Microseconds per problem time unit (problem times are ms when profiled)."""

STREAM_TIDS = {stream: i + 1 for i, stream in enumerate(STREAM_ORDER)}
"""Thread id of each stream in its device's process (not 0: Perfetto treats tid 0 as idle)."""


def time_unit(problem: Problem) -> str | None:
    """The unit of the problem's times: its profile's (``ms``), or None for hand-written ones."""
    profile = problem.extra.get("profile")
    unit = profile.get("time_unit") if isinstance(profile, dict) else None
    if unit is None and problem.unit == "bytes":
        unit = "ms"  # the profiler's problems are in bytes and milliseconds
    return unit if isinstance(unit, str) else None


def device_pid(device: int) -> int:
    """Process id of a device's row: ``device + 1``, since Perfetto treats pid 0 as the kernel's."""
    return device + 1


def trace_events(schedule: Schedule, *, time_unit_us: float = TIME_UNIT_US) -> dict[str, Any]:
    """The schedule as a Chrome trace-event object (``{"traceEvents": [...], ...}``).

    Parameters
    ----------
    schedule
        Any timed schedule; devices without ops still get their process row.
    time_unit_us
        Microseconds per problem time unit. The default shows profiled
        problems (times in ms) at their true scale.

    Returns
    -------
    dict
        JSON-ready: metadata events first, then one ``X`` event per op in each
        device's execution order, then the memory counters.
    """
    if (
        isinstance(time_unit_us, bool)
        or not isinstance(time_unit_us, int | float)
        or not 0 < time_unit_us < float("inf")
    ):
        raise ProblemError("time_unit_us", f"got {time_unit_us!r}; it must be greater than 0")
    events: list[dict[str, Any]] = []
    by_device = schedule.by_device()
    for device, own in enumerate(by_device):
        streams = {op.stream for op in own} | {Stream.COMPUTE}
        events += _metadata_events(device, streams)
    for device, own in enumerate(by_device):
        events += [_op_event(op, device, time_unit_us) for op in own]
    events += _memory_counters(schedule, time_unit_us)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": _other_data(schedule, time_unit_us),
    }


def write_trace(
    schedule: Schedule,
    path: str | Path,
    *,
    time_unit_us: float = TIME_UNIT_US,
    force: bool = False,
) -> None:
    """Write :func:`trace_events` as JSON to ``path`` (open it in https://ui.perfetto.dev).

    The schedule is validated first (``force`` writes an invalid one anyway, with a
    warning); the file is written whole or not at all.
    """
    from pp_opt.atomic import write_text
    from pp_opt.validator import require_valid

    require_valid(schedule, force=force, action="export")
    text = json.dumps(trace_events(schedule, time_unit_us=time_unit_us), separators=(",", ":"))
    write_text(path, text + "\n", field="path")


def _metadata_events(device: int, streams: set[Stream]) -> list[dict[str, Any]]:
    """Name and order the device's process and the threads of the streams it uses."""
    pid = device_pid(device)
    events: list[dict[str, Any]] = [
        _meta("process_name", pid, 1, {"name": f"device {device}"}),
        _meta("process_sort_index", pid, 1, {"sort_index": device}),
    ]
    for stream, tid in STREAM_TIDS.items():
        if stream not in streams:
            continue
        events.append(_meta("thread_name", pid, tid, {"name": stream.value}))
        events.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
    return events


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _op_event(op: ScheduledOp, device: int, scale: float) -> dict[str, Any]:
    name = f"{op.kind.value} s{op.stage} mb{op.microbatch}"
    pair: dict[str, Any] = {}
    if op.partner is not None:  # an overlapped pair: name its backward half too
        back = op.partner
        name += f" + {back.kind.value} s{back.stage} mb{back.microbatch}"
        pair = {"stage_b": back.stage, "microbatch_b": back.microbatch, "backward": back.kind.value}
    return {
        "name": name,
        "cat": op.kind.value,
        "ph": "X",
        "pid": device_pid(device),
        "tid": STREAM_TIDS[op.stream],
        "ts": op.start * scale,
        "dur": (op.end - op.start) * scale,
        "args": {
            "op": op.kind.value,
            "stage": op.stage,
            "microbatch": op.microbatch,
            **pair,
            "device": device,
            "fraction": op.fraction,
            "start": op.start,
            "end": op.end,
        },
    }


def _memory_counters(schedule: Schedule, scale: float) -> list[dict[str, Any]]:
    """One ``C`` event per step of each device's memory (static plus activations)."""
    problem = schedule.problem
    events = []
    for device, steps in enumerate(memory_profile(problem, schedule.ops)):
        for time, level in steps:
            events.append(
                {
                    "name": "memory",
                    "ph": "C",
                    "pid": device_pid(device),
                    "tid": STREAM_TIDS[Stream.COMPUTE],
                    "ts": time * scale,
                    "args": {problem.unit: level},
                }
            )
    return events


def _other_data(schedule: Schedule, scale: float) -> dict[str, Any]:
    problem, metrics = schedule.problem, schedule.metrics
    return {
        "format": "pp-opt.trace",
        "name": problem.name,
        "solver": schedule.solver.name,
        "status": schedule.solver.status,
        "p": problem.p,
        "m": problem.m,
        "v": problem.v,
        "placement": problem.placement,
        "makespan": metrics.makespan,
        "bubble_rate": metrics.bubble_rate,
        "time_unit": time_unit(problem) or "arbitrary",
        "time_unit_us": scale,
        "memory_unit": problem.unit,
        "caps": [d.cap for d in problem.devices],
    }
