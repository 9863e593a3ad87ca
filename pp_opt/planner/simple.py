"""The simple points of a plan: what a user would try by hand (issue 40).

For the degrees of the most promising configurations (``tp``, ``pp``, ``cp``, the data- and
expert-parallel degrees, the checkpointing mode and the other settings), every placement
and ``v`` with the framework's even split (torchtitan's, the embedding and the output layer
counted as a layer each) at every microbatch size, without the solver's recompute and
offload. The plan solves them before anything else, so that no time limit drops them: its
best is then never slower than the best of them. The groups of degrees come in the order of
their best step-time bound, as many as :data:`SIMPLE_SHARE` of the screening time holds
(the first group always whole).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import fields, replace

from pp_opt.errors import ProblemError
from pp_opt.frameworks import torchtitan as titan
from pp_opt.job import Job
from pp_opt.planner.candidates import even_split
from pp_opt.planner.config import Candidate, PlanInputs
from pp_opt.planner.problems import Bounded, bound_candidate

SIMPLE_SHARE = 0.3
"""Share of the screening solves the simple points may take (the first group's always)."""
VARIED = ("placement", "v", "mbs", "microbatches", "layers", "full_layers")
"""What varies within a group of simple points; the other job fields are its degrees."""
SIMPLE = "simple"
"""A simple point's :attr:`Candidate.origin`."""


def degrees(job: Job) -> tuple[object, ...]:
    """The job's fields but those a group of simple points varies."""
    return tuple(getattr(job, f.name) for f in fields(job) if f.name not in VARIED)


def framework_split(layers: int, stages: int) -> tuple[int, ...]:
    """torchtitan's default split, or the plain even one where it leaves a stage empty."""
    try:
        return titan.default_layers(layers, stages)
    except ProblemError:
        return even_split(layers, stages)


def simple_points(
    inputs: PlanInputs, configs: Iterable[Candidate], bounded: Sequence[Bounded], *, most: int
) -> list[Bounded]:
    """The feasible simple points (bounded) of the groups of degrees that the feasible
    ``bounded`` candidates rank best by step-time bound, group after group while their
    count stays within ``most`` (the first group whole); ``configs``: the plan's legal
    configurations (layers not split)."""
    groups: dict[tuple[object, ...], list[Job]] = {}
    for config in configs:
        if not (config.recompute or config.offload):
            groups.setdefault(degrees(config.job), []).append(config.job)
    best: dict[tuple[object, ...], float] = {}
    for b in bounded:
        if b.infeasible is None:
            key = degrees(b.candidate.job)
            best[key] = min(best.get(key, float("inf")), b.step_bound)
    out: list[Bounded] = []
    for key in sorted(best, key=lambda k: best[k]):
        jobs = groups.get(key, [])
        if out and len(out) + len(jobs) > most:
            break
        for job in jobs:
            split = framework_split(inputs.model.layers, job.stages)
            point = Candidate(job=job.with_layers(split), recompute=False, offload=False,
                              origin=SIMPLE)  # fmt: skip
            b = bound_candidate(inputs, point)
            if b.infeasible is None:
                out.append(b)
    return out


def same_point(a: Candidate, b: Candidate) -> bool:
    """Whether two candidates are solved as the same problem (their origins aside)."""
    return replace(a, origin=b.origin) == b
