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
    """Issue 18's family, as the benchmark builds it (``exact_instance``), typed."""
    problem: Problem = tight_instances().exact_instance(p, m, cap, placement, v=v, **given)
    return problem
