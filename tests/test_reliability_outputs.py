"""Issue 11, findings 1, 3, 4: nothing invalid leaves the tool, a printed cap works, and no
output file is ever half-written."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from cli_helpers import run

import pp_opt
from pp_opt.cli import exit_codes
from pp_opt.errors import InfeasibleError, OutputError, ceil_significant
from pp_opt.problem import uniform_problem
from pp_opt.schedule_io import dumps_schedule, loads_schedule
from pp_opt.validator import ValidationError

FORMATS = ("torch-csv", "trace", "svg")


def _broken_schedule_file(tmp_path: Path, how: str) -> Path:
    """A valid 1F1B schedule file, edited so it breaks a dependency or the memory cap."""
    schedule = pp_opt.baseline("1f1b", uniform_problem(p=2, m=4, t_comm=0.1))
    data = json.loads(dumps_schedule(schedule))
    if how == "dependency":  # F(1, 0) moved before F(0, 0) ends
        for op in data["devices"][1]["ops"]:
            if op["op"] == "F" and op["microbatch"] == 0:
                op["end"] -= op["start"]
                op["start"] = 0.0
    else:  # a cap below what the schedule holds
        for device in data["problem"]["devices"]:
            device["cap"] = 1.0
    path = tmp_path / f"{how}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


@pytest.mark.parametrize("how", ["dependency", "memory"])
def test_finding1_export_and_show_refuse_invalid_schedules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    path = _broken_schedule_file(tmp_path, how)
    rule = "dependency broken" if how == "dependency" else "memory broken"
    for fmt in FORMATS:
        out = tmp_path / f"out.{fmt}"
        code, _, err = run(["export", str(path), "--format", fmt, "-o", str(out)], capsys)
        assert code == exit_codes.BAD_INPUT
        assert rule in err and "--force" in err
        assert not out.exists()
    code, out_text, err = run(["show", str(path)], capsys)
    assert code == exit_codes.BAD_INPUT and rule in err and out_text == ""
    # --force exports anyway, loudly
    out = tmp_path / "forced.csv"
    code, _, err = run(["export", str(path), "-o", str(out), "--force"], capsys)
    assert code == exit_codes.OK and out.is_file()
    assert "WARNING" in err and "INVALID" in err


def test_finding1_python_export_and_save_refuse_invalid(tmp_path: Path) -> None:
    broken = loads_schedule(_broken_schedule_file(tmp_path, "dependency").read_text())
    with pytest.raises(ValidationError, match="dependency broken"):
        pp_opt.export(broken, "trace", tmp_path / "t.json")
    with pytest.raises(ValidationError, match="force"):
        pp_opt.save_schedule(broken, tmp_path / "s.json")
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "s.json").exists()
    pp_opt.export(broken, "trace", tmp_path / "t.json", force=True)
    assert (tmp_path / "t.json").is_file()


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1.0, "1"), (0.3, "0.3"), (1.0000001, "1.00001"), (2.999999999, "3"), (123456.7, "123457")],
)
def test_finding3_ceil_significant(value: float, expected: str) -> None:
    """Six significant digits, rounded up: the printed number is never below the value."""
    text = ceil_significant(value)
    assert float(text) >= value
    assert text == expected


def test_finding3_printed_minimum_cap_works_in_bytes() -> None:
    """The cap printed for a profiled (bytes) problem, given back, is feasible."""
    gib = 1024**3
    base = uniform_problem(p=2, m=4, m_b=1.2345678901 * gib, static=7.7777777 * gib, cap=9 * gib)
    problem = base.replace(unit="bytes")
    with pytest.raises(InfeasibleError) as err:
        pp_opt.solve(problem, time_limit=5)
    message = str(err.value)
    assert "bytes (" in message and "GiB)" in message
    printed = float(message.split("raise cap to at least ")[1].split(" ")[0])
    assert printed >= err.value.min_cap
    fixed = problem.replace(
        devices=tuple(pp_opt.Device(cap=printed, static=d.static) for d in problem.devices)
    )
    assert pp_opt.solve(fixed, time_limit=5).schedule.metrics.makespan > 0


def test_finding3_printed_minimum_cap_works_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        "p = 2\nm = 4\n[stage]\nt_f = 1.0\nt_b = 1.0\nt_w = 1.0\nm_b = 0.1234567891\n"
        "[device]\ncap = 1.0\nstatic = 0.3333333333\n"
    )
    code, _, err = run(["solve", str(path), "--cap", "0.4", "-q"], capsys)
    assert code == exit_codes.INFEASIBLE and "(unit: M_B" in err
    printed = err.split("raise --cap to at least ")[1].split(" ")[0]
    code, _, err = run(["solve", str(path), "--cap", printed, "-q", "--time-limit", "5"], capsys)
    assert code == exit_codes.OK, err


def _fail_replace(*args: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("fmt", ["json", "torch-csv", "trace", "svg"])
def test_finding4_failed_write_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    schedule = pp_opt.baseline("1f1b", uniform_problem(p=2, m=4))
    path = tmp_path / f"out.{fmt}"
    path.write_text("previous content")
    monkeypatch.setattr(os, "replace", _fail_replace)
    with pytest.raises(OutputError, match="No space left on device"):
        if fmt == "json":
            pp_opt.save_schedule(schedule, path)
        else:
            pp_opt.export(schedule, fmt, path)
    assert path.read_text() == "previous content"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_finding4_unwritable_output_fails_before_solving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pp_opt.solvers as solvers

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("solved although the output cannot be written")

    monkeypatch.setattr(solvers, "solve", never)
    missing = tmp_path / "no" / "such" / "folder" / "s.json"
    for command in (
        ["solve", "examples/small.toml"],
        ["baseline", "1f1b", "examples/small.toml"],
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
        ],
    ):
        code, _, err = run([*command, "-o", str(missing)], capsys)
        assert code == exit_codes.OUTPUT
        assert "does not exist" in err


def test_finding4_a_failed_write_after_a_solve_keeps_the_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "s.json"
    out.write_text("previous content")
    real_replace = os.replace

    def full_disk(src: str, dst: str) -> None:
        if Path(dst) == out:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    code, _, err = run(["solve", "examples/small.toml", "--time-limit", "2", "-q", "-o", str(out)],
                       capsys)  # fmt: skip
    assert code == exit_codes.OUTPUT
    assert out.read_text() == "previous content"
    rescue = Path(err.split("the schedule was saved to ")[1].strip())
    assert pp_opt.validate(pp_opt.load_schedule(rescue)) == []
    rescue.unlink()
