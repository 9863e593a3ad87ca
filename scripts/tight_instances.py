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
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pp_opt.problem import Device, Problem, Stage
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
