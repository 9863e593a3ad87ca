"""The planner: from a model, a GPU count and a batch to the fastest configuration.

A short pipeline of named steps, each a plain function of its own module:

1. :func:`~pp_opt.planner.space.enumerate_configs`: legal configurations (skipped ones counted);
2. :func:`~pp_opt.planner.candidates.split_layers`: a few layer splits per configuration, from a
   small CP-SAT model over the layer boundaries (:mod:`pp_opt.planner.split`);
3. :func:`~pp_opt.planner.problems.bound_candidate`: lower bounds and memory feasibility;
4. :func:`~pp_opt.planner.search.solve_survivors`: best-bound-first solves, pruning the rest;
5. :mod:`~pp_opt.planner.baselines`: torchtitan's and Megatron-LM's defaults beside the best;
6. :func:`~pp_opt.planner.search.refine`: the top few again with the time left;
7. :class:`~pp_opt.planner.result.Plan`: ranked by step time (:mod:`pp_opt.planner.step`).

:func:`~pp_opt.planner.pipeline.prepare` runs steps 1 to 3; :func:`~pp_opt.planner.pipeline.plan`
all of them. Nothing below this package imports it.
"""

from pp_opt.job import Job
from pp_opt.planner.config import Candidate, Pins, PlanInputs
from pp_opt.planner.evaluate import EvaluationTask, Scored, evaluate
from pp_opt.planner.executors import Executor, PoolExecutor, RayExecutor, SerialExecutor
from pp_opt.planner.pipeline import plan
from pp_opt.planner.predict import Prediction, predict
from pp_opt.planner.result import Plan
from pp_opt.planner.search import PlanProgress

__all__ = [
    "Prediction",
    "predict",
    "Candidate",
    "EvaluationTask",
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
