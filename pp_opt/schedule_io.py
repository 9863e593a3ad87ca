"""Schedule JSON (DESIGN.md §5): ``"format": "pp-opt.schedule"``, version 1.

Writing is deterministic and loading keeps every value as written, so a
schedule loaded and saved again gives the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pp_opt.errors import ProblemError
from pp_opt.ops import OpKind, Stream
from pp_opt.order import Variant
from pp_opt.problem_io import problem_from_dict, problem_to_dict
from pp_opt.schedule import Metrics, Schedule, ScheduledOp, SolverInfo, Status

FORMAT = "pp-opt.schedule"
VERSION = 1
_SOLVER_KEYS = ("name", "status", "objective", "lower_bound", "gap", "seconds")
_METRIC_KEYS = ("makespan", "span", "bubble_rate", "idle_fraction", "peak_memory", "busy")


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    solver = schedule.solver
    solver_dict = {k: getattr(solver, k) for k in _SOLVER_KEYS} | solver.extra
    metrics = {k: getattr(schedule.metrics, k) for k in _METRIC_KEYS}
    devices = []
    for device, own in enumerate(schedule.by_device()):
        rows = []
        for op in own:
            row: dict[str, Any] = {
                "op": op.kind.value,
                "stage": op.stage,
                "microbatch": op.microbatch,
                "stream": op.stream.value,
                "start": op.start,
                "end": op.end,
            }
            if op.kind in (OpKind.OFFLOAD, OpKind.RELOAD):
                row["fraction"] = op.fraction
            rows.append(row)
        devices.append({"device": device, "ops": rows})
    return {
        "format": FORMAT,
        "version": VERSION,
        "problem": problem_to_dict(schedule.problem),
        "solver": solver_dict,
        "metrics": metrics,
        "devices": devices,
    }


def dumps_schedule(schedule: Schedule) -> str:
    return json.dumps(schedule_to_dict(schedule), indent=1) + "\n"


def save_schedule(schedule: Schedule, path: str | Path) -> None:
    Path(path).write_text(dumps_schedule(schedule))


def schedule_from_dict(data: dict[str, Any]) -> Schedule:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ProblemError("format", f"expected {FORMAT!r}, got {got!r}; is this a schedule file?")
    if data.get("version") != VERSION:
        raise ProblemError(
            "version", f"got {data.get('version')!r}; this pp_opt reads version {VERSION}"
        )
    for key in ("problem", "solver", "metrics", "devices"):
        if key not in data:
            raise ProblemError(key, "missing from the schedule file")
    problem = problem_from_dict(data["problem"])
    solver_data = dict(data["solver"])
    status = solver_data.pop("status", "feasible")
    if status not in [s.value for s in Status]:
        raise ProblemError("solver.status", f"got {status!r}; use one of {', '.join(Status)}")
    solver = SolverInfo(
        name=solver_data.pop("name", "?"),
        status=Status(status),
        objective=solver_data.pop("objective", 0.0),
        lower_bound=solver_data.pop("lower_bound", None),
        gap=solver_data.pop("gap", None),
        seconds=solver_data.pop("seconds", 0.0),
        extra=solver_data,
    )
    metrics_data = data["metrics"]
    missing = [k for k in _METRIC_KEYS if k not in metrics_data]
    if missing:
        raise ProblemError(f"metrics.{missing[0]}", "missing from the schedule file")
    metrics = Metrics(**{k: metrics_data[k] for k in _METRIC_KEYS})
    ops = []
    for d, dev in enumerate(data["devices"]):
        for i, row in enumerate(dev.get("ops", [])):
            where = f"devices[{d}].ops[{i}]"
            try:
                ops.append(
                    ScheduledOp(
                        kind=OpKind(row["op"]),
                        stage=int(row["stage"]),
                        microbatch=int(row["microbatch"]),
                        stream=Stream(row["stream"]),
                        start=row["start"],
                        end=row["end"],
                        fraction=row.get("fraction", 1.0),
                    )
                )
            except (KeyError, ValueError, TypeError) as err:
                raise ProblemError(where, f"malformed op ({err})") from None
            if not 0 <= ops[-1].stage < problem.num_stages:
                raise ProblemError(f"{where}.stage", f"outside 0..{problem.num_stages - 1}")
            if problem.device_of(ops[-1].stage) != dev.get("device", d):
                raise ProblemError(
                    f"{where}.stage",
                    f"stage {ops[-1].stage} runs on device {problem.device_of(ops[-1].stage)}, "
                    f"not {dev.get('device', d)}; list the op under its own device",
                )
    # The file does not name its DAG variant: its op kinds do.
    variant = Variant.of_kinds((op.kind for op in ops), split_backward=problem.split_backward)
    return Schedule(
        problem=problem, ops=tuple(ops), solver=solver, metrics=metrics, variant=variant
    )


def loads_schedule(text: str) -> Schedule:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProblemError("", f"not valid JSON ({err})") from None
    return schedule_from_dict(data)


def load_schedule(path: str | Path) -> Schedule:
    path = Path(path)
    if not path.is_file():
        raise ProblemError("", f"{path}: no such file; give the path of a schedule JSON")
    return loads_schedule(path.read_text())
