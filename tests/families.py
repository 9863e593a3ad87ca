"""Problem families several test modules share, from the benchmark's own builders
(``scripts/tight_instances.py``), so that the tests and the benchmark hold one definition."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from pp_opt.problem import Problem

ROOT = Path(__file__).resolve().parent.parent


@cache
def tight_instances() -> ModuleType:
    """``scripts/tight_instances.py`` (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(
        "tight_instances", ROOT / "scripts" / "tight_instances.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exact_family(
    p: int, m: int, cap: float, placement: str = "v", *, v: int = 2, **given: Any
) -> Problem:
    """Issue 18's ``v`` family (:func:`tight_instances.exact_instance`): per chunk
    ``t_f = t_b = 0.5``, ``t_w = 0.3``, ``m_b = 0.5``, ``m_w = 0.2``, ``t_comm = 0.05``, two
    chunks per device, makespan; ``given`` overrides costs or adds fields of
    :func:`~pp_opt.problem.uniform_problem`."""
    problem: Problem = tight_instances().exact_instance(p, m, cap, placement, v=v, **given)
    return problem
