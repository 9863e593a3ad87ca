"""Every bundled example problem loads, and says what its comments say."""

from __future__ import annotations

from pathlib import Path

import pytest

from pp_opt.problem_io import load_problem

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TOML_FILES = sorted(EXAMPLES.glob("*.toml"))

# (p, m, t_f, t_b, t_w, t_comm, m_w): docs/design.md §7 and the files' comments.
EXPECTED = {
    "small": (4, 8, 1.0, 1.0, 1.0, 0.05, 0.5),
    "zb-1.5b": (8, 24, 18.52, 18.09, 9.34, 0.60, 0.366),
    "zb-6.2b": (8, 24, 29.72, 29.44, 19.93, 0.53, 0.281),
    "zb-14.6b": (16, 48, 11.35, 11.25, 8.13, 0.38, 0.281),
    "zb-28.3b": (32, 96, 10.42, 10.21, 7.72, 0.41, 0.281),
}


def test_the_examples_are_there() -> None:
    assert {path.stem for path in TOML_FILES} >= set(EXPECTED)


@pytest.mark.parametrize("path", TOML_FILES, ids=lambda path: path.stem)
def test_example_loads(path: Path) -> None:
    problem = load_problem(path)
    assert problem.num_stages >= problem.p


@pytest.mark.parametrize("name", list(EXPECTED))
def test_example_numbers(name: str) -> None:
    problem = load_problem(EXAMPLES / f"{name}.toml")
    p, m, t_f, t_b, t_w, t_comm, m_w = EXPECTED[name]
    assert (problem.name, problem.unit) == (name, "m_b")
    assert (problem.p, problem.m, problem.placement, problem.t_comm) == (p, m, "loop", t_comm)
    for stage in problem.stages:
        assert (stage.t_f, stage.t_b, stage.t_w, stage.m_b, stage.m_w) == (t_f, t_b, t_w, 1.0, m_w)
    assert all(device.cap == 2 * p and device.static == 0.0 for device in problem.devices)
