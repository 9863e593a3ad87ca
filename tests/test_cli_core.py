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
        (GOOD + "\n[device]\ncap = 1.0\nstatic = 2.0\n", "raise --cap to at least 3 (unit: M_B"),
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
    """Finding 10: a usage error is bad input (exit 1), not click's 2 ("infeasible" here)."""
    code, _, err = run(["frobnicate"], capsys)
    assert code == 1
    assert "No such command" in err


def test_models_lists_every_bundled_card(capsys: pytest.CaptureFixture[str]) -> None:
    from pp_opt.card_files import card_names

    code, out, _ = run(["models"], capsys)
    assert code == 0
    lines = out.strip().splitlines()
    assert sorted(line.split()[0] for line in lines) == card_names()
    by_name = {line.split()[0]: line.split()[1] for line in lines}
    assert by_name["zb-1.5b"] == "model" and by_name["a100-80gb"] == "hardware"
    assert "Zero Bubble paper" in next(line for line in lines if line.startswith("zb-1.5b"))


def test_chunks_is_v_under_its_former_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "problem.toml"
    path.write_text(GOOD)
    out = tmp_path / "s.json"
    code, _, err = run(["baseline", "1f1b", str(path), "--v", "2", "-o", str(out)], capsys)
    assert code == 0 and err == ""
    assert '"v": 1' in out.read_text()  # 1F1B merges the chunks back
    code, stdout, err = run(["baseline", "interleaved-1f1b", str(path), "--chunks", "3"], capsys)
    assert code == 0 and "v=3" in stdout
    assert err.strip() == "warning: --chunks is deprecated; use --v"
    path.write_text(GOOD.replace("p = 2", "p = 2\nvpp = 2"))
    with caplog.at_level("WARNING", logger="pp_opt"):
        code, stdout, _ = run(["baseline", "interleaved-1f1b", str(path)], capsys)
    assert code == 0 and "v=2" in stdout
    assert "vpp is deprecated; use v" in caplog.text


def test_library_errors_name_arguments_and_the_cli_its_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pp_opt import ProblemError, solve, uniform_problem

    with pytest.raises(ProblemError) as err:
        solve(uniform_problem(p=2, m=2), time_limit=0)
    assert str(err.value).startswith("time_limit: ")
    small = Path(__file__).resolve().parent.parent / "examples" / "small.toml"
    code, _, stderr = run(["solve", str(small), "--time-limit", "0"], capsys)
    assert code == 1 and stderr.startswith("error: --time-limit: got 0")
