"""Schedule JSON (docs/design.md §5): ``"format": "pp-opt.schedule"``, version 1.

Writing is deterministic and loading keeps every value as written, so a
schedule loaded and saved again gives the same bytes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pp_opt.arguments import a_schedule, flag, of_type
from pp_opt.errors import ProblemError
from pp_opt.ops import OpKey, OpKind, Stream
from pp_opt.order import Variant
from pp_opt.problem_io import existing_file, problem_from_dict, problem_to_dict, read_text
from pp_opt.schedule import Metrics, Schedule, ScheduledOp, SolverInfo, Status, dag_ops

FORMAT = "pp-opt.schedule"
VERSION = 1
_SOLVER_KEYS = ("name", "status", "objective", "lower_bound", "gap", "seconds")
_METRIC_KEYS = ("makespan", "span", "bubble_rate", "idle_fraction", "peak_memory", "busy")


def schedule_to_dict(schedule: Schedule, *, rows: bool = True) -> dict[str, Any]:
    """The schedule as the JSON data of docs/design.md §5 (each device's ``ops`` empty unless
    ``rows``)."""
    solver = schedule.solver
    solver_dict = {k: getattr(solver, k) for k in _SOLVER_KEYS} | solver.extra
    metrics = {k: getattr(schedule.metrics, k) for k in _METRIC_KEYS}
    devices = []
    for device, own in enumerate(schedule.by_device() if rows else [[]] * schedule.problem.p):
        listed = []
        for op in own:
            row: dict[str, Any] = {
                "op": op.kind.value,
                "stage": op.stage,
                "microbatch": op.microbatch,
                **_pair_keys(op),
                "stream": op.stream.value,
                "start": op.start,
                "end": op.end,
            }
            if op.kind in (OpKind.OFFLOAD, OpKind.RELOAD):
                row["fraction"] = op.fraction
            listed.append(row)
        devices.append({"device": device, "ops": listed})
    return {
        "format": FORMAT,
        "version": VERSION,
        "problem": problem_to_dict(schedule.problem),
        "solver": solver_dict,
        "metrics": metrics,
        "devices": devices,
    }


def dumps_schedule(schedule: Schedule) -> str:
    """The schedule's JSON text (``json.dumps(schedule_to_dict(schedule), indent=1)``).

    The op rows, nearly all of a large schedule, are written by :func:`_rows_text`, which
    gives the same text as ``json.dumps`` many times faster (its indenting encoder is pure
    Python)."""
    data = schedule_to_dict(schedule, rows=False)
    for device in data["devices"]:
        device["ops"] = _ROWS_MARK.format(device["device"])
    text = json.dumps(data, indent=1)
    for device, own in enumerate(schedule.by_device()):
        text = text.replace(json.dumps(_ROWS_MARK.format(device)), _rows_text(own), 1)
    return text + "\n"


_ROWS_MARK = "\x00pp-opt rows {}\x00"
"""Stands for one device's op rows in the text until they are written in."""
_ROW = "    {\n     %s\n    }"
_FIELDS = ',\n     "'.join(
    ['"op": "%s"', 'stage": %d', 'microbatch": %d', 'stream": "%s"', 'start": %s', 'end": %s']
)
"""One row of :func:`schedule_to_dict` as ``json.dumps(indent=1)`` writes it five levels
deep (root, devices, device, ops, row), for ``%`` formatting."""


def _rows_text(ops: list[ScheduledOp]) -> str:
    """``json.dumps`` of the rows of ``ops`` (:func:`schedule_to_dict`) at the depth of a
    device's ``ops``, indent 1."""
    if not ops:
        return "[]"
    lines = []
    for op in ops:
        if op.partner is not None:  # a pair (rare): its row as json.dumps writes it
            row = {"op": op.kind.value, "stage": op.stage, "microbatch": op.microbatch,
                   **_pair_keys(op), "stream": op.stream.value}  # fmt: skip
            text = ",\n     ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in row.items())
            text += ',\n     "start": ' + _json_number(op.start)
            lines.append(_ROW % (text + ',\n     "end": ' + _json_number(op.end)))
            continue
        # Kinds and streams are plain identifiers; a finite float is written as its repr.
        text = _FIELDS % (op.kind.value, op.stage, op.microbatch, op.stream.value,
                          _json_number(op.start), _json_number(op.end))  # fmt: skip
        if op.kind in (OpKind.OFFLOAD, OpKind.RELOAD):
            text += ',\n     "fraction": ' + _json_number(op.fraction)
        lines.append(_ROW % text)
    return "[\n" + ",\n".join(lines) + "\n   ]"


def _pair_keys(op: ScheduledOp) -> dict[str, Any]:
    """The keys of a pair's backward half (docs/design.md §5), or none for any other op."""
    back = op.partner
    if back is None:
        return {}
    return {"stage_b": back.stage, "microbatch_b": back.microbatch, "backward": back.kind.value}


def _json_number(value: float) -> str:
    return repr(value) if type(value) is float and math.isfinite(value) else json.dumps(value)


def save_schedule(schedule: Schedule, path: str | Path, *, force: bool = False) -> Path:
    """Validate ``schedule`` and write its JSON to ``path`` atomically.

    An invalid schedule raises :class:`~pp_opt.validator.ValidationError` naming its first
    violation, unless ``force`` (then it is written with a logged warning). The file is
    written whole or not at all (:mod:`pp_opt.atomic`).
    """
    from pp_opt.atomic import write_text
    from pp_opt.validator import require_valid

    require_schedule("schedule", schedule)
    of_type("path", path, (str, Path), "a file path")
    flag("force", force)
    require_valid(schedule, force=force, action="save")
    return write_text(path, dumps_schedule(schedule), field="path")


def require_schedule(name: str, value: object) -> Schedule:
    """``value`` when it is a :class:`Schedule`; a :class:`ProblemError` naming ``name`` if not."""
    return a_schedule(value, name)


_TOP_KEYS = ("format", "version", "problem", "solver", "metrics", "devices")
_OP_KEYS = ("op", "stage", "microbatch", "stream", "start", "end", "fraction", "stage_b",
            "microbatch_b", "backward")  # fmt: skip


def _number(field: str, value: Any, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProblemError(field, f"got {value!r}; expected a number")
    return value


def _integer(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProblemError(field, f"got {value!r}; expected an integer")
    return value


def _object(field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProblemError(field, f"got {type(value).__name__}; expected an object")
    return value


def _list(field: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ProblemError(field, f"got {type(value).__name__}; expected a list")
    return value


def _solver_info(data: Any) -> SolverInfo:
    solver_data = dict(_object("solver", data))
    status = solver_data.pop("status", "feasible")
    if status not in [s.value for s in Status]:
        raise ProblemError("solver.status", f"got {status!r}; use one of {', '.join(Status)}")
    name = solver_data.pop("name", "?")
    if not isinstance(name, str):
        raise ProblemError("solver.name", f"got {name!r}; expected a string")
    return SolverInfo(
        name=name,
        status=Status(status),
        objective=_number("solver.objective", solver_data.pop("objective", 0.0)),
        lower_bound=_number(
            "solver.lower_bound", solver_data.pop("lower_bound", None), optional=True
        ),  # fmt: skip
        gap=_number("solver.gap", solver_data.pop("gap", None), optional=True),
        seconds=_number("solver.seconds", solver_data.pop("seconds", 0.0)),
        extra=solver_data,
    )


def _metrics(data: Any) -> Metrics:
    metrics_data = _object("metrics", data)
    missing = [k for k in _METRIC_KEYS if k not in metrics_data]
    if missing:
        raise ProblemError(f"metrics.{missing[0]}", "missing from the schedule file")
    for key in metrics_data:
        if key not in _METRIC_KEYS:
            raise ProblemError(f"metrics.{key}", f"unknown key; allowed: {', '.join(_METRIC_KEYS)}")
    for key in ("makespan", "bubble_rate", "idle_fraction"):
        _number(f"metrics.{key}", metrics_data[key])
    for key in ("span", "peak_memory", "busy"):
        for i, value in enumerate(_list(f"metrics.{key}", metrics_data[key])):
            _number(f"metrics.{key}[{i}]", value)
    return Metrics(**{k: metrics_data[k] for k in _METRIC_KEYS})


def _op(where: str, row: Any) -> ScheduledOp:
    row = _object(where, row)
    for key in row:
        if key not in _OP_KEYS:
            raise ProblemError(f"{where}.{key}", f"unknown key; allowed: {', '.join(_OP_KEYS)}")
    for key in ("op", "stage", "microbatch", "stream", "start", "end"):
        if key not in row:
            raise ProblemError(f"{where}.{key}", "missing; every op needs op, stage, "
                               "microbatch, stream, start and end")  # fmt: skip
    kinds, streams = [k.value for k in OpKind], [k.value for k in Stream]
    if row["op"] not in kinds:
        raise ProblemError(f"{where}.op", f"got {row['op']!r}; use one of {', '.join(kinds)}")
    if row["stream"] not in streams:
        raise ProblemError(
            f"{where}.stream", f"got {row['stream']!r}; use one of {', '.join(streams)}"
        )
    return ScheduledOp(
        partner=_partner(where, row),
        kind=OpKind(row["op"]),
        stage=_integer(f"{where}.stage", row["stage"]),
        microbatch=_integer(f"{where}.microbatch", row["microbatch"]),
        stream=Stream(row["stream"]),
        start=_number(f"{where}.start", row["start"]),
        end=_number(f"{where}.end", row["end"]),
        fraction=_number(f"{where}.fraction", row.get("fraction", 1.0)),
    )


def _partner(where: str, row: dict[str, Any]) -> OpKey | None:
    """The backward half of a pair row (``FB``, with ``stage_b``, ``microbatch_b`` and
    ``backward``), or None for any other op (which must not have those keys)."""
    keys = ("stage_b", "microbatch_b", "backward")
    if row["op"] != OpKind.FB.value:
        extra = [k for k in keys if k in row]
        if extra:
            raise ProblemError(f"{where}.{extra[0]}", "only an FB pair has a backward half")
        return None
    for key in keys:
        if key not in row:
            raise ProblemError(f"{where}.{key}", "missing; an FB pair names its backward half "
                               "by stage_b, microbatch_b and backward (B or BW)")  # fmt: skip
    if row["backward"] not in (OpKind.B.value, OpKind.BW.value):
        raise ProblemError(f"{where}.backward", f"got {row['backward']!r}; use B or BW")
    return OpKey(OpKind(row["backward"]), _integer(f"{where}.stage_b", row["stage_b"]),
                 _integer(f"{where}.microbatch_b", row["microbatch_b"]))  # fmt: skip


def schedule_from_dict(data: dict[str, Any]) -> Schedule:
    """A schedule from its JSON object; every field is checked (one-line errors naming it)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ProblemError("format", f"expected {FORMAT!r}, got {got!r}; is this a schedule file?")
    if data.get("version") != VERSION:
        raise ProblemError(
            "version", f"got {data.get('version')!r}; this pp_opt reads version {VERSION}"
        )
    for key in data:
        if key not in _TOP_KEYS:
            raise ProblemError(
                key, f"unknown key in a schedule file; allowed: {', '.join(_TOP_KEYS)}"
            )
    for key in ("problem", "solver", "metrics", "devices"):
        if key not in data:
            raise ProblemError(key, "missing from the schedule file")
    problem = problem_from_dict(data["problem"])
    solver = _solver_info(data["solver"])
    metrics = _metrics(data["metrics"])
    ops = []
    for d, dev in enumerate(_list("devices", data["devices"])):
        dev = _object(f"devices[{d}]", dev)
        device = _integer(f"devices[{d}].device", dev.get("device", d))
        for i, row in enumerate(_list(f"devices[{d}].ops", dev.get("ops", []))):
            where = f"devices[{d}].ops[{i}]"
            ops.append(_op(where, row))
            if not 0 <= ops[-1].stage < problem.num_stages:
                raise ProblemError(f"{where}.stage", f"outside 0..{problem.num_stages - 1}")
            if problem.device_of(ops[-1].stage) != device:
                raise ProblemError(
                    f"{where}.stage",
                    f"stage {ops[-1].stage} runs on device {problem.device_of(ops[-1].stage)}, "
                    f"not {device}; list the op under its own device",
                )
    # The file does not name its DAG variant: its op kinds do.
    variant = Variant.of_kinds((op.kind for op in dag_ops(ops)),
                               split_backward=problem.split_backward)  # fmt: skip
    return Schedule(
        problem=problem, ops=tuple(ops), solver=solver, metrics=metrics, variant=variant
    )


def loads_schedule(text: str) -> Schedule:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ProblemError("", f"not valid JSON ({err})") from None
    return schedule_from_dict(data)


def load_schedule(path: str | Path) -> Schedule:
    """The schedule in the JSON file at ``path`` (``"format": "pp-opt.schedule"``), checked.

    Loading does not validate it (:func:`pp_opt.validate` does); a file that is not a
    schedule, or holds a wrong value, raises :class:`~pp_opt.errors.ProblemError` naming the
    field.
    """
    path = existing_file(path, "schedule JSON")
    try:
        return loads_schedule(read_text(path, "schedule JSON"))
    except ProblemError as err:
        if err.field:
            raise
        raise ProblemError("", f"{path}: {err.message}") from None
