"""pp_opt: optimal pipeline-parallel schedules under per-GPU memory caps.

The pieces, each a plain function over plain data::

    import pp_opt

    problem = pp_opt.load_problem("examples/small.toml")  # or Problem(...), profile_problem(...)
    job = pp_opt.Job(pp=4, v=2, microbatches=16, seq=4096)  # one configuration
    costs = pp_opt.profile_job(job, model="llama2-7b", hardware="a100-80gb")  # a CostProfile
    problem = pp_opt.problem_from_profile(costs)
    result = pp_opt.solve(problem, solver="cpsat", time_limit=10)
    pp_opt.save_schedule(result.schedule, "s.json")
    pp_opt.export(result.schedule, "torch-csv", "s.csv")

``import pp_opt`` stays light: OR-Tools, PuLP and HiGHS load when a backend runs,
matplotlib when a picture is drawn, PyTorch only in the measured profiler and the runtime.
"""

from pp_opt.bounds import lower_bound, min_feasible_cap
from pp_opt.errors import (
    DeadlockError,
    InfeasibleError,
    Interrupted,
    NoOrderError,
    OutputError,
    PPOptError,
    ProblemError,
    TimeLimitError,
)
from pp_opt.export import export
from pp_opt.job import Job
from pp_opt.order import Order, Variant
from pp_opt.orders import baseline, baseline_names
from pp_opt.planner import (
    Candidate,
    Pins,
    Plan,
    PlanInputs,
    Prediction,
    Scored,
    plan,
    predict,
)
from pp_opt.problem import Device, Problem, Stage, uniform_problem
from pp_opt.problem_io import load_problem, resplit
from pp_opt.problem_overrides import apply_overrides, problem_with_overrides
from pp_opt.profiler import (
    CostProfile,
    HardwareCard,
    ModelCard,
    problem_from_profile,
    profile_job,
    profile_problem,
)
from pp_opt.schedule import Schedule, Status
from pp_opt.schedule_io import load_schedule, save_schedule
from pp_opt.simulator import order_of, retime, simulate
from pp_opt.solvers import SolveResult, StopToken, solve
from pp_opt.validator import ValidationError, Violation, check_schedule, validate

__version__ = "0.1.0"

__all__ = [
    "apply_overrides",
    "Candidate",
    "CostProfile",
    "DeadlockError",
    "Device",
    "HardwareCard",
    "InfeasibleError",
    "Interrupted",
    "Job",
    "ModelCard",
    "NoOrderError",
    "OutputError",
    "Order",
    "PPOptError",
    "Pins",
    "Plan",
    "PlanInputs",
    "Problem",
    "ProblemError",
    "Schedule",
    "Scored",
    "SolveResult",
    "Stage",
    "Status",
    "StopToken",
    "TimeLimitError",
    "ValidationError",
    "Variant",
    "Violation",
    "baseline",
    "baseline_names",
    "check_schedule",
    "export",
    "load_problem",
    "load_schedule",
    "lower_bound",
    "min_feasible_cap",
    "order_of",
    "plan",
    "predict",
    "Prediction",
    "problem_from_profile",
    "problem_with_overrides",
    "profile_job",
    "profile_problem",
    "resplit",
    "retime",
    "save_schedule",
    "simulate",
    "solve",
    "uniform_problem",
    "validate",
]
