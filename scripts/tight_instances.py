"""The memory-tight instances of issue 10, one function each, returning a ``Problem``.

- V instances: the Zero Bubble 1.5B and 28.3B configurations (``examples/``) re-split
  to the ``v`` placement (two chunks per device, per-chunk times and memory halved,
  ``m_w / m_b`` kept), objective makespan, caps in whole-device activations
  (``M_B = 1``; one chunk's ``m_b`` is 0.5).
- PipeOffload instances: ``p = 8``, ``m = 32``, 4 chunks per device on the ``loop``
  placement, per chunk ``t_f = t_b = t_w = 0.25`` (1 per device-stage),
  ``t_comm = 0.05``, ranks ``2i`` and ``2i + 1`` share one host link, per chunk
  ``m_b = 0.25`` (``M_B = 1`` per device) and ``m_w = m_b / 2``, copy time
  ``0.75 k`` per chunk (the whole device's activation in ``3k``), split backward.

``INSTANCES`` maps each row name of ``scripts/anchors.json`` to its builder.

Issue 18's small instances (:func:`exact_instance`, :func:`span_instance`,
:func:`v_offload_instance`) are listed in ``EXACT``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pp_opt.problem import Device, Problem, Stage, uniform_problem
from pp_opt.problem_io import load_problem, resplit

ROOT = Path(__file__).resolve().parent.parent


def with_cap(problem: Problem, cap: float) -> Problem:
    """The problem with every device's cap set to ``cap`` (static memory kept)."""
    return problem.replace(devices=tuple(Device(cap=cap, static=d.static) for d in problem.devices))


def v_instance(config: str, cap: float) -> Problem:
    """A Zero Bubble configuration on the ``v`` placement with the given cap."""
    base = load_problem(ROOT / "examples" / f"{config}.toml")
    problem = resplit(base, "v", 2).replace(objective="makespan")
    return with_cap(problem, cap).replace(name=f"{config} v cap={cap:g}")


def pipeoffload_instance(k: float, cap: float, *, p: int = 8, m: int = 32, v: int = 4) -> Problem:
    """The PipeOffload instance with copy ratio ``k`` and the given cap (in ``M_B``)."""
    t = 1.0 / v
    stage = dict(t_f=t, t_b=t, t_w=t, m_b=1.0 / v, m_w=0.5 / v,
                 t_offload=3 * t * k, t_reload=3 * t * k)  # fmt: skip
    return Problem(
        p=p,
        m=m,
        stages=tuple(Stage(device=s % p, **stage) for s in range(p * v)),
        devices=tuple(Device(cap=cap) for _ in range(p)),
        placement="loop",
        t_comm=0.05,
        host_links=tuple((i, i + 1) for i in range(0, p - 1, 2)),
        offload=True,
        name=f"pipeoffload k={k:g} cap={cap:g}",
    )


def v_half_1p5b() -> Problem:
    return v_instance("zb-1.5b", 5.0)


def v_min_1p5b() -> Problem:
    return v_instance("zb-1.5b", 4.0)


def v_half_28p3b() -> Problem:
    return v_instance("zb-28.3b", 17.0)


def v_min_28p3b() -> Problem:
    return v_instance("zb-28.3b", 12.0)


def pipeoffload_k05_cap2() -> Problem:
    return pipeoffload_instance(0.5, 2.0)


def pipeoffload_k05_cap375() -> Problem:
    return pipeoffload_instance(0.5, 3.75)


def pipeoffload_k1_cap4() -> Problem:
    return pipeoffload_instance(1.0, 4.0)


INSTANCES: dict[str, Callable[[], Problem]] = {
    "1.5b-v-half": v_half_1p5b,
    "1.5b-v-min": v_min_1p5b,
    "28.3b-v-half": v_half_28p3b,
    "28.3b-v-min": v_min_28p3b,
    "pipeoffload-k0.5-cap2": pipeoffload_k05_cap2,
    "pipeoffload-k0.5-cap3.75": pipeoffload_k05_cap375,
    "pipeoffload-k1-cap4": pipeoffload_k1_cap4,
}
"""Row name -> instance builder, in the order of the issue's tables."""


def exact_instance(
    p: int, m: int, cap: float, placement: str = "v", *, v: int = 2, **given: Any
) -> Problem:
    """Issue 18: ``v`` placement, per chunk ``t_f = t_b = 0.5``, ``t_w = 0.3``, ``m_b = 0.5``,
    ``m_w = 0.2``, ``t_comm = 0.05``; ``cap`` in whole-device activations (``M_B = 1``).
    The tests (``tests/families.py``) also take other placements and chunk counts, and
    ``given`` costs or fields of :func:`~pp_opt.problem.uniform_problem`."""
    costs = dict(t_f=1.0, t_b=1.0, t_w=0.6, m_b=1.0, m_w=0.4, t_comm=0.05) | given
    problem = uniform_problem(p=p, m=m, cap=cap, placement=placement, v=v, **costs)
    return problem.replace(objective="makespan", name=f"{placement} p={p} m={m} cap={cap:g}")


def span_instance() -> Problem:
    """Issue 18: 3 devices, 5 microbatches, uneven stages, cap 2.5 activations, span."""
    stages = (
        Stage(device=0, t_f=1.0, t_b=1.2, t_w=0.6, m_w=0.3),
        Stage(device=1, t_f=1.5, t_b=1.6, t_w=0.8, m_w=0.4),
        Stage(device=2, t_f=1.2, t_b=1.0, t_w=0.5, m_w=0.2),
    )
    return Problem(p=3, m=5, stages=stages, devices=tuple(Device(cap=2.5) for _ in range(3)),
                   t_comm=0.1, objective="span", name="loop p=3 m=5 uneven cap=2.5")  # fmt: skip


def v_offload_instance(
    cap: float, *, offload: bool = True, placement: str = "v", m: int = 12
) -> Problem:
    """Issue 18 (``m = 12``) and issue 28 (``m`` up to 32): ``p = 4``, per chunk
    ``t_f = t_b = 0.5``, ``t_w = 0.35``, ``t_comm = 0.02``, ``m_b = 0.5``, ``m_w = 0.2``,
    ``t_offload = t_reload = 0.8``, host links ``[[0, 1], [2, 3]]``, two chunks per device."""
    problem = uniform_problem(p=4, m=m, t_f=1.0, t_b=1.0, t_w=0.7, m_b=1.0, m_w=0.4,
                              t_comm=0.02, cap=cap, placement=placement, v=2,
                              host_links=((0, 1), (2, 3)))  # fmt: skip
    stages = tuple(dataclasses.replace(st, t_offload=0.8, t_reload=0.8) for st in problem.stages)
    name = f"{placement} offload p=4 m={m} cap={cap:g}" + ("" if offload else " no-offload")
    return problem.replace(stages=stages, offload=offload, objective="makespan", name=name)


V_OFFLOAD_M: tuple[int, ...] = (12, 16, 24, 32)
"""Microbatch counts of the ``v`` offload rows of ``bench_solvers.py --parts v-offload``."""


EXACT: tuple[tuple[int, int, float], ...] = (
    (3, 6, 2.5), (3, 6, 2.0), (4, 8, 3.0),  # the table
    (3, 8, 2.5), (3, 8, 2.0), (4, 8, 2.5),  # m = 8 (p 3) and cap 2.5 (p 4)
    (3, 6, 3.0), (4, 8, 4.0),  # ZB-V's cap, for the comparison with ZB-V
    (4, 12, 2.5),  # issue 28: one size up (optimum 38.30, proved in 60 s since the proof workers)
    (4, 12, 2.0),  # the same size at another cap (proved since the W order)
    (4, 12, 3.0),  # and at a third (proved since the proof starts from the warm start)
)  # fmt: skip
"""``(p, m, cap)`` of the exact rows of ``bench_solvers.py --parts exact``."""
