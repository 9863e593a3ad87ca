"""Issue 11: malformed problems, cards and schedules never produce a traceback, a hang or
a damaged file; every run ends with a documented exit code.

The default run tries a few dozen inputs of each kind (derandomized, a few seconds); the
long run is behind the ``fuzz`` marker: ``pytest -m fuzz`` (about a minute per test).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import json
import math
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pp_opt.cli import exit_codes, main
from pp_opt.orders import baseline
from pp_opt.problem import Problem, uniform_problem
from pp_opt.problem_io import problem_to_dict
from pp_opt.profiler.cards import load_hardware_card, load_model_card
from pp_opt.schedule_io import dumps_schedule

DOCUMENTED = {code for code, _ in exit_codes.TABLE}
SENTINEL = "previous output, must survive a failed run\n"
QUICK = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
LONG = settings(max_examples=1500, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


def fuzz(prop: Callable[..., None], how: settings, *strategies: Any) -> Callable[..., None]:
    """A hypothesis test of ``prop`` over ``strategies`` with the ``how`` settings."""

    def test(*args: Any) -> None:
        prop(*args)

    test.__signature__ = inspect.signature(prop)  # type: ignore[attr-defined]
    return given(*strategies)(how(test))


SECONDS = 20.0
"""No single run may take longer (the solves get a one-second limit)."""

# --- values and mutations -----------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 40),
    st.sampled_from([0, -1, 2**31, 10**9, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.5, 1e308, 1e-300, 0.25]),
    st.text(max_size=6),
)
values = st.one_of(
    scalars,
    st.lists(st.one_of(st.integers(-2, 5), st.text(max_size=2)), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(-2, 5), max_size=2),
)


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside nested dicts and lists."""
    found = []
    if isinstance(data, dict):
        for key, value in data.items():
            found.append((*prefix, key))
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data[:3]):  # the first few entries are enough
            found.append((*prefix, i))
            found += _paths(value, (*prefix, i))
    return found


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with one to three values replaced, removed, or an unknown key added."""
    data = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["set", "set", "set", "drop", "extra"]))
        if action == "drop" and isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif action == "extra" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=5))] = draw(values)
        else:
            parent[path[-1]] = draw(values)
    return data


def _toml_value(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        items = [_toml_value(v) for v in value]
        if any(i is None for i in items) or len({type(v) for v in value}) > 1:
            return None
        return "[" + ", ".join(i for i in items if i is not None) + "]"
    return None


def to_toml(data: dict[str, Any]) -> str:
    """Flat keys first, then one table per nested dict (enough for specs and cards)."""
    lines, tables = [], []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((key, value))
            continue
        text = _toml_value(value)
        if text is not None:
            lines.append(f"{json.dumps(key)} = {text}")
    for name, table in tables:
        lines.append(f"[{json.dumps(name)}]")
        for key, value in table.items():
            text = _toml_value(value)
            if text is not None:
                lines.append(f"{json.dumps(key)} = {text}")
    return "\n".join(lines) + "\n"


# --- running the command line -------------------------------------------------------------


def run_cli(argv: list[str]) -> tuple[int, str]:
    """Exit code and output (stderr, then stdout) of ``pp-opt argv`` run in this process;
    any exception other than ``SystemExit`` (a traceback) fails the test."""
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    assert time.perf_counter() - started < SECONDS, argv
    return code, err.getvalue() + out.getvalue()


def check(argv_for: Callable[[Path], list[str]], write: Callable[[Path], Path]) -> None:
    """Write the input, run the command with an existing output file, check the outcome."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        path = write(root)
        out = root / "out.json"
        out.write_text(SENTINEL)
        argv = argv_for(path)
        if argv[-1] == "-o":  # the command writes a file: give it one that exists
            argv.append(str(out))
        code, err = run_cli(argv)
        assert code in DOCUMENTED, (code, err)
        assert "Traceback" not in err
        if code != 0:
            assert err.strip(), "a failure must say why"
            assert out.read_text() == SENTINEL  # never damaged by a failed run
        leftovers = [p.name for p in root.iterdir() if p.name.startswith(".")]
        assert not leftovers  # no temporary file left behind


# --- problem files ------------------------------------------------------------------------

PROBLEM = {"format": "pp-opt.problem", **problem_to_dict(uniform_problem(p=2, m=3, m_w=0.5))}
SPEC = {"p": 2, "m": 3, "placement": "loop", "t_comm": 0.1, "offload": False,
        "stage": {"t_f": 1.0, "t_b": 1.0, "t_w": 1.0, "m_b": 1.0, "m_w": 0.5},
        "device": {"cap": 4.0, "static": 0.0}}  # fmt: skip


def _problem_json(data: dict[str, Any]) -> Callable[[Path], Path]:
    def write(root: Path) -> Path:
        path = root / "problem.json"
        path.write_text(json.dumps(data))
        return path

    return write


def _problem_toml(data: dict[str, Any]) -> Callable[[Path], Path]:
    def write(root: Path) -> Path:
        path = root / "problem.toml"
        path.write_text(to_toml(data))
        return path

    return write


def _solve(path: Path) -> list[str]:
    return ["solve", str(path), "--time-limit", "1", "--threads", "1", "-q", "-o"]


def _baseline(path: Path) -> list[str]:
    return ["baseline", "zb-h1", str(path), "-o"]


def problem_json_property(data: dict[str, Any]) -> None:
    check(_solve, _problem_json(data))


def problem_toml_property(data: dict[str, Any]) -> None:
    check(_baseline, _problem_toml(data))


def raw_bytes_property(blob: bytes) -> None:
    def write(root: Path) -> Path:
        path = root / "problem.toml"
        path.write_bytes(blob)
        return path

    check(_baseline, write)


test_fuzz_problem_json = fuzz(problem_json_property, QUICK, mutated(PROBLEM))
test_fuzz_problem_toml = fuzz(problem_toml_property, QUICK, mutated(SPEC))
test_fuzz_raw_bytes = fuzz(raw_bytes_property, QUICK, st.binary(max_size=120))

# --- cards --------------------------------------------------------------------------------

MODEL = load_model_card("zb-1.5b").to_dict()
HARDWARE = load_hardware_card("a100-80gb").to_dict()


def card_property(model: dict[str, Any], hardware: dict[str, Any]) -> None:
    def write(root: Path) -> Path:
        (root / "model.toml").write_text(to_toml(model))
        (root / "hardware.toml").write_text(to_toml(hardware))
        return root

    check(lambda root: ["profile", "--model", str(root / "model.toml"), "--hardware",
                        str(root / "hardware.toml"), "--pp", "2", "--microbatches", "4",
                        "--layers", "11,11", "-o"], write)  # fmt: skip


test_fuzz_cards = fuzz(card_property, QUICK, mutated(MODEL), mutated(HARDWARE))

# --- schedules ----------------------------------------------------------------------------

SCHEDULE = json.loads(dumps_schedule(baseline("1f1b", uniform_problem(p=2, m=3, t_comm=0.1))))
COMMANDS = [["validate"], ["show"], ["export", "--format", "trace"],
            ["export", "--format", "torch-csv"]]  # fmt: skip


def schedule_property(data: dict[str, Any], command: list[str]) -> None:
    def write(root: Path) -> Path:
        path = root / "schedule.json"
        path.write_text(json.dumps(data))
        return path

    output = command[0] == "export"
    check(lambda path: [*command, str(path), *(["-o"] if output else [])], write)


test_fuzz_schedules = fuzz(schedule_property, QUICK, mutated(SCHEDULE), st.sampled_from(COMMANDS))

# --- the long run (pytest -m fuzz) --------------------------------------------------------

long = pytest.mark.fuzz
test_fuzz_long_problem_json = long(fuzz(problem_json_property, LONG, mutated(PROBLEM)))
test_fuzz_long_problem_toml = long(fuzz(problem_toml_property, LONG, mutated(SPEC)))
test_fuzz_long_raw_bytes = long(fuzz(raw_bytes_property, LONG, st.binary(max_size=400)))
test_fuzz_long_cards = long(fuzz(card_property, LONG, mutated(MODEL), mutated(HARDWARE)))
test_fuzz_long_schedules = long(
    fuzz(schedule_property, LONG, mutated(SCHEDULE), st.sampled_from(COMMANDS))
)

# --- issue 16: the printed minimum cap is a promise ----------------------------------------

costs = st.sampled_from([0.5, 1.0, 1.5, 2.25])


@st.composite
def small_problems(draw: st.DrawFn) -> Problem:
    """Small problems of every placement, in activations or in bytes of a model's size."""
    placement, v = draw(st.sampled_from([("loop", 1), ("loop", 2), ("v", 2)]))
    scale = draw(st.sampled_from([1.0, 1.37 * 2**30]))
    m_b = draw(st.sampled_from([0.5, 1.0, 1.3])) * scale
    return uniform_problem(
        p=draw(st.integers(2, 3)), m=draw(st.integers(2, 5)), placement=placement, v=v,
        t_f=draw(costs), t_b=draw(costs), t_w=draw(costs), m_b=m_b,
        m_w=draw(st.sampled_from([0.0, 0.3, 0.5])) * m_b,
        static=draw(st.sampled_from([0.0, 0.7])) * scale,
        t_comm=draw(st.sampled_from([0.0, 0.1])), unit="m_b" if scale == 1 else "bytes",
    )  # fmt: skip


PRINTED_CAP = re.compile(r"raise --cap to at least ([0-9.]+) (\(unit|bytes)")


def min_cap_property(problem: Problem) -> None:
    """At the cap ``pp-opt solve`` prints as the smallest, a valid schedule comes back
    (exit 0); just below the smallest cap, exit 2."""
    from pp_opt.bounds import check_caps
    from pp_opt.errors import InfeasibleError
    from pp_opt.schedule_io import load_schedule
    from pp_opt.validator import validate

    tight = problem.devices[0].static + 1e-3
    with pytest.raises(InfeasibleError) as smallest:
        check_caps(problem.replace(devices=tuple(dataclasses.replace(d, cap=tight)
                                                 for d in problem.devices)))  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        path = root / "problem.json"
        path.write_text(json.dumps({"format": "pp-opt.problem", **problem_to_dict(problem)}))
        solve = ["solve", str(path), "--time-limit", "1", "--threads", "1", "-q", "--cap"]
        code, text = run_cli([*solve, repr(tight)])
        assert code == exit_codes.INFEASIBLE, text
        printed = PRINTED_CAP.search(text)
        assert printed is not None, text
        out = root / "s.json"
        code, text = run_cli([*solve, printed.group(1), "-o", str(out)])
        assert code == exit_codes.OK, text
        assert validate(load_schedule(out)) == []
        code, text = run_cli([*solve, repr(smallest.value.min_cap * (1 - 1e-6))])
        assert code == exit_codes.INFEASIBLE, text


FEW = settings(max_examples=3, deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
SOME = settings(max_examples=25, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
test_fuzz_min_cap = fuzz(min_cap_property, FEW, small_problems())
test_fuzz_long_min_cap = long(fuzz(min_cap_property, SOME, small_problems()))
