"""Issue 28: every public function of ``pp_opt`` checks its arguments by name.

The functions come from ``pp_opt.__all__``, so one added later is covered too (the test
asks for good arguments for it). Each argument in turn gets ``None`` (unless ``None`` is
its default, hence allowed) and a value of a wrong type; the call must raise a
:class:`~pp_opt.errors.ProblemError` (a ``ValueError``) whose ``field`` is that argument,
before any long work starts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pp_opt
from pp_opt.errors import ProblemError

ROOT = Path(__file__).resolve().parent.parent


def _functions() -> list[str]:
    return [name for name in pp_opt.__all__ if inspect.isfunction(getattr(pp_opt, name))]


def _good(tmp: Path) -> dict[str, dict[str, Any]]:
    """For each public function, one good value of every named argument (fast calls)."""
    problem = pp_opt.uniform_problem(p=2, m=4)
    schedule = pp_opt.baseline("1f1b", problem)
    saved = pp_opt.save_schedule(schedule, tmp / "saved.json")
    job = pp_opt.Job(pp=2, microbatches=4, seq=1024)
    cards = {"model": "zb-1.5b", "hardware": "a100-80gb", "seq": 1024}
    return {
        "baseline": {"name": "1f1b", "problem": problem, "time_limit": 5.0},
        "baseline_names": {},
        "check_schedule": {"schedule": schedule, "tol": 1e-7},
        "validate": {"schedule": schedule, "tol": 1e-7},
        "export": {
            "schedule": schedule,
            "format": "trace",
            "path": tmp / "x.json",
            "force": False,
        },  # fmt: skip
        "load_problem": {"path": ROOT / "examples" / "small.toml"},
        "load_schedule": {"path": saved},
        "lower_bound": {"problem": problem, "objective": "makespan", "offload_fractions": (1.0,)},
        "min_feasible_cap": {"problem": problem, "offload_fractions": (1.0,)},
        "order_of": {"schedule": schedule},
        "plan": {
            **cards,
            "gpus": 8,
            "global_batch": 64,
            "pins": None,
            "time_limit": 1.0,
            "workers": 1,
            "ray": None,
            "executor": None,
            "keep": 5,
            "splits": 2,
            "refine_top": 3,
            "seed": 0,
            "threads": 1,
            "progress": None,
            "stop": None,
        },  # fmt: skip
        "predict": {
            **cards,
            "gpus": 2,
            "global_batch": 8,
            "tp": 1,
            "pp": 2,
            "cp": 1,
            "dp_shard": 1,
            "dp_replicate": 1,
            "mbs": 1,
            "schedule": "1F1B",
            "v": None,
            "placement": "loop",
            "layers": None,
            "ac": "none",
            "fp8": False,
            "compile": False,
            "async_tp": False,
            "fp8_all_gather": None,
            "full_layers": (),
            "time_limit": 2.0,
        },  # fmt: skip
        "profile_problem": {
            **cards,
            "pp": 2,
            "v": 1,
            "placement": "loop",
            "microbatches": 8,
            "mbs": 1,
            "tp": 1,
            "layers": None,
            "measure": False,
            "vpp": None,
        },  # fmt: skip
        "profile_job": {"job": job, "model": "zb-1.5b", "hardware": "a100-80gb", "measure": False},
        "problem_from_profile": {
            "profile": pp_opt.profile_job(job, model="zb-1.5b", hardware="a100-80gb")
        },
        "problem_with_overrides": {
            "path": ROOT / "examples" / "small.toml",
            "cap": 8.0,
            "placement": "loop",
            "v": 1,
            "objective": "makespan",
            "offload": False,
            "recompute": False,
        },  # fmt: skip
        "apply_overrides": {
            "problem": problem,
            "cap": 8.0,
            "objective": "makespan",
            "offload": False,
            "recompute": False,
        },  # fmt: skip
        "resplit": {"problem": problem, "placement": "v", "v": 2},
        "retime": {"schedule": schedule, "solver": None},
        "save_schedule": {"schedule": schedule, "path": tmp / "y.json", "force": True},
        "simulate": {"order": pp_opt.order_of(schedule), "dag": None, "solver": None},
        "solve": {
            "problem": problem,
            "solver": "cpsat",
            "time_limit": 2.0,
            "threads": 1,
            "seed": 0,
            "objective": None,
            "warm_start": True,
            "progress": None,
            "offload_fractions": (1.0,),
            "stop": None,
        },  # fmt: skip
        "uniform_problem": {
            "p": 2,
            "m": 4,
            "t_f": 1.0,
            "t_b": 1.0,
            "t_w": 1.0,
            "m_b": 1.0,
            "m_w": 0.0,
            "t_comm": 0.0,
            "cap": None,
            "static": 0.0,
            "placement": "loop",
            "v": 1,
        },  # fmt: skip
    }


def _wrong_type(good: Any) -> Any:
    """A value of a type the argument does not take, near what a caller might pass."""
    if isinstance(good, bool):
        return "yes"
    if isinstance(good, str | Path):
        return 3.5
    if isinstance(good, int | float):
        return "3"
    if isinstance(good, tuple):
        return 1.0
    return "text"  # a Problem, Schedule, Order; or an object where None is the default


def _calls(tmp: Path) -> list[tuple[str, str, Any, Callable[[], object]]]:
    good = _good(tmp)
    missing = [name for name in _functions() if name not in good]
    assert not missing, f"give good arguments for {missing} in _good"
    calls = []
    for name in _functions():
        function = getattr(pp_opt, name)
        parameters = inspect.signature(function).parameters
        named = [p for p in parameters.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        assert {p.name for p in named} <= set(good[name]), f"{name}: arguments left out of _good"
        for parameter in named:
            bad_values = [_wrong_type(good[name][parameter.name])]
            if parameter.default is not None:
                bad_values.append(None)
            for bad in bad_values:
                arguments = {**good[name], parameter.name: bad}
                calls.append((name, parameter.name, bad,
                              lambda f=function, a=arguments: f(**a)))  # fmt: skip
    return calls


def test_every_public_function_is_listed_with_every_argument(tmp_path: Path) -> None:
    calls = _calls(tmp_path)
    assert {name for name, *_ in calls} >= {"baseline", "solve", "validate", "plan"}
    assert len(calls) > 100


def test_each_argument_is_checked_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``None`` and a wrong type for each argument: a ProblemError naming it, at once."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PP_OPT_IN_PROCESS", "1")  # no solver child to start and stop per call
    wrong = []
    for name, argument, bad, call in _calls(tmp_path):
        try:
            call()
        except ProblemError as err:
            if err.field != argument:
                wrong.append(f"{name}({argument}={bad!r}): names {err.field!r}: {err}")
        except Exception as err:  # noqa: BLE001 - listed as a failure below
            wrong.append(f"{name}({argument}={bad!r}): {type(err).__name__}: {err}")
        else:
            wrong.append(f"{name}({argument}={bad!r}): accepted")
    assert not wrong, "\n".join(wrong)


def test_baseline_without_a_problem_names_it() -> None:
    """The case of issue 28: an AttributeError before."""
    with pytest.raises(ValueError, match="^problem: got NoneType"):
        pp_opt.baseline("1f1b", None)  # type: ignore[arg-type]
