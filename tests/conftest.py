"""Shared fixtures: small problems that every test module may use."""

from __future__ import annotations

from pathlib import Path

import pytest

from pp_opt.problem import Problem, uniform_problem

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture
def small_problem() -> Problem:
    """p = 4, m = 8, unit costs, cap 2p activations."""
    return uniform_problem(p=4, m=8, t_comm=0.0)
