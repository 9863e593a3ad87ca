"""Problem families several test modules share."""

from __future__ import annotations

from typing import Any

from pp_opt.problem import Problem, uniform_problem


def exact_family(
    p: int, m: int, cap: float, placement: str = "v", *, v: int = 2, **given: Any
) -> Problem:
    """Issue 18's ``v`` family (``scripts/tight_instances.exact_instance``): per chunk
    ``t_f = t_b = 0.5``, ``t_w = 0.3``, ``m_b = 0.5``, ``m_w = 0.2``, ``t_comm = 0.05``, two
    chunks per device, makespan; ``given`` overrides costs or adds fields of
    :func:`~pp_opt.problem.uniform_problem`."""
    costs = dict(t_f=1.0, t_b=1.0, t_w=0.6, m_b=1.0, m_w=0.4, t_comm=0.05) | given
    problem = uniform_problem(p=p, m=m, cap=cap, placement=placement, v=v, **costs)
    return problem.replace(objective="makespan")
