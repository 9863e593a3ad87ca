"""The planner: from a model, a GPU count and a batch to the fastest configuration.

A short pipeline of named steps, each a plain function of its own module:

1. :func:`~pp_opt.plan.space.enumerate_configs`: legal configurations (skipped ones counted);
2. :func:`~pp_opt.plan.candidates.split_layers`: a few layer splits per configuration, from a
   small CP-SAT model over the layer boundaries (:mod:`pp_opt.plan.split`);
3. :func:`~pp_opt.plan.problems.bound_candidate`: lower bounds and memory feasibility;
4. :func:`~pp_opt.plan.search.solve_survivors`: best-bound-first solves, pruning the rest;
5. :mod:`~pp_opt.plan.baselines`: torchtitan's and Megatron-LM's defaults beside the best;
6. :func:`~pp_opt.plan.search.refine`: the top few again with the time left;
7. :class:`~pp_opt.plan.result.Plan`: ranked by step time (:mod:`pp_opt.plan.step`).

:func:`~pp_opt.plan.pipeline.prepare` runs steps 1 to 3; :func:`~pp_opt.plan.pipeline.plan`
all of them. Nothing below this package imports it.
"""

from pp_opt.plan.config import Candidate, Config, Pins, PlanInputs
from pp_opt.plan.evaluate import Job, Scored, evaluate
from pp_opt.plan.executors import Executor, PoolExecutor, RayExecutor, SerialExecutor
from pp_opt.plan.pipeline import plan
from pp_opt.plan.result import Plan
from pp_opt.plan.search import PlanProgress

__all__ = [
    "Candidate",
    "Config",
    "Executor",
    "Job",
    "Pins",
    "Plan",
    "PlanInputs",
    "PlanProgress",
    "PoolExecutor",
    "RayExecutor",
    "Scored",
    "SerialExecutor",
    "evaluate",
    "plan",
]
