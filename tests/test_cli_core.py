"""The CLI turns bad input into one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run

GOOD = """
p = 2
m = 4
[stage]
t_f = 1.0
t_b = 1.0
t_w = 1.0
m_w = 0.5
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("p = 2\nm = 4\n[stage]\nt_f = 1.0\nt_b = 1.0\n", "stage.t_w: missing"),
        (GOOD.replace("t_w = 1.0", "t_w = -1.0"), "stage.t_w: got -1; it must be 0 or more"),
        (GOOD + "\n[device]\ncap = 1.0\nstatic = 2.0\n", "device.cap: got 1 < static memory"),
        (GOOD.replace("p = 2", "p = 2\nplacement = 'v'\nv = 3"), "v: got 3"),
        (GOOD.replace("p = 2", "p = 2\nspeed = 3"), "speed: unknown key"),
        (GOOD.replace("m = 4", "m = 'four'"), "m: got 'four'; expected an integer"),
        ("p = 2\nm = [", "not valid TOML"),
    ],
)
def test_bad_problem_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = tmp_path / "problem.toml"
    path.write_text(text)
    code, _, err = run(["baseline", "1f1b", str(path)], capsys)
    assert code != 0
    assert expected in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["show", "no/such/schedule.json"], capsys)
    assert code == 1
    assert "no such file" in err


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["frobnicate"], capsys)
    assert code == 2
    assert "No such command" in err
