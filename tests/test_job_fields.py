"""A Job field is declared once: Pins, predict, the CLI options and the files derive from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import typer
from typer.main import get_command

from pp_opt.cli.plan import plan as plan_command
from pp_opt.cli.predict import predict as predict_command
from pp_opt.cli.profile import profile as profile_command
from pp_opt.errors import ProblemError
from pp_opt.job import FIELDS, Job, job_options
from pp_opt.planner.config import PINNED, Candidate, Pins
from pp_opt.planner.predict import PREDICT_FIELDS, prediction_job
from pp_opt.profiler.cards import load_model_card

ROOT = Path(__file__).resolve().parent.parent / "pp_opt"
DERIVED = ("cli/predict.py", "cli/plan.py", "cli/profile.py", "planner/predict.py",
           "planner/config.py")  # fmt: skip
"""The modules that take the job's fields without naming them."""
DEGREES = {"pp", "tp", "v", "placement", "mbs", "microbatches", "seq", "layers", "dp",
           "optimizer_sharding", "cp", "dp_shard", "dp_replicate"}  # fmt: skip
"""The layout's own fields, which the derived modules may name (the GPU count's product, the
candidate order's head, the microbatches of a profile)."""


def _options(func: object) -> set[str]:
    app = typer.Typer()
    app.command()(func)
    command = get_command(app)
    return {opt for p in command.params for opt in p.opts}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("command", "func"),
    [("predict", predict_command), ("plan", plan_command), ("profile", profile_command)],
)
def test_every_field_a_command_takes_is_its_option(command: str, func: object) -> None:
    options = _options(func)
    wanted = {spec.flag(name) for name, spec in job_options(command).items()}
    assert wanted and wanted <= {o.split("/")[0] for o in options}
    assert "--ep" in options and "--stack" in options


def test_pins_and_predict_take_every_field() -> None:
    assert {"ep", "etp", "dispatcher", "stack", "ac", "fp8"} <= set(PINNED)
    pins = Pins(ep=(8, 16), etp=2, stack="megatron-core", fp8=True)
    assert pins.ep == (8, 16) and pins.etp == (2,) and pins.stack == "megatron-core"
    assert set(PREDICT_FIELDS) == set(FIELDS) - {"dp", "microbatches", "seq"}
    card = load_model_card("qwen3-30b-a3b")
    job = prediction_job(card, gpus=16, global_batch=64, seq=4096, schedule="pp_opt",
                         dp_replicate=16, ep=16, dispatcher="deepep",
                         stack="megatron-core")  # fmt: skip
    assert (job.ep, job.edp, job.dispatcher) == (16, 1, "deepep")
    with pytest.raises(ProblemError) as err:
        Pins(not_a_field=(1,))
    assert err.value.field == "not_a_field"


def test_the_derived_modules_name_no_setting() -> None:
    """Adding a Job field (``ep``, ``dispatcher``) touches the job and the profiler, not the
    keyword lists of predict, the plan's pins or the commands."""
    settings = set(FIELDS) - DEGREES
    for path in DERIVED:
        tree = ast.parse((ROOT / path).read_text())
        named = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                named.add(node.id)
            elif isinstance(node, ast.Attribute):
                named.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg or isinstance(node, ast.arg):
                named.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                named.add(node.value)
        assert not named & settings, f"{path} names {sorted(named & settings)}"


def test_a_job_round_trips_through_its_files() -> None:
    job = Job(pp=4, microbatches=8, seq=4096, tp=2, dp=8, ep=8, etp=2, dispatcher="deepep",
              ac="modules:layernorm,moe_act", stack="megatron-core")  # fmt: skip
    assert Job.from_layout_dict(job.layout_dict(16.0)) == job.__class__(
        **{**{f: getattr(job, f) for f in FIELDS}, "bytes_per_param": 16.0}
    )
    candidate = Candidate(job=job, recompute=False, offload=True)
    assert Candidate.from_dict(candidate.to_dict(), seq=4096) == candidate
    assert "ep8 etp2 deepep" in job.label() and "megatron-core" in job.label()
    assert Job.from_dict({"pp": 2, "microbatches": 4, "seq": 64, "recompute": "full"}).ac == "full"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (dict(ep=3), "ep"),
        (dict(ep=2, etp=4), "ep"),
        (dict(ac="modules:attention"), "ac"),
        (dict(dispatcher="nccl"), "dispatcher"),
        (dict(expert_imbalance=0.5), "expert_imbalance"),
    ],
)
def test_bad_expert_settings_name_their_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(ProblemError) as err:
        Job(pp=2, microbatches=4, seq=64, dp=4, **fields)  # type: ignore[arg-type]
    assert err.value.field == field and "\n" not in str(err.value)
