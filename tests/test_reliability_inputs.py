"""Issue 11, findings 7, 8, 9, 10, 12: every bad input is one line naming the field, the
value and the fix, with its documented exit code; nothing hangs or prints a traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_helpers import run

import pp_opt
from pp_opt.bounds import check_caps, device_min_memory, lower_bound, min_feasible_cap
from pp_opt.cli import exit_codes
from pp_opt.errors import ProblemError
from pp_opt.problem import uniform_problem
from pp_opt.profiler.cards import hardware_card_from_dict, load_model_card, model_card_from_dict
from pp_opt.schedule_io import dumps_schedule

GOOD = "p = 2\nm = 4\n[stage]\nt_f = 1.0\nt_b = 1.0\nt_w = 1.0\nm_w = 0.5\n"


def _one_line_error(err: str) -> None:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.fixture
def schedule_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    problem = tmp_path / "p.toml"
    problem.write_text(GOOD)
    path = tmp_path / "s.json"
    assert run(["baseline", "1f1b", str(problem), "-o", str(path)], capsys)[0] == 0
    return path


# --- finding 7: sizes are limited up front, not hung on -----------------------------------


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("p = 100000\nm = 8\n", "p: got 100000; pp_opt handles at most 1024 devices"),
        ("p = 4\nm = 100000\n", "m: got 100000; pp_opt handles at most 10000 microbatches"),
        ("p = 8\nm = 10000\n", "activations; pp_opt handles at most 50000"),
        ("p = 8\nm = 24\nv = 1000\n", "v: got 1000; pp_opt handles at most 64 chunks"),
    ],
)
def test_finding7_sizes_beyond_the_limits_fail_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, field: str
) -> None:
    path = tmp_path / "big.toml"
    path.write_text(text + "[stage]\nt_f = 1.0\nt_b = 1.0\nt_w = 1.0\n")
    started = time.perf_counter()
    code, _, err = run(["solve", str(path), "--time-limit", "5", "-q"], capsys)
    assert time.perf_counter() - started < 2.0
    assert code == exit_codes.BAD_INPUT
    assert field in err
    _one_line_error(err)


def test_finding7_chunks_flag_is_limited(capsys: pytest.CaptureFixture[str]) -> None:
    started = time.perf_counter()
    code, _, err = run(["baseline", "1f1b", "examples/zb-1.5b.toml", "--chunks", "1000"], capsys)
    assert time.perf_counter() - started < 2.0
    assert code == exit_codes.BAD_INPUT and "at most 64 chunks" in err


# --- finding 8: one line, not a traceback -------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("bad.toml", b'p = 2\nm = 4\nname = "\xff"\n', "not UTF-8 text (byte 0xff"),
        (
            "bad.json",
            b'{"format": "pp-opt.problem", "p": 2, "m": 4, "stages": {"a": 1}, "devices": []}',
            "problem.stages: expected a list of tables",
        ),
        ("bad2.json", b"[1, 2]", "expected pp-opt.schedule, pp-opt.problem or pp-opt.costs"),
        (
            "pl.toml",
            GOOD.replace("m = 4", 'm = 4\nplacement = [0, "1"]').encode(),
            "entry '1' is not a device number",
        ),
        ("big.toml", GOOD.replace("t_f = 1.0", "t_f = 1e308").encode(), "numbers up to 1e+15"),
    ],
)
def test_finding8_bad_problem_files_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: bytes, expected: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    code, _, err = run(["solve", str(path), "--time-limit", "2", "-q"], capsys)
    assert code == exit_codes.BAD_INPUT
    assert expected in err
    _one_line_error(err)


def test_finding8_seed_beyond_32_bits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.toml"
    path.write_text(GOOD)
    code, _, err = run(["solve", str(path), "--seed", str(2**31), "-q"], capsys)
    assert code == exit_codes.BAD_INPUT and "--seed: got 2147483648" in err
    _one_line_error(err)


def test_finding8_show_width_zero(schedule_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["show", str(schedule_file), "--width", "0"], capsys)
    assert code == exit_codes.BAD_INPUT and "--width: got 0" in err
    _one_line_error(err)


def test_finding8_null_start(schedule_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(schedule_file.read_text())
    data["devices"][0]["ops"][0]["start"] = None
    schedule_file.write_text(json.dumps(data))
    for command in (["show"], ["validate"], ["export", "--format", "trace"]):
        code, _, err = run([*command, str(schedule_file)], capsys)
        assert code == exit_codes.BAD_INPUT
        assert "devices[0].ops[0].start: got None; expected a number" in err
        _one_line_error(err)


# --- finding 9: bad values are refused, not used ------------------------------------------


HARDWARE = {
    "peak_tflops": 312.0,
    "gemm_efficiency": 0.6,
    "hbm_gib": 80.0,
    "hbm_gbs": 2039.0,
    "d2h_gbs": 15.0,
    "h2d_gbs": 15.0,
    "intra_node_gbs": 250.0,
    "inter_node_gbs": 25.0,
}


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_finding9_hardware_card_nan_or_infinite(value: float) -> None:
    with pytest.raises(ProblemError) as err:
        hardware_card_from_dict({**HARDWARE, "d2h_gbs": value})
    assert err.value.field == "hardware.d2h_gbs"


def test_finding9_model_card_bias_must_be_a_boolean() -> None:
    data = load_model_card("zb-1.5b").to_dict()
    with pytest.raises(ProblemError) as err:
        model_card_from_dict({**data, "bias": "no"})
    assert err.value.field == "model.bias"


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_finding9_bytes_per_param(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        [
            "profile",
            "--model",
            "zb-1.5b",
            "--hardware",
            "a100-80gb",
            "--pp",
            "4",
            "--microbatches",
            "8",
            "--bytes-per-param",
            value,
        ],
        capsys,
    )
    assert code == exit_codes.BAD_INPUT and "--bytes-per-param: got" in err
    _one_line_error(err)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["devices"][0]["ops"][0].update(stage=0.5), "stage: got 0.5"),
        (lambda d: d["devices"][0]["ops"][0].update(microbatch=1.5), "microbatch: got 1.5"),
        (lambda d: d.update(comment="hand-edited"), "comment: unknown key"),
        (lambda d: d["solver"].update(lower_bound=1e9), "lower_bound broken"),
    ],
)
def test_finding9_validate_refuses_what_it_used_to_accept(
    schedule_file: Path, capsys: pytest.CaptureFixture[str], mutate, expected: str
) -> None:
    data = json.loads(schedule_file.read_text())
    mutate(data)
    schedule_file.write_text(json.dumps(data))
    code, out, err = run(["validate", str(schedule_file)], capsys)
    assert code == exit_codes.BAD_INPUT
    assert expected in out + err


# --- finding 10: usage errors do not collide with "infeasible" ----------------------------


def test_finding10_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.toml"
    path.write_text(GOOD + "[device]\ncap = 4.0\nstatic = 1.0\n")
    assert run(["solve", str(path), "--no-such-flag"], capsys)[0] == exit_codes.BAD_INPUT
    assert run(["solve"], capsys)[0] == exit_codes.BAD_INPUT  # no problem given
    code, _, err = run(["solve", str(path), "--cap", "0.5", "-q"], capsys)  # below static
    assert code == exit_codes.INFEASIBLE
    assert "raise --cap to at least 2 (unit: M_B" in err
    code, out, _ = run(["--help"], capsys)
    assert code == exit_codes.OK and "Exit codes: 0 ok" in out.replace("\n", " ")


# --- finding 12: library errors name the argument -----------------------------------------


def _calls() -> list[tuple[str, object]]:
    problem = uniform_problem(p=2, m=4)
    schedule = pp_opt.baseline("1f1b", problem)
    return [
        ("problem", lambda: pp_opt.solve("problem.toml")),
        ("time_limit", lambda: pp_opt.solve(problem, time_limit="10")),
        ("time_limit", lambda: pp_opt.solve(problem, time_limit=float("inf"))),
        ("seed", lambda: pp_opt.solve(problem, seed=-1)),
        ("seed", lambda: pp_opt.solve(problem, seed=2**40)),
        ("threads", lambda: pp_opt.solve(problem, threads=2.5)),
        ("warm_start", lambda: pp_opt.solve(problem, warm_start="yes")),
        ("progress", lambda: pp_opt.solve(problem, progress="print")),
        ("offload_fractions", lambda: pp_opt.solve(problem, offload_fractions="1")),
        ("offload_fractions", lambda: min_feasible_cap(problem, "foo")),
        ("offload_fractions", lambda: device_min_memory(problem, "foo")),
        ("offload_fractions", lambda: check_caps(problem, "foo")),
        ("objective", lambda: lower_bound(problem, "foo")),
        ("problem", lambda: lower_bound("foo")),
        ("schedule", lambda: pp_opt.export("s.json", "trace", "out.json")),
        ("format", lambda: pp_opt.export(schedule, 3, "out.json")),
        ("path", lambda: pp_opt.export(schedule, "trace", 42)),
        ("dpi", lambda: pp_opt.export(schedule, "png", "x.png", dpi=-1)),
        ("time_unit_us", lambda: pp_opt.export(schedule, "trace", "x.json", time_unit_us="ms")),
        ("drop_offload", lambda: pp_opt.export(schedule, "torch-csv", "x.csv", drop_offload=1)),
        ("schedule", lambda: pp_opt.save_schedule("not a schedule", "s.json")),
        ("path", lambda: pp_opt.load_problem(42)),
        ("schedule", lambda: pp_opt.validate("s.json")),
        ("tol", lambda: pp_opt.validate(schedule, tol="small")),
        ("placement", lambda: uniform_problem(p=2, m=4, placement=[0, "1"])),
        ("p", lambda: uniform_problem(p=2.5, m=4)),
        (
            "repeats",
            lambda: pp_opt.profile_problem(
                model="zb-1.5b", hardware="a100-80gb", pp=4, microbatches=8, repeats=0
            ),
        ),
    ]


def test_finding12_api_errors_name_the_argument(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name, call in _calls():
        with pytest.raises(ProblemError) as err:
            call()
        assert err.value.field == name, (name, str(err.value))
    assert not list(tmp_path.iterdir())  # nothing written by a refused call


def test_dumps_is_not_gated_but_save_is(tmp_path: Path) -> None:
    """Tests and tools may build broken files with dumps_schedule; save_schedule refuses."""
    schedule = pp_opt.baseline("1f1b", uniform_problem(p=2, m=4))
    assert dumps_schedule(schedule)


def test_a_huge_cap_is_no_limit_for_the_solvers() -> None:
    """Found by the fuzz test: a cap of 1e18 overflowed CP-SAT's integer model."""
    problem = uniform_problem(p=2, m=3)
    problem = problem.replace(devices=(pp_opt.Device(cap=4.0), pp_opt.Device(cap=1e18)))
    for solver in ("cpsat", "milp"):
        assert pp_opt.solve(problem, solver=solver, time_limit=3, threads=1).objective > 0
