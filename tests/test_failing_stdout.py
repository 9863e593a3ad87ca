"""A failing standard output (a full disk) loses only what was printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pp_opt
from pp_opt.cli import exit_codes
from pp_opt.validator import validate

ROOT = Path(__file__).resolve().parent.parent
FULL = Path("/dev/full")


@pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full")
@pytest.mark.parametrize("command", ["solve", "show", "--help", "models"])
def test_a_full_stdout_keeps_the_schedule_and_says_so_in_one_line(
    tmp_path: Path, command: str
) -> None:
    out = tmp_path / "s.json"
    pp_opt.save_schedule(pp_opt.baseline("1f1b", pp_opt.uniform_problem(p=2, m=4)), out)
    if command == "show":
        args = ["show", str(out)]
    elif command != "solve":
        args = [command]
    else:  # an OSError traceback on main (exit 1)
        args = ["solve", str(ROOT / "examples" / "small.toml"), "--objective", "span",
                "--time-limit", "3", "-o", str(out)]  # fmt: skip
    with FULL.open("w") as full:
        done = subprocess.run([sys.executable, "-m", "pp_opt", *args], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)  # fmt: skip
    assert done.returncode == exit_codes.OUTPUT, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert errors[0].startswith("error: standard output: No space left on device")
    assert validate(pp_opt.load_schedule(out)) == []
