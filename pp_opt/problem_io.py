"""Problems to and from plain dicts, TOML problem files, problem and cost-profile JSON;
re-splitting into chunks."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pp_opt.arguments import a_problem
from pp_opt.compat import with_v
from pp_opt.errors import ProblemError
from pp_opt.limits import check_size
from pp_opt.placement import PLACEMENTS, stage_devices
from pp_opt.problem import Device, Problem, Stage

STAGE_KEYS = ("t_f", "t_b", "t_w", "t_bw", "m_b", "m_w", "m_in", "t_offload", "t_reload",
              "t_f_comm", "t_b_comm")  # fmt: skip
DEVICE_KEYS = ("cap", "static")
TOP_KEYS = (
    "name", "p", "m", "placement", "v", "t_comm", "objective", "unit", "split_backward",
    "offload", "recompute", "host_links", "stage", "stages", "device", "devices", "pairs",
    "pair_overhead",
)  # fmt: skip
_ADDITIVE = ("t_f", "t_b", "t_w", "m_b", "m_w", "t_offload", "t_reload", "t_f_comm", "t_b_comm")

COSTS_FORMAT = "pp-opt.costs"
"""``format`` of a cost profile JSON (:func:`pp_opt.profiler.profile_costs` writes them)."""
COSTS_VERSION = 1
COSTS_PROBLEM_KEYS = ("name", "p", "m", "placement", "v", "unit", "t_comm", "stages", "devices",
                      "host_links", "pairs", "pair_overhead")  # fmt: skip


def _reject_unknown(where: str, data: Mapping[str, Any], allowed: Sequence[str]) -> None:
    for key in data:
        if key not in allowed:
            raise ProblemError(
                f"{where}{key}", f"unknown key; allowed keys are {', '.join(allowed)}"
            )


def _typed(field: str, value: Any, kind: type) -> Any:
    if kind is bool and not isinstance(value, bool):
        raise ProblemError(field, f"got {value!r}; expected true or false")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ProblemError(field, f"got {value!r}; expected an integer")
    if kind is str and not isinstance(value, str):
        raise ProblemError(field, f"got {value!r}; expected a string")
    return value


def _stage(where: str, values: Mapping[str, Any], device: int) -> Stage:
    _reject_unknown(where, values, (*STAGE_KEYS, "device"))
    missing = [k for k in ("t_f", "t_b", "t_w") if k not in values]
    if missing:
        raise ProblemError(f"{where}{missing[0]}", "missing; every stage needs t_f, t_b and t_w")
    kwargs = {k: values[k] for k in STAGE_KEYS if k in values}
    try:
        return Stage(device=device, **kwargs)
    except ProblemError as err:
        raise ProblemError(f"{where}{err.field}", err.message) from None


def _device(where: str, values: Mapping[str, Any]) -> Device:
    """A checked device; a cap below its static memory is kept (as the static memory) and
    reported by :func:`_check_static` once the stages are known."""
    _reject_unknown(where, values, DEVICE_KEYS)
    if "cap" not in values:
        raise ProblemError(f"{where}cap", "missing; give each device a memory cap")
    try:
        device = Device(**values)
    except ProblemError as err:
        if err.field == "cap" and isinstance(values.get("static"), int | float):
            return Device(cap=values["static"], static=values["static"])
        raise ProblemError(f"{where}{err.field}", err.message) from None
    return device


def _check_static(problem: Problem, caps: Sequence[Any]) -> Problem:
    """The problem, or :class:`InfeasibleError` (exit 2, with the smallest cap that works)
    when a device's cap is below its static memory."""
    from pp_opt.bounds import check_static_caps

    return check_static_caps(problem, caps)


def _table(field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ProblemError(field, f"got {value!r}; expected a table like [{field}]")
    return dict(value)


def _tables(field: str, value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ProblemError(field, f"expected a list of tables, one [[{field}]] per entry")
    return [dict(v) for v in value]


def problem_from_spec(spec: Mapping[str, Any]) -> Problem:
    """Build a problem from a hand-written spec (the TOML layout; see examples/small.toml)."""
    spec = with_v(spec)
    _reject_unknown("", spec, TOP_KEYS)
    for key in ("p", "m"):
        if key not in spec:
            raise ProblemError(key, "missing; a problem needs p (devices) and m (microbatches)")
    p = _typed("p", spec["p"], int)
    m = _typed("m", spec["m"], int)
    check_size(p=p, m=m)
    raw_placement = spec.get("placement", "loop")
    if isinstance(raw_placement, list):
        devices_of = stage_devices(raw_placement, p, 1)
        placement = "explicit"
    else:
        placement = _typed("placement", raw_placement, str)
        default_v = 2 if placement in ("v", "dual") else 1
        devices_of = stage_devices(placement, p, _typed("v", spec.get("v", default_v), int))
    check_size(m=m, stages=len(devices_of))
    stage_default = _table("stage", spec.get("stage", {}))
    per_stage = _tables("stages", spec.get("stages", []))
    if per_stage and len(per_stage) != len(devices_of):
        raise ProblemError(
            "stages", f"got {len(per_stage)} entries for {len(devices_of)} stages; give one each"
        )
    stages = []
    for s, d in enumerate(devices_of):
        values = {**stage_default, **(per_stage[s] if per_stage else {})}
        if "device" in values and values.pop("device") != d:
            raise ProblemError(f"stages[{s}].device", "disagrees with placement; set placement")
        stages.append(_stage("stage." if not per_stage else f"stages[{s}].", values, d))
    dev_default = _table("device", spec.get("device", {}))
    if "cap" not in dev_default and not spec.get("devices"):
        # Default cap: 2p activations of a whole device (the ZB-2p budget), plus static memory.
        activation = [0.0] * p
        for st in stages:
            activation[st.device] += st.m_b
        static = dev_default.get("static", 0.0)
        if isinstance(static, bool) or not isinstance(static, int | float):
            raise ProblemError("device.static", f"got {static!r}; expected a number")
        dev_default["cap"] = 2 * p * max(activation) + static
    per_device = _tables("devices", spec.get("devices", []))
    if per_device and len(per_device) != p:
        raise ProblemError("devices", f"got {len(per_device)} entries for p = {p}; give one each")
    device_values = [{**dev_default, **(per_device[d] if per_device else {})} for d in range(p)]
    devices = [
        _device("device." if not per_device else f"devices[{d}].", values)
        for d, values in enumerate(device_values)
    ]
    problem = Problem(
        p=p,
        m=m,
        stages=tuple(stages),
        devices=tuple(devices),
        placement=placement,
        **_settings("", spec),
    )
    return _check_static(problem, [values.get("cap") for values in device_values])


_SWITCHES: tuple[tuple[str, Any, type], ...] = (
    ("split_backward", True, bool),
    ("offload", False, bool),
    ("recompute", False, bool),
    ("pairs", False, bool),
    ("objective", "makespan", str),
    ("unit", "m_b", str),
    ("name", "", str),
)
"""Problem settings with their defaults and types, the same in TOML and schedule JSON."""


def _settings(where: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The problem-wide settings of ``spec`` (fields named ``where`` + key), checked."""
    settings = {key: _typed(where + key, spec.get(key, default), kind)
                for key, default, kind in _SWITCHES}  # fmt: skip
    settings["t_comm"] = spec.get("t_comm", 0.0)
    settings["pair_overhead"] = spec.get("pair_overhead", 0.0)
    settings["host_links"] = _host_links(spec.get("host_links", []))
    return settings


def _host_links(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list) or not all(isinstance(g, list) for g in value):
        raise ProblemError("host_links", "expected a list of device lists, e.g. [[0, 1], [2, 3]]")
    return tuple(tuple(_typed("host_links", d, int) for d in g) for g in value)


def stage_row(st: Stage) -> dict[str, Any]:
    """One stage of a problem or cost profile file (``t_bw`` only when the stage has one)."""
    row: dict[str, Any] = {"device": st.device, "t_f": st.t_f, "t_b": st.t_b, "t_w": st.t_w}
    if st.t_bw is not None:
        row["t_bw"] = st.t_bw
    row.update(m_b=st.m_b, m_w=st.m_w, m_in=st.m_in)
    row.update(t_offload=st.t_offload, t_reload=st.t_reload)
    for name in ("t_f_comm", "t_b_comm"):  # only when given: files without pairs stay as they were
        if getattr(st, name):
            row[name] = getattr(st, name)
    return row


def problem_to_dict(problem: Problem) -> dict[str, Any]:
    """The JSON form of docs/design.md §5 (the ``problem`` object of a schedule)."""
    stages = [stage_row(st) for st in problem.stages]
    out: dict[str, Any] = {
        "name": problem.name,
        "p": problem.p,
        "m": problem.m,
        "placement": problem.placement,
        "v": problem.v,
        "objective": problem.objective,
        "unit": problem.unit,
        "stages": stages,
        "t_comm": problem.t_comm,
        "devices": [{"cap": d.cap, "static": d.static} for d in problem.devices],
        "host_links": [list(g) for g in problem.host_links],
        "split_backward": problem.split_backward,
        "offload": problem.offload,
        "recompute": problem.recompute,
    }
    if problem.pairs:
        out["pairs"] = True
    if problem.pair_overhead:
        out["pair_overhead"] = problem.pair_overhead
    if problem.extra:
        out["extra"] = problem.extra
    return out


def problem_from_dict(data: Mapping[str, Any]) -> Problem:
    """Inverse of :func:`problem_to_dict`; every field is checked (one-line errors)."""
    if not isinstance(data, Mapping):
        raise ProblemError("problem", f"got {type(data).__name__}; expected an object")
    data = with_v(data, "problem.")
    allowed = (
        "name", "p", "m", "placement", "v", "objective", "unit", "stages", "t_comm", "devices",
        "host_links", "split_backward", "offload", "recompute", "extra", "pairs", "pair_overhead",
    )  # fmt: skip
    _reject_unknown("problem.", data, allowed)
    for key in ("p", "m", "stages", "devices"):
        if key not in data:
            raise ProblemError(f"problem.{key}", "missing")
    p = _typed("problem.p", data["p"], int)
    m = _typed("problem.m", data["m"], int)
    rows = _tables("problem.stages", data["stages"])
    check_size(p=p, m=m, stages=len(rows))
    stages = []
    for s, row in enumerate(rows):
        if "device" not in row:
            raise ProblemError(f"problem.stages[{s}].device", "missing; give the stage's device")
        device = _typed(f"problem.stages[{s}].device", row["device"], int)
        values = {k: v for k, v in row.items() if k != "device"}
        stages.append(_stage(f"problem.stages[{s}].", values, device))
    device_rows = _tables("problem.devices", data["devices"])
    devices = tuple(_device(f"problem.devices[{d}].", row) for d, row in enumerate(device_rows))
    placement = data.get("placement", "explicit")
    if not isinstance(placement, str):
        raise ProblemError("problem.placement", f"got {placement!r}; expected loop, v or explicit")
    extra = data.get("extra", {})
    if not isinstance(extra, Mapping):
        raise ProblemError("problem.extra", f"got {extra!r}; expected an object")
    problem = Problem(
        p=p,
        m=m,
        stages=tuple(stages),
        devices=devices,
        placement=placement,
        **_settings("problem.", data),
        extra=dict(extra),
    )
    return _check_static(problem, [row.get("cap") for row in device_rows])


def read_text(path: Path, what: str) -> str:
    """A file's text (UTF-8), or a one-line :class:`ProblemError` saying why it cannot be read."""
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise ProblemError("", f"{path}: is a directory; give the path of a {what}") from None
    except OSError as err:
        raise ProblemError("", f"{path}: cannot be read ({err.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProblemError(
            "", f"{path}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); "
            f"give a {what} saved as UTF-8",
        ) from None  # fmt: skip


def existing_file(path: str | Path, what: str) -> Path:
    """``path`` as a :class:`Path` that exists, or a one-line error asking for a ``what``."""
    if not isinstance(path, str | Path):
        raise ProblemError("path", f"got {type(path).__name__}; give a file path")
    path = Path(path)
    if not path.exists():
        raise ProblemError("", f"{path}: no such file; give the path of a {what}")
    return path


def load_problem(path: str | Path) -> Problem:
    """Read a problem from a TOML spec, a problem/schedule JSON, or a cost profile JSON."""
    path = existing_file(path, "problem .toml or .json")
    text = read_text(path, "problem .toml or .json")
    if path.suffix == ".toml":
        try:
            spec = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError) as err:
            raise ProblemError("", f"{path}: not valid TOML ({err})") from None
        return problem_from_spec(spec)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ProblemError("", f"{path}: not valid JSON ({err})") from None
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt == "pp-opt.schedule":
        if "problem" not in data:
            raise ProblemError("problem", f"{path}: the schedule file has no problem")
        return problem_from_dict(data["problem"])
    if fmt == "pp-opt.problem":
        return problem_from_dict({k: v for k, v in data.items() if k not in ("format", "version")})
    if fmt == COSTS_FORMAT:
        return problem_from_costs(data)
    raise ProblemError(
        "format", f"{path}: expected pp-opt.schedule, pp-opt.problem or pp-opt.costs, got {fmt!r}"
    )


def problem_from_costs(data: Mapping[str, Any]) -> Problem:
    """Build the Problem a cost profile describes; its provenance goes to ``extra["profile"]``."""
    if not isinstance(data, Mapping):
        raise ProblemError("data", f"got {type(data).__name__}; expected a cost profile object")
    if data.get("format") != COSTS_FORMAT:
        raise ProblemError("format", f"got {data.get('format')!r}; expected {COSTS_FORMAT!r}")
    if data.get("version") != COSTS_VERSION:
        raise ProblemError(
            "version", f"got {data.get('version')!r}; this pp_opt reads version {COSTS_VERSION}"
        )
    data = with_v(data)
    allowed = (*COSTS_PROBLEM_KEYS, "format", "version", "profile")
    for key in data:
        if key not in allowed:
            raise ProblemError(key, f"unknown key in a cost profile; allowed: {', '.join(allowed)}")
    if data.get("unit", "bytes") != "bytes":
        raise ProblemError("unit", "a cost profile measures memory in bytes; set unit = 'bytes'")
    problem = {k: data[k] for k in COSTS_PROBLEM_KEYS if k in data and k != "v"}
    profile = data.get("profile", {})
    if not isinstance(profile, Mapping):
        raise ProblemError("profile", f"got {profile!r}; expected an object")
    problem["extra"] = {"profile": dict(profile)}
    return problem_from_dict(problem)


def resplit(problem: Problem, placement: str, v: int) -> Problem:
    """Re-split each device's layers into ``v`` chunks with the given placement.

    Per-chunk times and memory are the device totals divided by ``v`` (as the Zero
    Bubble paper does for ZB-V); the stage input size ``m_in`` stays that of a stage.
    """
    a_problem(problem)
    if placement not in PLACEMENTS:
        raise ProblemError(
            "placement", f"unknown {placement!r}; use one of {', '.join(PLACEMENTS)}"
        )
    devices_of = stage_devices(placement, problem.p, v)
    if placement == problem.placement and v == problem.v:
        return problem
    totals: list[dict[str, float]] = []
    for d in range(problem.p):
        own = [problem.stages[s] for s in problem.stages_on(d)]
        row = {k: sum(getattr(st, k) for st in own) for k in _ADDITIVE}
        row["t_bw"] = sum(st.fused_backward for st in own)
        row["m_in"] = max(st.m_in for st in own)
        totals.append(row)
    stages = []
    for d in devices_of:
        row = totals[d]
        fused = row["t_bw"] / v
        split_sum = (row["t_b"] + row["t_w"]) / v
        stages.append(
            Stage(
                device=d,
                **{k: row[k] / v for k in _ADDITIVE},
                t_bw=None if abs(fused - split_sum) < 1e-12 else fused,
                m_in=min(row["m_in"], row["m_b"] / v),
            )
        )
    return problem.replace(stages=tuple(stages), placement=placement)
